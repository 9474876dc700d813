"""`dsr warm-up`: record the classes a run loads, so every later Spark-starting command starts faster.

Runs a whole tiny cycle (generate, access export, erase, purge, verify), twice (with generated code,
then interpreted, as small lakes run), in a throw-away lakehouse with a JVM that writes a
class-data-sharing archive when it exits (lake/jvm.py). Costs such a run (about 40 s) and the
archive's ~190 MB in ~/.cache/lakehouse-dsr/cds (archives of Java or Spark installations no
longer on this machine are removed then); saves 2-4 s on every later JVM start on this
machine (a tiny `dsr run`: 27 s -> 24 s, see mkdocs/docs/benchmarks/fixed-costs.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from . import synth
from .config import demo_settings
from .exceptions import EnvironmentSetupError
from .lake import jvm
from .lake.spark import INTERPRETED, build_session
from .ledger.ledger import Ledger
from .ledger.requests import RequestInput
from .runner import run


@dataclass
class WarmUp:
    archive: Path
    bytes: int
    removed: list[tuple[Path, int]] = field(default_factory=list)  # stale archives (jvm.remove_stale_archives)


def record_archive() -> WarmUp:
    """Record the archive for this Java and Spark installation, replacing an older one atomically,
    then remove the archives no installation on this machine can use any more.

    Must run in a process that has not started Spark yet: the JVM records what it loads from its
    start to its exit, and this function ends that JVM."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        raise EnvironmentSetupError("dsr warm-up needs a process of its own: Spark has already started here")
    archive = jvm.archive_path()
    if archive is None:
        raise EnvironmentSetupError("Java was not found: Spark needs Java 17 on the PATH or under JAVA_HOME")
    if not jvm.can_record_archive():
        raise EnvironmentSetupError("this Java cannot record a class archive (Java 13 or newer can): "
                                    "commands still work, they only start Spark without one")
    archive.parent.mkdir(parents=True, exist_ok=True)
    staged = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    launcher = cast(Path, jvm.archive_path("launcher"))
    launcher_staged = launcher.with_name(f"{launcher.name}.{os.getpid()}.tmp")
    work = Path(tempfile.mkdtemp(prefix="dsr-warm-up-"))
    user_launcher_options = os.environ.get("SPARK_LAUNCHER_OPTS")
    try:
        settings = demo_settings(work)  # the demo's tables, tiny
        # spark-submit's launcher JVM has ended (and written its archive) once the session is up
        os.environ["SPARK_LAUNCHER_OPTS"] = jvm.launcher_options(record_to=launcher_staged)
        spark = build_session(settings, record_classes_to=staged)
        if jvm.archive_usable(launcher_staged):
            jvm.note_installation(launcher, "launcher")
            os.replace(launcher_staged, launcher)
        synth.generate(spark, settings, users=40, events=600, seed=1)
        subjects = [synth.user_id(1, i) for i in range(6)]
        ledger = Ledger(settings)
        # queries with generated code, then interpreted (as small lakes run them)
        for cycle, conf in ((subjects[:3], {}), (subjects[3:], INTERPRETED)):
            for key, value in conf.items():
                spark.conf.set(key, value)
            ledger.submit([RequestInput(cycle[0], "access", "gdpr", None),
                           *(RequestInput(s, "erase", "gdpr", None) for s in cycle[1:])])
            run(spark, settings)
        _end_jvm(spark)
        if not jvm.archive_usable(staged):
            raise EnvironmentSetupError("the JVM did not write a usable class archive (see its output above)")
        jvm.note_installation(archive)
        os.replace(staged, archive)
        return WarmUp(archive, archive.stat().st_size, jvm.remove_stale_archives())
    finally:
        if user_launcher_options is None:
            os.environ.pop("SPARK_LAUNCHER_OPTS", None)
        else:
            os.environ["SPARK_LAUNCHER_OPTS"] = user_launcher_options
        staged.unlink(missing_ok=True)
        launcher_staged.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def _end_jvm(spark) -> None:
    """Stop Spark and let its JVM exit normally (it writes the archive on exit): PySpark's gateway
    JVM exits when its stdin closes."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    process = getattr(gateway, "proc", None)
    if gateway is None or process is None:
        raise EnvironmentSetupError("dsr warm-up needs a local Spark driver it started itself")
    gateway.shutdown()
    process.stdin.close()
    if process.wait(timeout=300) != 0:
        raise EnvironmentSetupError(f"the Spark JVM exited with status {process.returncode}")
    SparkContext._gateway = SparkContext._jvm = None
