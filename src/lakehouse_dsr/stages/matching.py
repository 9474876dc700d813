"""Which rows of a table name which requests: the batch's identifiers per key column, and the joins
that mark rows by them. Shared by the erase plan, its statement, the collateral check and the export."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType

from ..datamap import DataMap, KeyGroup, column_path, column_ref, is_array
from ..inventory.check import KeyTypes
from ..lake import frames, indriver, membership, skipping
from ..lake.catalyst import try_cast
from ..lake.table import TableHandle


def keys_for_identifier(keys: DataFrame, identifier: str, key_type: DataType) -> DataFrame:
    """(request_id, key_value) of one identifier, cast to a key column's type.

    Values that cannot be that type (a text id against a numeric key) become NULL and are dropped:
    they cannot match any row.
    """
    return (
        keys.where(F.col("key_type") == identifier)
        .select("request_id", try_cast(keys.sparkSession, F.col("key_value"), key_type).alias("key_value"))
        .where(F.col("key_value").isNotNull())
    )


@dataclass(frozen=True)
class KeySet:
    """A batch's values of one identifier, cast to one key type, grouped by value with the requests
    naming each (`key_value`, `request_ids`). Kept (in the driver's JVM, or a local checkpoint; one
    small row per value) and built once per run for every key column holding that identifier at
    that type, so no table's plan, statement or check shuffles the batch again."""

    requesters: DataFrame
    size: int  # distinct values: decides whether the statement may broadcast them
    values: skipping.KeyValues | None = None  # the same values in the driver's JVM, for data skipping
    # The values' minimum and maximum as one row (`min`, `max`) held in the driver's JVM, where the
    # driver's Python knew them (`arrow_key_set`): pruning by their range reads it instead of every
    # value (2.5 s at a million), and no Spark job.
    bounds: DataFrame | None = None
    # The rows of `requesters` as the driver's Python holds them (Arrow, in `requesters`' order), where
    # it built them (`arrow_key_set`) and the values are not held in the driver's JVM with their
    # requests: rows are tested and counted against the values' `positions`.
    held: pa.Table | None = field(default=None, compare=False, repr=False)

    @cached_property
    def positions(self) -> Any:
        """The values' positions in `held`, held in the driver's JVM and broadcast once for every
        membership test and row counter of the run (membership.py's `positions`; only with `held`)."""
        return membership.positions(self.requesters.sparkSession, self.requesters.select("key_value"),
                                    self.requesters.schema["key_value"].dataType)

    def row_counter(self) -> membership.RowCounter:
        """A new RowCounter of these values (`countable` key sets only)."""
        key_type = self.requesters.schema["key_value"].dataType
        if self.held is not None:
            return membership.row_counter_on(self.requesters.sparkSession, self.positions, self.held, key_type)
        return membership.row_counter(self.requesters.sparkSession, cast(skipping.KeyValues, self.values).lookup,
                                      key_type)

    @property
    def countable(self) -> bool:
        """Whether a rewrite can count the requested rows per request (membership.py's RowCounter)."""
        return (self.values is not None and self.values.lookup is not None) or self.held is not None

    @cached_property
    def span(self) -> DataFrame:
        """The values' minimum and maximum as one row (`min`, `max`), what data skipping by their range
        reads: `bounds`, else an aggregation of the values (a small job when read). One DataFrame
        per key set, so the listings memoised by it (DeltaTable.files_for_keys) serve every reader."""
        return self.bounds if self.bounds is not None else self.hits.agg(F.min("key_value").alias("min"),
                                                                         F.max("key_value").alias("max"))

    @cached_property
    def hits(self) -> DataFrame:
        """The distinct requested values (column `key_value`): one DataFrame per key set, so the
        listings memoised by it (DeltaTable.files_for_keys) serve the plan and the check alike."""
        return self.requesters.select("key_value")


