"""The Py4J bridge (lake/bridge.py, Bridge.java): its one-call answers about Iceberg metadata agree
with an independent reader (pyiceberg, the operating system's own listing), and the driver tuning
it installs keeps behaviour: files get the permissions Hadoop would give them, without a `chmod`
process; a class lookup still finds real classes and still refuses missing ones."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest

from lakehouse_dsr.lake import bridge, iceberg
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.table import listing, parquet_files_under, same_file

EVENTS = "demo.events"


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    from helpers import SEED, make_settings
    from lakehouse_dsr import synth
    from lakehouse_dsr.lake.spark import attach

    settings = make_settings(tmp_path_factory.mktemp("bridge"))
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=2)
    # a commit that removes rows
    spark.sql(f"DELETE FROM {settings.table(EVENTS)} WHERE pmod(xxhash64(event_id), 7) = 0")
    return settings


def test_snapshots_and_properties_match_pyiceberg(spark, lake):
    table = open_catalog(lake).load_table(EVENTS)
    current = Lake.of(spark, lake).table(EVENTS).current_snapshot()
    expected = table.current_snapshot()
    assert current.snapshot_id == expected.snapshot_id
    assert current.parent_id == expected.parent_snapshot_id
    assert current.committed_ms == expected.timestamp_ms
    assert current.operation == expected.summary.operation.value
    for key in ("total-records", "total-data-files", "total-delete-files", "deleted-records"):
        assert current.summary.get(key) == expected.summary.get(key), key
    assert current.counts()["total-records"] == int(expected.summary["total-records"])
    assert Lake.of(spark, lake).table(EVENTS).properties() == dict(table.properties)
    history = Lake.of(spark, lake).table(EVENTS).commits_since(table.snapshots()[0].snapshot_id, expected.snapshot_id)
    assert [c.snapshot_id for c in history] == [s.snapshot_id for s in table.snapshots()[1:]]


def test_live_files_and_listing_match_independent_readers(spark, lake):
    table = open_catalog(lake).load_table(EVENTS)
    jtable = Lake.of(spark, lake).table(EVENTS).java()
    live = iceberg._live_files(spark, jtable, jtable.currentSnapshot())
    data = [t.file.file_path for t in table.scan().plan_files()]
    deletes = [d.file_path for t in table.scan().plan_files() for d in t.delete_files]
    assert sorted(map(same_file, live)) == sorted(map(same_file, {*data, *deletes}))

    location = same_file(table.location())
    on_disk = sorted(os.path.join(d, f) for d, _, files in os.walk(location) for f in files
                     if not f.endswith(".crc"))  # Hadoop's checksum files, hidden by its local file system
    listed = listing(spark, table.location())
    assert sorted(same_file(p) for p, _ in listed) == on_disk
    assert all(abs(ms / 1000 - os.stat(same_file(p)).st_mtime) < 2 for p, ms in listed)
    assert sorted(map(same_file, parquet_files_under(spark, table.location()))) == \
        [p for p in on_disk if p.endswith(".parquet")]
    assert listing(spark, table.location() + "/no-such-folder") == []


def test_local_files_keep_hadoop_permissions(spark, tmp_path):
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}").getFileSystem(conf)
    assert fs.getRawFileSystem().getClass().getName() == "lakehouse_dsr.Bridge$LocalFiles"
    umask = os.umask(0)
    os.umask(umask)
    out = fs.create(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/a/b/file.bin"), True)
    out.write(bytearray(b"x"))
    out.close()
    assert (tmp_path / "a/b/file.bin").read_bytes() == b"x"
    assert stat.S_IMODE((tmp_path / "a/b/file.bin").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "a/b").stat().st_mode) == 0o777 & ~umask
    assert (tmp_path / "a/b/.file.bin.crc").exists(), "checksums as Hadoop's LocalFileSystem writes them"
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/a/b/file.bin"),
                     jvm.org.apache.hadoop.fs.permission.FsPermission.createImmutable(0o600))
    assert stat.S_IMODE(Path(tmp_path / "a/b/file.bin").stat().st_mode) == 0o600


def test_class_lookups_still_find_and_refuse(spark):
    strategy = spark._jvm.py4j.reflection.ReflectionUtil.getClassLoadingStrategy()
    assert strategy.getClass().getName() == "lakehouse_dsr.Bridge$RememberingClassLoading"
    assert not strategy.remembersMissing("org.example.NoSuchClass")
    for _ in range(2):  # the second time from memory
        with pytest.raises(Exception, match="ClassNotFoundException"):
            strategy.classForName("org.example.NoSuchClass")
        assert strategy.remembersMissing("org.example.NoSuchClass")
    assert not strategy.remembersMissing("org.apache.iceberg.Table")
    assert strategy.classForName("org.apache.iceberg.Table").getName() == "org.apache.iceberg.Table"
    assert bridge.jclass(spark, "org.apache.iceberg.expressions.Expressions").alwaysTrue().toString() == "true"


def test_compiled_classes_are_kept_in_a_jar_and_a_damaged_one_is_compiled_again(spark, tmp_path, monkeypatch):
    """A later JVM loads Bridge from the class cache instead of compiling it with Janino; a cache file
    that is not a jar is replaced by a fresh compile, and the class works either way."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = (Path(bridge.__file__).parent / "Bridge.java").read_text()
    jar = bridge.class_jar(spark, "Bridge", source)
    assert jar.parent == tmp_path / "lakehouse-dsr" / "classes"

    gateway, jvm = spark.sparkContext._gateway, spark._jvm

    def fresh() -> object:  # as in a new JVM: nothing made yet
        monkeypatch.setattr(bridge, "_cached", {})
        made = bridge.compiled(spark, "Bridge")
        assert made.getClass().getName() == "lakehouse_dsr.Bridge"
        # Through reflection: Py4J remembers methods by class name, and here one JVM holds two classes of that name.
        types, args = gateway.new_array(jvm.java.lang.Class, 1), gateway.new_array(jvm.java.lang.Object, 1)
        types[0], args[0] = jvm.java.lang.Class.forName("java.lang.Object"), "a"
        assert made.getClass().getMethod("toJson", types).invoke(made, args) == "\"a\""
        return made.getClass().getClassLoader()

    compiled_by = fresh()
    assert "janino" in compiled_by.getClass().getName().lower() or "compiler" in compiled_by.getClass().getName()
    assert {"lakehouse_dsr/Bridge.class", "lakehouse_dsr/Bridge$LocalFiles.class"} \
        <= set(zipfile.ZipFile(jar).namelist())
    cached_by = fresh()
    assert cached_by.getClass().getName() == "java.net.URLClassLoader"
    assert [u.getPath() for u in cached_by.getURLs()] == [str(jar)]
    jar.write_bytes(b"not a jar")
    assert "URLClassLoader" not in fresh().getClass().getName()
    assert zipfile.ZipFile(jar).testzip() is None  # written again, whole
    assert [p.name for p in jar.parent.iterdir()] == [jar.name]  # no staged file left
