"""Streaming ingest that never re-admits an erased person, and `dsr ingest` (files or a Kafka topic).

`suppress_stream` wraps any streaming DataFrame (a file source, Kafka, ...):

    from lakehouse_dsr import suppress_stream
    events = spark.readStream.format("kafka").option("subscribe", "events").load() \\
        .select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
    clean = suppress_stream(events, settings, "user_id")
    clean.writeStream.format("iceberg").option("checkpointLocation", "...").toTable("lakehouse.demo.events")

Each row's key is hashed (HMAC in Spark, under each key of the ledger's keyring) and joined with
the ledger's suppression list, read through a catalog without Iceberg's table cache: Spark plans a
stream-static join's static side again at every micro-batch, so an erasure recorded a second ago
applies to the next batch without a restart. Rows are counted, never shown, in the query's
progress: `observedMetrics["dsr_rows_in"]["rows"]` arrived, `observedMetrics["dsr_rows_kept"]["rows"]`
passed (the difference: rows of erased people dropped).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..datamap import column_ref, is_array
from ..drop.matching import match_items
from ..drop.screening import listed_rows, screen_stream
from ..exceptions import DataMapError, DsrError
from ..inventory.check import field_at
from ..lake.hmac import keyed_hash, pads
from ..lake.indriver import local_rows
from ..lake.kafka import Cluster
from ..lake.lakehouse import Lake
from ..lake.metrics import observed
from ..lake.spark import uncached_catalog
from ..ledger.ledger import Ledger
from .suppress import known_identifier

ROWS_IN, ROWS_KEPT = "dsr_rows_in", "dsr_rows_kept"  # observed metrics in the query's progress


def suppression_list(spark: SparkSession, settings: Settings, ledger: Ledger, identifier: str) -> DataFrame:
    """(key_hash, key_id) of every `identifier` value acted on for an erase request (expired records'
    kept hashes included, ledger/records.py), read by Spark through the uncached catalog: planned
    again, it reads the ledger as it is then."""
    for table in ("requests", "request_keys", "erased_keys"):
        ledger.store.load(table)  # created when missing: a stream may start before the first request
    catalog = uncached_catalog(spark, settings)
    uncached = lambda name: spark.table(".".join(f"`{p}`" for p in [catalog, *name.split(".")]))  # noqa: E731
    erasures = uncached(ledger.requests_table).where(F.col("request_type") == "erase").select("request_id")
    kept = uncached(ledger.store.name("erased_keys")).where(F.col("key_type") == identifier)
    return (uncached(ledger.keys_table).where(F.col("key_type") == identifier)
            .join(F.broadcast(erasures), "request_id", "left_semi").select("key_hash", "key_id")
            .unionByName(kept.select("key_hash", "key_id")))


def suppress_stream(stream_df: DataFrame, settings: Settings, key_column: str, identifier: str | None = None
                    ) -> DataFrame:
    """`stream_df` without the rows whose `key_column` (a column or struct path) holds an identifier of
    a person who asked to be erased, by keyed hash; works on batch DataFrames too.

    Cost per micro-batch: one HMAC per row and key of the keyring (two SHA-256 of the value), one
    read of the ledger's suppression list (small), broadcast and joined on a 64-bit hash of each
    stored hash (the full hashes are compared only where those agree).
    """
    identifier = known_identifier(settings, identifier)
    try:
        field_at(stream_df.schema, key_column)
    except ValueError as exc:
        raise DataMapError(f"the stream has no key column {key_column!r}: {exc}") from None
    if is_array(key_column):
        raise DataMapError("suppress_stream takes one identifier per row; explode an array first")
    spark = stream_df.sparkSession
    ledger = Ledger(settings)
    ring = ledger.keyring.keys()  # every key that may have made a hash: active and retired
    listed = suppression_list(spark, settings, ledger, identifier)
    rows = stream_df.observe(ROWS_IN, F.count(F.lit(1)).alias("rows")).crossJoin(F.broadcast(_pad_row(spark, ring)))
    value = F.col(column_ref(key_column)).cast("string").cast("binary")
    for i, (kid, _) in enumerate(sorted(ring.items())):
        rows = rows.withColumn("dsr_h", keyed_hash(value, F.col(f"dsr_i{i}"), F.col(f"dsr_o{i}"))) \
            .withColumn("dsr_k", F.xxhash64("dsr_h"))
        made = listed.where(F.col("key_id").isNull() | (F.col("key_id") == kid)).select(
            F.xxhash64("key_hash").alias("dsr_listed_k"), F.col("key_hash").alias("dsr_listed_h"))
        # An equi-join on the 64-bit hashes; startswith (equal lengths: equality) checks the full hash.
        rows = rows.join(F.broadcast(made), (F.col("dsr_k") == F.col("dsr_listed_k"))
                         & F.col("dsr_h").startswith(F.col("dsr_listed_h")), "left_anti")
    kept = rows.observe(ROWS_KEPT, F.count(F.lit(1)).alias("rows"))
    return kept.select(*[F.col(f"`{c}`") for c in stream_df.columns])


def _pad_row(spark: SparkSession, ring: dict[str, bytes]) -> DataFrame:
    """One row: the HMAC pads of each key as columns (dsr_i<i>, dsr_o<i>), so hashing under k keys
    adds k columns, not k rows; never literals in the query plan."""
    row, schema = [], []
    for i, (_, key) in enumerate(sorted(ring.items())):
        inner, outer = pads(key)
        row += [inner, outer]
        schema += [f"dsr_i{i} binary", f"dsr_o{i} binary"]
    return local_rows(spark, [tuple(row)], ", ".join(schema))


def _failure(message: str) -> str:
    """A failed query's error in words that hold no record: Spark's malformed-record error quotes the
    fields it parsed, which may name a person."""
    if "MALFORMED_RECORD" in message:
        return "a record's value is not a JSON object with the table's columns (nothing of that micro-batch " \
               "was written; fix or skip the record, e.g. --starting-offsets, and restart)"
    return message.splitlines()[0]


def suppressed_counts(progress: dict) -> tuple[int, int]:
    """(rows in, rows kept) of a micro-batch, from its progress dictionary."""
    return observed(progress, ROWS_IN), observed(progress, ROWS_KEPT)


@dataclass
class IngestResult:
    batches: int = 0
    rows_in: int = 0
    rows_suppressed: int = 0
    rows_written: int = 0
    # DROP (drop/screening.py): rows that carried a waiting work item's hash, and what the matches
    # run after those batches filed (MatchResult's counts, summed)
    drop_listed: int = 0
    drop_matched: dict[str, int] = field(default_factory=dict)


def ingest(spark: SparkSession, settings: Settings, source: str, fmt: str, table: str, checkpoint: str,
           once: bool = False, key: str | None = None, identifier: str | None = None,
           options: dict[str, str] | None = None, on_batch=None, starting_offsets: str = "earliest") -> IngestResult:
    """Stream `source` into `table` (Iceberg or Delta, as the data map places it) through
    `suppress_stream`, exactly once across restarts from `checkpoint`: the source's offsets in the
    checkpoint plus the table's idempotent streaming commits (each micro-batch committed once, by its id).

    `source`: a folder whose arriving files (`fmt`: json | csv | parquet) are read with the table's
    schema, or a Kafka topic, `kafka://HOST:PORT/TOPIC`, whose records' values are JSON objects read
    with the table's schema (`fmt` json; a value that is not such an object stops the query with an
    error rather than being dropped or admitted; tombstones, null values, are skipped), from
    `starting_offsets` (earliest | latest | Spark's per-partition JSON) on the first start; client
    properties (security, SASL) come from `settings.kafka`. `options`: the Spark source's own options
    (maxOffsetsPerTrigger, maxFilesPerTrigger ...). `once`: what is there now, then stop
    (availableNow); otherwise until interrupted. `key`/`identifier` default to the table's data-map
    entry (its one key column). `on_batch(progress)` is called after each micro-batch with Spark's
    progress dictionary.

    Where the data map places DROP lists in `table`, each micro-batch is also screened against the
    work items waiting (drop/screening.py); after a batch that carried one, the waiting items are
    matched against the lake (`match_items`: a scan of the lists' columns), so the person's request
    is filed before the next `dsr run`."""
    topic = Cluster.at(source, settings.kafka) if source.startswith("kafka:") else None
    if fmt not in ("json", "csv", "parquet") or (topic and fmt != "json"):
        raise DsrError(f"unknown format {fmt!r} (expected {'json' if topic else 'json, csv or parquet'})")
    if topic is None and "://" not in source and not Path(source).is_dir():
        raise DsrError(f"source folder {source} does not exist")
    if key is None:
        mapping = settings.datamap.keyed.get(table)
        if mapping is None or len(mapping.groups) != 1:
            raise DsrError(f"{table} has no single key column in the data map: give --key")
        key, identifier = mapping.groups[0].column, identifier or mapping.groups[0].identifier
    try:
        schema = spark.table(settings.table(table)).schema
    except Exception:
        raise DsrError(f"table {table} cannot be read: the stream appends to an existing table") from None
    if topic is not None:
        cluster, name = topic
        records = cluster.stream(spark, name, starting_offsets, options).where(F.col("value").isNotNull())
        arriving = records.select(F.from_json(F.col("value").cast("string"), schema, {"mode": "FAILFAST"})
                                  .alias("dsr_value")).select("dsr_value.*")
    else:
        arriving = spark.readStream.format(fmt).schema(schema).options(
            **({"header": "true"} if fmt == "csv" else {}), **(options or {})).load(source)
    clean = screen_stream(suppress_stream(arriving, settings, key, identifier), settings, table)
    writer = clean.writeStream.option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime="5 seconds")
    query = Lake.of(spark, settings).table(table).append_stream(writer)
    result, seen = IngestResult(), set()
    try:
        while query.isActive or query.recentProgress:
            try:
                query.awaitTermination(1)
            except StreamingQueryException:
                break  # told below, from query.exception()
            for progress in query.recentProgress:
                if progress["batchId"] in seen or not progress.get("numInputRows"):
                    continue
                seen.add(progress["batchId"])
                rows_in, kept = suppressed_counts(progress)
                result.batches += 1
                result.rows_in += rows_in
                result.rows_suppressed += rows_in - kept
                if listed := listed_rows(progress):
                    result.drop_listed += listed
                    matched = match_items(Lake.of(spark, settings), Ledger(settings), settings)
                    result.drop_matched = dict(Counter(result.drop_matched) + Counter(asdict(matched)))
                if on_batch:
                    on_batch(progress)
            if not query.isActive:
                break
    finally:
        if query.isActive:
            query.stop()
    if failure := query.exception():
        raise DsrError(f"the streaming query failed: {_failure(str(failure))}")
    result.rows_written = result.rows_in - result.rows_suppressed
    return result

