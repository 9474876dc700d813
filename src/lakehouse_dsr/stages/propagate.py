"""Propagation: aggregates built from erased tables are rebuilt from what the erasure left.

A `derived:` table carrying the subject's key is erased like a mapped table (erase.py), after its
sources. An aggregate (`sql`) holds no key, yet its figures were computed with the erased rows, so:
- `group_by` (the accepted shapes: datamap/lineage.py): the erased rows (each erased source at its
  pre-erase snapshot, joined with the batch's keys; a redacting source adds the rows as redacted)
  go through the aggregate's own GROUP BY to name the groups they fed. Where only counts are
  involved (`lineage.subtraction`), each such group's figures lose the erased rows' own, in one
  MERGE (a group left with no rows is deleted) that reads no source again; otherwise the groups
  are recomputed from the post-erase sources and replaced in one MERGE commit that deletes the rows
  that changed or vanished (an emptied group disappears) and inserts the new ones;
- `refresh: full`, a shape that cannot be proven, a source that is itself an aggregate that just
  changed, or a table left behind by an interrupted run: recomputed whole and replaced by one
  overwrite commit.
Its old snapshots still hold the old figures: the run's purge expires them like any table's.
Verification recomputes the replaced groups (or the whole table) and compares them row for row.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from functools import reduce
from typing import cast

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import MapType

from ..datamap import DataMap, lineage
from ..exceptions import first_line
from ..lake import indriver
from ..lake.lakehouse import Lake
from ..lake.table import TableHandle, same_file
from . import matching
from .collateral import erased_value
from .erase import TableErasure, TablePlan
from .matching import TableKeys
from .verify import TableVerification


@dataclass(frozen=True)
class Upstream:
    """How a source changed in this run: erased by key from `snapshot_before` (rows traceable), or
    rewritten as a whole (`keys` None: an aggregate that was recomputed)."""

    snapshot_before: int | None
    keys: TableKeys | None = None
    action: str = "delete"


def erased_rows(table: TableHandle, change: Upstream) -> DataFrame:
    """The rows an erasure changed, as they were and (redaction) as they became. Cost: one scan of
    the pre-erase snapshot (the columns the aggregate uses), its rows tested by `matching.requested_rows`."""
    keys = cast(TableKeys, change.keys)  # a source erased by key (a recomputed one is never traced)
    rows = table.read_at(change.snapshot_before)
    marked = matching.requested_rows(rows, keys)
    before = marked.select(*[F.col(f"`{c}`") for c in rows.columns])
    if change.action == "delete":
        return before
    after = marked.select(*[erased_value(f, matching.redactions(keys)).alias(f.name)
                            for f in rows.schema.fields])
    return before.unionByName(after)


def _same(columns: list[str], left: DataFrame, right: DataFrame, names: dict[str, str] | None = None) -> Column:
    """Null-safe equality of `columns` between two DataFrames (`names`: the right side's names for them)."""
    names = names or {}
    return reduce(lambda a, b: a & b, [left[f"`{c}`"].eqNullSafe(right[f"`{names.get(c, c)}`"]) for c in columns])


def _rows_differing(held: DataFrame, fresh: DataFrame) -> int:
    """How many rows the two differ by, duplicates counted (the sizes of both multiset differences,
    what `exceptAll` both ways counts). Cost: one job, one shuffle of both sides' rows by value;
    `exceptAll` both ways is two jobs of a shuffle each."""
    sign, columns = "_dsr_sign", [F.col(f"`{c}`") for c in held.columns]
    both = held.withColumn(sign, F.lit(1)).unionByName(fresh.select(*columns).withColumn(sign, F.lit(-1)))
    balance = both.groupBy(*columns).agg(F.sum(sign).alias(sign))
    (total,) = balance.agg(F.sum(F.abs(F.col(sign)))).collect()[0]  # an aggregate: one row, null when empty
    return int(total or 0)


def _in_groups(df: DataFrame, groups: DataFrame | None, group_by: list[str]) -> DataFrame:
    return df if groups is None else df.join(F.broadcast(groups), _same(group_by, df, groups), "left_semi")


def refresh(lake: Lake, datamap: DataMap, table: str, changes: dict[str, Upstream | None],
            stale: bool = False) -> TableErasure:
    """Bring one aggregate in line with its erased sources in at most one commit.

    `changes`: the sources this run changed (None for a source rewritten whole); `stale`: an earlier
    run erased a source and did not finish this table, so only a full recomputation is sure.
    Cost, by groups: one scan of each erased source's pre-erase snapshot, the aggregate over the
    current sources restricted to the affected groups (Spark pushes the restriction below the
    GROUP BY), the table's rows in those groups; full: the aggregate over the current sources.
    """
    spark = lake.spark
    handle = lake.table(table)
    start = time.perf_counter()
    mapping = datamap.aggregates[table]
    snapshot = handle.current_snapshot()
    target = spark.table(lake.quoted(table))
    query = _query(lake, datamap, table)
    current = lineage.bound(spark, query, lambda t: spark.table(lake.quoted(t)))  # analyzed once, for the checks
    reason = "a source erased by an earlier, interrupted run" if stale else None
    if reason is None:
        reason = lineage.shape(current, mapping.group_by).reason if mapping.refresh == "groups" else "refresh: full"
    if reason is None and any(c is None for c in changes.values()):
        reason = "a source is an aggregate that was recomputed"
    erased = cast(dict[str, Upstream], changes)  # read by groups only when `reason` is None: then no None here
    if reason is None and any(isinstance(f.dataType, MapType) for f in target.schema.fields):
        reason = "a map column cannot be compared row by row"
    subtract = None
    if reason is None and len(changes) == 1:
        (source, change), = erased.items()
        if change.action == "delete":
            subtract = lineage.subtraction(current, mapping.group_by, _erased_by(datamap, source))
    strategy = "full_refresh" if reason else "subtract_groups" if subtract else "affected_groups"
    plan = TablePlan(table=table, key="", identifier="", action="recompute", strategy=strategy,
                     write_mode=handle.write_mode("merge"), rows_before=target.count(),
                     rows_matched=0, matches_by_request={}, snapshot_before=snapshot.snapshot_id if snapshot else None,
                     reason=reason)
    result = TableErasure(plan)
    try:
        if subtract:
            result.groups = _subtract(lake, datamap, table, query, target, mapping.group_by, subtract, erased)
            plan.rows_matched = result.groups.count()
        elif reason:
            lake.with_conflict_retries(f"table {table}: the recomputation", lambda: _recomputed(
                lake, datamap, query, target).writeTo(lake.quoted(table)).overwrite(F.lit(True)))
        else:
            result.groups = _affected_groups(lake, datamap, query, mapping.group_by, erased)
            plan.rows_matched = result.groups.count()
            if plan.rows_matched:
                _replace_groups(lake, datamap, table, query, target, mapping.group_by, result.groups)
    except Exception as exc:  # recorded; verification then shows what is left
        result.error = first_line(exc, with_type=True)
    result.took(handle.own_commit_since(plan.snapshot_before))
    result.rows_after = plan.rows_before if result.snapshot_id is None else \
        handle.rows_after_commit(result.snapshot_id, plan.rows_before)
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _erased_by(datamap: DataMap, source: str) -> str | None:
    """The column a delete erases every row of an erased value by: a source's one flat key column."""
    mapping = datamap.table_mapping(source)
    return mapping.key if mapping.simple and mapping.action == "delete" and "." not in cast(str, mapping.key) else None


def _subtract(lake: Lake, datamap: DataMap, table: str, query: lineage.Query, target: DataFrame,
              group_by: list[str], subtract: lineage.Subtraction, changes: dict[str, Upstream]) -> DataFrame:
    """Each group the erased rows fed loses their counts, in one MERGE; a group left with no rows is
    deleted. Returns the groups (kept). Cost: the erased rows' read (`erased_rows`), their GROUP BY,
    and a join with the table's rows in those groups; no other source row is read."""
    spark = lake.spark
    (source, change), = changes.items()
    erased = erased_rows(lake.table(source), change)
    lost = lineage.aggregated(spark, lineage.bound(spark, query, lambda t: erased))
    names = {c: f"dsr_{i}" for i, c in enumerate(lost.columns)}
    lost = lost.select(*[F.col(f"`{c}`").alias(name) for c, name in names.items()])
    held = target.join(lost, _same(group_by, target, lost, names), "inner")
    left = held.select(*[(F.col(f"`{c}`") - F.col(names[c])).cast(target.schema[c].dataType).alias(c)
                         if c in subtract.columns else F.col(f"`{c}`") for c in target.columns])
    changed = left.withColumn("dsr_op", F.when(F.col(f"`{subtract.rows}`") <= 0, "d").otherwise("u")
                              ).localCheckpoint(eager=True)
    groups = changed.select(*[f"`{c}`" for c in group_by]).distinct().localCheckpoint(eager=True)
    on = " AND ".join(f"t.`{c}` <=> s.`{c}`" for c in group_by)
    sets = ", ".join(f"t.`{c}` = s.`{c}`" for c in subtract.columns)
    _merge(lake.table(table), changed, f"ON {on} WHEN MATCHED AND s.dsr_op = 'd' THEN DELETE "
           f"WHEN MATCHED THEN UPDATE SET {sets}", "the groups' new counts")
    return groups


def _merge(table: TableHandle, source: DataFrame, clauses: str, what: str) -> None:
    """`MERGE INTO table AS t USING source AS s <clauses>`: one commit (none when `source`, which is
    kept, is empty). The source passes as a temporary view: its values never enter the SQL text."""
    if source.isEmpty():
        return
    spark = table.spark
    view = f"dsr_changes_{uuid.uuid4().hex[:12]}"
    source.createOrReplaceTempView(view)
    statement = f"MERGE INTO {table.quoted} AS t USING {view} AS s {clauses}"
    try:
        table.lake.with_conflict_retries(f"table {table.name}: {what}", lambda: spark.sql(statement))
    finally:
        spark.catalog.dropTempView(view)


def _query(lake: Lake, datamap: DataMap, table: str) -> lineage.Query:
    return lineage.parse(lake.spark, table, datamap.aggregates[table],
                         {*datamap.tables, *datamap.derived}, lake.catalog_name)


def _recomputed(lake: Lake, datamap: DataMap, query: lineage.Query, target: DataFrame,
                groups: DataFrame | None = None, group_by: list[str] | None = None) -> DataFrame:
    """The aggregate over the current sources in the table's column types, in `groups` only (None: all)."""
    spark = lake.spark
    fresh = lineage.bound(spark, query, lambda t: spark.table(lake.quoted(t)))
    fresh = fresh.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in target.schema.fields])
    return _in_groups(fresh, groups, group_by or [])


