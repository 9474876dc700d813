import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from py4j.finalizer import ThreadSafeFinalizer
from pyspark import SparkContext

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.exceptions import ConfigError, EnvironmentSetupError
from lakehouse_dsr.lake import jars, jvm
from lakehouse_dsr.lake import spark as spark_module


def test_catalog_properties_and_user_conf_become_spark_conf(tmp_path):
    settings = settings_from_dict({
        "catalog": {"name": "prod", "properties": {"type": "jdbc", "uri": "jdbc:sqlite:/x.db"}},
        "spark": {"conf": {"spark.sql.shuffle.partitions": 64, "spark.jars": "/opt/extra.jar"}},
    }, base=tmp_path)
    conf = spark_module.session_conf(settings)
    assert conf["spark.sql.catalog.prod"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.prod.type"] == "jdbc" and conf["spark.sql.catalog.prod.uri"] == "jdbc:sqlite:/x.db"
    assert conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.jars"].split(",") == [*map(str, jars.resolve()), "/opt/extra.jar"]
    assert conf["spark.sql.extensions"] == spark_module.EXTENSIONS


def test_every_session_gets_both_formats_extensions_and_deltas_session_catalog(tmp_path):
    conf = spark_module.session_conf(settings_from_dict({}, base=tmp_path))
    assert conf["spark.sql.extensions"].split(",") == [  # Iceberg's parser outermost: its procedures need it
        "io.delta.sql.DeltaSparkSessionExtension", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"]
    assert conf["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert conf["spark.sql.catalog.lakehouse"] == "org.apache.iceberg.spark.SparkCatalog"
    names = [Path(jar).name for jar in conf["spark.jars"].split(",")]
    assert any(n.startswith("iceberg-spark-runtime-") for n in names)
    assert any(n.startswith("delta-spark_") for n in names)
    own = settings_from_dict({"spark": {"conf": {"spark.sql.catalog.spark_catalog": "my.Catalog",
                                                 "spark.sql.extensions": "my.Extensions"}}}, base=tmp_path)
    conf = spark_module.session_conf(own)  # the user's conf still wins
    assert conf["spark.sql.catalog.spark_catalog"] == "my.Catalog" and conf["spark.sql.extensions"] == "my.Extensions"


def test_a_cluster_that_provides_the_format_jars_gets_none_from_the_engine(tmp_path, monkeypatch):
    def no_fetch(*args, **kwargs):
        raise AssertionError("provided: the engine resolves no jar")

    monkeypatch.setattr(jars, "resolve", no_fetch)
    provided = settings_from_dict({"spark": {"format_jars": "provided"}}, base=tmp_path)
    assert spark_module.session_jars(provided) == []
    conf = spark_module.session_conf(provided)
    assert "spark.jars" not in conf and "spark.driver.extraClassPath" not in conf
    assert conf["spark.sql.extensions"] == spark_module.EXTENSIONS  # the cluster's jars still need them
    own = settings_from_dict({"spark": {"format_jars": "provided", "conf": {"spark.jars": "/opt/extra.jar"}}},
                             base=tmp_path)
    assert spark_module.session_conf(own)["spark.jars"] == "/opt/extra.jar"
    with pytest.raises(ConfigError, match="format_jars"):
        settings_from_dict({"spark": {"format_jars": "ivy"}}, base=tmp_path)


def test_user_supplied_iceberg_package_replaces_the_bundled_jar(tmp_path):
    pkg = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.2"
    settings = settings_from_dict({"spark": {"conf": {"spark.jars.packages": pkg}}}, base=tmp_path)
    conf = spark_module.session_conf(settings)
    assert "spark.jars" not in conf and conf["spark.jars.packages"] == pkg


def test_missing_java_is_explained(monkeypatch):
    monkeypatch.setattr(spark_module.shutil, "which", lambda _: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(EnvironmentSetupError, match="openjdk-17-jre-headless"):
        spark_module.build_session(settings_from_dict({}))


def test_jars_that_cannot_be_fetched_stop_the_session_before_spark_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing cached
    monkeypatch.setattr(jars, "MVN", "mvn-not-installed-here")
    with pytest.raises(EnvironmentSetupError, match="install Maven"):
        spark_module.build_session(settings_from_dict({}, base=tmp_path))


def test_driver_jvm_flags_follow_the_class_archive_and_the_lake_size(tmp_path, monkeypatch):
    resolved = jars.resolve()  # the machine's cache, before the archive's moves to tmp_path
    monkeypatch.setattr(jars, "resolve", lambda *args, **kwargs: resolved)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = settings_from_dict({}, base=tmp_path)

    def java_options(**kwargs) -> str:
        return spark_module.session_conf(settings, jvm.driver_options(**kwargs))["spark.driver.extraJavaOptions"]

    assert "-XX:SharedArchiveFile" not in java_options() and "TieredStopAtLevel" not in java_options()
    assert "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m" in java_options(quick_jit=True)
    archive = jvm.archive_path()
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"recorded")
    assert f"-XX:SharedArchiveFile={archive}" in java_options()
    recording = java_options(record_to=tmp_path / "new.jsa")  # never read one archive while writing another
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}" in recording and "SharedArchiveFile" not in recording
    # the format jars on the driver's own class path (so their classes can be archived), local masters only
    assert spark_module.session_conf(settings)["spark.driver.extraClassPath"] == os.pathsep.join(map(str, resolved))
    cluster = settings_from_dict({"spark": {"master": "spark://h:7077"}}, base=tmp_path)
    assert "spark.driver.extraClassPath" not in spark_module.session_conf(cluster)
    own = settings_from_dict({"spark": {"conf": {"spark.driver.extraJavaOptions": "-Dmine=1"}}}, base=tmp_path)
    conf = spark_module.session_conf(own, jvm.driver_options(quick_jit=True))
    assert conf["spark.driver.extraJavaOptions"] == "-Dmine=1"


def test_spark_submits_launcher_gets_the_quick_compiler_and_its_own_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert jvm.launcher_options() == "-XX:TieredStopAtLevel=1"
    archive = jvm.archive_path("launcher")
    assert archive.name.startswith("launcher-") and archive.parent == jvm.archive_path().parent
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"recorded")
    assert f"-XX:SharedArchiveFile={archive}" in jvm.launcher_options()
    recording = jvm.launcher_options(record_to=tmp_path / "new.jsa")
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}" in recording and "SharedArchiveFile" not in recording


