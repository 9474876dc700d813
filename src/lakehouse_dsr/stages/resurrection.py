"""Nothing erased comes back: rows of people erased earlier that reappeared in a mapped table.

A backfill, a replay of raw files or a restore can write an erased person's rows again. Each run
reads, per keyed table, only the rows added since the table's last check: the live data files whose
data sequence number is newer than the checked one (Iceberg gives a commit's new files the commit's
number). Their key columns are hashed (the ledger's keyed HMAC) and joined with the stored hashes of
every completed erase request; the values found stay in Spark and join the run's erase batch (one
commit per table, the same collateral check, purge and proof). When the table's current snapshot does
not descend from the checked one (a rollback, a table registered again from older metadata, a
replaced table, history expired by another tool in between) or its files carry no sequence numbers
(format v1), every live file is read.

The checkpoint is the journal step `checked` (snapshot id, sequence number through which every live
row was checked), recorded at the end of each run that moved it (`checkpoint_after`). A `files:`
dataset has no snapshots: its checkpoint is the list of files it held when last checked, and a run
reads the files not on it (those a run rewrote itself included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..datamap import DataMap
from ..inventory.check import KeyTypes
from ..lake import indriver, plainfiles, skipping
from ..lake.batching import map_in_threads, map_unions
from ..lake.lakehouse import Lake
from ..lake.table import Snapshot
from ..ledger.journal import Step
from . import verify
from .purge import TablePurge

CHECKED = "checked"  # the journal step
_FILE = "dsr_file"


@dataclass(frozen=True)
class Checkpoint:
    snapshot_id: int  # the snapshot checked last
    sequence: int  # every live file with a data sequence number up to this one was checked


def checkpoints(steps: list[Step]) -> dict[str, Checkpoint]:
    """Each table's latest checkpoint in the journal."""
    latest: dict[str, Checkpoint] = {}
    for s in steps:
        if s.step == CHECKED and s.snapshot_id is not None:
            latest[s.table] = Checkpoint(s.snapshot_id, int(s.detail["sequence"]))
    return latest


def dataset_checkpoints(steps: list[Step]) -> dict[str, frozenset[str]]:
    """Each `files:` dataset's latest checkpoint in the journal: the files it held when checked, by
    their paths under the dataset's folder."""
    return {s.table: frozenset(s.detail["files"]) for s in steps if s.step == CHECKED and "files" in s.detail}


def under(root: str, path: str) -> str:
    """`path` relative to the dataset folder `root`, whatever scheme either is written with
    (`file:/a/b` and `/a/b` are one file)."""
    return urlparse(path).path.removeprefix(urlparse(root).path.rstrip("/") + "/")


@dataclass
class Scope:
    """What one table's check reads: the files added since its checkpoint, at the current snapshot."""

    table: str
    snapshot: Snapshot | None  # current when checked (None: an empty table)
    whole: bool = False  # every live file is read (no usable checkpoint)
    candidates: skipping.Candidates | None = None  # the files to read (None: none)
    sequences: dict[str, int | None] = field(default_factory=dict)  # file -> its data sequence number
    listing: tuple[str, ...] = ()  # a `files:` dataset: every file it held when checked (paths under its folder)
    paths: tuple[str, ...] = ()  # a `files:` dataset: the files to read

    @property
    def files(self) -> int:
        return self.candidates.files if self.candidates else len(self.paths)

    @property
    def reads(self) -> bool:
        return self.candidates is not None or bool(self.paths)


