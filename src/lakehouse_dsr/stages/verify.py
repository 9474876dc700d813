"""Proof of erasure, by keyed hash, so the same check runs during a run and long after it.

For one table and a set of identifier hashes, count rows still holding an identifier in:
  live     the current snapshot (what every reader sees)
  history  every data/delete file referenced by any retained snapshot (time travel)
  storage  every Parquet data file under the table location, referenced or not (orphans)
  metadata every value the table's metadata files hold as text (a Delta log's statistics and
           predicates; TableHandle.metadata_files)
  refs     each branch/tag snapshot (reported by name, as they block expiry)
Values are grouped first, then hashed (HMAC-SHA256 in Spark) and joined to the hashes, so no
plaintext identifier is needed and the driver receives only per-request counts. After a key
rotation each value is hashed under every key that made one of the hashes (the active key and
retired ones), and each stored hash is compared with the candidates of its own key only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ..config import EraseSettings, Settings
from ..datamap import DataMap, KeyGroup, column_ref
from ..exceptions import LedgerError
from ..inventory.check import KeyTypes, check_against_catalog, schema_of
from ..keys import Keyring, as_keyring, key_id, keys_in_use
from ..lake import frames, indriver, plainfiles, skipping
from ..lake.batching import collect_union, map_in_threads
from ..lake.hmac import join_on_key, with_keyring_hashes
from ..lake.lakehouse import Lake
from ..lake.table import TableHandle, same_file, unreadable_parquet
from ..ledger.ledger import Ledger
from .matching import TableKeys


def _entry(group: int, identifier: str) -> Callable[[Column], Column]:
    return lambda value: F.struct(F.lit(group).alias("dsr_group"), F.lit(identifier).alias("key_type"),
                                  value.cast("string").alias("dsr_value"))


def key_values(rows: DataFrame, groups: list[KeyGroup], key_columns: list[Column] | None = None,
               carry: list[str] | None = None) -> DataFrame:
    """(dsr_group, key_type, dsr_value): every key column's value of every row of `rows` (which
    holds the key columns at their paths, struct paths included, unless `key_columns` says where),
    as text, plus the `carry` columns; one row per key column, and per element of an array key."""
    key_columns = key_columns or [F.col(column_ref(g.column)) for g in groups]
    if len(groups) == 1 and not groups[0].is_array:  # one value per row: no array and explode per row
        return rows.select(_entry(0, groups[0].identifier)(key_columns[0]).alias("dsr_kv"), *(carry or [])
                           ).select("dsr_kv.*", *(carry or []))
    parts = []
    for i, (g, value) in enumerate(zip(groups, key_columns, strict=True)):
        entry = _entry(i, g.identifier)
        parts.append(F.transform(F.coalesce(value, F.array()), entry) if g.is_array else F.array(entry(value)))
    return rows.select(F.explode(F.concat(*parts)).alias("dsr_kv"), *(carry or [])).select("dsr_kv.*", *(carry or []))


def find_hashed(spark: SparkSession, values: DataFrame, hashes: DataFrame, key: bytes | dict[str, bytes]
                ) -> dict[str, int]:
    """Rows of `values` (`key_values`) whose value hashes to one of `hashes` (request_id, key_type,
    key_hash[, key_id]) of the same identifier, per request.

    `key`: one key or {key_id: key} (`keys_for` resolves a Keyring); each stored hash is compared
    with the value's hash under the key that made it (hashing.join_on_key). One scan; hashing cost
    is per distinct value and key, not per row. A value found twice for one request in one key
    column (its hashes were recorded before and after a rotation) counts once.
    """
    grouped = values.groupBy("dsr_group", "key_type", "dsr_value").count()
    return {r.request_id: int(r.n) for r in _found(grouped, hashes, key, []).collect()}


def found_values(values: DataFrame, hashes: DataFrame, key: bytes | dict[str, bytes]) -> DataFrame:
    """(request_id, key_type, key_value): the distinct values of `values` (`key_values`) whose hash is
    one of `hashes` of the same identifier, as text; the shape `matching.key_sets` takes, so rows
    found by hash alone can be erased. The values stay in Spark (never collected, never in SQL
    text). Cost: one scan of `values`, hashing per distinct value and key."""
    distinct = values.select("dsr_group", "key_type", "dsr_value").distinct()
    return (matched(distinct, hashes, key)
            .select("request_id", "key_type", F.col("dsr_value").alias("key_value")).distinct())


def matched(grouped: DataFrame, hashes: DataFrame, key: bytes | dict[str, bytes]) -> DataFrame:
    """Grouped values (`key_values`' columns, any others carried) joined with the stored hashes
    (request_id) of the same identifier they are found among: one HMAC per row and key in use."""
    keys = {key_id(key): key} if isinstance(key, bytes) else key
    hashed = with_keyring_hashes(grouped.sparkSession, grouped.where(F.col("dsr_value").isNotNull()), "dsr_value",
                                 keys)
    stored = hashes.select("request_id", "key_hash", F.col("key_type").alias("dsr_stored_type"),
                           *(["key_id"] if "key_id" in hashes.columns else []))
    return join_on_key(hashed, stored).where(F.col("key_type") == F.col("dsr_stored_type"))


def _found(grouped: DataFrame, hashes: DataFrame, key: bytes | dict[str, bytes], by: list[str]) -> DataFrame:
    """Rows (`by` columns..., request_id, n) of grouped values found among the stored hashes."""
    # One shuffle: partitioned by request, both the de-duplication and the sum run in place.
    return (
        matched(grouped, hashes, key)
        .repartition("request_id").dropDuplicates([*by, "request_id", "dsr_group", "dsr_value"])
        .groupBy(*by, "request_id").agg(F.sum("count").alias("n"))
    )


def live_found(lake: Lake, datamap: DataMap, erase: EraseSettings, tables: list[str], hashes: DataFrame,
               key: HashKeys, prune: dict[str, TableKeys] | None = None,
               proven: dict[str, frozenset[str]] | None = None, *, parallel_tables: int) -> dict[str, dict[str, int]]:
    """{table: {request id: rows}}: the live check of many tables (verify_table's first scan) in one
    Spark job over the union of their key columns, instead of a job per table: on a wide lake of
    small tables each job's fixed cost is most of the work. `prune`, `proven`: see verify_table; a
    table no file of which can hold the keys adds nothing to the job, and a small one is checked in
    the driver (lake/indriver.py: the same keyed hashes, no Spark job); `parallel_tables`
    (`run.parallel_tables`): tables planned, and scans collected, at once."""
    found: dict[str, dict[str, int]] = {table: {} for table in tables}
    spark = lake.spark
    lookup = driver_lookup(hashes, key)

    def part(table: str) -> DataFrame | None:
        keys = (prune or {}).get(table)
        rows: DataFrame | None
        if keys is None:
            rows = spark.table(lake.quoted(table))
        else:
            candidates = _live_candidates(lake.table(table), keys, (proven or {}).get(table))
            if indriver.refusal(spark, candidates, keys.key_columns(), erase.in_driver_max_bytes) is None:
                live = indriver.attempt(f"{table}: the live check", lambda: indriver.live_found(
                    spark, candidates, keys.key_columns(), [g.identifier for g in keys.groups], lookup()))
                if live is not None:
                    found[table] = live
                    return None
            rows = skipping.read(candidates)  # the files planned above, not planned again
        if rows is None:
            return None
        values = key_values(rows, datamap.mapping(table).groups)
        return values.select(F.lit(table).alias("dsr_table"), "dsr_group", "key_type", "dsr_value")

    parts = [p for p in map_in_threads(part, tables, parallel_tables) if p is not None]
    per_table = lambda union: _found(  # noqa: E731
        union.groupBy("dsr_table", "dsr_group", "key_type", "dsr_value").count(), hashes, key.keys, ["dsr_table"])
    for r in collect_union(parts, per_table, parallel_tables):
        found[r.dsr_table][r.request_id] = int(r.n)
    return found


def driver_lookup(hashes: DataFrame, key: HashKeys) -> Callable[[], Any]:
    """A function returning the stored `hashes` and the keys that made them in the driver's JVM
    (indriver.hash_lookup), for checks by keyed hash in the driver: made on its first call, once,
    whichever thread calls. Cost then: one small job reading the hashes (not identifiers)."""
    lookups: list = []
    lock = threading.Lock()

    def lookup() -> Any:
        with lock:
            if not lookups:
                made_by = F.col("key_id") if "key_id" in hashes.columns else F.lit(None).cast("string")
                stored = [tuple(r) for r in hashes.select("request_id", "key_type", "key_hash", made_by).collect()]
                lookups.append(indriver.hash_lookup(hashes.sparkSession, stored, key.keys))
            return lookups[0]
    return lookup


def _live_rows(table: TableHandle, prune: TableKeys | None, proven: frozenset[str] | None = None
               ) -> DataFrame | None:
    """The current snapshot's rows (only the files that may hold `prune`'s keys and are not `proven`;
    None when no file is left)."""
    if prune is None:
        return table.spark.table(table.quoted)
    return skipping.read(_live_candidates(table, prune, proven))


def _live_candidates(table: TableHandle, prune: TableKeys, proven: frozenset[str] | None) -> skipping.Candidates:
    """The current snapshot's files that may hold `prune`'s keys (metadata only), without those
    proven free of them already (`proven`): a data file never changes, and deletes attached to it
    since can only remove rows."""
    candidates = prune.current_candidates(table)
    return candidates.subset(table.spark, set(candidates.paths()) - proven) if proven else candidates


@dataclass(frozen=True)
class HashKeys:
    """The keys that made a set of stored hashes, resolved once for every table a run verifies."""

    keys: dict[str, bytes]  # key id -> key, only the keys in use
    lost: dict[str, str]  # request id -> id of a key that made its hashes and that no keyring holds


def keys_for(key_file: Path, hashes: DataFrame, key: bytes | Keyring | HashKeys) -> HashKeys:
    """The keys of the ring (a bare `key` is the active one; retired keys come from the keyring file
    beside `key_file`, `Settings.key_file()`) that made `hashes`, and the requests whose hashes were
    made by a key in no keyring any more.

    Cost: none for hashes held in the driver's JVM (`stored_hashes`), else one distinct over the
    (small) hashes' key ids (none when given HashKeys); only the keys in use are hashed with.
    """
    if isinstance(key, HashKeys):
        return key
    ring = as_keyring(key, key_file)
    if "key_id" not in hashes.columns:
        return HashKeys(ring.keys(), {})
    ids = hashes.select("request_id", "key_id")
    used = set(indriver.distinct_values(ids, "key_id"))
    lost_ids = sorted(k for k in used - set(ring.keys()) if k is not None)
    lost: dict[str, str] = {}
    if lost_ids:
        by_lost = indriver.kept_where(ids, "key_id", lost_ids) if indriver.is_local(ids) else ids.distinct().where(
            F.col("key_id").isin(*lost_ids))
        lost = {r.request_id: r.key_id for r in by_lost.collect()}
    return HashKeys(keys_in_use(ring, used), lost)


HASHES = "request_id string, key_type string, key_hash string, key_id string"  # stored keyed hashes, as rows


def stored_hashes(spark: SparkSession, ledger: Ledger, request_ids: list[str], in_driver_max: int) -> DataFrame:
    """(request_id, key_type, key_hash, key_id) the ledger holds for these requests (hashes only, no
    plaintext), held in the driver's JVM, where reading it back takes no Spark job, unless there are
    more than `in_driver_max` (lake/frames.py). Cost: one pyiceberg read of the ledger's keys."""
    return frames.rows_frame(spark, ledger.key_hashes_arrow(request_ids), in_driver_max)


@dataclass
class TableVerification:
    table: str
    live: int = 0
    history: int = 0
    storage: int = 0
    metadata: int = 0
    refs: dict[str, int] = field(default_factory=dict)
    physical: bool = True  # False: live data only (logical erasure, purge still scheduled)
    # True when history and storage hold exactly the current snapshot's files: the live scan proved all three
    one_scan: bool = False
    collateral_ok: bool = True
    collateral_detail: str | None = None
    failing: dict[str, list[str]] = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # what else a table's kind of proof established (shred.py)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failing and self.collateral_ok

    def fail(self, request_id: str, reason: str) -> None:
        self.failing.setdefault(request_id, []).append(reason)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("failing")
        d["passed"] = self.passed
        d["requests_failing"] = len(self.failing)
        return d

    def evidence(self, request_id: str, collateral: bool = True) -> dict:
        """The proof as a request's evidence records it: the batch's `checks` (collateral only where one
        was made), whether none of them found this request's subject (`passed`), and how (`method`)."""
        scanned_metadata = self.physical and self.details.get("metadata_files")
        return {"checks": {"live": self.live == 0, **({"collateral": self.collateral_ok} if collateral else {}),
                           **({"history": self.history == 0, "storage": self.storage == 0} if self.physical else {}),
                           **({"metadata": self.metadata == 0} if scanned_metadata else {})},
                "verification": {"method": self.details.get("method", ""), "passed": not self.failing.get(request_id),
                                 "one_scan": self.one_scan, "refs_checked": sorted(self.refs)}}


def verify_table(
    lake: Lake, key_file: Path, table: str, groups: list[KeyGroup], types: dict[str, DataType],
    hashes: DataFrame, key: bytes | Keyring | HashKeys, physical: bool = True,
    prune: TableKeys | None = None, live: dict[str, int] | None = None, proven: frozenset[str] | None = None,
) -> TableVerification:
    """Run the live, history, storage and ref checks over every key column of one table.

    `groups`: the key columns and the identifier each holds; `types`: their Spark types
    (inventory.check); `key_file`: `Settings.key_file()`, beside which the keyring file lies.
    `physical=False` runs the live check only: one scan of the key columns in the
    current snapshot. `key`: the keyring, or the active key (the retired ones are then read from
    the keyring file), or the keys `keys_for` resolved already for a set of hashes including these.
    A request whose hashes were made by a key in no keyring any more (destroyed) cannot be proven:
    it fails with that reason. `prune`: the plaintext keys these hashes were made from (a run knows
    them; `dsr verify` does not): the live scan then reads only the files that may hold them
    (lake/skipping.py), and none, with no Spark job, when metadata rules every file out. `proven`
    (with `prune` only): files this run's collateral check read whole and found none of those keys
    in (collateral.CollateralResult.clean_files), which the live scan skips. `live`: the live
    check's findings, made already for many tables at once (`live_found`).

    Cost: one scan of the key columns in the current snapshot (its candidate files with `prune`),
    one over the files of all retained snapshots, one over all Parquet files under the location
    (every key column's values, numeric and nested ones included), one per branch/tag. When the
    retained snapshots and the storage listing hold exactly the current snapshot's files and no
    delete files (the state a purge leaves), those scans would read the same bytes as the live one,
    so the live scan stands for all three (metadata and one listing decide it). One scan marking
    rows by input file was measured slower (10M events: 12.0 s against 6.8 s), as every file holds
    most subjects and grouping by (value, file) keeps millions of groups.
    """
    spark, handle = lake.spark, lake.table(table)
    result, keys = _started(key_file, table, hashes, key, physical=physical)
    if live is None:
        current = _live_rows(handle, prune, proven)
        live = find_hashed(spark, key_values(current, groups), hashes, keys) if current is not None else {}
    result.live = _record(result, live, "rows in the current snapshot")
    if not physical:
        return result

    result.one_scan = handle.history_is_live()
    if result.one_scan:
        history = storage = live
    else:
        paths, _ = handle.retained_files()
        on_storage = _readable_on_storage(spark, result, hashes, handle.data_files_on_storage(), paths)
        schema = schema_of(types)
        history = find_hashed(spark, key_values(handle.read_raw(paths, schema), groups),
                              hashes, keys) if paths else {}
        storage = find_hashed(spark, key_values(handle.read_raw(on_storage, schema), groups),
                              hashes, keys) if on_storage else {}
    result.history = _record(result, history, "rows in files retained by snapshots (time travel)")
    result.storage = _record(result, storage, "rows in files on storage (incl. unreferenced/orphan files)")
    if metadata := handle.metadata_files():
        found = find_hashed(spark, metadata_values(spark, metadata, groups), hashes, keys)
        result.metadata = _record(result, found, "values in the table's metadata (its log's statistics)")
        result.details["metadata_files"] = len(metadata)

    for ref in handle.refs():
        pinned = handle.read_at(ref.snapshot_id)
        found = find_hashed(spark, key_values(pinned, groups), hashes, keys)
        label = f"{ref.kind.lower()} {ref.name}"
        result.refs[label] = _record(
            result, found, f"{label} pins snapshot {ref.snapshot_id} holding the subject's rows; "
            "remove the ref or set purge.pinned_refs: drop or rewrite"
        )
    return result


# Text in a metadata file that may be a value: a JSON string (whole), a string inside a JSON string
# (a Delta commit's `stats`), and the words and numbers between JSON's and SQL's punctuation (a
# predicate's literal, a numeric statistic).
# Unrolled, possessive: Java's regex engine recurses once per character of `(?:a|b)*`, and a long quoted
# string (a Delta 4 checkpoint's statistics) overflowed an executor thread's stack, which ends the JVM.
_QUOTED = r'"([^"\\\\]*+(?:\\\\.[^"\\\\]*+)*+)"'
_NESTED = r'\\\\"([^"\\\\]*)\\\\"'
_WORDS = r'[\s"{}\[\](),:=<>\\]+'


def metadata_values(spark: SparkSession, files: list[str], groups: list[KeyGroup]) -> DataFrame:
    """(dsr_group, key_type, dsr_value): every value `files` (metadata: JSON or text, and Parquet
    such as a Delta checkpoint, read row by row as JSON) may hold, once per key group, for a check
    by keyed hash (`find_hashed`). Reads each file whole; the values stay in Spark."""
    texts = [f for f in files if not f.endswith(".parquet")]
    parts = [spark.read.text(texts)] if texts else []
    for path in (f for f in files if f.endswith(".parquet")):
        table = spark.read.parquet(path)
        parts.append(table.select(F.to_json(F.struct(*[F.col(f"`{c}`") for c in table.columns])).alias("value")))
    lines = parts[0]
    for part in parts[1:]:
        lines = lines.unionByName(part)
    tokens = F.array_union(F.array_union(
        F.expr(f"regexp_extract_all(value, '{_QUOTED}', 1)"), F.expr(f"regexp_extract_all(value, '{_NESTED}', 1)")),
        F.split("value", _WORDS))
    values = lines.select(F.explode(tokens).alias("dsr_value")).where("dsr_value != ''").distinct()
    each_group = F.array(*[F.struct(F.lit(i).alias("dsr_group"), F.lit(g.identifier).alias("key_type"))
                           for i, g in enumerate(groups)])
    return values.select(F.explode(each_group).alias("g"), "dsr_value").select("g.dsr_group", "g.key_type",
                                                                                 "dsr_value")


def _started(key_file: Path, table: str, hashes: DataFrame, key: bytes | Keyring | HashKeys, **flags
             ) -> tuple[TableVerification, dict[str, bytes]]:
    """A table's verification before any scan, with the keys to hash under: requests whose hashes a
    destroyed key made already fail, as they cannot be proven."""
    result = TableVerification(table, **flags)
    resolved = keys_for(key_file, hashes, key)
    for request_id, lost_key in sorted(resolved.lost.items()):
        result.fail(request_id, f"{table}: hashed under key {lost_key}, which no keyring holds any more: "
                    "cannot be verified")
    return result, resolved.keys


def _readable_on_storage(spark: SparkSession, result: TableVerification, hashes: DataFrame, on_storage: list[str],
                         retained: list[str]) -> list[str]:
    """The files on storage the proof can read: those no version references are checked first (a
    write cut short by a full disk or a killed task leaves torn files, which would fail the read of
    all of them). A torn file cannot be proven free of anyone, so every request of the batch fails
    with why, until the purge removes it as the orphan it is; a file gone since the listing is
    skipped. Cost: 12 bytes read per unreferenced file."""
    referenced = {same_file(p) for p in retained}
    torn, gone = unreadable_parquet(spark, [p for p in on_storage if same_file(p) not in referenced])
    if torn:
        result.details["unreadable_files"] = len(torn)
        for request_id in sorted(r for r in indriver.distinct_values(hashes, "request_id") if r):
            result.fail(request_id, f"{result.table}: {len(torn)} file(s) on storage that no version references "
                        "cannot be read as Parquet (a write cut short, by a full disk say): the purge removes them "
                        "once older than purge.orphan_min_age_minutes, and the proof then reads storage whole")
    skipped = {same_file(p) for p in [*torn, *gone]}
    return [p for p in on_storage if same_file(p) not in skipped]


def _record(result: TableVerification, found: dict[str, int], what: str) -> int:
    for request_id, n in found.items():
        result.fail(request_id, f"{result.table}: {n} {what}")
    return sum(found.values())


def verify_tables(
    lake: Lake, datamap: DataMap, erase: EraseSettings, key_file: Path, hashes: DataFrame,
    key: bytes | Keyring | HashKeys, key_types: KeyTypes, tables: list[str] | None = None, physical: bool = True,
    prune: dict[str, TableKeys] | None = None, live: dict[str, dict[str, int]] | None = None,
    proven: dict[str, frozenset[str]] | None = None, *, parallel_tables: int,
) -> list[TableVerification]:
    """Verify tables holding subject keys, file datasets and shares (default: all; aggregates hold no
    keys and are proven in the run that recomputes them, stages/propagate.py) against (request_id,
    key_type, key_hash) rows (`prune`, `proven`: each table's plaintext keys and files proven free of
    them, see verify_table). The live checks of the tables run as one Spark job (`live_found`)
    unless `live` brings their findings (`erase`, `parallel_tables`: as live_found's)."""
    key = keys_for(key_file, hashes, key)  # once for all tables
    tables = tables or [*datamap.keyed_order(), *datamap.files,
                        *(s for s in datamap.shares if s in key_types)]  # created shares
    keyed = [t for t in tables if t not in datamap.files]
    if live is None and len(keyed) > 1:
        live = live_found(lake, datamap, erase, keyed, hashes, key, prune, proven, parallel_tables=parallel_tables)
    return [verify_dataset(lake, datamap, key_file, table, hashes, key) if table in datamap.files
            else verify_table(lake, key_file, table, datamap.mapping(table).groups, key_types[table], hashes,
                              key, physical, (prune or {}).get(table), (live or {}).get(table),
                              (proven or {}).get(table))
            for table in tables]


def verify_dataset(lake: Lake, datamap: DataMap, key_file: Path, name: str, hashes: DataFrame,
                   key: bytes | Keyring | HashKeys) -> TableVerification:
    """A `files:` dataset's live data, history and storage are the same files: one read of every
    file's key columns proves all three."""
    spark, mapping = lake.spark, datamap.files[name]
    result, keys = _started(key_file, name, hashes, key, physical=True, one_scan=True)
    found = find_hashed(spark, key_values(plainfiles.read_dataset(spark, mapping), mapping.groups), hashes, keys)
    result.live = result.history = result.storage = _record(result, found, f"rows in files under {mapping.path}")
    return result


def verify_completed(spark: SparkSession, settings: Settings, request_ids: list[str] | None = None
                     ) -> dict[str, list[str]]:
    """Re-run the proof for completed erase requests from their stored hashes alone.

    Returns {request_id: reasons}; an empty list means the request is still proven erased.
    Same cost as the run's verify stage, for all mapped tables.
    """
    ledger = Ledger(settings)
    completed = set(ledger.completed_ids("erase"))
    if request_ids:
        unknown = [r for r in request_ids if r not in completed]
        if unknown:
            raise LedgerError(f"not completed erase requests (or unknown): {', '.join(unknown)}")
    ids = sorted(request_ids or completed)
    results: dict[str, list[str]] = {rid: [] for rid in ids}
    if not ids:
        return results
    key_types = check_against_catalog(spark, settings.datamap, settings.table)
    hashes = stored_hashes(spark, ledger, ids, settings.erase.in_driver_max_requests)
    proven = verify_tables(Lake.of(spark, settings), settings.datamap, settings.erase, settings.key_file(), hashes,
                           ledger.keyring, key_types, parallel_tables=settings.run.parallel_tables)
    for table_result in proven:
        for rid, reasons in table_result.failing.items():
            results[rid].extend(reasons)
    ledger.audit([(rid, None, "reverified", {"passed": not reasons}) for rid, reasons in results.items()])
    return results
