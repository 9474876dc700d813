"""Spark's Python workers, started before the access export needs them.

The export writes zip packages (csv, parquet) in a Python worker (stages/packages.py; JSON packages
are written by the JVM, lake/privatefiles.py, and need none). Spark starts their daemon
at the first job that needs one: an interpreter and PySpark's imports, about 1.3 s on a 2-core
machine, which a small run would wait for in the middle of its export. Started in the background
when the run begins, the same start overlaps the driver's own work (reading the ledger, planning
the resolve and the erasure), which leaves a core idle most of the time.
"""

from __future__ import annotations

import logging
import threading
import weakref

from pyspark import SparkContext
from pyspark.sql import SparkSession

from ..exceptions import first_line
from .metrics import beside

log = logging.getLogger(__name__)
_started: weakref.WeakSet[SparkContext] = weakref.WeakSet()
_lock = threading.Lock()


def start_python_workers(spark: SparkSession) -> None:
    """Start the Python worker daemon of `spark`'s context in the background, once per context: a job
    of one task evaluating a built-in Python function on one row (no data, no identifier). Returns at
    once. A failure is only logged: the export then starts the daemon itself."""
    sc = spark.sparkContext
    with _lock:
        if sc in _started:
            return
        _started.add(sc)
    threading.Thread(target=_start, args=(spark,), name="dsr-python-workers", daemon=True).start()


def _start(spark: SparkSession) -> None:
    try:
        with beside(spark, "Python workers started ahead of the export"):  # stage meters leave it out
            spark.sparkContext.parallelize([0], 1).map(int).collect()  # a built-in: unpickled without imports
    except Exception as exc:  # a stopped context, say
        log.debug("Python workers not started ahead: %s", first_line(exc))
