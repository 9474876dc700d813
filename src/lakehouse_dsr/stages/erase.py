"""Logical erasure: one DELETE or UPDATE commit per mapped table for a whole batch.

Both statements honour the table's write mode: copy-on-write rewrites the files holding
matches; merge-on-read writes delete files / deletion vectors and leaves the purge to purge.py.
The statement is chosen by `choose_strategy`, a rule measured with bench/strategy.py. Where the
plan's own scan already found what to change, no statement runs: the files holding matches are
rewritten (`rewrite_files`), or a merge-on-read deletion's position delete files are written at
the positions the scan found (`delete_positions`). Where no metadata narrows the files and a sample
says the batch's rows are in nearly every file, the plan reads nothing and the rewrite of every
candidate file counts the requested rows itself (`folds`).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..config import EraseSettings
from ..datamap import DataMap, TableMapping, column_ref, is_array
from ..lake import hashsum, indriver, membership, skipping
from ..lake.batching import map_in_threads, map_unions
from ..lake.frames import to_arrow
from ..lake.lakehouse import Lake
from ..lake.skipping import POSITION, Candidates
from ..lake.table import DriverRewriting, FileRewriting, Snapshot, TableHandle
from . import collateral, matching
from .collateral import CollateralResult, Observed
from .matching import TableKeys

_FILE = "dsr_file"


@dataclass
class TablePlan:
    table: str
    key: str
    identifier: str
    action: str
    strategy: str
    write_mode: str
    rows_before: int
    rows_matched: int
    matches_by_request: dict[str, int]
    snapshot_before: int | None
    reason: str | None = None  # why this strategy (an aggregate recomputed whole: why not by groups)
    rows_scanned: int | None = None  # rows of the files the plan read (data skipping: fewer than rows_before)
    skipping: dict | None = None  # skipping.Candidates.as_dict(): files and bytes read of the table's
    candidate_files: list[str] = field(default_factory=list)  # the files the plan read
    # The files among them holding a match, each with the rows a request names there (counted once).
    requested_by_file: dict[str, int] = field(default_factory=dict)
    # `delete_positions`: per file holding a match, the ascending positions of the requested rows.
    positions: dict[str, list[int]] = field(default_factory=dict)
    # The plan read no rows (`folds`): the rewrite of every candidate file counts the matches, and
    # `rows_matched` and `matches_by_request` are its counts once it has run.
    folded: bool = False

    @classmethod
    def from_found(cls, table: str, mapping: TableMapping, found: Found, strategy: str, write_mode: str,
                   snapshot_before: int | None, rows_before: int | None = None,
                   candidates: Candidates | None = None, positions: dict[str, list[int]] | None = None
                   ) -> TablePlan:
        """The plan from what a scan `found`. `rows_before`: the table's rows when the scan read only
        some files (`candidates`); `positions`: the requested rows' positions, per file, for
        `delete_positions`."""
        # A scan of files without deletes counts the rows it matched only: their manifests count the rest.
        known = candidates.rows if candidates is not None else None
        matched = sum(found.requested_by_file.values())
        scanned = known if known is not None else matched + found.other_rows
        return cls(table=table, key=", ".join(mapping.key_columns),
                   identifier=", ".join(dict.fromkeys(g.identifier for g in mapping.groups)), action=mapping.action,
                   strategy=strategy, write_mode=write_mode,
                   rows_before=scanned if rows_before is None else rows_before,
                   rows_matched=matched, matches_by_request=found.matches_by_request,
                   snapshot_before=snapshot_before, rows_scanned=scanned,
                   skipping=candidates.as_dict() if candidates else None,
                   candidate_files=candidates.paths() if candidates else [],
                   requested_by_file=found.requested_by_file if candidates else {},
                   positions=positions or {})

    @property
    def matched_files(self) -> list[str]:
        """The files the plan found a match in."""
        return sorted(self.requested_by_file)

    @property
    def expected_rows_after(self) -> int:
        """What the table must hold after the erase commit: fewer rows only by the matches deleted."""
        return self.rows_before if self.action == "redact" else self.rows_before - self.rows_matched


@dataclass
class Found:
    """What a plan's scan found in one table: per file, the rows requests name (counted once however
    many requests name a row) and their positions; the rows nobody asked about (`other_rows`, where
    the scan counted them); per request, the rows naming its subject."""
    requested_by_file: dict[str, int] = field(default_factory=dict)
    other_rows: int = 0
    matches_by_request: dict[str, int] = field(default_factory=dict)
    # None: a file holding requested rows came without them (the table's matches exceeded
    # `erase.max_delete_positions`, or the plan was made in the driver)
    positions: dict[str, list[int]] | None = field(default_factory=dict)

    @classmethod
    def of_groups(cls, groups: Sequence[tuple[str | None, list[str] | None, int]]) -> Found:
        """From (file, request ids or None, rows) per file and combination of requests naming a row."""
        found = cls()
        for path, request_ids, count in groups:
            if not request_ids:
                found.other_rows += count
                continue
            found.positions = None  # none recorded
            found.requested_by_file[str(path)] = found.requested_by_file.get(str(path), 0) + count
            for request_id in request_ids:
                found.matches_by_request[request_id] = found.matches_by_request.get(request_id, 0) + count
        return found

    @classmethod
    def of_arrow(cls, rows: pa.Table) -> Found:
        """From `_found`'s rows of one table: per file (`dsr_file`; NULL for rows nobody asked about)
        its rows and positions, and per request (`request_id`) its rows. Cost: Arrow, and one dict
        entry per request."""
        by_request = rows.filter(pc.is_valid(rows.column("request_id")))
        ids: list[str] = by_request.column("request_id").to_pylist()  # type: ignore[assignment]  # no NULL
        counts: list[int] = by_request.column("count").to_pylist()  # type: ignore[assignment]
        found = cls(matches_by_request=dict(zip(ids, counts, strict=True)))
        for f in rows.filter(pc.is_null(rows.column("request_id"))).to_pylist():
            if f[_FILE] is None:
                found.other_rows += f["count"]
                continue
            found.requested_by_file[f[_FILE]] = f["count"]
            if f["positions"] is None:
                found.positions = None
            elif found.positions is not None:
                found.positions[f[_FILE]] = sorted(f["positions"])
        return found


@dataclass
class TableErasure:
    plan: TablePlan
    snapshot_id: int | None = None
    rows_after: int = 0
    data_files_rewritten: int = 0
    bytes_rewritten: int = 0
    delete_files_added: int = 0
    seconds: float = 0.0
    error: str | None = None
    attempts: int = 1  # statements run: more than one when concurrent commits conflicted
    rounds: int = 1  # erase rounds: more than one when late rows of requested subjects arrived
    collateral: CollateralResult | None = None
    observed: Observed | None = None  # the rewritten files' fingerprints, read by the rewrite
    groups: DataFrame | None = None  # an aggregate recomputed by groups: the groups replaced

    @property
    def rows_changed(self) -> int:
        return self.plan.rows_matched if self.plan.action == "redact" else self.plan.rows_before - self.rows_after

    def took(self, snapshot: Snapshot | None) -> None:
        """Record our commit (None: nothing committed) and what its stats say it rewrote."""
        if snapshot is None:
            return
        self.snapshot_id = snapshot.snapshot_id
        self.data_files_rewritten = snapshot.stats.files_removed
        self.bytes_rewritten = snapshot.stats.bytes_removed
        self.delete_files_added = snapshot.stats.delete_files_added

    def absorb(self, later: TableErasure) -> None:
        """Fold a later round (late rows erased) into this result: counts add up, the newest commit wins."""
        self.plan.rows_matched += later.plan.rows_matched
        for request_id, n in later.plan.matches_by_request.items():
            self.plan.matches_by_request[request_id] = self.plan.matches_by_request.get(request_id, 0) + n
        self.snapshot_id = later.snapshot_id or self.snapshot_id
        self.data_files_rewritten += later.data_files_rewritten
        self.bytes_rewritten += later.bytes_rewritten
        self.delete_files_added += later.delete_files_added
        self.attempts += later.attempts
        self.rounds += later.rounds
        self.error = later.error or self.error
        if later.collateral and not later.collateral.ok or self.collateral is None:
            self.collateral = later.collateral

    def as_dict(self) -> dict:
        frames = ("plan", "groups", "observed")
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in frames}
        d["collateral"] = self.collateral.as_dict() if self.collateral else None
        # The per-request and per-file maps stay out: asdict would deep-copy them first (a million
        # requests' matches: seconds) only for them to be dropped.
        per_item = ("matches_by_request", "candidate_files", "requested_by_file", "positions")
        plan = {f.name: copy.deepcopy(getattr(self.plan, f.name)) for f in fields(self.plan) if f.name not in per_item}
        return {**plan, **d, "rows_changed": self.rows_changed}


def choose_strategy(action: str, distinct_keys: int, broadcast_max_keys: int, modes: dict[str, str],
                    simple: bool = True, rewrite: bool = False, positions: bool = False,
                    subquery_dml: bool = True) -> str:
    """Rewrite the files holding matches where allowed, else write position deletes where the plan
    found the positions, else MERGE with a broadcast key set while it fits and the table's modes
    allow, else DELETE/UPDATE.

    `rewrite_files` (`rewrite`: a handle that rewrites files and keeps what its format tracks per row
    that way (FileRewriting.rewritable: Iceberg v1/v2; Delta without a change data feed or row
    tracking), and copy-on-write for this change or a purge in this run): only the files the plan
    found matches in are read and rewritten (without the requested rows, or with their groups
    nulled), in one commit replacing them (FileRewriting.overwrite_files). Spark's
    MERGE plans its own scan and reads the key columns of every file first, since data skipping
    cannot reach it without values in its text. On a merge-on-read table whose purge runs in the
    same run, delete files would be rewritten by the purge minutes later: rewriting the files at
    once does that work once. Format v3 keeps Spark's statements (row lineage).

    `delete_positions` (`positions`: a format-v2 merge-on-read deletion, the purge not in this run,
    and the plan's scan recorded the requested rows' positions, see `positional`): one position
    delete file per data file holding matches, written in the driver (lake/indriver.py) and
    committed as one row delta validated like Spark's serializable merge-on-read delete. Nothing is
    read: Spark's MERGE would read every candidate file's key columns again to find the same rows.

    Measured at 1M events / 100 subjects (medians of 3, bench/strategy.py): MERGE with a broadcast
    source took 1.69 s against 3.47 s for DELETE ... WHERE EXISTS on copy-on-write, 0.40 s against
    0.75 s on merge-on-read; both rewrote the same files. DELETE ... WHERE EXISTS plans an extra
    pass over the table to find the affected files. Broadcasting stops paying once the key set
    is too large for every executor's memory, hence the limit. A MERGE follows the table's
    `write.merge.mode`, so it is used only where that equals the mode the table set for this kind
    of change (`write.delete.mode` / `write.update.mode`): the owner's choice is respected.

    Several key columns or an array key (not `simple`): a MERGE on the requested rows' distinct key
    tuples (`merge_key_tuples`, read once from the key columns), whatever the table's modes: a
    redaction nulls each group only where its own key matched (and takes the erased elements out of
    an array key), which an UPDATE cannot say (Spark allows no subquery in SET); a delete ORing one
    EXISTS per key column was measured slower (bench/keys.py, 2M rows: 6.3 s against 3.9 s, where
    one key takes 3.0 s), and a MERGE on `k1 = v OR k2 = v` would be a nested-loop join.

    Without `subquery_dml` (open-source Delta refuses a subquery in DELETE and UPDATE), a MERGE
    against the key set erases: broadcast while it fits (`merge_broadcast`), else joined by a shuffle
    (`merge_keys`). A MERGE also keeps identifiers out of Delta's log, which records a DELETE's or
    UPDATE's predicate text but only a MERGE's join condition.
    """
    natural = "delete" if action == "delete" else "update"
    if rewrite and distinct_keys <= broadcast_max_keys:  # its join broadcasts the key set
        return "rewrite_files"
    if positions:
        return "delete_positions"
    if not simple:
        return "merge_key_tuples"
    if distinct_keys <= broadcast_max_keys and (modes["merge"] == modes[natural] or not subquery_dml):
        return "merge_broadcast"
    return f"{natural}_where_exists" if subquery_dml else "merge_keys"


def write_modes(table: TableHandle) -> dict[str, str]:
    return {op: table.write_mode(op) for op in ("delete", "update", "merge")}


def positional(table: TableHandle, mapping: TableMapping, erase: EraseSettings, purging: bool) -> bool:
    """Whether the plan's scan should record the requested rows' positions for `delete_positions`:
    a deletion on a format-v2 table whose owner chose merge-on-read deletes, its purge not in this
    run (else the files are rewritten at once). Format v3 takes deletion vectors: Spark writes those."""
    return (mapping.action == "delete" and erase.max_delete_positions > 0 and not purging
            and table.capabilities.driver_files and _in_driver_rewriting(table).format_version() == 2
            and table.write_mode("delete") == "merge-on-read" and indriver.available(table.spark))


def plan(lake: Lake, datamap: DataMap, erase: EraseSettings, table: str, keys: TableKeys, purging: bool = False
         ) -> TablePlan:
    """Count matches per request and the files holding them, and pick the strategy (`purging`: the
    purge follows in this run, see choose_strategy).

    Reads the key columns of the files that may hold the batch's keys only (lake/skipping.py:
    column bounds, partition transforms and bloom filters decide it from metadata), joined with
    each key column's broadcast key set; a table no file of which can hold a key costs no Spark
    job, and one whose every file a sample finds the batch spread over reads only that sample
    (`folds`: the rewrite counts the matches). The table's row count comes from its snapshot
    summary. The driver receives one row per file and combination of matching requests (request
    ids, the file's name and a count; never a value), and for a `positional` table the requested
    rows' positions (at most `erase.max_delete_positions`).
    """
    return plan_many(lake, datamap, erase, [table], {table: keys}, purging, parallel_tables=1)[table]


def plan_many(lake: Lake, datamap: DataMap, erase: EraseSettings, tables: list[str], keys: dict[str, TableKeys],
              purging: bool = False, *, parallel_tables: int, per_request: bool = True) -> dict[str, TablePlan]:
    """`plan` for several tables in a few Spark jobs over unions of their scans (lake/batching.py): on
    a wide lake of small tables, a job per table would cost more than the reading. `parallel_tables`
    (`run.parallel_tables`): tables scanned, and scans collected, at once. `per_request=False` (a
    forecast: runner/plan.py): the rows and files only, `matches_by_request` left empty, which spares
    the Spark plan's grouping of the requested rows by request (at a million requests, a third of
    its cost)."""
    in_driver: dict[str, Found] = {}
    folded: set[str] = set()
    spark = lake.spark
    with_positions = {t: positional(lake.table(t), datamap.table_mapping(t), erase, purging) for t in tables}

    def scan(table: str) -> tuple[skipping.Candidates, DataFrame | None]:
        candidates = keys[table].current_candidates(lake.table(table))
        if _in_driver(spark, erase, candidates, keys[table]):
            found = indriver.attempt(f"{table}: the plan",
                                     lambda: indriver.plan(spark, candidates, keys[table].key_columns()))
            if found is not None:
                in_driver[table] = Found.of_groups(found)
                return candidates, None
        if folds(lake.table(table), datamap.table_mapping(table), erase, keys[table], candidates, purging):
            folded.add(table)
            return candidates, None
        rows = skipping.read(candidates, position=with_positions[table])
        if rows is None:
            return candidates, None
        # One group per file and combination of requests naming a row. The other rows are counted from
        # the files' manifest entries when no file has deletes (grouping 10M rows nobody asked about
        # cost 1.5 s more than reading their key); else in one group of their own, without a file name.
        located = rows.withColumn(_FILE, F.input_file_name())  # at the scan
        marked = (matching.requested_rows(located, keys[table], requests=per_request) if candidates.rows is not None
                  else matching.mark(located, keys[table], requests=per_request))
        hit = matching.any_hit(keys[table])
        position = F.when(hit, F.col(POSITION)) if with_positions[table] else F.lit(None).cast("bigint")
        ids = matching.request_ids(keys[table]) if per_request else F.lit(None).cast("array<string>")
        return candidates, marked.select(F.lit(table).alias("dsr_table"), ids.alias("request_ids"),
                                         F.when(hit, F.col(_FILE)).alias(_FILE), position.alias(POSITION))

    scans = dict(zip(tables, map_in_threads(scan, tables, parallel_tables), strict=True))
    per_file = partial(_found, max_positions=erase.max_delete_positions if any(with_positions.values()) else None)
    parts = [part for _, part in scans.values() if part is not None]
    rows = pa.concat_tables(map_unions(parts, per_file, parallel_tables)) if parts else None
    found = {table: in_driver.get(table) or (Found() if rows is None else Found.of_arrow(
        rows.filter(pc.equal(rows.column("dsr_table"), pa.scalar(table))))) for table in tables}
    return {table: _plan(lake.table(table), datamap.table_mapping(table), erase, keys[table], purging,
                         scans[table][0], found[table], with_positions[table], table in folded)
            for table in tables}


def _found(union: DataFrame, max_positions: int | None) -> pa.Table:
    """What the scans of `union` found (`Found.of_arrow`'s rows, every table's), shipped as Arrow: one
    row per file and one per request (a million requests: a million Python `Row`s cost 15 s). Each
    row, or group of rows (`_positions`), counts once for its file and once for each of its requests,
    in one aggregation: two over the same rows would scan the tables twice (column pruning makes their
    exchanges differ). Without positions that aggregation is a plain hash aggregation straight over
    the rows (at 1M requests, first grouping by request combination and collecting lists cost 9 s of
    a 15 s plan; now 5)."""
    nothing = F.lit(None).cast("string")
    no_positions = F.lit(None).cast("array<bigint>")
    rows = union.select("dsr_table", "request_ids", _FILE, F.lit(1).alias("count"), no_positions.alias("positions")
                        ) if max_positions is None else _positions(union, max_positions)
    entries = F.concat(
        F.array(F.struct(F.col(_FILE).alias(_FILE), nothing.alias("request_id"), F.col("positions"))),
        F.transform(F.coalesce(F.col("request_ids"), F.array().cast("array<string>")),
                    lambda request_id: F.struct(nothing.alias(_FILE), request_id.alias("request_id"),
                                                no_positions.alias("positions"))))
    grouped = rows.select("dsr_table", "count", F.explode(entries).alias("e")).groupBy(
        "dsr_table", f"e.{_FILE}", "e.request_id")
    if max_positions is None:
        return to_arrow(grouped.agg(F.sum("count").alias("count")).withColumn("positions", no_positions))
    return to_arrow(grouped.agg(F.sum("count").alias("count"),
                                F.when(F.count(F.lit(1)) == F.count("e.positions"),
                                       F.flatten(F.collect_list("e.positions"))).alias("positions")))


def _positions(union: DataFrame, max_positions: int) -> DataFrame:
    """The plan's groups with the requested rows' positions: rows per table, file and combination of
    requests, in groups of at most 65,536 positions (an executor holds one group's list at a time),
    the positions kept only for tables with at most `max_positions` requested rows."""
    groups = union.groupBy("dsr_table", "request_ids", _FILE, F.shiftright(POSITION, 16).alias("dsr_bucket")).agg(
        F.count(F.lit(1)).alias("count"), F.collect_list(POSITION).alias("positions"))
    requested = F.sum(F.when(F.col("request_ids").isNotNull(), F.col("count"))).over(Window.partitionBy("dsr_table"))
    return groups.withColumn("positions", F.when((requested <= max_positions) & (F.size("positions") > 0),
                                                 F.col("positions")))


def _in_driver(spark: SparkSession, erase: EraseSettings, candidates: skipping.Candidates, keys: TableKeys) -> bool:
    """Whether `candidates` are small and plain enough to read and rewrite in the driver (lake/indriver.py)."""
    return indriver.refusal(spark, candidates, keys.key_columns(), erase.in_driver_max_bytes) is None


def _rewrites(handle: TableHandle, mapping: TableMapping, purging: bool, modes: dict[str, str]) -> bool:
    """Whether the table's files may be rewritten at once (choose_strategy's `rewrite`)."""
    return handle.capabilities.file_rewrite and _rewriting(handle).rewritable() and (
        purging or modes["delete" if mapping.action == "delete" else "update"] == "copy-on-write")


def _rewriting(handle: TableHandle) -> FileRewriting:
    """`handle` as one that rewrites named files (only where `capabilities.file_rewrite` holds)."""
    return cast(FileRewriting, handle)


def _in_driver_rewriting(handle: TableHandle) -> DriverRewriting:
    """`handle` as one that commits files the driver wrote (only where `capabilities.driver_files` holds)."""
    return cast(DriverRewriting, handle)


def _plan(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, keys: TableKeys, purging: bool,
          candidates: skipping.Candidates, found: Found, with_positions: bool, folded: bool = False) -> TablePlan:
    snapshot_id = candidates.snapshot_id
    positions = found.positions if with_positions else None
    modes = write_modes(handle)
    strategy = choose_strategy(mapping.action, keys.size, erase.broadcast_max_keys, modes, mapping.simple,
                               _rewrites(handle, mapping, purging, modes), positions is not None,
                               handle.capabilities.subquery_dml)
    # the write mode the strategy leaves the table's files in; a statement that would mask rows the
    # purge rewrites in this run rewrites them at once where the format lets it (statements_in_mode)
    mode = {"rewrite_files": "copy-on-write", "delete_positions": "merge-on-read"}.get(strategy) \
        or ("copy-on-write" if purging and handle.capabilities.statement_modes else modes[strategy.split("_")[0]])
    table_plan = TablePlan.from_found(handle.name, mapping, found, strategy, mode, snapshot_id,
                                       handle.live_rows(snapshot_id), candidates, positions)
    if folded:
        table_plan.folded, table_plan.rows_scanned = True, 0
    return table_plan


# A folded plan needs this many requested rows, of at least two requests, in a sampled file: with
# rows in random order a file then misses the batch with a chance of about e^-4 (2%), where the
# rewrite of a file that held no one costs about a tenth of the key scan it spares.
_FOLD_MIN_ROWS = 4
_FOLD_MIN_REQUESTS = 2
_FOLD_MIN_FILES = 4


def folds(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, keys: TableKeys,
          candidates: skipping.Candidates, purging: bool) -> bool:
    """Whether the plan should read nothing and leave finding the requested rows to the rewrite:
    when its scan could only learn that every candidate file holds someone, and the rewrite reads
    every row of them anyway. So: a `rewrite_files` deletion or redaction on one scalar key column
    (the rewrite counts its requested rows: membership.py's RowCounter, from the values held in the
    driver's JVM or, for a set too large for that, read there for the counter); at least
    `_FOLD_MIN_FILES` candidate files, none with deletes, too large for the driver, and no metadata
    that narrowed them (the table has no sort order, and its bounds, partitions and bloom filters
    left every file); and one sampled file (the median by size) holds at least `_FOLD_MIN_ROWS`
    requested rows of `_FOLD_MIN_REQUESTS` requests. A clustered or sorted table keeps its plan: there it
    reads few files and spares rewriting the others.

    Cost: metadata, and the sampled file's key column (read in the driver, or by one Spark job on a
    format whose files the driver does not read). Spared: the key column of every file (on the
    unclustered 10M-event table, 190 MB of a 670 MB erase stage, about 3 s)."""
    if (not keys.single or keys.groups[0].is_array or candidates.files < _FOLD_MIN_FILES
            or candidates.rows is None or candidates.bytes <= erase.in_driver_max_bytes
            or candidates.files < candidates.total_files or not handle.capabilities.file_rewrite
            or _rewriting(handle).sorted_by_order()):
        return False
    key_type = keys.sets[0].requesters.schema["key_value"].dataType
    if not membership.supported(handle.spark, key_type) or keys.size > erase.broadcast_max_keys \
            or not keys.sets[0].countable or not _rewrites(handle, mapping, purging, write_modes(handle)):
        return False
    sample = candidates.subset(handle.spark, {candidates.median_file()})
    requested = _sampled(handle, sample, keys)
    return requested is not None and (sum(count for _, count in requested) >= _FOLD_MIN_ROWS
                                      and len({i for ids, _ in requested for i in ids}) >= _FOLD_MIN_REQUESTS)


def _sampled(handle: TableHandle, sample: skipping.Candidates, keys: TableKeys) -> list[tuple[list[str], int]] | None:
    """(request ids, rows) per combination of requests naming rows of the `sample` file: its key column
    read in the driver where the format's files can be and the batch's values and their requests are
    held there, else by one Spark job over that column (request ids and counts reach the driver; for
    a batch beyond the driver's lookups, counted against the values' positions, no join with the
    batch: one combination, every request found, with the rows). None when the driver's read of the
    file fails."""
    if handle.capabilities.driver_files and indriver.refusal(handle.spark, sample, keys.key_columns(),
                                                             sample.bytes) is None:
        found = indriver.attempt(f"{handle.name}: the plan's sample",
                                 lambda: indriver.plan(handle.spark, sample, keys.key_columns()))
        return None if found is None else [(ids, count) for _, ids, count in found if ids]
    rows = skipping.read(sample)
    if rows is None:
        return []
    if keys.sets[0].held is not None:
        counter = keys.sets[0].row_counter()
        key = F.col(column_ref(keys.groups[0].column))
        rows.select(key).where(counter.counting(key)).write.format("noop").mode("overwrite").save()
        total, per_request = counter.counted()
        return [(sorted(per_request), total)] if total else []
    counted = matching.requested_rows(rows, keys).groupBy(matching.request_ids(keys).alias("ids")).count()
    return [(list(r.ids), int(r["count"])) for r in counted.collect()]


def _view(df: DataFrame) -> str:
    view = f"dsr_keys_{uuid.uuid4().hex[:12]}"
    df.createOrReplaceTempView(view)
    return view


def _run_statement(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, strategy: str,
                   table_plan: TablePlan, keys: TableKeys) -> None:
    """Run `strategy`'s SQL statement once, its key views dropped after it."""
    views: list[str] = []
    try:
        with handle.statements_in_mode(table_plan.write_mode):
            handle.spark.sql(_statement(handle, mapping, erase, strategy, table_plan, keys, views))
    finally:
        for view in views:
            handle.spark.catalog.dropTempView(view)


