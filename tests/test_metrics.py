"""Stage meters (lake/metrics.py): work a thread runs beside the run's other stages (`beside`) is
counted by the meter made for it, and by no other."""

from __future__ import annotations

import threading

from pyspark.sql import functions as F

from lakehouse_dsr.lake.metrics import StageMeter, beside


def test_jobs_run_beside_are_counted_by_their_own_meter_only(spark):
    everything = StageMeter(spark)
    start = everything.mark()
    seen: dict[str, object] = {}

    def beside_the_run() -> None:
        with beside(spark, "a test's work") as jobs:
            meter = StageMeter(spark, only=jobs)
            mark = meter.mark()
            spark.range(0, 1000, 1, 2).select(F.sum("id")).collect()
            seen["rows"] = meter.since(mark).rows_read
            seen["meter"], seen["mark"] = meter, mark
        seen["description after"] = spark.sparkContext.getLocalProperty("spark.job.description")

    thread = threading.Thread(target=beside_the_run)
    thread.start()
    thread.join()
    own = StageMeter(spark)
    mark = own.mark()
    spark.range(0, 30, 1, 1).select(F.sum("id")).collect()
    assert (seen["rows"], seen["description after"]) == (1000, None)
    assert own.since(mark).rows_read == 30
    assert everything.since(start).rows_read == 30  # the work beside left out
    assert seen["meter"].since(seen["mark"]).rows_read == 1000  # and the other thread's job left out of its meter