def test_small_lakes_get_interpreted_queries_unless_the_user_says_otherwise(tmp_path):
    settings = settings_from_dict({}, base=tmp_path)
    assert not set(spark_module.INTERPRETED) & set(spark_module.session_conf(settings))
    assert spark_module.session_conf(settings, interpreted=True).items() >= spark_module.INTERPRETED.items()
    own = settings_from_dict({"spark": {"conf": {"spark.sql.codegen.wholeStage": "true"}}}, base=tmp_path)
    conf = spark_module.session_conf(own, interpreted=True)
    assert conf["spark.sql.codegen.wholeStage"] == "true" and conf["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"


@pytest.mark.parametrize("small", [True, False])
def test_run_and_verify_start_small_lakes_with_both_and_other_commands_with_neither(tmp_path, monkeypatch, small):
    from lakehouse_dsr import cli

    started: list[dict] = []
    kept: list[dict] = []
    monkeypatch.setattr(spark_module, "build_session", lambda settings, **how: started.append(how) or how)
    closed: list[dict] = []
    monkeypatch.setattr(spark_module, "keep_java_objects", kept.append)
    monkeypatch.setattr(spark_module, "close_gateway", closed.append)
    monkeypatch.setattr(jvm, "small_lake", lambda settings: small)
    monkeypatch.setattr(cli, "_state", {"settings": settings_from_dict({}, base=tmp_path)})
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)  # as in a new `dsr` process
    cli._spark(by_lake_size=True)
    cli._state.pop("spark")
    cli._spark()  # generate, bench: whatever the lake's size
    assert started == [{"quick_jit": small, "interpreted": small}, {"quick_jit": False, "interpreted": False}]
    assert kept == ([started[0]] if small else [])
    monkeypatch.setattr(cli, "app", lambda **how: None)  # the command has run: `dsr` ends
    cli._state["command"] = "demo"
    cli._done_with_spark(started[1])
    assert closed == []  # demo's run goes on to other commands on the same session
    cli._state["command"] = "run"
    cli._done_with_spark(started[1])  # `dsr run`'s Spark work is over: its JVM exits meanwhile
    assert closed == [started[1]]
    cli.entry()
    assert closed == [started[1]]  # once: a JVM the process started ends with it, whatever the lake's size
    cli._state["own_jvm"] = True  # a command that did not hand its session back
    cli.entry()
    assert closed == [started[1]] * 2

    def broken(session):
        raise RuntimeError("gateway gone")
    monkeypatch.setattr(spark_module, "close_gateway", broken)
    cli._state["own_jvm"] = True
    cli._done_with_spark(started[1])  # the run goes on to record its outcomes
    assert gc.get_freeze_count() > 0  # the imports' objects: out of the collector's way
    monkeypatch.setattr(SparkContext, "_active_spark_context", object())  # a notebook's context, say
    cli._state.pop("spark")
    cli._spark(by_lake_size=True)
    assert len(kept) == (1 if small else 0)  # objects of a session the caller goes on using are released
    cli._done_with_spark(started[2])
    cli.entry()
    assert len(closed) == 2  # and its gateway stays open


