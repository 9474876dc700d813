"""Files written by Spark's tasks from inside its generated code: one owner-only file per row.

The access export writes one JSON package per request where Spark holds it. A Python UDF did that at
the price of a Python worker (an interpreter and PySpark's imports, ~1.3 CPU-seconds on a 2-core
machine) and of pickling every package's text to it: 1.4-1.9 s of a run exporting 1,000 packages, of
which writing the files took 0.04 s. A `written` column writes them in the JVM instead
(PrivateFiles.java, reached through Spark's `Invoke`: catalyst.py). Where that helper is off or
cannot be compiled (bridge.helper), a Python UDF writes the same files: the cost above comes back.
"""

from __future__ import annotations

import hashlib
import os
import signal
from functools import partial
from pathlib import Path

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from ..keys import write_private
from . import catalyst
from .bridge import helper


def written(spark: SparkSession, directory: Path, name: Column, text: Column, kill_pid: int | None = None) -> Column:
    """A string column: the SHA-256 (hex) of `text` (UTF-8) once a task has written it to file `name` of
    `directory`, atomically (a temporary file renamed) and owner-only (0600) from its creation; NULL
    where either is NULL. Not synced: check the files before relying on them. Non-deterministic, so
    Spark writes each row once per evaluation of the plan. `kill_pid`: a process killed after each
    write (the export's failpoint). Cost: one file write and one hash per row; the tasks must see
    `directory` (a local master, or a shared file system)."""
    factory = helper(spark, "PrivateFiles", tasks=True)
    if factory is None:
        write = F.udf(partial(_write, str(directory), kill_pid or 0), StringType()).asNondeterministic()
        return write(name, text)
    target = factory.writer(str(directory), kill_pid or 0)
    return catalyst.invoke(spark, target, "java.util.function.BiFunction", "apply", [name, text], StringType(),
                           propagate_null=True, nullable=True, deterministic=False)


def _write(directory: str, kill_pid: int, name: str | None, text: str | None) -> str | None:
    """PrivateFiles.java's `apply` in a Python worker: the plain-Spark path of `written`."""
    if name is None or text is None:
        return None
    data = text.encode("utf-8")
    write_private(Path(directory) / name, data, sync=False)  # not synced, as the JVM's writer: checked after
    if kill_pid > 0:  # the export's failpoint
        os.kill(kill_pid, signal.SIGKILL)
    return hashlib.sha256(data).hexdigest()
