"""Spark's Python worker daemon for a local session, importing PySpark from its installed package.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` and py4j's zip first on its Python workers' path. A
pip-installed PySpark is its own SPARK_HOME and carries those zips too, but Python keeps no bytecode
for modules imported from a zip: every daemon compiled PySpark's modules from source, 0.75-1.1
CPU-seconds on a 2-core machine against 0.3-0.4 s from the installed package's bytecode, while a
small run's driver waited for a core. This daemon drops the two zips from its path when the package
found without them is SPARK_HOME itself (the same release's code, compiled), then runs Spark's own
daemon. lake/spark.py names it `spark.python.daemon.module` for local masters whose workers run the
driver's interpreter (where this package is installed).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def installed_pyspark_first(path: list[str], spark_home: str | None) -> list[str]:
    """`path` without SPARK_HOME's bundled zips when PySpark is then found in SPARK_HOME itself (a
    pip-installed PySpark); `path` unchanged otherwise (a Spark distribution: the zip is its PySpark)."""
    if not spark_home:
        return path
    bundled = os.path.join(spark_home, "python", "lib") + os.sep
    kept = [p for p in path if not p.startswith(bundled)]
    if kept == path:
        return path
    saved = sys.path[:]
    sys.path[:] = kept
    try:
        spec = importlib.util.find_spec("pyspark")  # finds, does not import
    finally:
        sys.path[:] = saved
    found = Path(spec.origin).parent.resolve() if spec and spec.origin else None
    return kept if found == Path(spark_home).resolve() else path


if __name__ == "__main__":
    sys.path[:] = installed_pyspark_first(sys.path, os.environ.get("SPARK_HOME"))
    from pyspark.daemon import manager

    manager()
