"""Build the embedded SparkSession, or configure the caller's one for our catalog."""

from __future__ import annotations

import atexit
import functools
import glob
import importlib.resources
import os
import shutil
import socket
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from pyspark import SparkConf
from pyspark.sql import SparkSession

from ..config import Settings
from ..exceptions import EnvironmentSetupError, SparkConnectError
from . import jars, jvm
from .bridge import tune_driver
from .catalog import create_catalog_tables, spark_catalog_properties

# Both table formats on every session: Iceberg's SQL extensions and Delta's, Delta's catalog as the
# session catalog (Delta tables by path or by name); Iceberg tables live in our own catalog.
# Delta's first: each extension's parser wraps the one before, and Iceberg's procedures (a sort order
# for rewrite_data_files) need Iceberg's to be the session's parser; it hands Delta's statements on.
EXTENSIONS = ",".join(["io.delta.sql.DeltaSparkSessionExtension",
                       "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"])
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
# A class of each format's jar, checked on the driver once the session is up.
_FORMAT_CLASSES = {"the Iceberg Spark runtime": "org.apache.iceberg.spark.SparkCatalog",
                   "Delta Lake (delta-spark)": "io.delta.tables.DeltaTable"}
# Read when the driver JVM starts: under spark-submit only the launcher can set them.
_LAUNCH_ONLY = ("spark.master", "spark.jars", "spark.jars.packages", "spark.driver.extraJavaOptions",
                "spark.driver.extraClassPath", "spark.driver.memory")


_CONNECT_REFUSED = (
    "this is a Spark Connect session: lakehouse-dsr's data plane (erase, purge, verify, export, "
    "ingest) runs in the Spark driver's JVM, through Iceberg's and Delta's Java APIs and helpers "
    "compiled there, which a Connect client cannot reach. Use a classic session: local[*], a "
    "standalone, YARN or Kubernetes master, or spark-submit (unset SPARK_REMOTE and spark.remote; "
    "spark.api.mode=classic). Commands that only read or write the ledger (submit, status, "
    "certificate, serve) need no Spark session. Nothing was changed.")


