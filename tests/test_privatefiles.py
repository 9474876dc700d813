"""Files written from inside Spark's generated code (lake/privatefiles.py, PrivateFiles.java): each row's
text in a file of its own, owner-only, its SHA-256 returned; in generated and interpreted sessions;
written once however the column is used; no path or text in a plan string; a clear error when the
directory cannot be written."""

from __future__ import annotations

import hashlib
import stat

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import functions as F

from helpers import GENERATED, codegen
from lakehouse_dsr.lake.privatefiles import written

SECRET = "ann@example.com"


def test_each_row_is_written_owner_only_and_its_hash_returned(spark, mode, tmp_path):
    texts = {"r1.json": f'{{"email": "{SECRET}"}}\n', "r2.json": "ünïcode ✓\n", "r3.json": ""}
    frame = spark.createDataFrame(list(texts.items()) + [("r4.json", None)], "name string, text string")
    (tmp_path / "r1.json").write_text("an older package")
    (tmp_path / "r1.json.tmp").write_text("a killed write's leftover")
    (tmp_path / "r1.json.tmp").chmod(0o644)
    rows = frame.select("name", written(spark, tmp_path, F.col("name"), F.col("text")).alias("sha")).collect()
    hashes = {r.name: r.sha for r in rows}
    assert hashes["r4.json"] is None and not (tmp_path / "r4.json").exists()  # NULL text: nothing written
    for name, text in texts.items():
        path = tmp_path / name
        assert path.read_bytes() == text.encode("utf-8")
        assert hashes[name] == hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(texts)  # no temporary file left


def test_written_once_however_often_the_column_is_read_and_no_path_in_a_plan(spark, tmp_path):
    frame = spark.createDataFrame([("a.txt", SECRET)], "name string, text string")
    sha = written(spark, tmp_path, F.col("name"), F.col("text"))
    # the result read twice above its projection: a deterministic column would be inlined into both
    twice = frame.select(sha.alias("sha")).select(F.col("sha"), F.length("sha").alias("n"))
    with codegen(spark, GENERATED):
        assert twice.collect()[0].n == 64
        execution = twice._jdf.queryExecution()
        optimized, plans = execution.optimizedPlan().toString(), execution.toString()
    assert optimized.count("private files") == 1
    assert str(tmp_path) not in plans and SECRET not in plans and "private files" in plans


def test_an_unwritable_directory_fails_the_job_clearly(spark, tmp_path):
    missing = tmp_path / "missing"
    frame = spark.createDataFrame([("a.txt", "x")], "name string, text string")
    with pytest.raises(Py4JJavaError, match="could not write"):
        frame.select(written(spark, missing, F.col("name"), F.col("text"))).collect()
    assert not missing.exists()