def scope(lake: Lake, datamap: DataMap, table: str, checkpoint: Checkpoint | None, plan: bool = True) -> Scope:
    """The files of `table` to check (see the module doc); `plan=False` (nobody erased yet): none, only
    the current snapshot is noted. Metadata only: the current snapshot's manifests are read on the
    driver (not even those when the table has not moved since its checkpoint), no Spark job."""
    spark, handle = lake.spark, lake.table(table)
    current = handle.current_snapshot()
    if current is None or not plan or (checkpoint is not None and checkpoint.snapshot_id == current.snapshot_id):
        return Scope(table, current)
    groups = tuple(datamap.mapping(table).groups)
    everything = skipping.plan(handle, current.snapshot_id, groups, (None,) * len(groups))
    sequences = dict(zip(everything.paths(), everything.sequence_numbers(spark), strict=True))
    whole = checkpoint is None or handle.commits_since(checkpoint.snapshot_id, current.snapshot_id) is None
    if whole:
        return Scope(table, current, True, everything, sequences)
    assert checkpoint is not None
    new = {path for path, seq in sequences.items() if seq is None or seq > checkpoint.sequence}
    return Scope(table, current, False, everything.subset(spark, new) if new else None,
                 {p: sequences[p] for p in new})


def dataset_scope(spark: SparkSession, datamap: DataMap, name: str, checked: frozenset[str] | None,
                  plan: bool = True) -> Scope:
    """The files of `files:` dataset `name` to check: those not on its checkpoint (all without one);
    none with `plan=False`. Cost: one listing of the dataset's folder."""
    root = datamap.files[name].path
    listing = tuple(plainfiles.data_files(spark, root))
    new = listing if checked is None else tuple(f for f in listing if under(root, f) not in checked)
    return Scope(name, None, checked is None, listing=tuple(under(root, f) for f in listing), paths=new if plan else ())