def is_connect(spark: object) -> bool:
    """Whether `spark` is a Spark Connect session (PySpark's `pyspark.sql.connect`): a client of a
    remote driver, with no JVM of its own to reach."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_classic(spark: SparkSession) -> SparkSession:
    """`spark` itself, or SparkConnectError (exit code 2) when it is a Spark Connect session. Every
    data-plane entry point asks before it changes anything."""
    if is_connect(spark):
        raise SparkConnectError(_CONNECT_REFUSED)
    return spark


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") or (java_home and (Path(java_home) / "bin" / "java").exists()):
        return
    raise EnvironmentSetupError(
        "Java was not found: Spark needs Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless), "
        "on the PATH or under JAVA_HOME"
    )


def session_jars(settings: Settings) -> list[str]:
    """The jars the session needs: the table formats' (Iceberg, Delta: lake/jars.py, fetched from Maven
    Central on first use, from the cache after) then the config's own `spark.jars`. Only the config's
    where it brings the formats itself: `spark.format_jars: provided`, a `spark.jars.packages`, or an
    Iceberg jar among its `spark.jars`. A local path there may be a glob (`hadoop-aws-*.jar`: one
    config for either Spark line's jars), expanded here: Spark's own expansion reaches the driver's
    classpath but not the jars it ships to executors."""
    user = settings.spark.conf
    own = [found for jar in user.get("spark.jars", "").split(",") if jar.strip() for found in _expanded(jar.strip())]
    if (settings.spark.format_jars == "provided" or "spark.jars.packages" in user
            or any("iceberg" in Path(jar).name for jar in own)):
        return own
    return [*map(str, jars.resolve()), *own]


def _expanded(jar: str) -> list[str]:
    """A local `spark.jars` entry with glob characters as the sorted files it matches (itself where
    it matches none, for Spark to report); any other entry as it is."""
    if "://" in jar and not jar.startswith("file:") or not any(c in jar for c in "*?["):
        return [jar]
    return sorted(glob.glob(jar.removeprefix("file:"))) or [jar]


def launched_by_spark_submit() -> bool:
    """True in a Python driver that spark-submit (or another launcher) started with its JVM already running."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def launcher_wins(conf: dict[str, str], launched: dict[str, str]) -> dict[str, str]:
    """`conf` without what a launcher already set (`launched`: its confs) or alone can set (master, jars,
    driver JVM options), nor our Python daemon where the launcher's master is not local (a cluster's
    executors may not have this package)."""
    local = launched.get("spark.master", "local").startswith("local")
    return {key: value for key, value in conf.items()
            if key not in _LAUNCH_ONLY and key not in launched and (local or key != PYTHON_DAEMON)}


# Generating and compiling Java for every query's operators and expressions (Janino, in a JVM still
# interpreting Janino itself) costs more than it saves over a small lake: a tiny run took 1.1 s
# less with both off (median of 4 interleaved pairs). Spark evaluates the same expressions then.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


PYTHON_DAEMON = "spark.python.daemon.module"


def _python_daemon(settings: Settings) -> dict[str, str]:
    """Our worker daemon (lake/pydaemon.py: PySpark's modules from their compiled, installed package
    rather than a zip) where the workers run this interpreter, which has this package: local masters
    whose PYSPARK_PYTHON is unset (build_session sets it to this interpreter) or this interpreter."""
    if settings.spark.master.startswith("local") and os.environ.get("PYSPARK_PYTHON", sys.executable) == sys.executable:
        return {PYTHON_DAEMON: "lakehouse_dsr.lake.pydaemon"}
    return {}


def session_conf(settings: Settings, java_options: Sequence[str] = (), interpreted: bool = False) -> dict[str, str]:
    """Every Spark conf the engine needs, with the user's `spark.conf` taking precedence (their
    `spark.driver.extraJavaOptions` replaces our log configuration and `java_options`).
    `interpreted`: queries evaluated without generated code (INTERPRETED), for small lakes."""
    conf = {
        "spark.sql.extensions": EXTENSIONS,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",  # our own progress bars
        "spark.sql.shuffle.partitions": "8",
        # Delta replays a table's log into this many partitions (default 50): tasks of a few files each
        # on a lake of small tables, every time a table's state is read.
        "spark.databricks.delta.snapshotPartitions": "8",
        # No file list (with its statistics: values) in Delta's .crc files, nor in its INFO log lines.
        "spark.databricks.delta.allFilesInCrc.enabled": "false",
        # With it on, Spark starts SQL UDFs' Python workers from a second daemon (its env differs from
        # the RDDs'): a second interpreter start, 1.5 s of a small run, for tracebacks with fewer frames.
        "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
        f"spark.sql.catalog.{settings.catalog.name}": "org.apache.iceberg.spark.SparkCatalog",
        **(INTERPRETED if interpreted else {}),
        **_python_daemon(settings),
    }
    user = settings.spark.conf
    if "spark.driver.extraJavaOptions" not in user:
        log_config = importlib.resources.files("lakehouse_dsr") / "log4j2.properties"
        conf["spark.driver.extraJavaOptions"] = " ".join([f"-Dlog4j2.configurationFile={log_config}", *java_options])
    if needed := session_jars(settings):
        conf["spark.jars"] = ",".join(needed)
        if settings.spark.master.startswith("local") and "spark.driver.extraClassPath" not in user:
            conf["spark.driver.extraClassPath"] = os.pathsep.join(needed)
    for key, value in spark_catalog_properties(settings).items():
        conf[f"spark.sql.catalog.{settings.catalog.name}.{key}"] = value
    for key, value in user.items():
        if key != "spark.jars":
            conf[key] = value
    return conf


def build_session(settings: Settings, quick_jit: bool = False, record_classes_to: Path | None = None,
                  interpreted: bool = False) -> SparkSession:
    """Start (or reuse) a SparkSession configured for the catalog in `settings`.

    Costs a JVM start (2-7 s) the first time in a process, less with the class archive `dsr warm-up`
    records (lake/jvm.py). `quick_jit`: C1 only, and `interpreted`: no generated code (session_conf),
    both for runs over small lakes; `record_classes_to`: record the classes this JVM loads into an
    archive there when it exits. Under spark-submit the launcher's master,
    jars and driver options win over dsr.yaml (the JVM is already running; pass the jars with
    `--jars $(dsr jars)`); every other setting of dsr.yaml still applies.
    """
    _check_java()
    conf = session_conf(settings, jvm.driver_options(quick_jit, record_classes_to), interpreted)
    if os.environ.get("SPARK_REMOTE") or "spark.remote" in conf or conf.get("spark.api.mode") == "connect":
        raise SparkConnectError(_CONNECT_REFUSED)  # PySpark's builder would make a Connect session
    master: str | None = settings.spark.master
    if launched_by_spark_submit():
        conf = launcher_wins(conf, dict(SparkConf().getAll()))  # the JVM's, as spark-submit set them
        master = None
    else:
        os.environ.setdefault("SPARK_LAUNCHER_OPTS", jvm.launcher_options())
        if settings.spark.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no network lookups for a local session
    # Executors run Python for access exports. PySpark takes the interpreter from this variable only
    # (not spark.pyspark.python); the driver's own interpreter has every package we need.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(settings.spark.app_name)
    if master:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = require_classic(builder.getOrCreate())
    _require_formats(spark)
    tune_driver(spark)
    spark.sparkContext.setLogLevel(os.environ.get("DSR_SPARK_LOG_LEVEL", "ERROR"))
    attach(spark, settings)
    return spark


def starting(spark: SparkSession | Callable[[], SparkSession]) -> Future[SparkSession]:
    """The session `spark` makes, made on a thread, so that the JVM starts while the caller reads the
    ledger (pyiceberg, no JVM); a session given is returned as it is. SparkConnectError (raised at
    once for a session given) for a Spark Connect session."""
    if not callable(spark):
        done: Future[SparkSession] = Future()
        done.set_result(require_classic(spark))
        return done
    make = spark
    pool = ThreadPoolExecutor(1, thread_name_prefix="dsr-spark")
    try:
        return pool.submit(lambda: require_classic(make()))
    finally:
        pool.shutdown(wait=False)


def keep_java_objects(spark: SparkSession) -> None:
    """Stop telling the driver JVM about each Python proxy of a JVM object that Python collects, for a
    process that runs once over a small lake and exits.

    py4j sends one message per collected proxy, from a background thread, and the JVM answers each:
    about 2,000 round trips in a tiny `dsr run` (a third of its Py4J calls), on a machine whose two
    cores the run keeps busy. Without them the objects stay until the JVM exits, with what they hold
    (plans, broadcast keys, shuffle files): on a small lake, kilobytes; a long-lived process or a big
    lake must keep releasing them. Proxies made before this call are still released.
    """
    gateway: Any = spark.sparkContext._gateway  # py4j's, untyped
    gateway.gateway_property.enable_memory_management = False


def close_gateway(spark: SparkSession) -> None:
    """Close Py4J's gateway in the driver JVM this process started, and let that JVM exit now, while
    Python finishes what needs no Spark (a run's ledger commits, its report): the JVM's exit
    (Spark's shutdown hooks stop the context and delete its temporary folders, ~0.3 s) is then off
    the path of whoever waits for the process. Any later call into the JVM from this process fails.

    A JVM also waits 300 ms at exit for threads blocked in native code, and the gateway's loop
    accepting connections is one (JDK's `VM_Exit::wait_for_threads_in_native_to_block`): closed
    first, it is not. The JVM exits when it reads the end of its input (PySpark's gateway server),
    which a JVM that spark-submit started (no input from us) reaches when Python exits.
    """
    gateway: Any = spark.sparkContext._gateway  # py4j's, untyped
    where = (gateway.java_parameters.address, gateway.java_parameters.port)
    gateway.shutdown()
    # py4j sends the command without waiting for the JVM to act on it: a call connecting meanwhile is
    # accepted, then never answered (it hangs). Go on once the gateway refuses connections.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            socket.create_connection(where, timeout=1).close()
        except OSError:
            break
        time.sleep(0.005)
    launched = getattr(gateway, "proc", None)  # set by PySpark's launch_gateway
    if launched is not None and launched.stdin is not None:
        # PySpark's accumulator server would print a traceback when the exiting JVM's connection ends
        accumulators: Any = getattr(spark.sparkContext, "_accumulatorServer", None)
        if accumulators is not None:
            accumulators.handle_error = lambda request, client_address: None
        launched.stdin.close()


def attach(spark: SparkSession, settings: Settings) -> None:
    """Register our catalog on an existing session (a notebook's, a cluster job's).

    Catalog settings are runtime SQL confs, so this works after start-up; the Iceberg and Delta jars
    and SQL extensions must already be on the session. On a cluster, executors also get this package's
    code (a zip of ~75 KB, built once per process), so they run the driver's version of it.
    """
    require_classic(spark)
    create_catalog_tables(settings)  # before Spark's catalog first opens (lazily, on first use)
    prefix = f"spark.sql.catalog.{settings.catalog.name}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    for key, value in spark_catalog_properties(settings).items():
        spark.conf.set(f"{prefix}.{key}", value)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if not cast(str, spark.sparkContext.master).startswith("local"):  # a running context has its master
        spark.sparkContext.addPyFile(str(_package_zip()))


def uncached_catalog(spark: SparkSession, settings: Settings) -> str:
    """Our catalog registered once more, as `<name>_uncached`, with Iceberg's table cache off: every
    scan planned through it reads the table's newest snapshot. A streaming query's static side is
    planned again at each micro-batch, so through this catalog it sees commits made meanwhile."""
    name = f"{settings.catalog.name}_uncached"
    prefix = f"spark.sql.catalog.{name}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    for key, value in {**spark_catalog_properties(settings), "cache-enabled": "false"}.items():
        spark.conf.set(f"{prefix}.{key}", value)
    return name


def _require_formats(spark: SparkSession) -> None:
    """A session without the Iceberg runtime or Delta fails late and cryptically; name what is missing
    and what to pass instead. Costs a class lookup per format (Py4J round trips, milliseconds)."""
    jvm: Any = spark.sparkContext._jvm  # py4j's view of the driver JVM: untyped
    missing = []
    for what, name in _FORMAT_CLASSES.items():
        try:
            jvm.java.lang.Class.forName(name, True, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        except Exception:
            missing.append(f"{what} ({name})")
    if missing:
        raise EnvironmentSetupError(
            f"not on the driver's classpath: {' and '.join(missing)}. Name the jars in spark.conf['spark.jars'] "
            "or ['spark.jars.packages'], or under spark-submit pass --jars \"$(dsr -c dsr.yaml jars)\""
        )


@functools.cache
def _package_zip() -> Path:
    """This package zipped once per process, for executors: they run the driver's version of our code
    even where lakehouse-dsr is not installed (their Python still needs pyarrow, pydantic and PyYAML)."""
    folder = Path(tempfile.mkdtemp(prefix="dsr-pyfiles-"))
    atexit.register(shutil.rmtree, folder, True)
    package = Path(__file__).resolve().parents[1]  # lakehouse_dsr/, not lake/
    archive = folder / "lakehouse_dsr.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(package.rglob("*")):
            if file.suffix in (".py", ".properties", ".yaml"):  # the demo's data map is read on import
                zf.write(file, file.relative_to(package.parent))
    return archive