def _statement(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, strategy: str,
               table_plan: TablePlan, keys: TableKeys, views: list[str]) -> str:
    """`strategy`'s one SQL statement; identifiers stay in temporary views (`views` collects their names)."""
    if strategy == "merge_key_tuples":
        return _merge_key_tuples(handle, mapping, erase, table_plan, keys, views)
    target, key = handle.quoted, f"t.{column_ref(cast(str, mapping.key))}"  # one flat key column
    views.append(_view(keys.sets[0].hits))
    nulls = ", ".join(f"t.{column_ref(c)} = NULL" for c in sorted(mapping.redacted_columns))
    exists = f"EXISTS (SELECT 1 FROM {views[0]} s WHERE s.key_value = {key})"
    matched = "DELETE" if mapping.action == "delete" else f"UPDATE SET {nulls}"
    return {
        "merge_broadcast": f"MERGE INTO {target} AS t USING (SELECT /*+ BROADCAST({views[0]}) */ key_value FROM "
                           f"{views[0]}) AS s ON {key} = s.key_value WHEN MATCHED THEN {matched}",
        "merge_keys": f"MERGE INTO {target} AS t USING (SELECT key_value FROM {views[0]}) AS s "
                      f"ON {key} = s.key_value WHEN MATCHED THEN {matched}",
        "delete_where_exists": f"DELETE FROM {target} AS t WHERE {exists}",
        "update_where_exists": f"UPDATE {target} AS t SET {nulls} WHERE {exists}",
    }[strategy]


