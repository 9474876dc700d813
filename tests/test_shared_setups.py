"""Configuration for shared catalogs and clusters, without servers: environment references in dsr.yaml,
the examples, launcher precedence, the code shipped to executors, the Spark-side jars from Maven."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from lakehouse_dsr.cli import app
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.exceptions import ConfigError, EnvironmentSetupError
from lakehouse_dsr.lake import jars
from lakehouse_dsr.lake import spark as spark_module

EXAMPLES = Path(__file__).parent.parent / "examples"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dsr.yaml"
    path.write_text(text)
    return path


def test_environment_references_are_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("DSR_T_URI", "http://catalog:8181")
    monkeypatch.setenv("DSR_T_KEY", "k$y{x}")  # a value is inserted as is, never expanded again
    monkeypatch.delenv("DSR_T_UNSET", raising=False)
    settings = load_settings(write(tmp_path, """
catalog:
  properties: {type: rest, uri: "${DSR_T_URI}", credential: "${DSR_T_KEY}:s", warehouse: wh}
spark:
  master: ${DSR_T_UNSET:-local[1]}
  conf: {spark.jars: "${DSR_T_UNSET:-}", spark.x: "a$b ${}"}
purge: {orphan_min_age_minutes: "${DSR_T_UNSET:-5}"}
"""))
    assert settings.catalog.properties["uri"] == "http://catalog:8181"
    assert settings.catalog.properties["credential"] == "k$y{x}:s"
    assert settings.spark.master == "local[1]" and settings.spark.conf["spark.jars"] == ""
    assert settings.spark.conf["spark.x"] == "a$b ${}"  # not a reference: left alone
    assert settings.purge.orphan_min_age_minutes == 5
    # A REST catalog's warehouse names a warehouse on the server: not turned into a local path.
    assert settings.catalog.properties["warehouse"] == "wh" and settings.catalog.local_warehouse() is None


def test_unset_environment_reference_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DSR_T_SECRET", "s3cr3t-value")
    monkeypatch.delenv("DSR_T_UNSET", raising=False)
    path = write(tmp_path, "catalog:\n  properties: {type: jdbc, uri: '${DSR_T_SECRET}', "
                           "jdbc.password: '${DSR_T_UNSET}'}\n")
    with pytest.raises(ConfigError, match="DSR_T_UNSET, which is not set") as err:
        load_settings(path)
    assert "s3cr3t" not in str(err.value)


EXAMPLE_ENV = {
    "rest-s3.yaml": {"DSR_JARS": "/jars", "DSR_REST_URI": "http://127.0.0.1:8181", "DSR_S3_ENDPOINT": "http://s3",
                     "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
    "jdbc-postgres.yaml": {"DSR_PG_URI": "jdbc:postgresql://127.0.0.1:5432/catalog", "DSR_PG_USER": "dsr",
                           "DSR_PG_PASSWORD": "pw"},
    "jdbc-sqlite.yaml": {},
}


@pytest.mark.parametrize("example", sorted(EXAMPLE_ENV))
def test_examples_load_and_name_every_variable_they_need(example, monkeypatch, tmp_path):
    for name in [*EXAMPLE_ENV[example], "DSR_SPARK_MASTER", "DSR_WAREHOUSE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in EXAMPLE_ENV[example].items():
        monkeypatch.setenv(name, value)
    settings = load_settings(EXAMPLES / example)
    assert settings.spark.master == "local[*]"
    assert settings.datamap == demo_datamap()  # the demo's whole map, written out: there is no default one
    conf = spark_module.session_conf(settings)
    assert not (EXAMPLES / "catalog.db").exists()  # computing the conf touches no database
    assert conf["spark.jars"].startswith(",".join(map(str, jars.resolve())))
    if example == "rest-s3.yaml":
        assert conf["spark.sql.catalog.lakehouse.uri"] == "http://127.0.0.1:8181"
        assert conf["spark.sql.catalog.lakehouse.credential"] == "k:s"
        assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://s3"
    else:
        assert settings.catalog.properties["type"] == "jdbc"
        sqlite = example == "jdbc-sqlite.yaml"  # Spark must not create the tables (its lock would block pyiceberg)
        assert (conf.get("spark.sql.catalog.lakehouse.jdbc.init-catalog-tables") == "false") == sqlite
        assert settings.catalog.local_warehouse() == EXAMPLES / "lakehouse"  # relative to the file
    for name in EXAMPLE_ENV[example]:  # each variable is required: unset, the error names it
        monkeypatch.delenv(name)
        with pytest.raises(ConfigError, match=name):
            load_settings(EXAMPLES / example)
        monkeypatch.setenv(name, EXAMPLE_ENV[example][name])


def test_a_launcher_keeps_its_master_jars_and_anything_it_set():
    conf = {"spark.master": "local[*]", "spark.jars": "/a.jar", "spark.driver.extraJavaOptions": "-Dx",
            "spark.sql.shuffle.partitions": "8", "spark.executor.memory": "2g",
            "spark.sql.catalog.lakehouse.type": "rest"}
    launched = {"spark.executor.memory": "1g", "spark.app.name": "job", "spark.master": "local[2]"}
    kept = spark_module.launcher_wins(conf, launched)
    assert kept == {"spark.sql.shuffle.partitions": "8", "spark.sql.catalog.lakehouse.type": "rest"}
    # our Python daemon module runs where the driver's interpreter (with this package) runs the workers
    ours = {**conf, spark_module.PYTHON_DAEMON: "lakehouse_dsr.lake.pydaemon"}
    assert spark_module.PYTHON_DAEMON in spark_module.launcher_wins(ours, launched)
    cluster = {**launched, "spark.master": "spark://h:7077"}
    assert spark_module.PYTHON_DAEMON not in spark_module.launcher_wins(ours, cluster)


def test_session_jars_and_the_jars_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DSR_T_JARS", "/opt/jars")
    config = write(tmp_path, "spark:\n  conf: {spark.jars: '${DSR_T_JARS}/a.jar,${DSR_T_JARS}/b.jar'}\n")
    result = CliRunner().invoke(app, ["-c", str(config), "jars"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout.strip().split(",") == [*map(str, jars.resolve()), "/opt/jars/a.jar", "/opt/jars/b.jar"]
    # a config that brings its own Iceberg runtime, or packages for Ivy, gets only its own
    own = write(tmp_path, "spark:\n  conf: {spark.jars: /opt/iceberg-spark-runtime-3.5_2.12-1.9.0.jar}\n")
    assert spark_module.session_jars(load_settings(own)) == ["/opt/iceberg-spark-runtime-3.5_2.12-1.9.0.jar"]
    packages = write(tmp_path, "spark:\n  conf: {spark.jars.packages: 'io.delta:delta-spark_2.12:3.3.2', "
                               "spark.jars: /opt/a.jar}\n")
    assert spark_module.session_jars(load_settings(packages)) == ["/opt/a.jar"]
    provided = write(tmp_path, "spark:\n  format_jars: provided\n")
    result = CliRunner().invoke(app, ["-c", str(provided), "jars"], catch_exceptions=False)
    assert result.exit_code == 0 and result.stdout.strip() == ""
    # a local glob names the files it matches (either Spark line's S3A jars from one config); a glob
    # matching nothing, and a remote path, stay as written for Spark to report
    s3a = tmp_path / "s3a"
    s3a.mkdir()
    for name in ("hadoop-aws-3.4.2.jar", "bundle-2.29.52.jar", "delta-storage-4.4.0.jar"):
        (s3a / name).write_bytes(b"jar")
    globs = write(tmp_path, f"spark:\n  format_jars: provided\n  conf: {{spark.jars: '{s3a}/hadoop-aws-*.jar,"
                            f"file:{s3a}/*bundle-*.jar,{s3a}/nothing-*.jar,s3a://b/x-*.jar'}}\n")
    assert spark_module.session_jars(load_settings(globs)) == [
        f"{s3a}/hadoop-aws-3.4.2.jar", f"{s3a}/bundle-2.29.52.jar", f"{s3a}/nothing-*.jar", "s3a://b/x-*.jar"]


@pytest.mark.parametrize("missing", [{"org.apache.iceberg.spark.SparkCatalog"}, {"io.delta.tables.DeltaTable"},
                                     {"org.apache.iceberg.spark.SparkCatalog", "io.delta.tables.DeltaTable"}])
def test_a_session_without_a_formats_jar_is_explained(missing):
    class Lacking:  # a JVM whose class loader lacks `missing`, as py4j reports it
        def __getattr__(self, name):
            return self

        def __call__(self, *args):
            if args and args[0] in missing:
                raise RuntimeError(f"java.lang.ClassNotFoundException: {args[0]}")
            return self

    session = SimpleNamespace(sparkContext=SimpleNamespace(_jvm=Lacking()))
    with pytest.raises(EnvironmentSetupError, match=r"pass --jars \"\$\(dsr -c dsr.yaml jars\)\"") as err:
        spark_module._require_formats(session)
    assert ("Iceberg" in str(err.value)) == ("org.apache.iceberg.spark.SparkCatalog" in missing)
    assert ("Delta" in str(err.value)) == ("io.delta.tables.DeltaTable" in missing)


def test_executors_get_the_whole_package():
    with zipfile.ZipFile(spark_module._package_zip()) as zf:
        names = set(zf.namelist())
    package = Path(spark_module.__file__).resolve().parents[1]
    expected = {f"lakehouse_dsr/{p.relative_to(package)}" for p in package.rglob("*.py")} \
        | {"lakehouse_dsr/log4j2.properties", "lakehouse_dsr/demo/datamap.yaml"}  # read on import
    assert names == expected


FAKE_MVN = """#!{python}
import pathlib, sys
args = sys.argv[1:]
with open({calls!r}, "a") as log:
    log.write(" ".join(args) + "\\n")
