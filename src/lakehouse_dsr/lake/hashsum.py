"""Counting and summing row hashes inside Spark's generated code, while an action reads the rows.

Spark's own way to collect an aggregate on the side of an action, `DataFrame.observe`, runs its
aggregates row by row outside whole-stage code generation: over a 10M-row rewrite it cost about 2 s
on two cores, more than hashing the rows. A `HashSum` is instead a filter that is always true and
adds each row's hash to a stock `LongAccumulator` (its count, and its sum wrapping around at 64 bits)
from the generated code (HashSum.java, reached through Spark's `Invoke` expression: catalyst.py).

Like every accumulator, it counts a task once when the action is a job's final stage (a write, a
collect); a map stage that Spark runs again (a lost shuffle file) counts its tasks again, and an action
that failed leaves the counts of the tasks that finished. A caller compares `rows` with what it
expects where either can happen. Where another thread's action reads the rows, `StageDone` tells when
the stage that read them has completed, before the action's later stages have. Where either helper
is off or cannot be compiled (`available`), nothing is summed on the side: the check reads the rows
itself, one more scan of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, SparkSession
from pyspark.sql.types import BooleanType

from . import catalyst
from .bridge import compiled, helper


@dataclass(frozen=True)
class HashSum:
    spark: SparkSession
    accumulator: Any  # the JVM's LongAccumulator (registered with the SparkContext)
    factory: Any  # a HashSum.java instance: makes the objects the columns call

    def adding(self, hash_column: Column) -> Column:
        """A boolean column, always true, that adds `hash_column` (a bigint, never NULL) of every row it is
        evaluated on. Non-deterministic: the optimizer neither drops nor moves it."""
        return catalyst.invoke(self.spark, self.factory.on(self.accumulator), "java.util.function.LongPredicate",
                               "test", [hash_column], BooleanType(), propagate_null=False, nullable=False,
                               deterministic=False)

    @property
    def rows(self) -> int:
        return int(self.accumulator.count())

    @property
    def total(self) -> int:
        """The hashes' sum modulo 2^64, as an unsigned number."""
        return int(self.accumulator.sum()) & (2**64 - 1)


NAME = "dsr: rows fingerprinted"  # Spark's UI shows the counts and sums (row hashes, never a value)


def available(spark: SparkSession) -> bool:
    """Whether rows can be fingerprinted on the side of another action in this session: the HashSum
    and StageDone helpers are on and compile (bridge.helper)."""
    return helper(spark, "HashSum", tasks=True) is not None and helper(spark, "StageDone") is not None


def hash_sum(spark: SparkSession) -> HashSum:
    """A new, empty HashSum. Named: Spark reports a stage's named accumulators, which `StageDone` watches."""
    factory = compiled(spark, "HashSum", tasks=True)
    return HashSum(spark, spark.sparkContext._jsc.sc().longAccumulator(NAME), factory)


class StageDone:
    """Watches for the first completed stage whose tasks added to any of `sums` (StageDone.java): once
    it has, their values are final unless Spark runs that stage again. For a thread that waits for
    another thread's action to have read the rows, not for all of that action. A context manager: the
    watch stops listening on exit."""

    def __init__(self, spark: SparkSession, sums: list[HashSum]):
        self._sc = spark.sparkContext._jsc.sc()
        self._watch = compiled(spark, "StageDone").watch(self._sc, [int(s.accumulator.id()) for s in sums])

    def wait(self, given_up: Callable[[], bool], poll_seconds: float = 0.05) -> bool:
        """Block until such a stage completed (True), or `given_up()` says none will (the action ended
        or failed before one did: False)."""
        while not self._watch.completed(int(poll_seconds * 1000)):
            if given_up():
                return bool(self._watch.completed(0))
        return True

    def __enter__(self) -> StageDone:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.close(self._sc)
