"""Rows the driver's Python holds (a batch's requests, the ledger's hashes of their identifiers) as
Spark DataFrames, in the form their size allows.

Up to a measured size they are a local relation in the driver's JVM (lake/indriver.py's
`local_rows`): reading them takes no Spark job, and the driver's helpers group and hash them there.
A local relation holds every row as JVM objects in the driver, and the helpers' maps hold them again:
a million requests ran a 1 GB driver out of memory. Beyond `in_driver_max_rows` the rows become
Arrow record batches instead, the compact form PySpark's own Arrow path ships (about the bytes of the
values), one partition per batch decoded on the executors, and every later step joins them in Spark.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.serializers import ArrowStreamSerializer
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from .arrow import plain_offsets
from .indriver import local_rows

BATCH_ROWS = 65_536  # rows per Arrow batch, each one partition of the DataFrame
_LOCAL_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


def rows_frame(spark: SparkSession, rows: pa.Table, in_driver_max_rows: int) -> DataFrame:
    """`rows` as a local relation when there are at most `in_driver_max_rows` of them, else as
    `arrow_frame`. Cost: one pass over the rows in Python (a local relation) or in Arrow."""
    if rows.num_rows <= in_driver_max_rows:
        return local_rows(spark, list(zip(*(c.to_pylist() for c in rows.columns), strict=True)),
                          from_arrow_schema(rows.schema))
    return arrow_frame(spark, rows)


def arrow_frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    """`rows` as a DataFrame of Arrow record batches (BATCH_ROWS each), written to an owner-only
    file in the context's temporary directory (deleted once read) and read by the JVM as PySpark's `createDataFrame`
    of Arrow data does (over its authenticated socket when I/O encryption is on); never as Py4J
    command text, and no Python worker reads them. Spark keeps the batches' bytes in the driver
    and ships them with each job that reads them."""
    rows = plain_offsets(rows)
    schema = from_arrow_schema(rows.schema)
    conf = spark.conf
    threshold = conf.get(_LOCAL_THRESHOLD, None)
    conf.set(_LOCAL_THRESHOLD, "0")  # never turned back into a local relation: that is what is avoided
    try:
        if pyspark.__version__ >= "4":  # Spark 4 takes Arrow tables directly
            return spark.createDataFrame(rows, schema)
        sc, jvm = spark.sparkContext, spark._jvm
        assert jvm is not None
        batches = rows.combine_chunks().to_batches(max_chunksize=BATCH_ROWS) or [
            pa.RecordBatch.from_pylist([], rows.schema)]
        stream = sc._serialize_to_jvm(batches, ArrowStreamSerializer(),
                                      jvm.PythonSQLUtils.readArrowStreamFromFile, jvm.ArrowIteratorServer)
        return DataFrame(jvm.PythonSQLUtils.toDataFrame(stream, schema.json(), spark._jsparkSession), spark)
    finally:
        if threshold is None:
            conf.unset(_LOCAL_THRESHOLD)
        else:
            conf.set(_LOCAL_THRESHOLD, threshold)


def to_arrow(df: DataFrame) -> pa.Table:
    """`df`'s rows in Python as one Arrow table, shipped as Arrow batches (a `collect` builds a Row
    object per row: seconds per 100,000). For derived data only (hashes, counts): table data is
    never collected."""
    frame: Any = df  # `toArrow` is a method in Spark 4, a column name in 3.5: checked against either line's hints
    if pyspark.__version__ >= "4":
        return frame.toArrow()
    return pa.Table.from_batches(frame._collect_as_arrow(), to_arrow_schema(df.schema))
