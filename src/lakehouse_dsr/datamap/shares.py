"""Shares (`shares:` in the data map) against the catalog, and their SQL over stand-in sources.

Like an aggregate's (lineage.py), a share's SQL names its `from` table as the data map does and runs
over any DataFrame standing in for it through a temporary view: the source at one snapshot (a full
refresh), or only the rows appended to it since the last refresh (an incremental one). That is
exact only when every result row comes from one source row, so only SQL of that shape (projections,
WHERE filters and generators such as explode over the source, no subquery) is refreshed
incrementally; any other (an aggregate, a join, DISTINCT, LIMIT, a window) is recomputed whole.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import AtomicType, DataType

from ..exceptions import DataMapError, first_line
from . import lineage
from .model import DataMap

_ROW_WISE = {"Project", "Filter", "SubqueryAlias", "Generate"}


def query(spark: SparkSession, datamap: DataMap, name: str, catalog: str) -> lineage.Query:
    """The share's SQL parsed; DataMapError when it does not parse or reads another table than its `from`."""
    return lineage.parse(spark, name, datamap.shares[name], {*datamap.tables, *datamap.derived}, catalog, "shares")


def over(spark: SparkSession, shared: lineage.Query, source: DataFrame) -> DataFrame:
    """The share's rows computed from `source` in place of its `from` table (analysed now, run lazily)."""
    return lineage.bound(spark, shared, lambda _table: source)


def full_refresh_reason(rows: DataFrame) -> str | None:
    """None when each row of `rows` (a share's `over`) comes from one source row, so the rows appended
    to the source give exactly the rows to append to the share; else why not. Plan inspection only."""
    node = rows._jdf.queryExecution().analyzed()
    while node.nodeName() != "View":
        if node.subqueries().size():
            return "its sql has a subquery"
        if node.nodeName() not in _ROW_WISE or node.children().size() != 1:
            return f"its sql has a {node.nodeName()} (only projections and filters are refreshed incrementally)"
        node = node.children().apply(0)
    return None


def check_shares(spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]
                 ) -> tuple[list[tuple[str, str]], dict[str, dict[str, DataType]]]:
    """Each share's SQL parses, reads only its `from` table and returns its `key` as a column of an
    atomic type; a share table that exists has that column. Returns (problems, each as (share, what
    is wrong), and {existing share: {key: its type}}): what a check of the shares' tables needs.
    Analysis and schemas only: no row is read."""
    problems: list[tuple[str, str]] = []
    types: dict[str, dict[str, DataType]] = {}
    catalog = qualify("a.b").split(".")[0].strip("`")
    for name, share in datamap.shares.items():
        try:
            result = over(spark, query(spark, datamap, name, catalog), spark.table(qualify(share.source)))
        except DataMapError as exc:
            problems.append((name, str(exc)))
            continue
        except Exception as exc:  # AnalysisException: a column or function the source lacks, ...
            problems.append((name, f"shares {name}: {first_line(exc)}"))
            continue
        fields = {f.name: f.dataType for f in result.schema.fields}
        if share.key not in fields:
            problems.append((name, f"shares {name}: key {share.key!r} is not a column of the sql's result "
                                   f"(has: {', '.join(fields)})"))
            continue
        if not isinstance(fields[share.key], AtomicType):
            problems.append((name, f"shares {name}: key {share.key!r} has type {fields[share.key].simpleString()}, "
                                   "which cannot hold a subject id"))
            continue
        if spark.catalog.tableExists(qualify(name)):
            held = {f.name: f.dataType for f in spark.table(qualify(name)).schema.fields}
            if share.key in held:
                types[name] = {share.key: held[share.key]}
            else:
                problems.append((name, f"shares {name}: the table exists without the key column {share.key!r}; "
                                       "drop it and the next dsr run creates it again"))
    return problems, types