@dataclass
class Found:
    """The people found again: their key values (in Spark only, as the batch's keys: request_id,
    key_type, key_value) and, per table, the rows found per request and per data file."""

    keys: DataFrame | None = None
    by_request: dict[str, dict[str, int]] = field(default_factory=dict)
    by_file: dict[str, dict[str, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_request)


def find(spark: SparkSession, datamap: DataMap, scopes: list[Scope], hashes: DataFrame, hash_keys: verify.HashKeys,
         parallel_tables: int = 1, key_types: KeyTypes | None = None, in_driver_max_bytes: int = 0) -> Found:
    """Key values of the scopes' files that hash to a completed erase request's stored hash.

    Cost: a table whose new files are small (at most `in_driver_max_bytes`, plain Parquet, flat key
    columns of type string, int or bigint: lake/indriver.py) is read in the driver, its key values
    hashed there (HMAC-SHA256, as the ledger's), with no Spark job; only where that finds someone
    does Spark read the files again, to keep the values for the erasure in Spark. The other tables:
    a Spark job over the key columns of their new files per UNION_WIDTH tables (lake/batching.py:
    one job over every table's scan costs quadratically; 100 tables of 10k rows took 13.5 s in one
    job), `parallel_tables` jobs at a time, each distinct value hashed once per key in use; then one
    small job over what they found. The driver receives counts per table, file and request, never a
    value."""
    lookup = verify.driver_lookup(hashes, hash_keys)

    def nobody_in_driver(s: Scope, candidates: skipping.Candidates) -> bool:
        """Whether the driver read the scope's files and found nobody (False: Spark reads them)."""
        groups = datamap.mapping(s.table).groups
        columns = [indriver.KeyColumn(g.column, None) for g in groups]  # an array or struct path: refused
        types = [t for g in groups if (t := (key_types or {}).get(s.table, {}).get(g.column)) is not None]
        if len(types) < len(groups) or indriver.refusal(spark, candidates, columns, in_driver_max_bytes, types):
            return False
        live = indriver.attempt(f"{s.table}: the check for erased people added again", lambda: indriver.live_found(
            spark, candidates, columns, [g.identifier for g in groups], lookup()))
        return live == {}

    def part(s: Scope) -> DataFrame | None:
        rows: DataFrame | None = None
        if s.paths:
            rows = plainfiles.reader(spark, datamap.files[s.table]).load(list(s.paths))
        elif s.candidates:
            if nobody_in_driver(s, s.candidates):
                return None
            rows = skipping.read(s.candidates)
        if rows is None:
            return None
        values = verify.key_values(rows.withColumn(_FILE, F.input_file_name()), datamap.mapping(s.table).groups,
                                   carry=[_FILE])
        return values.select(F.lit(s.table).alias("dsr_table"), _FILE, "key_type", "dsr_value")

    def matched(union: DataFrame) -> DataFrame:  # a table's rows stay in its own chunk
        grouped = union.groupBy("dsr_table", _FILE, "key_type", "dsr_value").count()
        return (verify.matched(grouped, hashes, hash_keys.keys)
                .select("dsr_table", _FILE, "request_id", "key_type", "dsr_value", "count")
                .dropDuplicates(["dsr_table", _FILE, "request_id", "key_type", "dsr_value"])
                .localCheckpoint())  # read twice: the counts, then the erasure's keys

    parts = [p for p in map_in_threads(part, scopes, parallel_tables) if p is not None]
    if not parts:
        return Found()
    found = reduce(DataFrame.unionByName, map_unions(parts, matched, parallel_tables))
    by_request: dict[str, dict[str, int]] = {}
    by_file: dict[str, dict[str, int]] = {}
    for r in found.groupBy("dsr_table", _FILE, "request_id").agg(F.sum("count").alias("n")).collect():
        requests = by_request.setdefault(r.dsr_table, {})
        requests[r.request_id] = requests.get(r.request_id, 0) + int(r.n)
        files = by_file.setdefault(r.dsr_table, {})
        files[r[_FILE]] = files.get(r[_FILE], 0) + int(r.n)
    if not by_request:
        return Found()
    keys = found.select("request_id", "key_type", F.col("dsr_value").alias("key_value")).distinct()
    return Found(keys, by_request, by_file)


def evidence(lake: Lake, scope: Scope, found: Found) -> dict:
    """A table's resurrection as the run report records it: the commits that brought the rows back
    (snapshot id and operation, from the files' sequence numbers), the rows found, and what the
    check read."""
    commits = {s.sequence_number: s for s in lake.table(scope.table).history()} if scope.snapshot else {}
    brought = sorted({q for f in found.by_file.get(scope.table, {}) if (q := scope.sequences.get(f)) is not None})
    return {"rows": sum(found.by_request.get(scope.table, {}).values()),
            "requests": len(found.by_request.get(scope.table, {})),
            "files": len(found.by_file.get(scope.table, {})),
            "commits": [{"snapshot_id": commits[q].snapshot_id, "operation": commits[q].operation}
                        if q in commits else {"sequence_number": q} for q in brought],
            "files_read": scope.files, "whole_table": scope.whole}


def checkpoint_after(lake: Lake, scope: Scope, purged: TablePurge | None) -> Checkpoint | None:
    """The table's checkpoint once the run is over (None: nothing to record). Everything live at the
    end is checked when, since the check's snapshot, only this run's erases and row-preserving
    rewrites were committed (for a purged table: decided by the purge before its expiry, then
    from the snapshot it kept). Otherwise only what was live at the check is: the next run reads
    every file newer than that, this run's rewrites included."""
    handle = lake.table(scope.table)
    start = scope.snapshot
    end = handle.current_snapshot()
    if start is None or end is None or start.sequence_number is None or end.sequence_number is None:
        return None
    if purged is not None and purged.kept_snapshot is not None:
        own = purged.own_line and handle.own_line_since(purged.kept_snapshot)
    else:
        own = handle.own_line_since(start.snapshot_id)
    return Checkpoint(end.snapshot_id, end.sequence_number if own else start.sequence_number)


def unchecked(checked: Mapping[str, Checkpoint], current: Mapping[str, int | None],
              listed: Mapping[str, frozenset[str]] | None = None, files: Mapping[str, frozenset[str]] | None = None
              ) -> list[str]:
    """Tables whose current snapshot (`current`: table -> snapshot id, None when empty) is not the one
    they were last checked at, and `files:` datasets holding a file their checkpoint (`listed`) does
    not (`files`: dataset -> its files now): a run is due for them even without requests."""
    moved = [t for t, snapshot_id in current.items()
             if snapshot_id is not None and (t not in checked or checked[t].snapshot_id != snapshot_id)]
    moved += [d for d, now in (files or {}).items() if now - (listed or {}).get(d, frozenset())]
    return sorted(moved)
