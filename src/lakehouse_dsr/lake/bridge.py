"""The Py4J bridge to Iceberg's Java API in the driver, made cheap for wide lakes.

Every Py4J call is a round trip to the JVM (about half a millisecond on a busy 2-core machine), and
PySpark's proxies turn reading a Java map or list into one round trip per entry: reading a snapshot
summary took about 250, a manifest's files several per file. Over 100 tables a run made 660,000
round trips, more time than its Spark jobs. So the engine reads Iceberg metadata through a small
Java class (`Bridge.java`, beside this module) that answers each question in one call with JSON;
Spark's own Janino compiler builds it inside the running driver once per JVM (about 0.2 s), so it
works with any SparkSession, a notebook's included, without an extra jar. Java class handles are
cached too: resolving `jvm.org.apache.iceberg.X` costs a round trip per package name.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from functools import reduce
from importlib import resources
from typing import Any

from pyspark.sql import SparkSession

from ..exceptions import first_line

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


def compiled(spark: SparkSession, name: str):
    """An instance of class `name`, compiled from `<name>.java` beside this module into `spark`'s
    driver JVM on first use."""

    def compile_class():
        jvm: Any = spark._jvm  # py4j's view of the driver JVM: untyped, and set on every started session
        compiler = jvm.org.codehaus.janino.SimpleCompiler()
        # Iceberg's classes come with the session's jars: the loader Spark uses for them.
        compiler.setParentClassLoader(jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader())
        compiler.cook(resources.files(__package__).joinpath(f"{name}.java").read_text())
        return compiler.getClassLoader().loadClass(f"lakehouse_dsr.{name}").newInstance()

    return _in_jvm(spark, f"lakehouse_dsr.{name}", compile_class)


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