def test_a_closed_gateway_lets_the_jvm_exit_at_once_after_sparks_own_shutdown(tmp_path):
    """A new Python process starts a session and closes its gateway: its JVM exits while Python goes
    on, after Spark's shutdown hooks deleted the session's temporary folders; calls after the close
    fail, and nothing is printed about the connections the JVM's exit ends."""
    script = tmp_path / "own.py"
    script.write_text(f"""
import time
from pyspark.sql import SparkSession
from lakehouse_dsr.lake.spark import close_gateway
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.local.dir", {str(tmp_path / "local")!r}).getOrCreate())
added = spark.sparkContext.accumulator(0)
spark.sparkContext.parallelize([1, 2], 1).foreach(added.add)  # the JVM connects to PySpark's accumulator server
spark.range(3).count()  # a job: block manager folders under spark.local.dir
jvm = spark.sparkContext._gateway.proc  # the JVM PySpark launched, a child of this process
close_gateway(spark)
try:
    spark.range(1).count()
except Exception as exc:
    print("refused:", type(exc).__name__, flush=True)
print("jvm exited before python:", jvm.wait(timeout=60) is not None, flush=True)
time.sleep(1.5)  # PySpark's accumulator server polls its connection every second
""")
    (tmp_path / "local").mkdir()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    refused, exited = done.stdout.split("\n")[:2]
    assert refused.startswith("refused: ")  # at once: no connection accepted and left unanswered
    assert exited == "jvm exited before python: True"
    assert list((tmp_path / "local").iterdir()) == []  # blockmgr-* and spark-* folders: the hooks ran
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr[-3000:]


def test_kept_java_objects_are_not_released_one_by_one(spark):
    gateway = spark.sparkContext._gateway
    client = gateway._gateway_client

    def released(proxy) -> bool:  # Py4J's finalizer key: a message to the JVM once Python collects it
        return f"{client.address}{client.port}{proxy._target_id}" in ThreadSafeFinalizer.finalizers

    assert all(released(gateway.jvm.java.util.ArrayList()) for _ in range(5))
    try:
        spark_module.keep_java_objects(spark)
        assert not any(released(gateway.jvm.java.util.ArrayList()) for _ in range(5))
    finally:  # the suite's session lives on
        gateway.gateway_property.enable_memory_management = True


