"""What an aggregate's SQL reads, and whether its groups can be recomputed one by one.

The SQL of a `derived:` aggregate names its sources as the data map does (`demo.events`). Spark's
own parser finds those names and where they stand in the text, so the same query can run over
any DataFrame standing in for a source (the post-erase table, or only the rows an erasure removed)
through a temporary view: no string matching, and no value ever enters the SQL text.

Incremental recomputation (`group_by`) is accepted for this shape only, checked on Spark's
analyzed plan: one source table; projections and WHERE filters; exactly one GROUP BY whose
`group_by` columns are (aliases of) grouping expressions; HAVING and ORDER BY above it. No join,
subquery, window function, set operation, LIMIT, GROUPING SETS/ROLLUP/CUBE, generator or
non-deterministic expression: each output row then depends only on the source rows of its own
group, so the groups no erased row fed are unchanged. Anything else is recomputed in full.

Within that shape, the affected groups can even be updated without reading the sources again
(`subtraction`): when the GROUP BY is the whole query (no HAVING, no expression over an
aggregate), `group_by` covers every grouping expression, and every other column is COUNT(*),
COUNT(column) or COUNT(DISTINCT key) of the key the erasure deleted by (all rows of an erased key
go, so it leaves each group's distinct count whole), a group's new figures are its old ones minus
those of the erased rows, and it disappears when its COUNT(*) reaches zero.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession

from ..exceptions import DataMapError, first_line
from .model import DerivedMapping, ShareMapping

_ABOVE = {"Project", "Filter", "Sort", "SubqueryAlias"}  # allowed above the Aggregate
_BELOW = {"Project", "Filter", "SubqueryAlias"}  # allowed between the Aggregate and the source


@dataclass(frozen=True)
class Query:
    """A derived table's SQL with the spans (start, stop, source table) where it names its sources."""

    table: str
    sql: str
    spans: tuple[tuple[int, int, str], ...]

    @property
    def sources(self) -> list[str]:
        return sorted({name for _, _, name in self.spans})


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _nodes(plan) -> Iterator:
    """Every node of a (parsed or analyzed) plan, CTE definitions and subqueries included."""
    yield plan
    inner = [*_seq(plan.children()), *_seq(plan.innerChildren())]  # inner: subqueries and CTE definitions
    for child in inner:
        yield from _nodes(child)


def parse(spark: SparkSession, name: str, mapping: DerivedMapping | ShareMapping, known: set[str], catalog: str,
          section: str = "derived") -> Query:
    """The aggregate's SQL (or a share's: `section` names it in errors) parsed; DataMapError when it does
    not parse, reads a table the data map does not list, or reads one its `from:` does not name (the
    erase order follows `from:`)."""
    sql = cast(str, mapping.sql)  # an aggregate's or a share's: given (the model checked it)
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(sql)
    except Exception as exc:  # ParseException
        raise DataMapError(f"{section} {name}: the sql does not parse: {first_line(exc)}") from None
    nodes = list(_nodes(plan))
    ctes = {pair._1() for n in nodes if n.nodeName() == "UnresolvedWith" for pair in _seq(n.cteRelations())}
    spans = []
    for node in nodes:
        if node.nodeName() != "UnresolvedRelation":
            continue
        parts = list(node.multipartIdentifier().mkString("\x00").split("\x00"))
        if len(parts) == 1 and parts[0] in ctes:
            continue
        if len(parts) == 3 and parts[0] == catalog:
            parts = parts[1:]
        table = ".".join(parts)
        if table not in known:
            raise DataMapError(f"{section} {name}: the sql reads {table}, which the data map does not list "
                               "(under tables: or derived:)")
        if table not in mapping.sources:
            raise DataMapError(f"{section} {name}: the sql reads {table}, which its 'from' does not name")
        origin = node.origin()
        spans.append((origin.startIndex().get(), origin.stopIndex().get(), table))
    if not spans:
        raise DataMapError(f"{section} {name}: the sql reads no table")
    return Query(name, sql, tuple(sorted(set(spans))))


def bound(spark: SparkSession, query: Query, frames: Callable[[str], DataFrame]) -> DataFrame:
    """The query over `frames(source)` in place of each source table. The frames pass through
    temporary views, dropped once Spark has analyzed the query (the result holds the analyzed plan)."""
    views = {table: f"dsr_src_{uuid.uuid4().hex[:12]}" for table in query.sources}
    text = query.sql
    for start, stop, table in reversed(query.spans):
        text = text[:start] + views[table] + text[stop + 1:]
    try:
        for table, view in views.items():
            frames(table).createOrReplaceTempView(view)
        return _resolved(spark, spark.sql(text)._jdf.queryExecution().analyzed())
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)


def _resolved(spark: SparkSession, plan) -> DataFrame:
    """A DataFrame of an analyzed plan: writers re-analyze a DataFrame's plan, which must then no
    longer name the (dropped) views."""
    jvm: Any = spark._jvm  # py4j's view of the driver JVM: untyped, and set on every started session
    # Spark 4 keeps the Dataset that runs in the JVM in package `classic`
    datasets = jvm.org.apache.spark.sql.classic.Dataset if int(spark.version.split(".")[0]) >= 4 \
        else jvm.org.apache.spark.sql.Dataset
    return DataFrame(datasets.ofRows(spark._jsparkSession, plan), spark)