def key_set(keys: DataFrame, identifier: str, key_type: DataType, rows: pa.Table | None = None) -> KeySet:
    """The KeySet of `identifier` at `key_type`. Cost: none when `keys` are held in the driver's JVM
    (identity.resolve keeps them there) and the type can be pruned on: they are grouped there; none
    either when the driver's Python holds them already as Arrow (`rows`: request_id, key_value; a
    batch's subjects at a text key type, `arrow_key_set`); else a job over the batch's keys that
    groups and counts them (kept on the executors: a local checkpoint), and one more that fetches
    them into the driver's JVM when there are at most skipping.MAX_VALUES."""
    selected = keys_for_identifier(keys, identifier, key_type)
    held = skipping.held_key_values(selected, key_type)
    if held is not None:
        return KeySet(*held)
    if rows is not None and isinstance(key_type, StringType):
        return arrow_key_set(keys.sparkSession, rows)
    grouped = selected.groupBy("key_value").agg(
        F.collect_set("request_id").alias("request_ids")).localCheckpoint(eager=False)
    size = grouped.count()  # fills the checkpoint; beyond MAX_VALUES the values are not fetched at all
    return KeySet(grouped, size, skipping.key_values(grouped, key_type) if size <= skipping.MAX_VALUES else None)


def arrow_key_set(spark: SparkSession, rows: pa.Table) -> KeySet:
    """The KeySet of text keys the driver's Python holds as Arrow (`request_id`, `key_value`): grouped
    by value in Arrow and handed to Spark as Arrow batches (lake/frames.py), which no Spark job
    groups or keeps (at a million requests, Spark's grouping and local checkpoint took 3 to 6 s).
    Cost: a hash of the values in Arrow, and a hash aggregation where some value has several
    requests; the values reach the driver's JVM only at most skipping.MAX_VALUES of them, as key_set
    fetches them."""
    present = rows.filter(pc.is_valid(rows.column("key_value")))
    if len(pc.unique(present.column("key_value"))) == present.num_rows:  # one request per value (0.1 s a million)
        ids = present.column("request_id").combine_chunks()
        grouped = pa.table({"key_value": present.column("key_value"), "request_ids": pa.ListArray.from_arrays(
            pa.array(range(len(ids) + 1), pa.int32()), ids)})
    else:  # a hash aggregation (1.5 s a million)
        grouped = present.group_by("key_value", use_threads=False).aggregate([("request_id", "distinct")])
        grouped = grouped.select(["key_value", "request_id_distinct"]).rename_columns(["key_value", "request_ids"])
    requesters = frames.arrow_frame(spark, grouped)
    size = grouped.num_rows
    if size <= skipping.MAX_VALUES:
        return KeySet(requesters, size, skipping.key_values(requesters, StringType()))
    span = pc.min_max(grouped.column("key_value"))  # UTF-8 byte order: Spark's and the statistics'
    bounds = pa.table({end: pa.array([span[end].as_py()], pa.string()) for end in ("min", "max")})
    return KeySet(requesters, size, None, frames.rows_frame(spark, bounds, 1), grouped)


def disjoint(a: KeySet, b: KeySet) -> bool:
    """Whether no value is in both key sets (of one key column's type). Compared in the driver's JVM
    when both are held there (no value crosses Py4J), else in one small Spark job."""
    if a.values is not None and b.values is not None:
        return a.values.disjoint(b.values, a.requesters.sparkSession)
    return a.hits.intersect(b.hits).isEmpty()


@dataclass(frozen=True)
class TableKeys:
    """A table's key groups, each with the batch's KeySet for its identifier and type."""

    groups: tuple[KeyGroup, ...]
    sets: tuple[KeySet, ...]

    @property
    def size(self) -> int:
        return max(s.size for s in self.sets)

    @property
    def single(self) -> bool:
        return len(self.groups) == 1

    @property
    def values(self) -> tuple[skipping.KeyValues | None, ...]:
        """Each group's values for data skipping (None: that group cannot be pruned on)."""
        return tuple(s.values for s in self.sets)

    def candidates(self, table: TableHandle, snapshot_id: int | None) -> skipping.Candidates:
        """The files of `table` at `snapshot_id` that may hold these keys (metadata only)."""
        return skipping.plan(table, snapshot_id, self.groups, self.values, tuple(s.span for s in self.sets))

    def current_candidates(self, table: TableHandle) -> skipping.Candidates:
        """`candidates` at the table's current snapshot (none for an empty table)."""
        return self.candidates(table, table.current_snapshot_id())

    def key_columns(self) -> list[indriver.KeyColumn]:
        """The groups as the driver's reader takes them (lake/indriver.py)."""
        return [indriver.KeyColumn(g.column, s.values, g.redact) for g, s in zip(self.groups, self.sets, strict=True)]

    def replace(self, index: int, keys: KeySet) -> TableKeys:
        return TableKeys(self.groups, tuple(keys if i == index else s for i, s in enumerate(self.sets)))


