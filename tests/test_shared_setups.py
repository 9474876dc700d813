"""Configuration for shared catalogs and clusters, without servers: environment references in dsr.yaml,
the examples, launcher precedence, the code shipped to executors, the S3A jar fetch."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from lakehouse_dsr.cli import app
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.exceptions import ConfigError, EnvironmentSetupError
from lakehouse_dsr.lake import connectors
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
    assert conf["spark.jars"].startswith(str(spark_module.iceberg_jar()))
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
    assert result.stdout.strip().split(",") == [str(spark_module.iceberg_jar()), "/opt/jars/a.jar", "/opt/jars/b.jar"]
    own = write(tmp_path, "spark:\n  conf: {spark.jars: /opt/iceberg-spark-runtime-3.5_2.12-1.9.0.jar}\n")
    assert spark_module.session_jars(load_settings(own)) == ["/opt/iceberg-spark-runtime-3.5_2.12-1.9.0.jar"]


def test_a_session_without_the_iceberg_runtime_is_explained():
    class NoIceberg:  # a JVM whose class loader lacks Iceberg, as py4j reports it
        def __getattr__(self, name):
            return self

        def __call__(self, *args):
            raise RuntimeError("java.lang.ClassNotFoundException: org.apache.iceberg.spark.SparkCatalog")

    session = SimpleNamespace(sparkContext=SimpleNamespace(_jvm=NoIceberg()))
    with pytest.raises(EnvironmentSetupError, match=r"pass --jars \"\$\(dsr -c dsr.yaml jars\)\""):
        spark_module._require_iceberg(session)


def test_executors_get_the_whole_package():
    with zipfile.ZipFile(spark_module._package_zip()) as zf:
        names = set(zf.namelist())
    package = Path(spark_module.__file__).resolve().parents[1]
    expected = {f"lakehouse_dsr/{p.relative_to(package)}" for p in package.rglob("*.py")} \
        | {"lakehouse_dsr/log4j2.properties", "lakehouse_dsr/demo/datamap.yaml"}  # read on import
    assert names == expected


def _fake_sdist(folder: Path, jars: dict[str, bytes]) -> None:
    with tarfile.open(folder / "sagemaker_pyspark-1.4.5.tar.gz", "w:gz") as tar:
        for name, content in jars.items():
            info = tarfile.TarInfo(f"sagemaker_pyspark-1.4.5/deps/jars/{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def _fake_pip(jars: dict[str, bytes], calls: list):
    def run(args, **kwargs):
        calls.append(args)
        _fake_sdist(Path(args[args.index("--dest") + 1]), jars)
        return subprocess.CompletedProcess(args, 0, "", "")

    return run


def test_s3a_jars_are_extracted_once_and_checked(tmp_path, monkeypatch):
    contents = {name: f"jar {name}".encode() for name in connectors.S3A_JARS}
    monkeypatch.setattr(connectors, "S3A_JARS", {n: hashlib.sha256(c).hexdigest() for n, c in contents.items()})
    calls: list = []
    monkeypatch.setattr(connectors.subprocess, "run", _fake_pip({**contents, "other.jar": b"x"}, calls))
    jars = connectors.s3a_jars(tmp_path / "cache")
    assert [j.read_bytes() for j in jars] == list(contents.values())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(contents)  # no sdist, no other jar
    assert connectors.s3a_jars(tmp_path / "cache") == jars and len(calls) == 1  # cached: no second download
    assert connectors.s3a_jars(tmp_path / "cache", fetch=False) == jars


def test_s3a_jar_with_a_wrong_checksum_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(connectors.subprocess, "run", _fake_pip({n: b"tampered" for n in connectors.S3A_JARS}, []))
    with pytest.raises(EnvironmentSetupError, match="does not match its pinned checksum"):
        connectors.s3a_jars(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    with pytest.raises(EnvironmentSetupError, match="dsr fetch-jars"):
        connectors.s3a_jars(tmp_path / "cache", fetch=False)


def test_failed_download_is_explained(tmp_path, monkeypatch):
    monkeypatch.setattr(connectors.subprocess, "run",
                        lambda args, **kw: subprocess.CompletedProcess(args, 1, "", "No matching distribution"))
    with pytest.raises(EnvironmentSetupError, match="could not download sagemaker-pyspark==1.4.5: No matching"):
        connectors.s3a_jars(tmp_path / "cache")
