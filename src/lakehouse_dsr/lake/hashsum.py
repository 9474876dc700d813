"""Counting and summing row hashes inside Spark's generated code, while an action reads the rows.

Spark's own way to collect an aggregate on the side of an action, `DataFrame.observe`, runs its
aggregates row by row outside whole-stage code generation: over a 10M-row rewrite it cost about 2 s
on two cores, more than hashing the rows. A `HashSum` is instead a filter that is always true and
adds each row's hash to a stock `LongAccumulator` (its count, and its sum wrapping around at 64 bits)
from the generated code (HashSum.java, reached through Spark's `Invoke` expression).

Like every accumulator, it counts a task once when the action is a job's final stage (a write, a
collect); a map stage that Spark runs again (a lost shuffle file) counts its tasks again, and an action
that failed leaves the counts of the tasks that finished. A caller compares `rows` with what it
expects where either can happen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, SparkSession

from .bridge import compiled


@dataclass(frozen=True)
class HashSum:
    accumulator: Any  # the JVM's LongAccumulator (registered with the SparkContext)
    factory: Any  # a HashSum.java instance: builds the columns

    def adding(self, hash_column: Column) -> Column:
        """A boolean column, always true, that adds `hash_column` (a bigint, never NULL) of every row it is
        evaluated on. Non-deterministic: the optimizer neither drops nor moves it."""
        return Column(self.factory.adding(self.accumulator, hash_column._jc))

    @property
    def rows(self) -> int:
        return int(self.accumulator.count())

    @property
    def total(self) -> int:
        """The hashes' sum modulo 2^64, as an unsigned number."""
        return int(self.accumulator.sum()) & (2**64 - 1)


def hash_sum(spark: SparkSession) -> HashSum:
    """A new, empty HashSum (unnamed: Spark's UI and event log leave it out)."""
    factory = compiled(spark, "HashSum", tasks=True)
    return HashSum(spark.sparkContext._jsc.sc().longAccumulator(), factory)