def key_sets(datamap: DataMap, keys: DataFrame, key_types: KeyTypes, tables: list[str],
             subjects: pa.Table | None = None) -> dict[str, TableKeys]:
    """Each table's TableKeys, with one KeySet per (identifier, key type): a hundred tables keyed by
    user_id share one. `subjects`: the batch's (request_id, subject_id) as Arrow, where the driver's
    Python holds them: the subject's key sets at a text key type are grouped there (`key_set`)."""
    built: dict[tuple[str, str], KeySet] = {}
    out = {}
    own = None if subjects is None else subjects.select(["request_id", "subject_id"]).rename_columns(
        ["request_id", "key_value"])
    for table in tables:
        groups = tuple(datamap.mapping(table).groups)
        sets = []
        for group in groups:
            key_type = key_types[table][group.column]
            shape = (group.identifier, key_type.simpleString())
            if shape not in built:
                built[shape] = key_set(keys, group.identifier, key_type,
                                       own if group.identifier == datamap.subject else None)
            sets.append(built[shape])
        out[table] = TableKeys(groups, tuple(sets))
    return out


def ids_column(index: int) -> str:
    """The column `mark` adds for key group `index`: the requests naming the row through it, or NULL."""
    return f"dsr_ids_{index}"


def hit(index: int) -> Column:
    return F.col(ids_column(index)).isNotNull()


def any_hit(table_keys: TableKeys) -> Column:
    condition = hit(0)
    for index in range(1, len(table_keys.groups)):
        condition = condition | hit(index)
    return condition


def _lookup(index: int) -> str:
    return f"dsr_lookup_{index}"


def mark(rows: DataFrame, table_keys: TableKeys, key_columns: list[Column] | None = None, *,
         requests: bool = True) -> DataFrame:
    """`rows` plus `dsr_ids_<i>` per key group (see `ids_column`): a scalar key whose values are
    held in the driver is looked up there (lake/membership.py's `requesters`: a hash lookup per row),
    other keys by a broadcast join with the batch's values; no shuffle. An array key (`recipients[]`)
    is matched element by element against the batch's values as one broadcast map (`dsr_lookup_<i>`, kept on the rows
    for `erased_elements`; a lookup costs time linear in the batch's distinct values). `key_columns`:
    where the key values are in `rows` (default: the mapped columns, struct paths included).
    `requests=False`, for callers that only ask whether a row is requested (`hit`, `any_hit`,
    `redactions`; not `request_ids`): a scalar key whose values are held in the driver is tested by
    membership instead of a join (lake/membership.py: a table lookup per row, no key row built
    and probed), and its `dsr_ids_<i>` is TRUE where a request names the row, NULL elsewhere."""
    key_columns = key_columns or _key_columns(table_keys)
    for index, (group, keys, value) in enumerate(zip(table_keys.groups, table_keys.sets, key_columns, strict=True)):
        if group.is_array:
            lookup = keys.requesters.agg(F.map_from_entries(F.collect_list(F.struct("key_value", "request_ids")))
                                         .alias(_lookup(index)))
            rows = rows.crossJoin(F.broadcast(lookup))
            ids = F.flatten(F.transform(erased_elements(index, value), _requests_of(index)))
            rows = rows.withColumn(ids_column(index), F.when(F.size(ids) > 0, ids))
            continue
        held = _member(rows, keys, value, requests)
        if held is not None:
            rows = rows.withColumn(ids_column(index), held if requests else F.when(held, F.lit(True)))
            continue
        found = keys.requesters.select(F.col("key_value").alias("dsr_match"), (
            F.col("request_ids") if requests else F.lit(True)).alias(ids_column(index)))  # without: half the bytes
        rows = rows.join(F.broadcast(found), value == found.dsr_match, "left").drop("dsr_match")
    return rows


