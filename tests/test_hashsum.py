"""Row sums inside Spark's generated code (lake/hashsum.py, HashSum.java): while an action reads the
rows, every row's value is counted and summed modulo 2^64 once, as Spark's own exact aggregate over
the same rows says; the call sits in whole-stage generated code; a side that saw rows twice (or not
all of them) is refused by the collateral check, which then reads the files itself; a thread can
wait for the stage that summed the rows while another thread's action goes on (StageDone); and the
check's row hash tells rows apart by where their NULLs sit, past 63 columns too."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from helpers import GENERATED, codegen
from lakehouse_dsr.lake.hashsum import StageDone, hash_sum
from lakehouse_dsr.stages import collateral


def _rows(spark):
    # Hashes spread over the whole 64-bit range: their sum wraps many times.
    return spark.range(0, 5000, 1, 3).select("id", F.xxhash64("id").alias("h"))


def _exact(spark) -> tuple[int, int]:
    """Count and exact sum of the hashes, from an ordinary aggregate over decimals."""
    row = _rows(spark).agg(F.count("*").alias("n"), F.sum(F.col("h").cast("decimal(38,0)")).alias("s")).first()
    return row["n"], int(row["s"])


def test_a_write_counts_and_sums_every_row_once(spark, tmp_path, mode):
    sums = hash_sum(spark)
    rows = _rows(spark)
    rows.where(sums.adding(F.col("h"))).write.parquet(str(tmp_path / "out"))
    count, exact = _exact(spark)
    assert (sums.rows, sums.total) == (count, exact % 2**64)
    assert exact % 2**64 != exact  # the sum did wrap: the comparison is modulo 2^64, as documented
    assert spark.read.parquet(str(tmp_path / "out")).count() == count  # the filter keeps every row


def test_the_call_is_in_whole_stage_generated_code(spark):
    sums = hash_sum(spark)
    frame = _rows(spark).where(sums.adding(F.col("h")))
    with codegen(spark, GENERATED):
        generated = spark._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "codegen")
    assert "WholeStageCodegen" in generated and "java.util.function.LongPredicate" in generated
    assert sums.rows == 0  # planning reads nothing


def test_the_after_side_is_refused_unless_each_row_was_seen_once(spark, mode):
    count, exact = _exact(spark)
    sums = collateral.Sums(hash_sum(spark), hash_sum(spark))
    frame = _rows(spark).where(F.when(F.col("id") < 10, sums.requested.adding(F.lit(0)))
                               .otherwise(sums.other.adding(F.col("h"))))
    assert collateral.after_split(sums, count) is None  # nothing read yet
    frame.collect()
    first_ten = _rows(spark).where("id < 10").agg(F.sum(F.col("h").cast("decimal(38,0)"))).first()[0]
    split = collateral.after_split(sums, count)
    assert split is not None and split.requested_after == 10
    assert split.found.rows == count - 10 and split.found.hash_sum == (exact - int(first_ten)) % 2**64
    frame.collect()  # a second read of the same rows: counted twice
    assert collateral.after_split(sums, count) is None
    assert collateral.after_split(sums, None) is None  # the commit's metadata did not say


def test_the_row_hash_tells_rows_apart_by_where_their_nulls_sit(spark):
    """xxhash64 skips a NULL input: without the NULL mask, ("a", NULL, "b") and ("a", "b", NULL) would
    hash alike. 70 columns take two masks: a NULL in the 63rd or 64th column counts as well."""
    wide = 70
    schema = ", ".join(f"c{i} string" for i in range(wide))
    def row(nulls: set[int], text: str = "v") -> tuple:
        return tuple(None if i in nulls else (text if i else "first") for i in range(wide))
    patterns = [set(), {1}, {2}, {0}, {62}, {63}, {64}, {62, 63}, {69}, {1, 2}]
    rows = [row(p) for p in patterns] + [row(set())]  # the last repeats the first
    frame = spark.createDataFrame([(i, *r) for i, r in enumerate(rows)], f"i int, {schema}")
    hashed = frame.select("i", collateral.row_hash(frame.drop("i").schema).alias("h")).orderBy("i").collect()
    hashes = [r.h for r in hashed]
    assert len(set(hashes[:-1])) == len(patterns)  # every pattern of NULLs hashes differently
    assert hashes[-1] == hashes[0]  # equal rows hash equally
    shifted = spark.createDataFrame([("a", None, "b"), ("a", "b", None)], "x string, y string, z string")
    first, second = [r.h for r in shifted.select(collateral.row_hash(shifted.schema).alias("h")).collect()]
    assert first != second


def _blocked_until(flag: Path):
    """A Python UDF that holds its task until `flag` exists (at most a minute): a later stage that
    keeps the action running."""
    def wait(value: int) -> int:
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value
    return F.udf(wait, "bigint")


def test_stage_done_opens_once_the_summing_stage_completed_while_the_action_runs_on(spark, tmp_path):
    """Another thread's action sums the rows in its first stage and is held in its second: the watch
    opens with every row counted and summed, before the action ends; the sums do not move after."""
    count, exact = _exact(spark)
    sums, flag = hash_sum(spark), tmp_path / "go"
    frame = _rows(spark).where(sums.adding(F.col("h"))).repartition(2, "id") \
        .select(_blocked_until(flag)("id").alias("id"))
    with StageDone(spark, [sums]) as read, ThreadPoolExecutor(1) as pool:
        action = pool.submit(lambda: frame.write.format("noop").mode("overwrite").save())
        try:
            assert read.wait(action.done)
            assert not action.done()  # held in its second stage
            assert (sums.rows, sums.total) == (count, exact % 2**64)
        finally:
            flag.touch()
        action.result()
    assert (sums.rows, sums.total) == (count, exact % 2**64)


def test_stage_done_gives_up_with_an_action_that_failed_and_its_sums_are_refused(spark, tmp_path):
    """An action whose summing stage fails part-way: the wait ends (the stage completed as failed, or
    the action ended first) and the check refuses the partial sums."""
    count, _ = _exact(spark)
    sums = collateral.Sums(hash_sum(spark), hash_sum(spark))
    frame = _rows(spark).where(F.when(F.col("id") == 4999, F.raise_error(F.lit("stop")))
                               .otherwise(sums.other.adding(F.col("h")))).repartition(2, "id")
    with StageDone(spark, [sums.other, sums.requested]) as read, ThreadPoolExecutor(1) as pool:
        action = pool.submit(lambda: frame.write.format("noop").mode("overwrite").save())
        read.wait(action.done)
        with pytest.raises(Exception, match="stop"):
            action.result()
    assert 0 < sums.rows < count and collateral.after_split(sums, count) is None