def _merge_key_tuples(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, table_plan: TablePlan,
                      keys: TableKeys, views: list[str]) -> str:
    """MERGE on the requested rows' distinct key tuples (read from the key columns of the plan's
    snapshot), each with which of its keys were requested: every target row matches at most one
    tuple (null-safe equality), so each group's columns are nulled exactly where its own key named
    an erased subject, an array key loses only the erased elements, or the row is deleted."""
    width = range(len(keys.groups))
    candidates = keys.candidates(handle, table_plan.snapshot_before)
    rows = cast(DataFrame, skipping.read(candidates)).select(  # not empty: the plan found matches
        *[F.col(column_ref(g.column)).alias(f"dsr_k{i}") for i, g in enumerate(keys.groups)])
    source = matching.requested_rows(rows, keys, [F.col(f"dsr_k{i}") for i in width]).select(
        *[f"dsr_k{i}" for i in width], *[matching.hit(i).alias(f"dsr_h{i}") for i in width],
        *[matching.erased_elements(i, F.col(f"dsr_k{i}")).alias(f"dsr_e{i}")
          for i, g in enumerate(keys.groups) if g.is_array]).distinct().localCheckpoint()
    views.append(_view(source))
    hint = f"/*+ BROADCAST({views[-1]}) */ " if keys.size <= erase.broadcast_max_keys else ""
    on = " AND ".join(f"t.{column_ref(g.column)} <=> s.dsr_k{i}" for i, g in enumerate(keys.groups))
    sets = []
    for column in sorted(mapping.redacted_columns):
        target_column = f"t.{column_ref(column)}"
        if is_array(column):  # the group's own array key: only the erased elements go
            i = next(i for i, g in enumerate(keys.groups) if g.column == column)
            value = f"filter({target_column}, dsr_x -> NOT array_contains(s.dsr_e{i}, dsr_x))"
            sets.append(f"{target_column} = CASE WHEN s.dsr_h{i} THEN {value} ELSE {target_column} END")
        else:
            hit = " OR ".join(f"s.dsr_h{i}" for i, g in enumerate(keys.groups) if column in g.redact)
            sets.append(f"{target_column} = CASE WHEN {hit} THEN NULL ELSE {target_column} END")
    action = "DELETE" if mapping.action == "delete" else f"UPDATE SET {', '.join(sets)}"
    return (f"MERGE INTO {handle.quoted} AS t USING (SELECT {hint}* FROM {views[-1]}) AS s "
            f"ON {on} WHEN MATCHED THEN {action}")


