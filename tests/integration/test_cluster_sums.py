"""The collateral check's row sums (lake/hashsum.py), key membership (lake/membership.py) and the
export's private files (lake/privatefiles.py) on a standalone cluster: the tasks run in executor JVMs
of their own, which load HashSum, Membership and PrivateFiles from the jars the driver adds to its
SparkContext (the key set comes as a broadcast), and what comes back to the driver is Spark's own
accumulator, or each file's SHA-256. The client runs in a process of its own (one
SparkContext per JVM)."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys

from .servers import spark_cluster

CLIENT = """
import json, sys
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.types import LongType
from lakehouse_dsr.lake.hashsum import hash_sum
from lakehouse_dsr.lake.membership import membership
from lakehouse_dsr.lake.privatefiles import written
from lakehouse_dsr.lake.jars import resolve
spark = (SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false")
         .config("spark.jars", ",".join(map(str, resolve()))).getOrCreate())
sums = hash_sum(spark)
rows = spark.range(0, 100_000, 1, 4).where(sums.adding(F.col("id"))).count()
wanted = spark._jvm.java.util.ArrayList([7, 99_999, 123_456])
members = spark.range(0, 100_000, 1, 4).where(membership(spark, wanted, F.col("id"), LongType())).count()
files = spark.range(0, 3, 1, 3).select(F.concat(F.col("id").cast("string"), F.lit(".txt")).alias("name"))
hashes = {r.name: r.sha for r in files.select("name", written(spark, sys.argv[2], F.col("name"), F.col("name"))
                                                      .alias("sha")).collect()}
print(json.dumps({"rows": rows, "counted": sums.rows, "total": sums.total, "members": members,
                  "master": spark.sparkContext.master, "files": hashes}))
spark.stop()
"""


def test_row_sums_and_key_membership_on_executors_of_a_standalone_cluster(tmp_path):
    (tmp_path / "cluster").mkdir()
    with spark_cluster(tmp_path / "cluster", workers=1) as cluster:
        (tmp_path / "packages").mkdir(mode=0o700)
        done = subprocess.run([sys.executable, "-c", CLIENT, cluster.master_url, str(tmp_path / "packages")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        executor_logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "cluster" / "work").rglob("stderr"))
    names = [f"{i}.txt" for i in range(3)]
    assert seen == {"rows": 100_000, "counted": 100_000, "total": sum(range(100_000)), "members": 2,
                    "master": cluster.master_url, "files": {n: hashlib.sha256(n.encode()).hexdigest() for n in names}}
    for name in names:  # written by the executors, owner-only
        path = tmp_path / "packages" / name
        assert path.read_text() == name and stat.S_IMODE(path.stat().st_mode) == 0o600
    # the classes came from the driver
    assert "HashSum-" in executor_logs and "Membership-" in executor_logs and "PrivateFiles-" in executor_logs
    assert "Fetching spark://" in executor_logs
