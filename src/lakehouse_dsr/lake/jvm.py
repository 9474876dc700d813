"""How the driver JVM starts: a class-data-sharing archive, and the quick compiler for small lakes.

A `dsr` command that starts Spark spends seconds before its first job loading and verifying tens of
thousands of classes, and on a small machine the JIT's optimizing compiler (C2) then competes with
the run for CPU while compiling code a short run barely uses. Two JVM features remove most of that:
- a class-data-sharing (CDS) archive of the classes a run loads, recorded once per Java and Spark
  installation by `dsr warm-up` (`make install` runs it): later JVMs map the classes instead of
  loading them. A missing or stale archive is ignored; the JVM then loads classes as usual.
  spark-submit's launcher, a JVM that only prints the driver's java command, gets one of its own.
- `-XX:TieredStopAtLevel=1` (C1 only) for runs over small lakes: a tiny run on 2 cores took 27 s
  with both compilers and 20 s with C1; at 2M events C1 doubled the purge, and over 50 tables of
  10k rows (a 90 s run) it gained nothing (95.5 s against 92.8 s). So only a lake of at most
  QUICK_JIT_MAX_TABLES tables and QUICK_JIT_MAX_BYTES of mapped data gets it.
A `spark.driver.extraJavaOptions` in dsr.yaml replaces all of this for the driver, a SPARK_LAUNCHER_OPTS
in the environment for the launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import Settings
from .jars import cache_dir

QUICK_JIT_MAX_BYTES = 32 * 1024 * 1024
QUICK_JIT_MAX_TABLES = 12
_QUIET = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]  # a stale archive is normal, not worth a warning


def java_binary() -> Path | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return Path(java_home) / "bin" / "java"
    found = shutil.which("java")
    return Path(found) if found else None


@dataclass(frozen=True)
class Installation:
    """The Java binary and Spark's jar folder an archive holds classes of: its name follows their
    paths and modification times, so upgrading either picks a new name instead of feeding the JVM an
    archive of other classes."""

    jvm: str  # "spark" (the driver) or "launcher" (spark-submit's)
    spark: str  # Spark's version
    java: str
    jars: str

    @classmethod
    def here(cls, jvm: str = "spark") -> Installation | None:
        """This process's Java and Spark (None without Java)."""
        import pyspark

        java = java_binary()
        if java is None:
            return None
        return cls(jvm, pyspark.__version__, str(java.resolve()), str(Path(pyspark.__file__).parent / "jars"))

    def archive_name(self) -> str | None:
        """The archive's file name as this installation stands now (None once its Java or PySpark is gone)."""
        java, jars = Path(self.java), Path(self.jars)
        if not java.exists() or not jars.parent.is_dir():  # PySpark's own folder: it may have no jars/
            return None
        stamp = f"{java}:{java.stat().st_mtime_ns}:{jars}:{jars.stat().st_mtime_ns if jars.exists() else 0}"
        return f"{self.jvm}-{self.spark}-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}.jsa"


def archive_path(jvm: str = "spark") -> Path | None:
    """Where the archive of the driver JVM ("spark") or of spark-submit's launcher JVM ("launcher")
    for this Java and this Spark installation lives (None without Java)."""
    here = Installation.here(jvm)
    name = here.archive_name() if here else None
    return cache_dir("cds") / name if name else None


def _installation_file(archive: Path) -> Path:
    return archive.with_name(archive.name + ".json")


def note_installation(archive: Path, jvm: str = "spark") -> None:
    """Record beside `archive` (before it is put in place) which installation it belongs to, so that
    `remove_stale_archives` can later tell when none on this machine does."""
    here = Installation.here(jvm)
    if here is not None:
        _installation_file(archive).write_text(json.dumps(asdict(here)))


def remove_stale_archives() -> list[tuple[Path, int]]:
    """Remove the archives (~190 MB each) that no installation on this machine can use any more:
    their Java or Spark was upgraded, moved or removed (a new virtual environment is a new Spark
    installation), or they do not say whose they are (recorded before archives said so); this
    process's own are kept. Returns each removed archive with its size. Cost: a stat of each
    archive's Java and jar folder."""
    ours = {path.name for path in (archive_path("spark"), archive_path("launcher")) if path is not None}
    removed = []
    for archive in sorted(cache_dir("cds").glob("*.jsa")):
        if archive.name in ours:
            continue
        noted = _installation_file(archive)
        try:
            usable = Installation(**json.loads(noted.read_text())).archive_name() == archive.name
        except (OSError, ValueError, TypeError):  # not noted, or not as we note it
            usable = False
        if usable:
            continue
        try:
            size = archive.stat().st_size
            archive.unlink()
        except FileNotFoundError:  # another warm-up removed it meanwhile
            continue
        noted.unlink(missing_ok=True)
        removed.append((archive, size))
    _remove_orphan_notes()
    return removed