def test_lake_size_read_from_table_metadata_decides_the_quick_compiler(new_lakehouse, monkeypatch, tmp_path):
    settings = new_lakehouse()
    size = jvm.mapped_bytes(settings)
    assert 0 < size <= jvm.QUICK_JIT_MAX_BYTES and jvm.small_lake(settings)
    monkeypatch.setattr(jvm, "QUICK_JIT_MAX_TABLES", len(settings.datamap.tables) - 1)
    assert not jvm.small_lake(settings)  # many small tables make a long run: both compilers pay off
    monkeypatch.setattr(jvm, "QUICK_JIT_MAX_TABLES", 12)
    monkeypatch.setattr(jvm, "QUICK_JIT_MAX_BYTES", size - 1)
    assert not jvm.small_lake(settings)
    monkeypatch.setattr(jvm, "QUICK_JIT_MAX_BYTES", 32 * 1024 * 1024)
    # a Delta table: its Parquet files on storage, not its log
    delta = tmp_path / "clicks"
    (delta / "_delta_log").mkdir(parents=True)
    (delta / "_delta_log" / f"{0:020d}.checkpoint.parquet").write_bytes(b"x" * 10**6)
    (delta / "part-0.parquet").write_bytes(b"x" * 1000)
    settings.datamap.tables["web.clicks"] = settings.datamap.tables["demo.events"].model_copy(
        update={"format": "delta", "path": str(delta)})
    assert jvm.mapped_bytes(settings) == size + 1000 and jvm.small_lake(settings)
    (delta / "part-1.parquet").write_bytes(b"x" * 32 * 1024 * 1024)
    assert not jvm.small_lake(settings)
    settings.datamap.tables["demo.missing"] = settings.datamap.tables["demo.events"]
    del settings.datamap.tables["web.clicks"]
    assert jvm.mapped_bytes(settings, limit=10**12) > 10**12 and not jvm.small_lake(settings)  # unreadable: big


def test_local_python_workers_import_the_installed_pyspark_not_the_bundled_zip(spark):
    import pyspark

    assert spark.sparkContext.getConf().get(spark_module.PYTHON_DAEMON) == "lakehouse_dsr.lake.pydaemon"

    def origin(_):
        import sys

        import pyspark as worker_pyspark
        return [(worker_pyspark.__file__, any(p.endswith(("pyspark.zip", "-src.zip")) for p in sys.path))]

    [(worker_file, zip_on_path)] = spark.sparkContext.parallelize([0], 1).mapPartitions(origin).collect()
    assert worker_file == pyspark.__file__ and not zip_on_path  # compiled once, not read from pyspark.zip


def test_the_bundled_zips_are_dropped_only_where_pyspark_is_then_spark_home_itself(tmp_path):
    import pyspark

    from lakehouse_dsr.lake.pydaemon import installed_pyspark_first

    home = str(Path(pyspark.__file__).parent)  # a pip-installed PySpark is its own SPARK_HOME
    zips = [f"{home}/python/lib/pyspark.zip", f"{home}/python/lib/py4j-0.10.9.7-src.zip"]
    rest = [p for p in sys.path if not p.endswith(".zip")]
    assert installed_pyspark_first([*zips, *rest], home) == rest
    distribution = tmp_path / "spark-3.5.9-bin"  # a Spark download: its zip is the only PySpark it has
    other = [f"{distribution}/python/lib/pyspark.zip", *rest]
    assert installed_pyspark_first(other, str(distribution)) == other
    assert installed_pyspark_first([*zips, *rest], None) == [*zips, *rest]


