"""The collateral check's row sums (lake/hashsum.py) and key membership (lake/membership.py) on a
standalone cluster: the tasks run in executor JVMs of their own, which load HashSum and Membership
from the jars the driver adds to its SparkContext (the key set comes as a broadcast), and what comes
back to the driver is Spark's own accumulator. The client runs in a process of its own (one
SparkContext per JVM)."""

from __future__ import annotations

import json
import subprocess
import sys

from .servers import spark_cluster

CLIENT = """
import json, sys
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.types import LongType
from lakehouse_dsr.lake.hashsum import hash_sum
from lakehouse_dsr.lake.membership import membership
from lakehouse_dsr.lake.spark import iceberg_jar
spark = (SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false")
         .config("spark.jars", str(iceberg_jar())).getOrCreate())
sums = hash_sum(spark)
rows = spark.range(0, 100_000, 1, 4).where(sums.adding(F.col("id"))).count()
wanted = spark._jvm.java.util.ArrayList([7, 99_999, 123_456])
members = spark.range(0, 100_000, 1, 4).where(membership(spark, wanted, F.col("id"), LongType())).count()
print(json.dumps({"rows": rows, "counted": sums.rows, "total": sums.total, "members": members,
                  "master": spark.sparkContext.master}))
spark.stop()
"""


def test_row_sums_and_key_membership_on_executors_of_a_standalone_cluster(tmp_path):
    (tmp_path / "cluster").mkdir()
    with spark_cluster(tmp_path / "cluster", workers=1) as cluster:
        done = subprocess.run([sys.executable, "-c", CLIENT, cluster.master_url], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        executor_logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "cluster" / "work").rglob("stderr"))
    assert seen == {"rows": 100_000, "counted": 100_000, "total": sum(range(100_000)), "members": 2,
                    "master": cluster.master_url}
    # the classes came from the driver
    assert "HashSum-" in executor_logs and "Membership-" in executor_logs and "Fetching spark://" in executor_logs