def _rewrite_files(handle: TableHandle, action: str, erase: EraseSettings, table_plan: TablePlan, keys: TableKeys,
                   observe: TableKeys | None) -> collateral.Observed | None:
    """The `rewrite_files` commit at the current snapshot: the plan's files holding matches, and any
    candidate file added since the plan (appends may hold requested rows), rewritten as the erasure
    leaves their rows; with `observe` (the collateral check's keys), the rows read are fingerprinted
    on the way. A folded plan's rewrite takes every candidate file, counts the requested rows as it
    reads them (the plan's counts), and commits nothing when it found none. Safe to repeat after a
    conflict: each attempt starts from the current snapshot."""
    table, spark = table_plan.table, handle.spark
    now = keys.current_candidates(handle)
    matched, planned = set(table_plan.matched_files), set(table_plan.candidate_files)
    chosen = now if table_plan.folded else now.subset(spark, {p for p in now.paths()
                                                              if p in matched or p not in planned})
    if chosen.empty:  # another writer removed them meanwhile: verification shows what is left
        return None
    read_snapshot_id = cast(int, now.snapshot_id)  # files to rewrite: the table has a snapshot
    if _in_driver(spark, erase, chosen, keys):  # the check reads the old files itself
        new_files = indriver.attempt(f"{table}: the rewrite",
                                     lambda: indriver.rewrite(spark, chosen, keys.key_columns(), action == "delete"))
        if new_files is not None:
            _in_driver_rewriting(handle).replace_files(chosen.jtable, chosen.data_files(spark), new_files,
                                                       read_snapshot_id, now.predicate)
            return None
    # A sorted table's files are rewritten one per task, each in its order (bounds stay narrow for
    # data skipping); other tables' files are packed into the read's splits, as compaction would:
    # at 10M unsorted events, 40 files in 4 tasks took 12.2 s against 15.7 s in 40.
    rows = cast(DataFrame, skipping.read(chosen,  # `chosen` is not empty
                                         file_per_task=_rewriting(handle).sorted_by_order()))
    counter = None
    if table_plan.folded:  # one scalar key whose requested rows can be counted (`folds`)
        counter = keys.sets[0].row_counter()
        rows = rows.where(counter.counting(F.col(column_ref(keys.groups[0].column))))
    sums = None
    if observe is not None and hashsum.available(spark):  # else the check reads the old files itself
        rows, sums = collateral.observe(rows, observe)

    def found_any() -> bool:
        if counter is None:
            return True
        table_plan.rows_matched, table_plan.matches_by_request = counter.counted()
        return table_plan.rows_matched > 0

    committed = _rewriting(handle).overwrite_files(chosen, collateral.erased_rows(rows, keys, action),
                                                   redacting=action == "redact", commit_if=found_any)
    return collateral.observed(sums, chosen.paths()) if sums and committed else None


