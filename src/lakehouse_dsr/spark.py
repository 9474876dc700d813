"""Build the embedded SparkSession, or configure the caller's one for our catalog."""

from __future__ import annotations

import importlib.resources
import os
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from .config import Settings
from .exceptions import EnvironmentSetupError

ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def iceberg_jar() -> Path:
    """The Iceberg 1.10.2 Spark runtime shipped in the snowpark-connect-deps-iceberg wheel."""
    try:
        jar = importlib.resources.files("snowpark_connect_deps_iceberg") / "jars" / ICEBERG_JAR
    except ModuleNotFoundError:
        jar = None
    if jar is None or not jar.is_file():
        raise EnvironmentSetupError(
            f"the Iceberg runtime jar {ICEBERG_JAR} was not found: install "
            "'snowpark-connect-deps-iceberg==1.0.2' (make install does), or set "
            "spark.conf['spark.jars.packages'] / ['spark.jars'] in dsr.yaml to your own Iceberg runtime"
        )
    return Path(str(jar))


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") or (java_home and (Path(java_home) / "bin" / "java").exists()):
        return
    raise EnvironmentSetupError(
        "Java was not found: Spark needs Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless), "
        "on the PATH or under JAVA_HOME"
    )


def session_conf(settings: Settings) -> dict[str, str]:
    """Every Spark conf the engine needs, with the user's `spark.conf` taking precedence."""
    conf = {
        "spark.sql.extensions": EXTENSIONS,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",  # our own progress bars
        "spark.sql.shuffle.partitions": "8",
        f"spark.sql.catalog.{settings.catalog.name}": "org.apache.iceberg.spark.SparkCatalog",
    }
    user = settings.spark.conf
    if "spark.driver.extraJavaOptions" not in user:
        log_config = importlib.resources.files("lakehouse_dsr") / "log4j2.properties"
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log_config}"
    if "spark.jars.packages" not in user and "iceberg" not in user.get("spark.jars", ""):
        jars = [str(iceberg_jar())] + ([user["spark.jars"]] if user.get("spark.jars") else [])
        conf["spark.jars"] = ",".join(jars)
    for key, value in settings.catalog.properties.items():
        conf[f"spark.sql.catalog.{settings.catalog.name}.{key}"] = value
    for key, value in user.items():
        if key != "spark.jars":
            conf[key] = value
    return conf


def build_session(settings: Settings) -> SparkSession:
    """Start (or reuse) a SparkSession configured for the catalog in `settings`.

    Costs a JVM start (3-7 s) the first time in a process.
    """
    _check_java()
    if settings.spark.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no network lookups for a local session
        # Python workers (access exports run there) must see this environment's packages; PySpark
        # reads only this variable, not spark.pyspark.python.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.spark.master).appName(settings.spark.app_name)
    for key, value in session_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DSR_SPARK_LOG_LEVEL", "ERROR"))
    attach(spark, settings)
    return spark


def attach(spark: SparkSession, settings: Settings) -> None:
    """Register our catalog on an existing session (a notebook's, a cluster job's).

    Catalog settings are runtime SQL confs, so this works after start-up; the Iceberg jar and
    SQL extensions must already be on the session.
    """
    prefix = f"spark.sql.catalog.{settings.catalog.name}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    for key, value in settings.catalog.properties.items():
        spark.conf.set(f"{prefix}.{key}", value)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
