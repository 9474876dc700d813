"""`dsr warm-up` records a class archive that later JVMs start with (a whole tiny run: slow suite)."""

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.lake import jvm
from lakehouse_dsr.lake import spark as spark_module

pytestmark = pytest.mark.slow


def test_warm_up_records_an_archive_the_next_session_starts_with(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    stale = tmp_path / "cache" / "lakehouse-dsr" / "cds" / "spark-3.4.0-0123456789ab.jsa"  # an earlier installation's
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 2**20)
    done = subprocess.run([sys.executable, "-m", "lakehouse_dsr", "warm-up"], capture_output=True, text=True,
                          cwd=tmp_path, env=os.environ, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    archive = jvm.archive_path()
    assert archive.is_file() and archive.stat().st_size > 10 * 2**20 and jvm.archive_usable(archive)
    launcher = jvm.archive_path("launcher")
    assert jvm.archive_usable(launcher)
    # each noted with its installation; nothing staged left; the stale archive removed
    assert sorted(p.name for p in archive.parent.iterdir()) == sorted(
        [archive.name, f"{archive.name}.json", launcher.name, f"{launcher.name}.json"])
    assert "removed 1 archive(s) of Java or Spark installations no longer here (1 MB)" in done.stdout
    # spark-submit's launcher, started as spark-class starts it, maps its classes from that archive
    jars = Path(pyspark.__file__).parent / "jars"
    launcher_main = ["org.apache.spark.launcher.Main", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]
    loaded = subprocess.run([str(jvm.java_binary()), "-Xmx128m", *jvm.launcher_options().split(), "-Xlog:class+load",
                             "-cp", f"{jars}/*", *launcher_main], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SPARK_HOME": str(jars.parent), "SPARK_SCALA_VERSION": "2.12"})
    assert "org.apache.spark.launcher.Main source: shared objects file (top)" in loaded.stdout, loaded.stderr[-2000:]
    assert not list(tmp_path.glob("hs_err*"))
    conf = spark_module.session_conf(settings_from_dict({}, base=tmp_path), jvm.driver_options())
    assert f"-XX:SharedArchiveFile={archive}" in conf["spark.driver.extraJavaOptions"]
    truncated = tmp_path / "truncated.jsa"  # what a crash mid-write would leave: it would crash the JVM
    truncated.write_bytes(archive.read_bytes()[:4096])
    assert not jvm.archive_usable(truncated)