def requested_rows(rows: DataFrame, table_keys: TableKeys, key_columns: list[Column] | None = None, *,
                   requests: bool = True) -> DataFrame:
    """The rows of `rows` that some request names, `mark`ed (`requests`: as `mark` says). Where every
    key group can be tested by membership (scalar keys whose values are held in the driver), the
    rows are tested that way first, so the lookups that find which requests name them run on the
    requested rows only."""
    key_columns = key_columns or _key_columns(table_keys)
    members = [None if g.is_array else _member(rows, keys, value)
               for g, keys, value in zip(table_keys.groups, table_keys.sets, key_columns, strict=True)]
    tests = [F.coalesce(m, F.lit(False)) for m in members if m is not None]
    if len(tests) == len(members):
        rows = rows.where(reduce(lambda a, b: a | b, tests))
    return mark(rows, table_keys, key_columns, requests=requests).where(any_hit(table_keys))


def _key_columns(table_keys: TableKeys) -> list[Column]:
    """The mapped key columns of `table_keys`' groups, struct paths included."""
    return [F.col(column_ref(g.column)) for g in table_keys.groups]


def _member(rows: DataFrame, keys: KeySet, value: Column, requests: bool = False) -> Column | None:
    """Whether `value` is one of `keys` by membership, or with `requests` which requests name it
    (lake/membership.py's `requesters`), answered from the values held in the driver; None when they
    are not held there or their type has no membership test."""
    key_type = keys.requesters.schema["key_value"].dataType
    if not membership.supported(rows.sparkSession, key_type):
        return None
    if keys.values is None:  # beyond the driver's lookups: the values' positions test them
        return None if requests or keys.held is None else membership.member_of(rows.sparkSession, keys.positions,
                                                                                  value)
    if requests:
        return membership.requesters(rows.sparkSession, keys.values.lookup, value, key_type)
    return membership.membership(rows.sparkSession, keys.values.java_list, value, key_type)


def _requests_of(index: int) -> Callable[[Column], Column]:
    return lambda element: F.col(_lookup(index))[element]


def erased_elements(index: int, array: Column) -> Column:
    """The elements of array key group `index` that name a requested subject (on rows `mark`ed)."""
    return F.filter(array, lambda x: F.col(_lookup(index))[x].isNotNull())


def request_ids(table_keys: TableKeys) -> Column:
    """The sorted, distinct requests naming a marked row through any key column; NULL for none.
    Arrays are built for rows that some request names only: on a large table, nearly none."""
    if table_keys.single and not table_keys.groups[0].is_array:
        return F.sort_array(F.col(ids_column(0)))  # a set already (KeySet), NULL where nobody asked
    # sort_array, not array_sort: Spark 3.5's array_sort compares through an interpreted lambda
    ids = F.sort_array(F.array_distinct(F.flatten(F.array(*[
        F.coalesce(F.col(ids_column(i)), F.array().cast("array<string>")) for i in range(len(table_keys.groups))]))))
    return F.when(any_hit(table_keys), ids)


Redaction = Callable[[Column], Column]


def redactions(table_keys: TableKeys) -> dict[str, list[Redaction]]:
    """Redacted column (or struct path) -> what a marked row's value must become, applied in turn:
    NULL where a key group listing it was hit; an array key's own `[]` loses only the erased
    subjects' elements."""
    out: dict[str, list[Redaction]] = {}
    for index, group in enumerate(table_keys.groups):
        for column in group.redact:
            if is_array(column):
                def drop_erased(value: Column, i: int = index) -> Column:
                    return F.when(hit(i), F.filter(value, lambda x: F.col(_lookup(i))[x].isNull())).otherwise(value)
                out.setdefault(column_path(column), []).append(drop_erased)
            else:
                def to_null(value: Column, i: int = index) -> Column:
                    return F.when(hit(i), F.lit(None)).otherwise(value)
                out.setdefault(column, []).append(to_null)
    return out