ORPHAN_NOTE_SECONDS = 600  # a warm-up notes its archive just before putting it in place


def _remove_orphan_notes() -> None:
    """Remove the notes whose archive never came (a warm-up killed between the two steps) or was
    removed by hand; a note younger than ORPHAN_NOTE_SECONDS may be a warm-up's about to place it."""
    old = time.time() - ORPHAN_NOTE_SECONDS
    for note in cache_dir("cds").glob("*.jsa.json"):
        try:
            if not note.with_suffix("").exists() and note.stat().st_mtime < old:
                note.unlink()
        except FileNotFoundError:  # another warm-up removed it meanwhile
            continue


def launcher_options(record_to: Path | None = None) -> str:
    """SPARK_LAUNCHER_OPTS for the JVM spark-submit starts only to print the driver's java command:
    C1 only and its own class archive (or record one at exit to `record_to`). It took 0.25 s, then
    0.08 s with both (medians of 4 here), on the way to every session this process starts."""
    options = ["-XX:TieredStopAtLevel=1"]
    archive = archive_path("launcher")
    if record_to is not None:
        options += [f"-XX:ArchiveClassesAtExit={record_to}", *_QUIET]
    elif archive is not None and archive.is_file():
        options += [f"-XX:SharedArchiveFile={archive}", *_QUIET]
    return " ".join(options)


def driver_options(quick_jit: bool = False, record_to: Path | None = None) -> list[str]:
    """JVM flags for the driver: use the archive if one was recorded (or record one at exit to
    `record_to`), and C1 only when `quick_jit`."""
    # C1 alone gets a 48 MB code cache by default: a run over 50 tables filled it with Spark's
    # generated code, then the JVM stopped compiling (and died); the tiered default is 240 MB.
    options = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"] if quick_jit else []
    if record_to is not None:
        return [*options, f"-XX:ArchiveClassesAtExit={record_to}", *_QUIET]
    archive = archive_path()
    if archive is not None and archive.is_file():
        options += [f"-XX:SharedArchiveFile={archive}", *_QUIET]
    return options


def can_record_archive() -> bool:
    """Java 13+ records dynamic archives (Spark 3.5 also runs on 8 and 11, which cannot)."""
    java = java_binary()
    if java is None:
        return False
    flags = subprocess.run([str(java), "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True,
                           timeout=60).stdout
    return " ArchiveClassesAtExit " in flags


def archive_usable(archive: Path) -> bool:
    """A JVM starts with it: a truncated or foreign archive can crash the JVM instead of being ignored."""
    java = java_binary()
    if java is None or not archive.is_file() or archive.stat().st_size == 0:
        return False
    with tempfile.TemporaryDirectory() as crash_dir:  # a crash report must not land in the caller's folder
        done = subprocess.run([str(java), f"-XX:SharedArchiveFile={archive}", *_QUIET,
                               f"-XX:ErrorFile={crash_dir}/hs_err_%p.log", "-version"], capture_output=True, timeout=60)
    return done.returncode == 0


def mapped_bytes(settings: Settings, limit: int = QUICK_JIT_MAX_BYTES) -> int:
    """Bytes of data files of the mapped tables, stopping once past `limit`, with no JVM: an Iceberg
    table's current snapshot through pyiceberg (one metadata read), a Delta table's Parquet files on
    local storage (a directory walk: files its history still keeps count too). A table that cannot
    be measured so (remote Delta storage, unreadable metadata) counts as past `limit`: when in
    doubt, the full compiler."""
    from .catalog import open_catalog

    catalog = open_catalog(settings)
    delta = settings.delta_tables()
    total = 0
    for table in [*settings.datamap.tables, *settings.datamap.derived]:
        try:
            if table in delta:
                total += _local_parquet_bytes(delta[table])
            else:
                snapshot = catalog.load_table(tuple(table.split("."))).current_snapshot()
                total += int(snapshot.summary.get("total-files-size") or 0) if snapshot and snapshot.summary else 0
        except Exception:
            total += limit + 1
        if total > limit:
            break
    return total


def _local_parquet_bytes(location: str) -> int:
    """Bytes of the Parquet files under a local location, its `_delta_log` aside (ValueError for other
    storage)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", location) and not location.startswith("file:"):
        raise ValueError(f"not local storage: {location}")
    root = Path(re.sub(r"^file:(//)?", "", location))
    return sum(p.stat().st_size for p in root.rglob("*.parquet") if "_delta_log" not in p.relative_to(root).parts)


def small_lake(settings: Settings) -> bool:
    """True for at most QUICK_JIT_MAX_TABLES mapped tables holding at most QUICK_JIT_MAX_BYTES of data files."""
    return (len(settings.datamap.tables) + len(settings.datamap.derived) <= QUICK_JIT_MAX_TABLES
            and mapped_bytes(settings, QUICK_JIT_MAX_BYTES) <= QUICK_JIT_MAX_BYTES)
