"""Screening new data against DROP's waiting work items as it arrives (`dsr ingest`).

The law keeps the hash of a work item that matched nobody: data collected later that matches it
must be acted on, and the new status reported at the next access of DROP. Every `dsr run` looks for
the waiting items in the whole lake (drop/matching.py's `match_waiting`); `screen_stream` catches
them at the door too. It hashes the DROP lists a table holds in each micro-batch of a stream into
that table, joins them with the hashes of the items waiting (read again at every micro-batch, so an
item imported a second ago counts), and counts the rows that carry one in the query's progress
(`observedMetrics["dsr_drop_listed"]["rows"]`). The rows pass unchanged: acting on them needs the
person they belong to, which a match finds once the batch is in the table (`dsr ingest` runs it
then: the requests are filed before the next `dsr run`, which carries them out).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..lake.metrics import observed
from ..lake.spark import uncached_catalog
from ..ledger.ledger import Ledger
from .hashing import Rules
from .matching import placements

LISTED = "dsr_drop_listed"  # observed metric: rows of a micro-batch carrying a waiting item's hash


def waiting_hashes(spark: SparkSession, settings: Settings) -> DataFrame:
    """(list_type, hash) of the work items a match still looks for (never matched, or found nobody
    before; not withdrawn), read through the uncached catalog: planned again, it reads the ledger
    as it is then."""
    ledger = Ledger(settings)
    name = ledger.store.name("drop_items")
    ledger.store.load("drop_items")  # created when missing: a stream may start before the first import
    catalog = uncached_catalog(spark, settings)
    items = spark.table(".".join(f"`{p}`" for p in [catalog, *name.split(".")]))
    return items.where(F.col("request_ids").isNull() & F.col("withdrawn_at").isNull()).select("list_type", "hash")


def screen_stream(stream_df: DataFrame, settings: Settings, table: str) -> DataFrame:
    """`stream_df` (rows for `table`, with its columns), counting in the query's progress the rows
    whose values hash to a waiting work item of a DROP list the data map places in `table`; `stream_df`
    itself when it places none. Cost per micro-batch: the hashes of those columns (names through a
    Python function), one read of the waiting items' two columns, and a join per list on the hash."""
    places = [p for p in placements(settings.datamap) if p.table == table
              and all(c in stream_df.columns for c in p.columns.values())]
    if not places:
        return stream_df
    waiting = waiting_hashes(stream_df.sparkSession, settings)
    rules = Rules(zip_plus4=settings.drop.zip_plus4)
    rows, flags = stream_df, []
    for i, place in enumerate(places):
        listed = waiting.where(F.col("list_type") == place.list_name).select(
            F.col("hash").alias(f"dsr_drop_w{i}")).distinct().withColumn(f"dsr_drop_f{i}", F.lit(True))
        rows = rows.withColumn(f"dsr_drop_h{i}", place.hash(stream_df.schema, rules)).join(
            listed, F.col(f"dsr_drop_h{i}") == F.col(f"dsr_drop_w{i}"), "left")
        flags.append(F.col(f"dsr_drop_f{i}").isNotNull())
    carried = reduce(lambda a, b: a | b, flags)
    counted = rows.observe(LISTED, F.sum(F.when(carried, 1).otherwise(0)).alias("rows"))
    return counted.select(*[F.col(f"`{c}`") for c in stream_df.columns])


def listed_rows(progress: dict) -> int:
    """Rows of a micro-batch that carried a waiting work item's hash, from its progress dictionary."""
    return observed(progress, LISTED)