@dataclass(frozen=True)
class Shape:
    columns: list[str]
    incremental: bool
    reason: str | None = None  # why the groups cannot be recomputed alone


def shape(df: DataFrame, group_by: list[str]) -> Shape:
    """Whether `df` (a `bound` aggregate) can be recomputed group by group on `group_by` (see the
    module docstring). DataMapError when a `group_by` column is not among the result's columns."""
    columns = df.columns
    missing = [c for c in group_by if c not in columns]
    if missing:
        raise DataMapError(f"group_by {', '.join(missing)} not among the sql's result columns ({', '.join(columns)})")
    if not group_by:
        return Shape(columns, False, "refresh: full")
    aggregate, reason = _aggregate(df._jdf.queryExecution().analyzed())
    if aggregate is None:
        return Shape(columns, False, reason)
    grouping = _seq(aggregate.groupingExpressions())
    named = {e.name(): e for e in _seq(aggregate.aggregateExpressions())}
    for column in group_by:
        e = named.get(column)
        value = e.child() if e is not None and e.nodeName() == "Alias" else e
        if value is None or not any(value.semanticEquals(g) for g in grouping):
            return Shape(columns, False, f"group_by column {column} is not a GROUP BY expression")
    return Shape(columns, True)


def _aggregate(plan):
    """The plan's one Aggregate when the plan has the accepted shape, else (None, why not)."""
    node, above = plan, True
    aggregate = None
    while True:
        kind = node.nodeName()
        if node.subqueries().size():
            return None, "a subquery"
        if not all(e.deterministic() for e in _seq(node.expressions())):
            return None, "a non-deterministic expression"
        if kind == "View":
            break
        if kind == "Aggregate":
            if aggregate is not None:
                return None, "more than one GROUP BY"
            aggregate, above = node, False
        elif kind not in (_ABOVE if above else _BELOW):
            return None, f"a {kind} node (only projections, filters and one GROUP BY are recomputed by group)"
        children = _seq(node.children())
        if len(children) != 1:
            return None, "more than one input"
        node = children[0]
    return (aggregate, None) if aggregate is not None else (None, "no GROUP BY")


@dataclass(frozen=True)
class Subtraction:
    """Result columns that lose the erased rows' figures by subtraction; `rows` is the COUNT(*) one."""

    rows: str
    columns: tuple[str, ...]


def subtraction(df: DataFrame, group_by: list[str], erased_key: str | None) -> Subtraction | None:
    """The Subtraction that updates `df`'s (a `bound` aggregate) groups exactly, or None (see the
    module docstring). `erased_key`: the source column an erasure deletes every row of an erased
    value by (None: the source is not erased by one key column, so COUNT(DISTINCT) is not exact)."""
    plan = df._jdf.queryExecution().analyzed()
    while plan.nodeName() in ("Sort", "SubqueryAlias"):
        plan = plan.child()
    aggregate, _ = _aggregate(plan)
    if aggregate is None or plan.nodeName() != "Aggregate":  # HAVING or an expression over an aggregate above
        return None
    named = {e.name(): e for e in _seq(aggregate.aggregateExpressions())}
    grouped = [named[c].child() if named[c].nodeName() == "Alias" else named[c] for c in group_by]
    if not all(any(g.semanticEquals(c) for c in grouped) for g in _seq(aggregate.groupingExpressions())):
        return None
    rows, columns = None, []
    for name, e in named.items():
        if name in group_by:
            continue
        value = e.child() if e.nodeName() == "Alias" else e
        if value.nodeName() != "AggregateExpression" or value.filter().isDefined():
            return None
        function = value.aggregateFunction()
        inputs = _seq(function.children())
        if function.nodeName() != "Count" or len(inputs) != 1:
            return None
        if value.isDistinct():
            if erased_key is None or inputs[0].nodeName() != "AttributeReference" or inputs[0].name() != erased_key:
                return None
        elif inputs[0].nodeName() == "Literal" and inputs[0].value() is not None:
            rows = rows or name
        columns.append(name)
    return Subtraction(rows, tuple(columns)) if rows else None


def groups_of(spark: SparkSession, df: DataFrame, group_by: list[str]) -> DataFrame:
    """The distinct `group_by` values `df` (a `bound` aggregate of accepted shape) forms before HAVING:
    the groups its input rows feed."""
    return aggregated(spark, df).select(*[f"`{c}`" for c in group_by]).distinct()


def aggregated(spark: SparkSession, df: DataFrame) -> DataFrame:
    """The GROUP BY of `df` (a `bound` aggregate of accepted shape) alone: every group its input
    rows form with all the aggregate's columns, before HAVING and anything above it."""
    aggregate, _ = _aggregate(df._jdf.queryExecution().analyzed())
    return _resolved(spark, aggregate)
