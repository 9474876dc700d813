import pytest

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.exceptions import EnvironmentSetupError
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
    assert conf["spark.jars"].split(",") == [str(spark_module.iceberg_jar()), "/opt/extra.jar"]
    assert conf["spark.sql.extensions"] == spark_module.EXTENSIONS


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


def test_missing_jar_is_explained(monkeypatch):
    monkeypatch.setattr(spark_module, "ICEBERG_JAR", "iceberg-spark-runtime-0.0.jar")
    with pytest.raises(EnvironmentSetupError, match="snowpark-connect-deps-iceberg==1.0.2"):
        spark_module.iceberg_jar()
