"""The ledger's I/O: its Iceberg tables read and written through pyiceberg, without a JVM.

Every table lives in the ledger namespace of the configured catalog (the same catalog Spark's
data tables use). Reads return Python rows (the ledger is small: requests, their keys, audit
events, per-table steps, the run lease). Every write is one commit that asserts the snapshot it
was computed from; a commit that lost a race with another writer (the intake service, a
concurrent `dsr submit`) is computed again from the new state and retried. Tables are created
on first use; columns added by later versions are added to older ledgers the same way.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs
from pyiceberg import expressions
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from ..config import Settings
from ..exceptions import CatalogUnavailableError, LedgerError, first_line
from ..lake.catalog import open_catalog

# pyiceberg's predicates take (column, value) or (column, values) through their own __init__ and
# __new__; mypy types them from their pydantic fields instead (keyword-only `term: UnboundTerm`,
# `value: Literal`) and rejects every call pyiceberg documents. These are the same classes, typed
# as pyiceberg accepts them.
In = cast(Callable[[str, Iterable[Any]], BooleanExpression], expressions.In)
EqualTo = cast(Callable[[str, Any], BooleanExpression], expressions.EqualTo)
LessThan = cast(Callable[[str, Any], BooleanExpression], expressions.LessThan)
GreaterThan = cast(Callable[[str, Any], BooleanExpression], expressions.GreaterThan)
GreaterThanOrEqual = cast(Callable[[str, Any], BooleanExpression], expressions.GreaterThanOrEqual)
LessThanOrEqual = cast(Callable[[str, Any], BooleanExpression], expressions.LessThanOrEqual)
And = cast(Callable[[BooleanExpression, BooleanExpression], BooleanExpression], expressions.And)
NotNull = cast(Callable[[str], BooleanExpression], expressions.NotNull)


@dataclass(frozen=True)
class Among:
    """The rows whose `column` (a string) is one of `values`, as `Store` reads, replaces and deletes
    them: the files that may hold the span [min, max] of `values` (pruned by their bounds; request ids
    sort by age, so a batch's span skips older files) read whole, and the values matched in one Arrow
    pass. pyiceberg binds an `In` literal by literal for every file it plans: 10 s per read of 100,000
    request ids."""

    column: str
    values: Sequence[str]

    @property
    def span(self) -> BooleanExpression:
        return And(GreaterThanOrEqual(self.column, min(self.values)), LessThanOrEqual(self.column, max(self.values)))

    def mask(self, rows: pa.Table) -> pa.BooleanArray:
        return pc.is_in(rows.column(self.column), value_set=pa.array(list(self.values), pa.string()))

    def read(self, loaded: Table, columns: tuple[str, ...] = ("*",)) -> pa.Table:
        """These rows of `loaded` (all columns or `columns`), as Arrow."""
        whole = "*" in columns or self.column in columns
        read = loaded.scan(row_filter=self.span, selected_fields=columns if whole else (*columns, self.column)
                           ).to_arrow()
        read = read.filter(self.mask(read))
        return read if whole else read.select(list(columns))


def _schema(columns: list[tuple[str, pa.DataType]]) -> pa.Schema:
    """`pa.schema` of (name, type) pairs (typed: the pyarrow stubs infer a list of mixed types as object)."""
    return pa.schema(columns)


_TS = pa.timestamp("us", tz="UTC")
SCHEMAS: dict[str, pa.Schema] = {
    "requests": _schema([
        ("request_id", pa.string()), ("request_type", pa.string()), ("regulation", pa.string()),
        ("subject_id", pa.string()), ("subject_hash", pa.string()), ("status", pa.string()),
        ("status_reason", pa.string()), ("received_at", _TS), ("due_date", pa.date32()), ("extended", pa.bool_()),
        ("extension_reason", pa.string()), ("updated_at", _TS), ("completed_at", _TS), ("run_id", pa.string()),
        ("evidence", pa.string()), ("purge_by", pa.date32()),
        ("drop_work_items", pa.string()),  # JSON list of the DROP work items a request answers (drop/items.py)
    ]),
    # key_id: the key that made key_hash (keys.key_id); NULL: the key in use before key rotation existed.
    "request_keys": _schema([("request_id", pa.string()), ("key_type", pa.string()), ("key_hash", pa.string()),
                               ("key_id", pa.string())]),
    "audit": _schema([("event_id", pa.string()), ("request_id", pa.string()), ("run_id", pa.string()),
                        ("at", _TS), ("event", pa.string()), ("detail", pa.string())]),
    "steps": _schema([("step_id", pa.string()), ("run_id", pa.string()), ("table_name", pa.string()),
                        ("step", pa.string()), ("snapshot_id", pa.int64()), ("at", _TS), ("detail", pa.string())]),
    # One row while a run holds the ledger (see lease.py); `requests`: a JSON list of the ids it works on,
    # `interrupted`: of the runs it took over from.
    "lease": _schema([("run_id", pa.string()), ("host", pa.string()), ("pid", pa.int64()), ("started_at", _TS),
                        ("heartbeat_at", _TS), ("expires_at", _TS), ("requests", pa.string()),
                       ("interrupted", pa.string())]),
    # One row per `dsr run` that did work (Ledger.record_run); `seconds` and `tables` are JSON.
    "runs": _schema([("run_id", pa.string()), ("started_at", _TS), ("finished_at", _TS), ("seconds", pa.string()),
                       ("tables", pa.string()), ("requests_completed", pa.int64()), ("requests_failed", pa.int64()),
                       ("requests_erased", pa.int64())]),
    # Each subject's last opt-out/opt-in (ledger/consent.py), by keyed hash and the key that made it.
    "consent": _schema([("subject_hash", pa.string()), ("key_id", pa.string()), ("opted_out", pa.bool_()),
                          ("request_id", pa.string()), ("updated_at", _TS)]),
    # Legal holds (ledger/holds.py): a subject by keyed hash and the key that made it, or a table.
    "holds": _schema([("hold_id", pa.string()), ("kind", pa.string()), ("table_name", pa.string()),
                        ("subject_hash", pa.string()), ("key_id", pa.string()), ("reason", pa.string()),
                        ("until", pa.date32()), ("created_at", _TS), ("created_by", pa.string()),
                        ("released_at", _TS), ("released_by", pa.string())]),
    # The keyed hashes of erase requests whose record expired (ledger/records.py): what suppression and
    # the resurrection check still need to keep those people out; nothing else of the request is left.
    "erased_keys": _schema([("request_id", pa.string()), ("key_type", pa.string()), ("key_hash", pa.string()),
                              ("key_id", pa.string())]),
    # Yearly figures (CCPA § 7102) of records that expired, per year received, regulation and type:
    # `days` is JSON {days to respond: requests}. Every row carries the fold's watermarks (records.py).
    "record_years": _schema([("year", pa.int64()), ("regulation", pa.string()), ("request_type", pa.string()),
                               ("received", pa.int64()), ("complied", pa.int64()), ("denied", pa.int64()),
                               ("days", pa.string()), ("completed_before", _TS), ("intake_before", _TS)]),
    # California DROP (drop/items.py): each work item of a download, as DROP sent it (an ID and the
    # hash of an identifier, never the identifier), and what became of it: `subjects` matched when it
    # was matched, `request_ids` (JSON) the requests filed for them; `status` is DROP's code (2 exempted,
    # 3 deleted, 4 opted out, 5 not found), null until settled.
    "drop_items": _schema([("work_item_id", pa.string()), ("list_type", pa.string()), ("hash", pa.string()),
                             ("download", pa.string()), ("download_day", pa.date32()), ("due_date", pa.date32()),
                             ("filed_at", _TS), ("matched_at", _TS), ("subjects", pa.int64()),
                             ("request_ids", pa.string()), ("status", pa.int64()), ("status_at", _TS),
                             ("withdrawn_at", _TS), ("reported_status", pa.int64()), ("reported_at", _TS)]),
    # Each file `dsr drop export` wrote (drop/items.py): DROP accepts a file name once per download.
    "drop_uploads": _schema([("download", pa.string()), ("file_name", pa.string()), ("kind", pa.string()),
                               ("items", pa.int64()), ("written_at", _TS)]),
    # Each DROP download imported: an access of DROP, which the law requires every `drop.interval_days`.
    "drop_downloads": _schema([("download", pa.string()), ("sha256", pa.string()), ("broker_id", pa.string()),
                                 ("download_day", pa.date32()), ("imported_at", _TS), ("lists", pa.string()),
                                 ("items", pa.int64()), ("filed", pa.int64()), ("withdrawn", pa.int64())]),
}
# No column bounds for subject_id, so no manifest ever carries an identifier; old metadata files go.
# No retries inside pyiceberg: it would re-apply a write computed from rows another writer has since
# changed (a lost update, or two lease holders); `transact` recomputes from the new state instead.
_NO_RETRY = {"commit.retry.num-retries": "0"}
_PROPS = {"format-version": "2", "write.metadata.delete-after-commit.enabled": "true",
          "write.metadata.previous-versions-max": "10", **_NO_RETRY}
_EXTRA_PROPS = {"requests": {"write.metadata.metrics.column.subject_id": "counts"}}
_RETRIES = 12
COMPACT_FILES, COMPACT_SNAPSHOTS = 8, 16  # Store.compact: a table past either is rewritten as one file
# A commit that lost a race: the catalog refused it, or pyiceberg's own check found the other writer's files.
_LOST_RACE = (CommitFailedException, ValidationException)
# An overwrite of rows not yet there (the first lease, a request's first outcome) is normal here.
warnings.filterwarnings("ignore", "Delete operation did not match any records", UserWarning, "pyiceberg")


@dataclass
class HistoryPurge:
    """What purging a ledger table's history did."""

    snapshots_expired: int = 0
    files_deleted: int = 0
    orphans_removed: int = 0


class Store:
    """The ledger tables of one catalog. Cheap to create: the catalog is opened on first use."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.namespace = settings.ledger_namespace
        self._ready: set[str] = set()

    @cached_property
    def catalog(self):
        return open_catalog(self.settings)

    def name(self, table: str) -> str:
        return f"{self.namespace}.{table}"

    # -- tables -----------------------------------------------------------------------------------
    def load(self, table: str, create: bool = True) -> Table:
        """The table as now committed, created if missing (unless `create` is False: NoSuchTableError),
        and given the columns of this version on first use in this store."""
        try:
            loaded = self.catalog.load_table(self.name(table))
        except NoSuchTableError:
            if not create:
                raise
            loaded = self._create(table)
        except CatalogUnavailableError:
            raise
        except Exception as exc:  # storage or server unreachable
            raise CatalogUnavailableError(f"catalog {self.settings.catalog.name} cannot be reached: "
                                          f"{first_line(exc)}") from exc
        if table not in self._ready:
            loaded = self._upgrade(table, loaded)
            self._ready.add(table)
        return loaded

    def _create(self, table: str) -> Table:
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
            return self.catalog.create_table(self.name(table), SCHEMAS[table],
                                             properties={**_PROPS, **_EXTRA_PROPS.get(table, {})})
        except Exception as exc:
            try:  # created meanwhile by another process
                return self.catalog.load_table(self.name(table))
            except NoSuchTableError:
                raise CatalogUnavailableError(f"catalog {self.settings.catalog.name}: the ledger table "
                                              f"{self.name(table)} cannot be created: {first_line(exc)}") from exc

    def _upgrade(self, table: str, loaded: Table) -> Table:
        """Columns a ledger written by an earlier version lacks (purge_by, key_id) are added, and
        pyiceberg's own commit retries turned off."""
        have = {f.name for f in loaded.schema().fields}
        missing = [f for f in SCHEMAS[table] if f.name not in have]
        retries_on = any(loaded.properties.get(k) != v for k, v in _NO_RETRY.items())
        if not missing and not retries_on:
            return loaded
        with loaded.transaction() as tx:
            if retries_on:
                tx.set_properties(_NO_RETRY)
            if missing:
                with tx.update_schema() as update:
                    for f in missing:
                        update.add_column(f.name, _iceberg_type(f.type))
        return self.catalog.load_table(self.name(table))

    # -- reading ---------------------------------------------------------------------------------
    def rows(self, table: str, row_filter: BooleanExpression | Among | None = None,
             columns: tuple[str, ...] = ("*",)) -> list[dict]:
        """`arrow`'s rows as dicts."""
        return self.arrow(table, row_filter, columns).to_pylist()

    def arrow(self, table: str, row_filter: BooleanExpression | Among | None = None,
              columns: tuple[str, ...] = ("*",)) -> pa.Table:
        """Rows of `table` (all, or those matching `row_filter`; all columns or `columns`) as Arrow, in
        the table's types; a table not created yet has none (reading creates nothing). Cost: reads
        the table's files that may hold such rows (pruned by their column statistics)."""
        schema = SCHEMAS[table] if "*" in columns else pa.schema([SCHEMAS[table].field(c) for c in columns])
        if isinstance(row_filter, Among) and not row_filter.values:
            return schema.empty_table()
        try:
            loaded = self.load(table, create=False)
        except NoSuchTableError:
            return schema.empty_table()
        for _ in range(_RETRIES):
            if loaded.current_snapshot() is None:
                return schema.empty_table()
            try:
                if isinstance(row_filter, Among):
                    return row_filter.read(loaded, columns)
                return loaded.scan(row_filter=row_filter or AlwaysTrue(), selected_fields=columns).to_arrow()
            except FileNotFoundError:  # compacted since we loaded it (`compact`): read the new file
                loaded = self.load(table, create=False)
        raise LedgerError(f"ledger table {self.name(table)} kept changing while read; try again")

    # -- writing ---------------------------------------------------------------------------------
    def append(self, table: str, rows: list[dict]) -> None:
        """Append rows in one commit (retried after a concurrent commit), then `compact` if due."""
        if rows:
            self.append_arrow(table, pa.Table.from_pylist(rows, schema=SCHEMAS[table]))

    def append_arrow(self, table: str, rows: pa.Table) -> None:
        """`append` of Arrow rows (columns by name, cast to the table's schema)."""
        if rows.num_rows:
            self.compact(self.transact(table, lambda loaded: loaded.append(
                rows.select(loaded.schema().as_arrow().names).cast(loaded.schema().as_arrow()))))

    def compact(self, loaded: Table) -> bool:
        """Rewrite the table as one file and purge its history once commits have left it more than
        COMPACT_FILES files or COMPACT_SNAPSHOTS snapshots. Appending tables (the journal, the audit
        trail, the run history, the requests) gain a file and a snapshot per commit and are read at
        every run: without this, every run would cost more than the last. Free below those numbers
        (read from the snapshot summary); above, one read and one write of the table's rows and a
        history purge (`purge_history`) that keeps the snapshot before the rewrite. True when it
        compacted."""
        snapshot = loaded.current_snapshot()
        files = int(snapshot.summary.get("total-data-files") or 0) if snapshot and snapshot.summary else 0
        if files <= COMPACT_FILES and len(loaded.metadata.snapshots) <= COMPACT_SNAPSHOTS:
            return False
        table = loaded.name()[-1]
        # The snapshot the rewrite replaces stays until the next compaction: a reader that planned on it
        # (a stream's micro-batch reading the requests through Spark, say) still finds its files.
        replaced: set[int] = set()

        def rewrite(now: Table) -> None:
            current = now.current_snapshot()
            if current is not None:
                replaced.add(current.snapshot_id)  # each attempt's: a retried one found a newer snapshot
                now.overwrite(now.scan().to_arrow())

        if files > 1:
            self.transact(table, rewrite)
        self.purge_history(table, self.settings.purge.orphan_min_age_minutes, frozenset(replaced))
        return True

    def replace(self, table: str, key: str, ids: list[str], change: Callable[[list[dict]], list[dict]]) -> None:
        """Replace the rows whose `key` is in `ids` with `change(those rows)`, in one commit.

        `change` sees the rows as committed at the moment of each attempt, so a concurrent change
        to other columns or other rows (an extension, a new request) is never lost. Cost: reads the
        files that may hold the span of `ids` (`Among`), rewrites the ones that hold some of it.
        """
        self.replace_arrow(table, key, ids, lambda loaded, rows: arrow_rows(loaded, change(rows.to_pylist())))

    def replace_arrow(self, table: str, key: str, ids: list[str],
                      change: Callable[[Table, pa.Table], pa.Table]) -> None:
        """`replace` with `change(table, those rows)` taking and giving Arrow in the table's schema: no
        Python object per row (a run's 100,000 outcomes cost seconds as dicts)."""
        if not ids:
            return
        among = Among(key, ids)

        def attempt(loaded: Table) -> None:
            schema = loaded.schema().as_arrow()
            within = loaded.scan(row_filter=among.span).to_arrow().cast(schema) if loaded.current_snapshot() \
                else schema.empty_table()
            chosen = among.mask(within)
            changed = change(loaded, within.filter(chosen))
            if changed.num_rows or pc.any(chosen).as_py():  # replacing no row with none commits nothing
                loaded.overwrite(pa.concat_tables([within.filter(pc.invert(chosen)), changed.cast(schema)]),
                                 overwrite_filter=among.span)

        self.transact(table, attempt)

    def delete(self, table: str, row_filter: BooleanExpression | Among) -> None:
        """Delete the rows matching `row_filter` in one commit (retried after a concurrent commit); a
        table without rows is left alone. Cost: reads the files that may hold such rows, rewrites those
        that do (their old versions stay in history until `purge_history`)."""
        if isinstance(row_filter, Among):
            self.replace(table, row_filter.column, list(row_filter.values), lambda rows: [])
            return

        def attempt(loaded: Table) -> None:
            if loaded.current_snapshot() is not None:
                loaded.delete(row_filter)

        self.transact(table, attempt)

    def compare_and_set(self, table: str, expected_snapshot: int | None, rows: list[dict]) -> bool:
        """Make `rows` the whole content of `table` in one commit, only if the table is still at
        `expected_snapshot` (None: no snapshot yet). False when another writer got there first."""
        loaded = self.load(table)
        current = loaded.current_snapshot()
        if (current.snapshot_id if current else None) != expected_snapshot:
            return False
        try:
            if rows:
                loaded.overwrite(arrow_rows(loaded, rows))
            elif current is not None:
                loaded.delete(AlwaysTrue())
        except _LOST_RACE:
            return False
        except FileNotFoundError:
            if self._moved_on(loaded):
                return False
            raise
        return True

    def _moved_on(self, loaded: Table) -> bool:
        """Whether another writer committed since `loaded`. A commit that found files of the snapshot it
        loaded missing lost a race to a compaction that purged them (`compact`): the same as a refused
        commit. Without a newer commit the files are really gone, and that is not retried away."""
        current, now = loaded.current_snapshot(), self.load(loaded.name()[-1]).current_snapshot()
        return (current.snapshot_id if current else None) != (now.snapshot_id if now else None)

    def snapshot_id(self, table: str) -> int | None:
        """The table's current snapshot (None: no snapshot, or no table: a read creates none)."""
        try:
            current = self.load(table, create=False).current_snapshot()
        except NoSuchTableError:
            return None
        return current.snapshot_id if current else None

    def transact(self, table: str, attempt: Callable[[Table], object]) -> Table:
        """Run `attempt(table as now committed)`, which commits once; again from the new state when a
        concurrent commit made it fail. Returns the table as that commit left it."""
        for n in range(_RETRIES):
            loaded = self.load(table)
            try:
                attempt(loaded)
                return loaded
            except _LOST_RACE:
                pass
            except FileNotFoundError:
                if not self._moved_on(loaded):
                    raise
            time.sleep(min(2.0, 0.02 * 2 ** n) * random.uniform(0.5, 1.5))
        raise LedgerError(f"ledger table {self.name(table)} kept changing under concurrent writers "
                          f"({_RETRIES} attempts); nothing was written, try again")

    # -- history and storage --------------------------------------------------------------------
    def purge_history(self, table: str, orphan_min_age_minutes: float, keep: frozenset[int] = frozenset()
                      ) -> HistoryPurge:
        """Expire every snapshot but the current one (and those branches or tags hold, and `keep`), delete
        the files only they referenced, and delete unreferenced files older than the orphan window.

        A concurrent writer is safe: only files of expired snapshots are deleted at once, and files no
        snapshot references (a writer may be about to commit them) only once older than the window.
        So is a concurrent purge (two writers compacting at once): a file it deleted first is not
        deleted twice, and history it expired while this one read it, or before this one's expiry
        committed, is read again from the new state.
        Cost: reads the manifests of every snapshot and lists the table location."""
        for _ in range(_RETRIES):
            try:
                return self._purge_history(table, orphan_min_age_minutes, keep)
            except _LOST_RACE:  # another writer committed in between: expire from the new state
                pass
            except FileNotFoundError:  # another purge deleted files of the history this one was reading
                pass
        raise LedgerError(f"ledger table {self.name(table)} kept changing while its history was purged "
                          f"({_RETRIES} attempts); try again")

    def _purge_history(self, table: str, orphan_min_age_minutes: float, keep: frozenset[int]) -> HistoryPurge:
        result = HistoryPurge()
        loaded = self.load(table)
        current = loaded.current_snapshot()
        if current is not None:
            protected = {ref.snapshot_id for ref in loaded.metadata.refs.values()} | keep
            expired = [s.snapshot_id for s in loaded.snapshots() if s.snapshot_id not in protected]
            if expired:
                before = _reachable(loaded, loaded.snapshots())
                try:
                    loaded.maintenance.expire_snapshots().by_ids(expired).commit()
                except ValueError:  # pyiceberg's word for a snapshot gone from the table it commits to
                    if self.load(table).metadata_location == loaded.metadata_location:
                        raise
                    raise CommitFailedException("another purge expired these snapshots first") from None
                loaded = self.load(table)
                gone = before - _reachable(loaded, loaded.snapshots())
                for path in gone:
                    with suppress(FileNotFoundError):  # deleted first by a concurrent purge
                        loaded.io.delete(path)
                result.snapshots_expired, result.files_deleted = len(expired), len(gone)
        result.orphans_removed = self._remove_orphans(loaded, orphan_min_age_minutes)
        return result

    def remove_orphans(self, table: str, orphan_min_age_minutes: float) -> int:
        """Delete the table's data and manifest files no snapshot references, once older than the orphan
        window (a write a full disk cut short leaves one, torn); returns how many. A table not created
        yet is left alone. Cost: reads the manifests of every snapshot and lists the table location."""
        try:
            loaded = self.load(table, create=False)
        except NoSuchTableError:
            return 0
        return self._remove_orphans(loaded, orphan_min_age_minutes)

    def _remove_orphans(self, loaded: Table, orphan_min_age_minutes: float) -> int:
        referenced = _reachable(loaded, loaded.snapshots()) | {_normal(loaded.metadata_location)}
        cutoff = time.time() - orphan_min_age_minutes * 60
        removed = 0
        for info in self.files(loaded):
            if info.uri not in referenced and info.path.endswith((".parquet", ".avro")) and info.mtime < cutoff:
                with suppress(FileNotFoundError):  # deleted first by a concurrent purge
                    info.fs.delete_file(info.path)
                removed += 1
        return removed

    def files(self, loaded: Table) -> list[StoredFile]:
        """Every file under the table's location, as the storage lists it."""
        location = loaded.location()
        scheme, netloc, path = PyArrowFileIO.parse_location(location)
        filesystem = loaded.io.fs_by_scheme(scheme, netloc) if isinstance(loaded.io, PyArrowFileIO) \
            else PyArrowFileIO(loaded.io.properties).fs_by_scheme(scheme, netloc)
        prefix = location[: len(location) - len(path.lstrip("/"))] if scheme != "file" else "file://"
        infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        return [StoredFile(filesystem, i.path, _uri(prefix, i.path, scheme), i.mtime.timestamp() if i.mtime else 0.0)
                for i in infos if i.type == pafs.FileType.File]

    def column_values(self, table: str, column: str) -> Iterator[str]:
        """Every non-null value of `column` in every Parquet file under the table's location, referenced
        or not: what storage still holds. Cost: reads that column of each file."""
        for stored in self.files(self.load(table)):
            if not stored.path.endswith(".parquet"):
                continue
            with stored.fs.open_input_file(stored.path) as fh:
                parquet = pq.ParquetFile(fh)
                if column in parquet.schema_arrow.names:
                    yield from (v for v in parquet.read(columns=[column]).column(column).to_pylist() if v is not None)


@dataclass(frozen=True)
class StoredFile:
    fs: pafs.FileSystem
    path: str
    uri: str
    mtime: float


def _uri(prefix: str, path: str, scheme: str) -> str:
    return f"file://{path}" if scheme == "file" else f"{prefix}{path.lstrip('/')}"


def _reachable(loaded: Table, snapshots) -> set[str]:
    """Manifest lists, manifests and live data/delete files of `snapshots`, normalised to URIs."""
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(loaded.io):
            files.add(manifest.manifest_path)
            files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(loaded.io))
    return {_normal(f) for f in files}


def _normal(path: str) -> str:
    """One spelling per local file: `file:/x`, `file:///x` and `/x` are the same file."""
    if path.startswith("file:"):
        return "file://" + "/" + path[len("file:"):].lstrip("/")
    return "file://" + path if path.startswith("/") else path


def arrow_rows(loaded: Table, rows: list[dict]) -> pa.Table:
    """Python rows as Arrow in the table's own schema (names, types, order)."""
    return pa.Table.from_pylist(rows, schema=loaded.schema().as_arrow())


def _iceberg_type(arrow_type: pa.DataType):
    from pyiceberg.types import BooleanType, DateType, LongType, StringType, TimestamptzType

    return {pa.string(): StringType(), pa.int64(): LongType(), pa.date32(): DateType(), pa.bool_(): BooleanType(),
            _TS: TimestamptzType()}[arrow_type]

