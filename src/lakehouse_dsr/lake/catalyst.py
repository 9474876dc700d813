"""A Java object's method called from inside Spark's generated code: the one place that builds
Catalyst expressions by hand, so the difference between Spark lines lives here only.

The engine's per-row helpers (membership.py's lookups, hashsum.py's sums, privatefiles.py's writer)
are Java objects that implement a `java.util.function` interface; Spark's stock `Invoke` expression
calls that interface's method on every row, so generated code names no class of ours. Spark 3.5
turns a Column into its expression with `Column.expr()` and back with `new Column(expression)`;
Spark 4 removed both (SPARK-49025): a classic session converts through
`org.apache.spark.sql.classic.ExpressionUtils`. Scala 2.13 also changes the `Seq` type `Invoke`
takes: PySpark's own `PythonUtils.toSeq` gives the one each line expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pyspark.sql import Column, SparkSession
from pyspark.sql.types import DataType

from .bridge import jclass


def spark4(spark: SparkSession) -> bool:
    """Whether `spark` runs Spark 4 (else 3.5)."""
    return int(spark.version.split(".")[0]) >= 4


def expression(spark: SparkSession, column: Column) -> Any:
    """`column`'s Catalyst expression (a JVM object)."""
    java_column = cast(Any, column)._jc  # a classic session's Column: Spark 4's hints name no `_jc`
    if spark4(spark):
        return jclass(spark, "org.apache.spark.sql.classic.ExpressionUtils").expression(java_column)
    return java_column.expr()


def column(spark: SparkSession, expr: Any) -> Column:
    """A Column of Catalyst expression `expr`."""
    if spark4(spark):
        return Column(jclass(spark, "org.apache.spark.sql.classic.ExpressionUtils").column(expr))
    return Column(jclass(spark, "org.apache.spark.sql.Column")(expr))


def invoke(spark: SparkSession, target: Any, interface: str, method: str, arguments: Sequence[Column],
           result: DataType, *, propagate_null: bool, nullable: bool, deterministic: bool) -> Column:
    """A column that calls `target.method(*arguments)` per row, through `interface` (the name of a
    Java interface `target` implements, e.g. "java.util.function.Predicate"), of type `result`.
    `propagate_null`: NULL without a call where an argument is NULL. `deterministic`: False keeps the
    optimizer from moving, repeating or dropping it (a call with a side effect). Spark ships `target`
    to its tasks inside the plan: its class must be Serializable and on the executors' classpath."""
    interface_class = jclass(spark, "java.lang.Class").forName(interface)
    as_type = jclass(spark, "org.apache.spark.sql.types.ObjectType")(interface_class)
    literal = jclass(spark, "org.apache.spark.sql.catalyst.expressions.Literal")(target, as_type)
    to_seq = jclass(spark, "org.apache.spark.api.python.PythonUtils").toSeq
    invoked = jclass(spark, "org.apache.spark.sql.catalyst.expressions.objects.Invoke")(
        literal, method, jclass(spark, "org.apache.spark.sql.types.DataType").fromJson(result.json()),
        to_seq([expression(spark, c) for c in arguments]), to_seq([]), propagate_null, nullable, deterministic)
    return column(spark, invoked)


def try_cast(spark: SparkSession, value: Column, to: DataType) -> Column:
    """`value` cast to `to`, NULL where it cannot be (a text id against a numeric key): never an error,
    whatever `spark.sql.ansi.enabled` says (Spark 4 turns it on; an ANSI cast error would also print
    the value, an identifier, into the log). Spark 3.5's Python Column has no `try_cast`: the same
    Catalyst cast in its TRY mode is built here."""
    if hasattr(Column, "try_cast"):  # on the class: an instance answers every name with a field access
        return cast(Any, value).try_cast(to)  # PySpark 4's; absent from 3.5's hints
    tried = jclass(spark, "org.apache.spark.sql.catalyst.expressions.Cast")(
        expression(spark, value), jclass(spark, "org.apache.spark.sql.types.DataType").fromJson(to.json()),
        jclass(spark, "scala.Option").apply(spark.conf.get("spark.sql.session.timeZone")),
        jclass(spark, "org.apache.spark.sql.catalyst.expressions.EvalMode").TRY())
    return column(spark, tried)