def test_our_python_daemon_is_named_for_local_masters_whose_workers_run_this_interpreter(tmp_path, monkeypatch):
    local = settings_from_dict({}, base=tmp_path)
    cluster = settings_from_dict({"spark": {"master": "spark://h:7077"}}, base=tmp_path)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert spark_module.session_conf(local)[spark_module.PYTHON_DAEMON] == "lakehouse_dsr.lake.pydaemon"
    assert spark_module.PYTHON_DAEMON not in spark_module.session_conf(cluster)
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")  # another interpreter: maybe without this package
    assert spark_module.PYTHON_DAEMON not in spark_module.session_conf(local)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    own = settings_from_dict({"spark": {"conf": {spark_module.PYTHON_DAEMON: "pyspark.daemon"}}}, base=tmp_path)
    assert spark_module.session_conf(own)[spark_module.PYTHON_DAEMON] == "pyspark.daemon"  # the user's wins


def test_stale_class_archives_are_removed_and_those_an_installation_here_can_use_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ours, launcher = jvm.archive_path(), jvm.archive_path("launcher")
    folder = ours.parent
    folder.mkdir(parents=True)

    def archive(installation: jvm.Installation | None, name: str | None = None, size: int = 10) -> Path:
        path = folder / (name or installation.archive_name())
        if installation is not None:
            path.with_name(path.name + ".json").write_text(json.dumps(dataclasses.asdict(installation)))
        path.write_bytes(b"x" * size)
        return path

    here = jvm.Installation.here()
    ours = archive(here)  # this installation's, noted: kept
    launcher.write_bytes(b"x")  # this installation's, recorded before archives were noted: kept
    other_venv = tmp_path / "venv2" / "jars"
    other_venv.mkdir(parents=True)
    other = archive(dataclasses.replace(here, jars=str(other_venv)))  # another virtualenv on this machine: kept
    upgraded_venv = tmp_path / "venv3" / "jars"
    upgraded_venv.mkdir(parents=True)
    upgraded = archive(dataclasses.replace(here, jars=str(upgraded_venv)), size=30)
    os.utime(upgraded_venv, ns=(1, 1))  # its Spark was reinstalled: the name it would use now differs
    java_gone = tmp_path / "jdk" / "bin" / "java"
    java_gone.parent.mkdir(parents=True)
    java_gone.write_text("")
    removed_java = archive(dataclasses.replace(here, java=str(java_gone)), size=20)
    java_gone.unlink()
    removed_venv = tmp_path / "venv4" / "pyspark"
    (removed_venv / "jars").mkdir(parents=True)
    gone_venv = archive(dataclasses.replace(here, jars=str(removed_venv / "jars")))
    shutil.rmtree(removed_venv)  # its virtualenv was deleted
    unnoted = archive(None, "spark-3.5.1-0123456789ab.jsa", size=40)  # recorded by an earlier version
    garbled = archive(None, "spark-3.5.1-ba9876543210.jsa")
    garbled.with_name(garbled.name + ".json").write_text("{not json")
    mistyped = archive(None, "spark-3.5.1-a1b2c3d4e5f6.jsa")
    mistyped.with_name(mistyped.name + ".json").write_text(json.dumps({**dataclasses.asdict(here), "java": 17}))
    staged = folder / f"{ours.name}.4242.tmp"  # another warm-up still writing: not an archive yet
    staged.write_bytes(b"x")
    orphan = folder / "spark-3.5.1-00000000feed.jsa.json"  # its warm-up was killed before placing the archive
    orphan.write_text(json.dumps(dataclasses.asdict(here)))
    os.utime(orphan, (1, 1))
    placing = folder / "spark-3.5.1-00000000cafe.jsa.json"  # a warm-up about to place its archive: kept
    placing.write_text(json.dumps(dataclasses.asdict(here)))

    removed = jvm.remove_stale_archives()

    assert sorted(removed) == sorted([(upgraded, 30), (removed_java, 20), (gone_venv, 10), (unnoted, 40),
                                      (garbled, 10), (mistyped, 10)])
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [ours.name, ours.name + ".json", launcher.name, other.name, other.name + ".json", staged.name, placing.name])
    assert jvm.remove_stale_archives() == []  # nothing more to remove