out = pathlib.Path(next(a for a in args if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
out.mkdir(parents=True, exist_ok=True)
names = {names!r} + ({s3a!r} if "s3a" in args else [])
if "-DexcludeTransitive=true" not in args:  # the broker's list: its runtime closure
    names = {broker!r}
for name in names[:{written}]:
    (out / name).write_bytes(b"jar " + name.encode())
if {fail!r}:
    print("[ERROR] Failed to execute goal on project spark-3.5-jars: Could not resolve dependencies")
    print("[ERROR] Could not transfer artifact from/to central: repo.maven.apache.org: Name or service not known")
    sys.exit(1)
"""
FORMATS = ["iceberg-spark-runtime-3.5_2.12-1.10.2.jar", "delta-spark_2.12-3.3.2.jar", "delta-storage-3.3.2.jar"]
S3A = ["hadoop-aws-3.3.4.jar", "aws-java-sdk-bundle-1.12.262.jar"]
BROKER = ["kafka_2.13-4.1.1.jar", "kafka-clients-4.1.1.jar", "log4j-slf4j-impl-2.24.3.jar", "slf4j-api-1.7.36.jar"]


def fake_mvn(tmp_path: Path, monkeypatch, fail: bool = False, written: int = 99) -> Path:
    """An `mvn` that copies made-up jars where it is told (and logs each call's arguments), or fails
    after copying `written` of them."""
    calls = tmp_path / "mvn-calls"
    calls.touch()
    script = tmp_path / "bin" / "mvn"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_MVN.format(python=sys.executable, calls=str(calls), names=FORMATS, s3a=S3A, broker=BROKER,
                                      written=written, fail=fail))
    script.chmod(0o755)
    monkeypatch.setattr(jars, "MVN", str(script))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return calls


def test_jars_are_fetched_once_then_come_from_the_cache_without_mvn(tmp_path, monkeypatch):
    calls = fake_mvn(tmp_path, monkeypatch)
    found = jars.resolve("3.5")
    folder = tmp_path / "cache" / "lakehouse-dsr" / "jars" / "spark-3.5" / "formats"
    assert [jar.name for jar in found] == sorted(FORMATS) and all(jar.parent == folder for jar in found)
    assert [jar.read_bytes() for jar in found] == [b"jar " + jar.name.encode() for jar in found]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["formats"]  # no staging folder left
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FORMATS, jars.MANIFEST])
    args = calls.read_text().splitlines()
    assert len(args) == 1 and "-P" not in args[0].split()
    assert "dependency:copy-dependencies -DexcludeTransitive=true -DincludeScope=runtime" in args[0]
    assert jars.resolve("3.5") == found and jars.resolve("3.5", fetch=False) == found
    assert len(calls.read_text().splitlines()) == 1  # cached: no second mvn
    with_s3a = jars.resolve("3.5", s3a=True)  # a folder of its own, with the profile
    assert [jar.name for jar in with_s3a] == sorted(FORMATS + S3A) and with_s3a[0].parent == folder.parent / "s3a"
    assert "-P s3a" in calls.read_text().splitlines()[-1]
    # a jar gone: the cache is incomplete, and is fetched again
    found[0].unlink()
    with pytest.raises(EnvironmentSetupError, match=r"run `dsr fetch-jars` \(make install does\)"):
        jars.resolve("3.5", fetch=False)
    assert jars.resolve("3.5") == found and len(calls.read_text().splitlines()) == 3


def test_a_changed_pom_fetches_again_and_drops_the_old_versions(tmp_path, monkeypatch):
    calls = fake_mvn(tmp_path, monkeypatch)
    poms = tmp_path / "poms"
    poms.mkdir()
    pom = poms / "spark-3.5.xml"
    pom.write_bytes(jars.pom("3.5").read_bytes())
    monkeypatch.setattr(jars, "_POMS", poms)
    first = jars.resolve("3.5")
    old = first[0].parent / "iceberg-spark-runtime-3.5_2.12-1.9.0.jar"  # as an older pom would have left it
    old.write_bytes(b"old")
    pom.write_text(pom.read_text().replace("<version>1.10.2</version>", "<version>1.10.3</version>"))
    with pytest.raises(EnvironmentSetupError, match="dsr fetch-jars"):
        jars.resolve("3.5", fetch=False)
    assert jars.resolve("3.5") == first and len(calls.read_text().splitlines()) == 2
    assert not old.exists()


def test_a_missing_mvn_is_explained_and_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(jars, "MVN", "mvn-not-installed-here")
    with pytest.raises(EnvironmentSetupError, match="install Maven") as err:
        jars.resolve("3.5")
    assert "spark.jars.packages" in str(err.value) and "spark.format_jars: provided" in str(err.value)
    assert not (tmp_path / "cache" / "lakehouse-dsr" / "jars" / "spark-3.5" / "formats").exists()


@pytest.mark.parametrize("written", [0, 2])  # nothing copied, or some jars before the failure
def test_a_failing_mvn_is_explained_and_leaves_no_complete_looking_cache(tmp_path, monkeypatch, written):
    calls = fake_mvn(tmp_path, monkeypatch, fail=True, written=written)
    with pytest.raises(EnvironmentSetupError, match=r"mvn could not fetch the Spark 3.5 jars \(exit 1\)") as err:
        jars.resolve("3.5")
    assert "Name or service not known" in str(err.value)  # the last lines of mvn's output
    parent = tmp_path / "cache" / "lakehouse-dsr" / "jars" / "spark-3.5"
    assert list(parent.iterdir()) == []  # neither a cache folder nor mvn's staging folder
    with pytest.raises(EnvironmentSetupError, match="dsr fetch-jars"):
        jars.resolve("3.5", fetch=False)
    assert len(calls.read_text().splitlines()) == 1


def test_the_spark_line_follows_pyspark(monkeypatch):
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "4.1.4")
    assert jars.spark_line() == "4.1"
    monkeypatch.setattr(pyspark, "__version__", "3.4.3")
    with pytest.raises(EnvironmentSetupError, match=r"PySpark 3.4.3 .*supported: 3.5, 4.1"):
        jars.spark_line()
    with pytest.raises(EnvironmentSetupError, match="no jars are declared for Spark 3.4"):
        jars.resolve("3.4")


def test_the_default_lines_jars_resolve_from_maven(monkeypatch):
    """Not mocked: the real pom through the real `mvn` (or the machine's cache, as `make install` left it)."""
    found = jars.resolve()
    assert found and all(jar.is_file() and jar.stat().st_size > 0 for jar in found)
    names = [jar.name for jar in found]
    assert any(name.startswith("iceberg-spark-runtime-") for name in names)
    assert any(name.startswith("delta-spark_") for name in names)


def test_the_kafka_brokers_jars_are_fetched_with_their_runtime_closure_into_a_folder_of_their_own(
        tmp_path, monkeypatch):
    calls = fake_mvn(tmp_path, monkeypatch)
    found = jars.broker()
    folder = tmp_path / "cache" / "lakehouse-dsr" / "jars" / "kafka-broker"
    assert [jar.name for jar in found] == sorted(BROKER) and all(jar.parent == folder for jar in found)
    (args,) = calls.read_text().splitlines()
    assert "-DexcludeTransitive" not in args and "-P" not in args.split()
    assert "dependency:copy-dependencies -DincludeScope=runtime" in args
    assert jars.broker(fetch=False) == found and jars.resolve("3.5") != found  # the Spark line's: its own
    found[0].unlink()
    with pytest.raises(EnvironmentSetupError, match=r"run `dsr fetch-jars --kafka-broker` \(make integration-deps"):
        jars.broker(fetch=False)


def test_the_fetch_jars_command_fetches_the_brokers_jars_alone(tmp_path, monkeypatch):
    fake_mvn(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["fetch-jars", "--kafka-broker"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout.strip() == str(tmp_path / "cache" / "lakehouse-dsr" / "jars" / "kafka-broker")
    refused = CliRunner().invoke(app, ["fetch-jars", "--kafka-broker", "--s3a"])
    assert refused.exit_code == 2 and "--kafka-broker fetches the broker's jars alone" in refused.output


def test_the_fetch_jars_command_prints_the_folder(tmp_path, monkeypatch):
    fake_mvn(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["fetch-jars", "--s3a", "--line", "3.5"], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout.strip() == str(tmp_path / "cache" / "lakehouse-dsr" / "jars" / "spark-3.5" / "s3a")