def _affected_groups(lake: Lake, datamap: DataMap, query: lineage.Query, group_by: list[str],
                     changes: dict[str, Upstream]) -> DataFrame:
    """The groups the erased rows fed (kept: small, and read by the commit and the verification)."""
    spark = lake.spark
    empty = lambda t: spark.table(lake.quoted(t)).limit(0)  # noqa: E731
    found = None
    for source, change in changes.items():
        erased = erased_rows(lake.table(source), change)
        def frames(t: str, s: str = source, e: DataFrame = erased) -> DataFrame:
            return e if t == s else empty(t)

        df = lineage.bound(spark, query, frames)
        groups = lineage.groups_of(spark, df, group_by)
        found = groups if found is None else found.unionByName(groups)
    if found is None:
        return indriver.local_rows(spark, [], "dsr_none string")
    return found.distinct().localCheckpoint(eager=True)


def _replace_groups(lake: Lake, datamap: DataMap, table: str, query: lineage.Query,
                    target: DataFrame, group_by: list[str], groups: DataFrame) -> None:
    """One MERGE: rows of the affected groups that the recomputation does not reproduce are deleted
    (matched on every column, null-safe), recomputed rows the table lacks are inserted."""
    columns = target.columns
    fresh = _recomputed(lake, datamap, query, target, groups, group_by)
    held = _in_groups(target, groups, group_by)
    gone = held.join(fresh, _same(columns, held, fresh), "left_anti").withColumn("dsr_op", F.lit("d"))
    new = fresh.join(held, _same(columns, fresh, held), "left_anti").withColumn("dsr_op", F.lit("i"))
    quoted = [f"`{c}`" for c in columns]
    on = " AND ".join(f"t.{c} <=> s.{c}" for c in quoted)
    _merge(lake.table(table), gone.unionByName(new).localCheckpoint(eager=True),
           f"ON {on} AND s.dsr_op = 'd' WHEN MATCHED THEN DELETE WHEN NOT MATCHED AND s.dsr_op = 'i' THEN INSERT "
           f"({', '.join(quoted)}) VALUES ({', '.join(f's.{c}' for c in quoted)})", "the recomputed groups")


