"""Data skipping: which files of a table can hold a batch's keys, decided on the driver from Iceberg
metadata, and a read of exactly those files.

A batch's key values become an Iceberg expression (`key IN (...)` per key column, ORed) built inside
the JVM from a small Dataset of the values (`collectAsList`): no value
crosses Py4J as command text (Py4J logs its commands at DEBUG), none enters SQL text or a Spark plan.
Iceberg plans the snapshot's files with it on the driver (no Spark job): manifests are skipped by
their partition summaries, files by partition values (identity and `bucket(key)` transforms project
the values) and by column bounds (sorted or clustered tables: `dsr optimize`). The surviving tasks
are staged with Iceberg's ScanTaskSetManager and read through `scan-task-set-id`, the mechanism
Iceberg's own compaction uses: the plan shows only the set's id. Each task carries the expression
as its residual, which Iceberg's Parquet reader uses to skip row groups by their statistics,
dictionaries and bloom filters (`write.parquet.bloom-filter-enabled.column.<key>`). Rows are not
filtered by the read: callers still join with the batch's keys.

Iceberg's own logs print the expression through `ExpressionUtil.toSanitizedString` (values
replaced by hashes), and at INFO only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DataType, IntegerType, LongType, StringType

from ..datamap import KeyGroup, column_path
from . import iceberg
from .bridge import bridge, call, compiled, jclass
from .catalyst import spark4
from .delta import DeltaTable
from .iceberg import IcebergTable, read_staged, release_staged
from .table import TableHandle

# Iceberg's metrics, manifest and row-group evaluators treat an IN of more than 200 values as
# "may match" (IN_PREDICATE_LIMIT): larger sets are split into ORed chunks of sorted values.
_IN_LIMIT = 200
# Beyond this many values per key column, a set is not turned into a predicate (every file is read):
# the expression travels with every task and is tested against every file's bounds.
MAX_VALUES = 100_000

_SPLIT = 128 * 1024 * 1024  # Iceberg's default read.split.target-size
POSITION = "dsr_pos"  # a row's position in its data file (read(position=True))
_PRUNABLE = (StringType, LongType, IntegerType)  # key types an Iceberg IN predicate is built for


@dataclass(frozen=True)
class KeyValues:
    """The batch's distinct values of one key column, held in the driver's JVM, never in Python: a
    sorted java.util.List, and a java.util.Map from each value to the sorted ids of the requests
    naming it (for reads in the driver, lake/indriver.py)."""

    java_list: Any  # py4j JVM objects
    size: int
    lookup: Any = None

    def disjoint(self, other: KeyValues, spark: SparkSession) -> bool:
        """Whether no value is in both (one key column's type): compared in the driver's JVM, no value
        crossing Py4J."""
        return bool(jclass(spark, "java.util.Collections").disjoint(
            jclass(spark, "java.util.HashSet")(self.java_list), other.java_list))


def key_values(grouped: DataFrame, key_type: DataType) -> KeyValues | None:
    """`grouped` (`key_value` of `key_type`, distinct, with `request_ids`) held in the JVM; None when
    the type cannot be pruned on or there are more than MAX_VALUES values. Cost: one small Spark job."""
    if type(key_type) not in _PRUNABLE:  # other types cannot become a pruning predicate
        return None
    ordered = (grouped.select("key_value", "request_ids").where("key_value IS NOT NULL").orderBy("key_value")
               .limit(MAX_VALUES + 1))
    lookup = compiled(grouped.sparkSession, "LocalRows").lookup(ordered._jdf.collectAsList())
    size = lookup.size()
    if size > MAX_VALUES:
        return None
    return KeyValues(compiled(grouped.sparkSession, "LocalRows").values(lookup), size, lookup)


def held_key_values(keys: DataFrame, key_type: DataType) -> tuple[DataFrame, int, KeyValues | None] | None:
    """`keys` (request_id, key_value of `key_type`) grouped by value inside the driver's JVM, when
    they are held there already (a local relation: lake/indriver.py's `kept`): the grouped rows
    (key_value, request_ids) as a local relation, their number, and their KeyValues (None beyond
    MAX_VALUES). None when reading `keys` would take a Spark job or the type cannot be pruned on:
    `key_values` then groups them in Spark. Cost: no Spark job."""
    if type(key_type) not in _PRUNABLE:
        return None
    local_rows = compiled(keys.sparkSession, "LocalRows")
    lookup = local_rows.groupedLocal(keys._jdf)
    if lookup is None:
        return None
    grouped = DataFrame(local_rows.requesters(keys._jdf, lookup), keys.sparkSession)
    size = lookup.size()
    return grouped, size, KeyValues(local_rows.values(lookup), size, lookup) if size <= MAX_VALUES else None


def expression(spark: SparkSession, groups: tuple[KeyGroup, ...], values: tuple[KeyValues | None, ...]):
    """OR over key columns of `column IN values` (in chunks): a row may name a requested subject
    through any of them. Always-true when a column cannot be pruned on (array keys, other types, too
    many values); always-false when no column has a value."""
    expressions = jclass(spark, "org.apache.iceberg.expressions.Expressions")
    result = expressions.alwaysFalse()
    for group, kv in zip(groups, values, strict=True):
        if group.is_array or kv is None:
            return expressions.alwaysTrue()
        for start in range(0, kv.size, _IN_LIMIT):
            chunk = kv.java_list.subList(start, min(start + _IN_LIMIT, kv.size))
            # `or` and `in` are Python keywords: reached by name
            result = getattr(expressions, "or")(result, getattr(expressions, "in")(column_path(group.column), chunk))
    return result


def release() -> None:
    """Drop every task set staged so far (iceberg.release_staged): a run calls it when it ends."""
    release_staged()


@dataclass
class Candidates:
    """The files of one snapshot that may hold a batch's keys, planned on the driver (see the module doc)."""

    source: TableHandle  # the table the files belong to
    snapshot_id: int | None
    files: int = 0  # candidate data files
    bytes: int = 0
    total_files: int = 0  # data files in the snapshot
    total_bytes: int = 0
    pruned: bool = False  # False: every file is a candidate (nothing to prune on)
    predicate: object = field(default=None, repr=False)  # the Iceberg expression planned with
    _tasks: object = field(default=None, repr=False)  # java.util.List<FileScanTask>
    _paths: list[str] = field(default_factory=list, repr=False)  # each task's data file, in order
    _sizes: list[int] = field(default_factory=list, repr=False)
    jtable: object = field(default=None, repr=False)  # the Java Table the files were planned from
    # Each file's rows as a reader sees them, from its manifest entry; None for a file with delete files.
    _rows: list[int | None] = field(default_factory=list, repr=False)

    @property
    def table(self) -> str:
        """The table's name (`namespace.table`)."""
        return self.source.name

    @property
    def rows(self) -> int | None:
        """The candidate files' rows from metadata alone; None when a file has deletes (a read counts them)."""
        return None if None in self._rows or len(self._rows) != self.files else sum(cast(list[int], self._rows))

    def rows_of(self, paths: set[str] | frozenset[str]) -> int | None:
        """The rows of the candidate files at `paths` from metadata alone; None when one of them has
        deletes or is not a candidate (a read counts them)."""
        rows = dict(zip(self._paths, self._rows, strict=True)) if self._rows else {}
        found = [rows.get(path) for path in paths]
        return None if None in found else sum(cast(list[int], found))

    @property
    def empty(self) -> bool:
        return self.files == 0

    def paths(self) -> list[str]:
        """The candidate data files' locations."""
        return list(self._paths)

    def median_file(self) -> str:
        """The location of the candidate file in the middle by size (not empty)."""
        return sorted(zip(self._sizes, self._paths, strict=True))[len(self._paths) // 2][1]

    def subset(self, spark: SparkSession, paths: set[str]) -> Candidates:
        """These candidates restricted to the files at `paths`."""
        kept = [i for i, path in enumerate(self._paths) if path in paths]
        chosen = bridge(spark).pick(self._tasks, json.dumps(kept)) if self._tasks is not None else None
        return Candidates(self.source, self.snapshot_id, len(kept), sum(self._sizes[i] for i in kept),
                          self.total_files, self.total_bytes, self.pruned, self.predicate, chosen,
                          [self._paths[i] for i in kept], [self._sizes[i] for i in kept], self.jtable,
                          [self._rows[i] for i in kept] if self._rows else [])

    def sequence_numbers(self, spark: SparkSession) -> list[int | None]:
        """Each candidate file's data sequence number (Iceberg gives a commit's new files the commit's
        number; a compaction may keep its inputs'), in `paths()` order; None in format v1. A Delta
        table's files: the version whose commit added them (DeltaTable.added_versions). Metadata only."""
        if not isinstance(self.source, IcebergTable):
            return cast(DeltaTable, self.source).added_versions(self._paths)
        return call(spark, "taskSequences", self._tasks) if self._tasks is not None else []

    def data_files(self, spark: SparkSession):
        """The candidates' Java DataFile objects, as a Java list (for a commit that replaces them)."""
        if self._tasks is None:
            return jclass(spark, "java.util.ArrayList")()
        return bridge(spark).dataFiles(self._tasks)

    def as_dict(self) -> dict:
        return {"files": self.files, "bytes": self.bytes, "total_files": self.total_files,
                "total_bytes": self.total_bytes, "pruned": self.pruned}


def plan(table: TableHandle, snapshot_id: int | None, groups: tuple[KeyGroup, ...],
         values: tuple[KeyValues | None, ...], spans: tuple[DataFrame, ...] | None = None) -> Candidates:
    """The candidate files of `table` at `snapshot_id` (None: an empty table) for the key values
    (one KeyValues per key group, None where the group cannot be pruned on). Metadata only, on the
    driver: manifests and their file entries are read, no data file and no Spark job. A Delta
    table's candidates come from its log's file statistics against each group's values where the
    driver's JVM holds them, else their range (`spans`: one row, `min` and `max`; DeltaTable.files_for_keys),
    every file where a group cannot be pruned on."""
    if not isinstance(table, IcebergTable):
        prunable = spans is not None and not any(g.is_array for g in groups) and \
            all(type(s.schema["min"].dataType) in _PRUNABLE for s in spans)
        keys = [(g.column, s, kv) for g, s, kv in zip(groups, spans or (), values, strict=False)] if prunable else None
        return _delta_files(cast(DeltaTable, table), snapshot_id, keys)
    spark = table.spark
    if snapshot_id is None:
        return Candidates(table, None, predicate=expression(spark, groups, values))
    jtable = table.java()
    predicate = expression(spark, groups, values)  # by the current names: what a conflicting commit is checked by
    renamed = _as_named_at(spark, jtable, snapshot_id, groups, values)
    summary = iceberg.snapshot_at(spark, jtable, snapshot_id).summary
    scan = jtable.newScan().useSnapshot(snapshot_id).caseSensitive(False)  # as Spark resolves data-map names
    pruned = not predicate.equals(jclass(spark, "org.apache.iceberg.expressions.Expressions").alwaysTrue())
    if pruned:
        scan = scan.filter(predicate if renamed is None else expression(spark, *renamed))
    if renamed is not None:  # the tasks' residuals would name columns the current table, which reads them, lacks
        scan = scan.ignoreResiduals()
    # Whole-file tasks: the staged scan splits them by the table's read.split.target-size itself.
    tasks = iceberg.planned(spark, scan)
    files = call(spark, "taskFiles", tasks)
    paths, sizes = [path for path, *_ in files], [size for _, size, *_ in files]
    rows = [None if deletes else records for _, _, records, deletes in files]
    return Candidates(table, snapshot_id, len(paths), sum(sizes), int(summary.get("total-data-files", 0)),
                      int(summary.get("total-files-size", 0)), pruned, predicate, tasks, paths, sizes, jtable, rows)


def _as_named_at(spark: SparkSession, jtable: Any, snapshot_id: int, groups: tuple[KeyGroup, ...],
                 values: tuple[KeyValues | None, ...]
                 ) -> tuple[tuple[KeyGroup, ...], tuple[KeyValues | None, ...]] | None:
    """The key groups with their columns named as Iceberg binds a scan of snapshot `snapshot_id`, without
    a column that snapshot does not have (none of its rows holds a key there), and their values; None
    where the scan binds the data map's names (the current ones; a column renamed since keeps its
    field id). Iceberg 1.10 binds every scan's filter against the current schema; 1.11 (Spark 4.1's
    runtime) binds a scan of any snapshot but the current one against that snapshot's schema."""
    current = jtable.schema()
    now = jtable.currentSnapshot()
    then = jtable.schemas().get(jtable.snapshot(snapshot_id).schemaId())
    time_travel = now is None or now.snapshotId() != snapshot_id
    if not spark4(spark) or not time_travel or then is None or then.schemaId() == current.schemaId():
        return None
    named, kept = [], []
    for group, kv in zip(groups, values, strict=True):
        found = None if group.is_array else current.caseInsensitiveFindField(column_path(group.column))
        old_name = then.findColumnName(found.fieldId()) if found is not None else group.column
        if old_name is not None:
            named.append(replace(group, column=old_name))
            kept.append(kv)
    return None if tuple(named) == groups else (tuple(named), tuple(kept))


def _delta_files(table: DeltaTable, snapshot_id: int | None,
                 keys: list[tuple[str, DataFrame, KeyValues | None]] | None) -> Candidates:
    """A Delta table's files at a version (None: an empty table) that may hold `keys` (None: all),
    and its totals, from one listing (DeltaTable.files_for_keys)."""
    if snapshot_id is None:
        return Candidates(table, None)
    every = table.files_for_keys(snapshot_id, keys)
    files = [f for f in every if f[3]]
    paths, sizes, rows = [f[0] for f in files], [f[1] for f in files], [f[2] for f in files]
    return Candidates(table, snapshot_id, len(paths), sum(sizes), len(every), sum(f[1] for f in every),
                      keys is not None, _paths=paths, _sizes=sizes, _rows=rows)


def read(candidates: Candidates, only: set[str] | frozenset[str] | None = None, file_per_task: bool = False,
         position: bool = False) -> DataFrame | None:
    """The candidate files' rows as of the candidates' snapshot (delete files applied), or of the
    files among them whose locations are in `only`; None when there is no such file (no Spark job
    is needed to know the answer). The read skips row groups the keys cannot be in; Spark's
    input_file_name() names each row's file. `file_per_task`: no task reads parts of two files
    (each task's rows are one file's, in the file's order), as a rewrite that keeps order needs.
    `position`: each row's position in its file too (Iceberg's `_pos`), as column POSITION.
    Files that fill more than one split are packed into tasks of even size (`balanced_groups`)."""
    spark = candidates.source.spark
    if only is not None:
        candidates = candidates.subset(spark, set(only))
    if candidates.empty:
        return None
    if not isinstance(candidates.source, IcebergTable):  # a Delta table: its files as of the version
        every = candidates.files == candidates.total_files
        return cast(DeltaTable, candidates.source).read_files(candidates.snapshot_id,
                                                              None if every else set(candidates.paths()))
    jtable = candidates.source.java()
    positions = POSITION if position else None
    split = int(jtable.properties().get("read.split.target-size") or _SPLIT)  # what Iceberg would pack by
    groups = None if file_per_task else balanced_groups(candidates._sizes, spark.sparkContext.defaultParallelism, split)
    if groups is None:
        options = {"split-size": str(_SPLIT), "file-open-cost": str(_SPLIT)} if file_per_task else {}
        return _staged_read(candidates, jtable, candidates._tasks, options, positions)
    # Each group's largest file first, then Iceberg packs the staged files into exactly these groups
    # where the heaviest group's weight as split makes it: one scan, its table broadcast once.
    groups = [sorted(g, key=lambda i: -candidates._sizes[i]) for g in groups]
    packing = bridge(spark).splitForGroups(candidates._tasks, json.dumps(groups))
    if packing:
        tasks = bridge(spark).pick(candidates._tasks, json.dumps([i for g in groups for i in g]))
        options = {"split-size": str(packing), "lookback": "1", "file-open-cost": "0"}
        return _staged_read(candidates, jtable, tasks, options, positions)
    # Else one task per group: a staged set each, its files in one split (a union carries no `_pos`:
    # each part selects its columns first).
    whole = {"split-size": str(2**62), "file-open-cost": "0"}
    parts = [_staged_read(candidates, jtable, bridge(spark).pick(candidates._tasks, json.dumps(g)), whole, positions)
             for g in groups]
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.union(part)
    return rows


def _staged_read(candidates: Candidates, jtable: Any, tasks: Any, options: dict[str, str],
                 position: str | None) -> DataFrame:
    """The scan tasks `tasks` of the candidates' table (`jtable`, its Java table), read as a staged task set."""
    return read_staged(candidates.source.spark, jtable, cast(IcebergTable, candidates.source).identifier, tasks,
                       options, position)


def balanced_groups(sizes: list[int], parallelism: int, split: int = _SPLIT) -> list[list[int]] | None:
    """The files (their indexes in `sizes`) in groups of about even size, as many as the splits they
    fill, rounded up to a multiple of `parallelism` where the groups stay at least half a split (a
    rewrite writes a file per group); None where Iceberg's own packing into splits does as well:
    files that fill one split, a file larger than a split (Iceberg splits it by row groups), or no
    more files than groups.

    Iceberg fills each split before it opens the next: at 10M unclustered events, 40 files of 12 MB
    went into tasks of 11, 11, 11 and 7 files, and on two cores one core idled for the last 1.5 s of
    a 15 s rewrite. Groups are filled largest file first into the lightest group."""
    total = sum(sizes)
    if total <= split or max(sizes) > split:
        return None
    count = -(-total // split)
    rounds = -(-count // parallelism) * parallelism  # whole rounds of tasks on the cores
    count = rounds if rounds <= 2 * count else count
    if count >= len(sizes):
        return None
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += sizes[i]
    return [sorted(g) for g in groups]
