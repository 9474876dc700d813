"""Resolve a batch of subjects to every identifier the data map knows for them."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..datamap import DataMap
from ..lake import indriver
from ..lake.lakehouse import Lake


def resolve(lake: Lake, datamap: DataMap, batch: DataFrame) -> DataFrame:
    """(request_id, key_type, key_value) for a batch of (request_id, subject_id).

    One broadcast join per linked identifier against its source table (reads two columns of it), in
    one job (none without linked identifiers) whose result is kept in the driver's JVM
    (lake/indriver.py's `kept`), never in Python:
    erasing the source tables afterwards cannot change it, and the key sets built from it
    (stages/matching.py) cost no further job. A batch too large for the driver (not a local
    relation: lake/frames.py) is joined by a shuffle instead, and the result kept on the executors
    (a local checkpoint).
    """
    dm, spark = datamap, lake.spark
    in_driver = indriver.is_local(batch)
    batch = batch.select("request_id", F.col("subject_id").cast("string").alias("subject_id"))
    parts = [batch.select("request_id", F.lit(dm.subject).alias("key_type"), F.col("subject_id").alias("key_value"))]
    for name, link in dm.identifiers.items():
        source = spark.table(lake.quoted(link.table)).select(
            F.col(link.subject_column).cast("string").alias("dsr_subject"),
            F.col(link.column).cast("string").alias("key_value"),
        )
        parts.append(
            source.join(F.broadcast(batch) if in_driver else batch, source.dsr_subject == batch.subject_id)
            .where(F.col("key_value").isNotNull())
            .select("request_id", F.lit(name).alias("key_type"), "key_value")
        )
    if len(parts) == 1:  # the batch's own rows, distinct and held in the driver already: not copied again
        return parts[0]
    keys = parts[0]
    for part in parts[1:]:
        keys = keys.unionByName(part)
    # distinct rows: a link table may name a key twice
    return indriver.kept(keys) if in_driver else keys.distinct().localCheckpoint()
