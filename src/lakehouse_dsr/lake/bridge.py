"""The Py4J bridge to Iceberg's Java API in the driver, made cheap for wide lakes.

Every Py4J call is a round trip to the JVM (about half a millisecond on a busy 2-core machine), and
PySpark's proxies turn reading a Java map or list into one round trip per entry: reading a snapshot
summary took about 250, a manifest's files several per file. Over 100 tables a run made 660,000
round trips, more time than its Spark jobs. So the engine reads Iceberg metadata through a small
Java class (`Bridge.java`, beside this module) that answers each question in one call with JSON;
Spark's own Janino compiler builds it inside the running driver, so it works with any SparkSession,
a notebook's included, without an extra jar on the classpath. Compiling in a fresh JVM costs 0.2-0.3 s
a class, and loading Janino itself more where Spark's code generation is off: the classes compiled
are kept in a jar per source, Spark and Iceberg version (~/.cache/lakehouse-dsr/classes), which later
JVMs load in milliseconds. Java class handles are cached too: resolving `jvm.org.apache.iceberg.X`
costs a round trip per package name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import zipfile
from collections.abc import Callable
from functools import reduce
from importlib import resources
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from ..exceptions import first_line
from .jars import cache_dir

log = logging.getLogger(__name__)

_lock = threading.Lock()
_cached: dict[tuple[int, str], tuple[Any, Any]] = {}  # (id(Py4J gateway), name) -> (that gateway, JVM object)


def _in_jvm(spark: SparkSession, name: str, make: Callable[[], Any]) -> Any:
    """`make()`'s JVM object for `spark`'s gateway, made once per JVM (a new gateway, a new JVM)."""
    gateway = spark.sparkContext._gateway
    found = _cached.get((id(gateway), name))
    if found is None or found[0] is not gateway:
        with _lock:
            found = _cached.get((id(gateway), name))
            if found is None or found[0] is not gateway:
                found = _cached[(id(gateway), name)] = (gateway, make())
    return found[1]


def compiled(spark: SparkSession, name: str, *, tasks: bool = False):
    """An instance of class `name`, built from `<name>.java` beside this module into `spark`'s driver
    JVM on first use: loaded from the class cache when an earlier JVM compiled the same source
    against the same Spark and Iceberg, else compiled with Janino and added to the cache. `tasks`:
    Spark's tasks deserialize objects of the class too, so its jar is added to the SparkContext
    (executors load it before their next task; a cache that cannot be written gets a jar of this
    process's own)."""

    def load():
        jvm: Any = spark._jvm  # py4j's view of the driver JVM: untyped, and set on every started session
        # Iceberg's classes come with the session's jars: the loader Spark uses for them.
        parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        source = _source(name)
        jar = class_jar(spark, name, source)
        instance = None
        if jar.is_file():
            try:
                instance = _jar_loader(spark, jar, parent).loadClass(f"lakehouse_dsr.{name}").newInstance()
            except Py4JJavaError as exc:  # a damaged or foreign cache entry: compiled again below
                log.debug("class cache %s unusable: %s", jar, first_line(exc.java_exception))
        if instance is None:
            compiler = jvm.org.codehaus.janino.SimpleCompiler()
            compiler.setParentClassLoader(parent)
            compiler.cook(source)
            classes = {str(k): bytes(v) for k, v in compiler.getBytecodes().items()}
            if not _store(jar, classes) and tasks:
                jar = Path(tempfile.mkdtemp(prefix="dsr-classes-")) / jar.name
                _store(jar, classes)
            instance = compiler.getClassLoader().loadClass(f"lakehouse_dsr.{name}").newInstance()
        if tasks:
            spark.sparkContext._jsc.sc().addJar(str(jar))
        return instance

    # A jar is added to one SparkContext: a new context in the same JVM adds it again.
    context = f"@{spark.sparkContext.applicationId}" if tasks else ""
    return _in_jvm(spark, f"lakehouse_dsr.{name}{context}", load)


# A Spark conf: "off" makes every optional helper (membership lookups, row-hash sums, the package
# writer, the in-driver rewrite) take its plain-Spark path, as if it had failed to compile.
HELPERS_CONF = "spark.lakehouse_dsr.helpers"
_unavailable: dict[tuple[int, str], Any] = {}  # (id(Py4J gateway), helper) -> that gateway: failed there once


def helper(spark: SparkSession, name: str, *, tasks: bool = False) -> Any | None:
    """`compiled(spark, name, tasks=tasks)` for a helper the engine can do without, or None: where the
    session's `spark.lakehouse_dsr.helpers` is "off", or where the class fails to compile or load
    (another Spark or Iceberg changed an API it calls; tried once per JVM, with one warning). The
    caller then takes its plain-Spark path, with the same results at a known cost
    (deployment/versions.md)."""
    if str(spark.conf.get(HELPERS_CONF, "on")).strip().lower() == "off":
        return None
    gateway = spark.sparkContext._gateway
    if _unavailable.get((id(gateway), name)) is gateway:
        return None
    try:
        return compiled(spark, name, tasks=tasks)
    except Py4JJavaError as exc:
        _unavailable[(id(gateway), name)] = gateway
        log.warning("the %s helper could not be compiled or loaded (%s): its plain-Spark path is used", name,
                    first_line(exc.java_exception))
        return None


def _source(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.java").read_text()


def class_jar(spark: SparkSession, name: str, source: str) -> Path:
    """Where the classes compiled from `source` for this session's Spark and Iceberg are cached: the
    bytecode calls their methods by signature, so another version of either compiles anew."""
    jvm: Any = spark._jvm
    stamp = f"{source}\0{spark.version}\0{jvm.org.apache.iceberg.IcebergBuild.fullVersion()}"
    return cache_dir("classes") / f"{name}-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.jar"


def _jar_loader(spark: SparkSession, jar: Path, parent: Any) -> Any:
    jvm: Any = spark._jvm
    gateway: Any = spark.sparkContext._gateway  # set on every started session
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(jar)).toURI().toURL()
    return jvm.java.net.URLClassLoader(urls, parent)


def _store(jar: Path, classes: dict[str, bytes]) -> bool:
    """`classes` (binary name -> bytecode) as `jar`, written whole or not at all (a process compiling
    the same source at the same time writes the same bytes). Only a saving: a cache that cannot be
    written is left alone (False)."""
    try:
        jar.parent.mkdir(parents=True, exist_ok=True)
        fd, staged = tempfile.mkstemp(dir=jar.parent, prefix=f".{jar.name}.")
    except OSError as exc:
        log.debug("class cache %s not written: %s", jar, exc)
        return False
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w") as zf:
            for binary_name, code in sorted(classes.items()):
                zf.writestr(binary_name.replace(".", "/") + ".class", code)
        os.chmod(staged, 0o644)
        os.replace(staged, jar)
        return True
    except OSError as exc:
        Path(staged).unlink(missing_ok=True)
        log.debug("class cache %s not written: %s", jar, exc)
        return False


def bridge(spark: SparkSession):
    """The Bridge object in `spark`'s driver JVM (compiled on first use)."""
    return compiled(spark, "Bridge")


def tune_driver(spark: SparkSession) -> None:
    """For sessions the engine starts itself: local `file:` paths written without a `chmod` process
    per file (Bridge.LocalFiles), and Py4J's failed class lookups remembered instead of repeated
    across every jar (Bridge.RememberingClassLoading). Either is only a saving: if Hadoop's cache or
    Py4J's strategy cannot be reached, their stock behaviour stays."""
    steps = {"local files": lambda b: b.useLocalFiles(spark._jsc.hadoopConfiguration()),
             "class lookups": lambda b: b.rememberMissingClasses()}
    for name, step in steps.items():
        try:
            step(bridge(spark))
        except Exception as exc:  # only slower
            log.debug("driver tuning (%s) skipped: %s", name, first_line(exc))


def jclass(spark: SparkSession, name: str):
    """The Py4J handle of Java class `name` (e.g. `org.apache.iceberg.expressions.Expressions`), cached."""
    return _in_jvm(spark, name, lambda: reduce(getattr, name.split("."), spark._jvm))


def call(spark: SparkSession, method: str, *args: Any) -> Any:
    """Bridge.`method`(*args), its JSON answer read into Python values."""
    return json.loads(getattr(bridge(spark), method)(*args))