def catch_up(lake: Lake, datamap: DataMap, table: str, erasure: TableErasure) -> None:
    """After a subtraction that verification found short of a recomputation (the table had fallen
    behind its sources: rows appended since it was last built), recompute those groups from the
    sources, in one more commit."""
    spark = lake.spark
    mapping = datamap.aggregates[table]
    target = spark.table(lake.quoted(table))
    groups = cast(DataFrame, erasure.groups)  # a subtraction keeps the groups it changed
    _replace_groups(lake, datamap, table, _query(lake, datamap, table), target, mapping.group_by, groups)
    erasure.plan.strategy = "affected_groups"
    erasure.plan.reason = "subtracted, then recomputed: the table was behind its sources"
    committed = lake.table(table).own_commit_since(erasure.snapshot_id)
    erasure.snapshot_id = committed.snapshot_id if committed else erasure.snapshot_id


def verify_aggregate(lake: Lake, datamap: DataMap, table: str, erasure: TableErasure | None,
                     request_ids: list[str], physical: bool = True) -> TableVerification:
    """An aggregate is proven when the groups this run replaced (all of them after a full refresh)
    equal a recomputation from the current sources row for row (`live`: rows that differ), and,
    with `physical`, no retained version but the current one is left (`history`: files only older
    versions keep, plus delete files or deletion vectors masking old rows) and storage holds no data
    file the current version does not reference (`storage`).
    Every request of the batch fails when it does not hold. Cost: the recomputation of those groups
    and a read of the table's rows in them; metadata and one listing of the table location."""
    spark = lake.spark
    handle = lake.table(table)
    result = TableVerification(table, physical=physical)
    if erasure is not None and (erasure.snapshot_id is not None or erasure.error):
        group_by = datamap.aggregates[table].group_by
        target = spark.table(lake.quoted(table))
        groups = None if erasure.plan.strategy == "full_refresh" else erasure.groups
        fresh = _recomputed(lake, datamap, _query(lake, datamap, table), target, groups, group_by)
        held = _in_groups(target, groups, group_by)
        result.live = _rows_differing(held, fresh)
        if result.live:
            for request_id in request_ids:
                result.fail(request_id, f"{table}: {result.live} rows differ from a recomputation from the "
                            "erased sources")
    if not physical:
        return result
    paths, current = handle.retained_files()
    live_files = {same_file(p) for p in current}
    result.history = len({same_file(p) for p in paths} - live_files) + handle.row_masks()
    result.storage = len({same_file(p) for p in handle.data_files_on_storage()} - live_files)
    result.one_scan = not result.history and not result.storage
    for request_id in request_ids if result.history or result.storage else []:
        result.fail(request_id, f"{table}: {result.history} files of older versions or row masks and "
                    f"{result.storage} unreferenced files still hold figures computed with erased rows")
    return result