def _delete_positions(handle: TableHandle, mapping: TableMapping, erase: EraseSettings, table_plan: TablePlan,
                      keys: TableKeys) -> None:
    """The `delete_positions` commit: the plan's positions as position delete files, committed as one
    row delta, while the table is still at the plan's snapshot. Once another writer has committed
    (an append may hold requested rows; a retry after a conflict), Spark's statement erases instead,
    finding the rows wherever they are."""
    now = keys.current_candidates(handle)
    if now.snapshot_id != table_plan.snapshot_before:  # one of Spark's statements, never a rewrite
        statement = choose_strategy(mapping.action, keys.size, erase.broadcast_max_keys, write_modes(handle),
                                    mapping.simple, subquery_dml=handle.capabilities.subquery_dml)
        _run_statement(handle, mapping, erase, statement, table_plan, keys)
        return
    spark = handle.spark
    written = indriver.position_deletes(spark, now, table_plan.positions)
    _in_driver_rewriting(handle).add_position_deletes(now.jtable, written, sorted(table_plan.positions),
                                            cast(int, now.snapshot_id), now.predicate)


def apply(lake: Lake, datamap: DataMap, erase: EraseSettings, table_plan: TablePlan, keys: TableKeys,
          observe: TableKeys | None = None) -> TableErasure:
    """Run the plan as one commit. Skips tables without matches (no empty commits). `observe`: the
    keys the collateral check marks rows by, for a rewrite to fingerprint what it reads.

    `rewrite_files`: reads and rewrites only the files holding matches (see choose_strategy), or
    every candidate file for a folded plan, which commits nothing where it found no match;
    `delete_positions`: reads nothing, writes a position delete file per file holding matches. Spark's
    statements plan their own scans, which data skipping cannot reach without values in SQL text:
    copy-on-write reads the key columns of every file to find those holding a match, then reads and
    rewrites those; merge-on-read reads the key columns of every file and writes delete files only.
    A redaction over several key columns first reads the key columns of the plan's candidate files
    once, for the requested key tuples.
    """
    handle = lake.table(table_plan.table)
    mapping = datamap.table_mapping(table_plan.table)
    result = TableErasure(table_plan)
    if table_plan.rows_matched == 0 and not table_plan.folded:
        result.rows_after = table_plan.rows_before
        return result
    if table_plan.strategy == "rewrite_files":
        result.observed, result.attempts = lake.with_conflict_retries(
            f"table {table_plan.table}: the erase commit", lambda: _rewrite_files(handle, mapping.action, erase,
                                                                                 table_plan, keys, observe))
        result.took(handle.own_commit_since(table_plan.snapshot_before))
        result.rows_after = handle.rows_after_commit(result.snapshot_id, table_plan.rows_before)
        return result
    if table_plan.strategy == "delete_positions":
        commit = partial(_delete_positions, handle, mapping, erase, table_plan, keys)
    else:
        commit = partial(_run_statement, handle, mapping, erase, table_plan.strategy, table_plan, keys)
    result.attempts = lake.with_conflict_retries(f"table {table_plan.table}: the erase commit", commit)[1]
    result.took(handle.own_commit_since(table_plan.snapshot_before))
    # Counted at the erase commit, so a concurrent append cannot pass for collateral damage.
    result.rows_after = handle.rows_after_commit(result.snapshot_id, table_plan.rows_before)
    return result
