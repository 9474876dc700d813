"""Whether a row's key is one of a batch's values, and which requests name it, answered inside
Spark's generated code.

The check that an erasure changed nothing else, and the rewrite that leaves the requested rows out,
need one bit per row: does a request name its key? A broadcast join (stages/matching.py's `mark`)
answers which requests do, at the price of building a key row, hashing it and probing a hashed
relation for every row; over a 10M-row scan that cost about 0.9 s on two cores. A `membership`
column is a table lookup instead (Membership.java, reached through Spark's `Invoke`: catalyst.py):
open addressing over 64-bit fingerprints of the values, so a key no request names costs its
fingerprint and one compared long (a java.util.HashSet ran UTF8String's Murmur3 and followed an
entry: 0.32 s against 0.19 s, and 0.43 s against 0.35 s in a noisier hour, over a 10M-row scan
with three lookups a row, warm). The table travels as a broadcast variable, and
plan strings show "membership", never a value. A `requesters` column looks up which requests name
the key the same way, where the join would also have cost a small broadcast job and its planning in
every query (plan, export). A `RowCounter` counts the rows whose key a request names, per request,
while an action such as a rewrite reads them, where a plan would have read the key column first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, IntegerType, LongType, StringType

from . import catalyst
from .bridge import compiled, helper

_TYPES: dict[type[DataType], str] = {StringType: "string", LongType: "bigint", IntegerType: "int"}


def supported(spark: SparkSession, key_type: DataType) -> bool:
    """Whether keys of `key_type` can be tested by `membership` in this session: a type it has a test
    for, and the Membership helper on and compiled (bridge.helper). Where not, callers match rows by
    a broadcast join with the batch's values (stages/matching.py's `mark`) and count nothing on the
    side of a rewrite."""
    return type(key_type) in _TYPES and helper(spark, "Membership", tasks=True) is not None


def membership(spark: SparkSession, values: Any, key: Column, key_type: DataType) -> Column:
    """A boolean column: whether `key` (of `key_type`, see `supported`) is one of `values` (a
    java.util.List held in the driver's JVM: skipping.KeyValues.java_list), NULL where `key` is NULL.
    Cost: one broadcast of the values; a table lookup per row."""
    table = compiled(spark, "Membership", tasks=True).table(spark.sparkContext._jsc.sc(), values, _type_name(key_type))
    return member_of(spark, table, key)


def requesters(spark: SparkSession, lookup: Any, key: Column, key_type: DataType) -> Column:
    """An array<string> column: the sorted ids of the requests naming `key` (of `key_type`, see
    `supported`) as `lookup` lists them (a java.util.Map held in the driver's JVM:
    skipping.KeyValues.lookup), NULL where none does or `key` is NULL. Cost: one broadcast of the
    lookup; a table lookup per row."""
    target = compiled(spark, "Membership", tasks=True).requesters(spark.sparkContext._jsc.sc(), lookup,
                                                                  _type_name(key_type))
    return catalyst.invoke(spark, target, "java.util.function.Function", "apply", [key.cast(key_type)],
                           ArrayType(StringType(), containsNull=False), propagate_null=True, nullable=True,
                           deterministic=True)


@dataclass(frozen=True)
class RowCounter:
    """Counts, per request, the rows an action reads whose key a request names (Membership.java's
    Counter: each task's counts per value go to an accumulator when the task completes, and Spark
    merges a finished task's once; a map stage run again would count again, so a caller counts in a
    job's final stage, a write's or a collect's)."""

    spark: SparkSession
    counter: Any  # the JVM's Membership.Counter
    key_type: DataType
    held: pa.Table | None = None  # `row_counter_on`'s rows, by the positions the counter counts by

    def counting(self, key: Column) -> Column:
        """A boolean column, always true, that counts each row whose `key` a request names: a filter
        that keeps every row (non-deterministic: the optimizer neither moves nor drops it)."""
        counting = catalyst.invoke(self.spark, self.counter.counting(), "java.util.function.Predicate", "test",
                                   [key.cast(self.key_type)], BooleanType(), propagate_null=True, nullable=True,
                                   deterministic=False)
        return F.coalesce(counting, F.lit(True))

    def counted(self) -> tuple[int, dict[str, int]]:
        """(rows counted, rows per request id) once the action has run: a row two requests name counts
        once in the first, for each in the second."""
        if self.held is None:
            counts = json.loads(self.counter.byRequest())
            return int(counts["total"]), {str(k): int(v) for k, v in counts["requests"].items()}
        return _by_position(self.held, bytes(self.counter.byOrdinal()))


def _by_position(held: pa.Table, counted: bytes) -> tuple[int, dict[str, int]]:
    """`RowCounter.counted` from a `counterOn` counter's answer (positions in `held`, then their
    rows, as little-endian longs): each position's rows go to each request of its `request_ids`."""
    n = len(counted) // 16
    longs = pa.Array.from_buffers(pa.int64(), 2 * n, [None, pa.py_buffer(counted)])
    positions, rows = longs.slice(0, n), longs.slice(n)
    lists = held.column("request_ids").take(positions)
    per = pa.table({"request_id": pc.list_flatten(lists), "rows": rows.take(pc.list_parent_indices(lists))})
    if len(pc.unique(per.column("request_id"))) < per.num_rows:  # a request naming several values (1.5 s a million)
        summed = per.group_by("request_id").aggregate([("rows", "sum")])
        per = pa.table({"request_id": summed.column("request_id"), "rows": summed.column("rows_sum")})
    total = pc.sum(rows).as_py() or 0
    return int(total), dict(zip(cast(list[str], per.column("request_id").to_pylist()),
                                cast(list[int], per.column("rows").to_pylist()), strict=True))


def row_counter(spark: SparkSession, lookup: Any, key_type: DataType) -> RowCounter:
    """A new RowCounter of the values in `lookup` (a java.util.Map held in the driver's JVM:
    skipping.KeyValues.lookup) for keys of `key_type` (see `supported`). Cost: one broadcast of the
    values; a table lookup per row, and a count per requested row."""
    return RowCounter(spark, compiled(spark, "Membership", tasks=True).counter(
        spark.sparkContext._jsc.sc(), lookup, _type_name(key_type)), key_type)


def positions(spark: SparkSession, values: DataFrame, key_type: DataType) -> Any:
    """The values of `values` (first column, of `key_type`) as a table of their positions in
    that order, held in the driver's JVM and broadcast once, for `member_of` and `row_counter_on`:
    for a set too large to hold there with its request ids (skipping.MAX_VALUES). No value crosses
    Py4J. Cost: one job collecting `values` into the driver's JVM (a million: about 100 MB of its
    heap while the table lives) and one broadcast."""
    return compiled(spark, "Membership", tasks=True).positions(spark.sparkContext._jsc.sc(), values._jdf,
                                                               _type_name(key_type))


def member_of(spark: SparkSession, table: Any, key: Column) -> Column:
    """`membership` over a `positions` table."""
    return catalyst.invoke(spark, compiled(spark, "Membership", tasks=True).memberOf(table),
                           "java.util.function.Predicate", "test", [key], BooleanType(), propagate_null=True,
                           nullable=True, deterministic=True)


def row_counter_on(spark: SparkSession, table: Any, held: pa.Table, key_type: DataType) -> RowCounter:
    """`row_counter` over a `positions` table: each value counted by its position, and the positions
    turned into requests in Arrow by `held`, the same rows as the driver's Python holds them
    (`key_value`, `request_ids`). Neither a value nor a request id crosses Py4J."""
    return RowCounter(spark, compiled(spark, "Membership", tasks=True).counterOn(spark.sparkContext._jsc.sc(), table),
                      key_type, held)


def _type_name(key_type: DataType) -> str:
    """Membership.java's name for `key_type`; a ValueError for a type it has no test for."""
    if type(key_type) not in _TYPES:
        raise ValueError(f"no membership test for keys of type {key_type.simpleString()}")
    return _TYPES[type(key_type)]
