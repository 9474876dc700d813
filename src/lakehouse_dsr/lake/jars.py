"""Jars from Maven Central through `mvn`, cached once per machine: the Spark-side jars (Iceberg's
runtime, Delta Lake, Spark's Kafka connector, and on request Hadoop's S3A connector), and the jars of
a local Apache Kafka broker for tests and benchmarks (lake/broker.py).

Each list is declared as a Maven pom in this package (lake/jars/*.xml) and fetched by the same code
(`fetched`), which differs only in what it copies:
- spark-<line>.xml, what each Spark line's sessions need: its dependencies are the table formats'
  jars and Kafka's connector (spark-sql-kafka, its token provider, the kafka-clients and
  commons-pool2 it declares), its profile `s3a` adds hadoop-aws and the AWS SDK bundle that
  hadoop-aws declares. Only those top-level jars are copied (`-DexcludeTransitive=true`): their
  transitive closure brings Jackson, Hadoop client, log4j... versions that clash with the jars
  PySpark ships. Spark's own resolver (`spark.jars.packages`, Ivy) cannot reach Maven Central on
  every machine `mvn` can, hence `mvn`; a cluster that brings its own jars sets
  `spark.format_jars: provided`.
- kafka-broker.xml, Apache Kafka's broker: copied WITH its runtime closure (~45 jars, ~43 MB), the
  classpath of a JVM of its own, which meets none of PySpark's jars.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..exceptions import EnvironmentSetupError

LINES = ("3.5", "4.1")  # Spark lines with a declared pom: lake/jars/spark-<line>.xml
BROKER = "kafka-broker"  # the local Kafka broker's pom (lake/jars/kafka-broker.xml) and cache folder
MANIFEST = "jars.txt"  # written last into a cache folder: the pom's digest, then the jar names, one a line
MVN = "mvn"
_POMS = Path(__file__).with_name("jars")
_MVN_TAIL_LINES = 15


def cache_dir(kind: str) -> Path:
    """~/.cache/lakehouse-dsr/<kind> (or under $XDG_CACHE_HOME): what a machine fetches or records once."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lakehouse-dsr" / kind


def spark_line() -> str:
    """The Spark line ("3.5", "4.1") of the installed PySpark: which pom's jars its sessions take.
    Costs an import of pyspark (already imported wherever a session is built)."""
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    if line not in LINES:
        raise EnvironmentSetupError(f"PySpark {pyspark.__version__} is not a supported Spark line "
                                    f"(supported: {', '.join(LINES)})")
    return line


def pom(line: str) -> Path:
    """The declared jars of a Spark line: the pom file shipped in this package."""
    if line not in LINES:
        raise EnvironmentSetupError(f"no jars are declared for Spark {line} (supported: {', '.join(LINES)})")
    return _POMS / f"spark-{line}.xml"


def folder(line: str, s3a: bool = False) -> Path:
    """Where the jars of `line` (with the S3A profile's when `s3a`) are cached."""
    return cache_dir("jars") / f"spark-{line}" / ("s3a" if s3a else "formats")


def broker_folder() -> Path:
    """Where the local Kafka broker's jars are cached: ~/.cache/lakehouse-dsr/jars/kafka-broker."""
    return cache_dir("jars") / BROKER


@dataclass(frozen=True)
class Declared:
    """One declared jar list: its pom, its cache folder, and how `mvn` copies it."""

    what: str  # for messages: "the Spark 4.1 jars with S3A"
    pom: Path
    folder: Path
    fetch_command: str  # the command that fetches it ("dsr fetch-jars --s3a"), and what runs that command
    fetched_by: str  # ("make install"): both for the message when fetching is not allowed
    instead: str  # how to do without `mvn`, for the message when it is missing
    profiles: tuple[str, ...] = ()
    transitive: bool = False  # the runtime closure too (a JVM of its own), or only the top-level jars

    def mvn_arguments(self, output: Path) -> list[str]:
        """`mvn`'s arguments after the pom's: the profiles, then the goal copying the jars to `output`."""
        closure = [] if self.transitive else ["-DexcludeTransitive=true"]
        return [*(["-P", ",".join(self.profiles)] if self.profiles else []), "dependency:copy-dependencies",
                *closure, "-DincludeScope=runtime", f"-DoutputDirectory={output}"]


def spark_jars(line: str, s3a: bool = False) -> Declared:
    """The jar list of a Spark line's sessions (with the S3A profile when `s3a`)."""
    return Declared(f"the Spark {line} jars{' with S3A' if s3a else ''}", pom(line), folder(line, s3a),
                    f"dsr fetch-jars{' --s3a' if s3a else ''}", "make install",
                    "give your own jars with spark.conf spark.jars / spark.jars.packages in dsr.yaml and "
                    "`spark.format_jars: provided`", ("s3a",) if s3a else ())


def broker_jars() -> Declared:
    """The jar list of the local Kafka broker (lake/broker.py), with its runtime closure."""
    return Declared("the Kafka broker's jars", _POMS / f"{BROKER}.xml", broker_folder(),
                    "dsr fetch-jars --kafka-broker", "make integration-deps",
                    "give LocalBroker a folder of Kafka's jars (an Apache Kafka 4.1 distribution's libs/)",
                    transitive=True)


def _stamp(declared: Path) -> str:
    """The manifest's first line: which pom the jars were fetched for (a package upgrade that changes
    a version changes it, and the cache is fetched again)."""
    return f"# {declared.name} sha256 {hashlib.sha256(declared.read_bytes()).hexdigest()}"


def cached(where: Path, declared: Path) -> list[Path] | None:
    """The jars a complete cache folder lists (its manifest, written last, names the pom `declared`
    as it is now, and every jar it lists is present), else None. Costs a read of the pom and of the
    manifest, and a stat of each jar."""
    try:
        stamp, *names = (where / MANIFEST).read_text().splitlines()
    except (OSError, ValueError):  # no manifest, or an empty one
        return None
    if stamp != _stamp(declared):
        return None
    jars = [where / name for name in names]
    if jars and all(jar.is_file() for jar in jars):
        return jars
    return None


def resolve(line: str | None = None, s3a: bool = False, fetch: bool = True) -> list[Path]:
    """The jars of a Spark line (default: the installed PySpark's), with the S3A profile's when `s3a`:
    `fetched` of its pom (about 10 s with Maven's repository warm, the download otherwise: formats
    and Kafka's connector ~58 MB on 3.5, ~65 MB on 4.1; S3A adds ~280 MB on 3.5, ~640 MB on 4.1)."""
    return fetched(spark_jars(line or spark_line(), s3a), fetch)


def broker(fetch: bool = True) -> list[Path]:
    """The local Kafka broker's jars, its runtime closure included: `fetched` of its pom (~43 MB
    downloaded once)."""
    return fetched(broker_jars(), fetch)


def fetched(declared: Declared, fetch: bool = True) -> list[Path]:
    """The jars of a declared list, from its cache folder.

    From a complete cache: no `mvn`, no network, a few file checks. Otherwise, when `fetch`, one
    `mvn` run copies the declared jars from Maven Central (or ~/.m2/repository) into a staging folder
    beside the cache, and they are moved in with the manifest last, so a fetch cut short never leaves
    a cache that looks complete.
    Raises EnvironmentSetupError when `mvn` is missing or fails, or (`fetch=False`) when the cache
    is incomplete.
    """
    what, where = declared.what, declared.folder
    if jars := cached(where, declared.pom):
        return jars
    if not fetch:
        raise EnvironmentSetupError(f"{what} are not in {where}: run `{declared.fetch_command}` "
                                    f"({declared.fetched_by} does)")
    mvn = shutil.which(MVN)
    if mvn is None:
        raise EnvironmentSetupError(
            f"Maven (`mvn`) was not found, and it fetches {what} from Maven Central: install Maven "
            f"(Debian/Ubuntu: apt-get install maven), or {declared.instead}"
        )
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{where.name}-staging-", dir=where.parent))
    try:
        shutil.copyfile(declared.pom, staging / "pom.xml")  # mvn never writes beside the installed pom
        command = [mvn, "-q", "-B", "-f", str(staging / "pom.xml"), *declared.mvn_arguments(staging / "jars")]
        done = subprocess.run(command, capture_output=True, text=True)
        copied = sorted((staging / "jars").glob("*.jar"))
        if done.returncode != 0 or not copied:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-_MVN_TAIL_LINES:])
            raise EnvironmentSetupError(f"mvn could not fetch {what} (exit {done.returncode}) declared in "
                                        f"{declared.pom}:\n{tail}")
        where.mkdir(exist_ok=True)
        (where / MANIFEST).unlink(missing_ok=True)  # incomplete from here until the new manifest is in
        for jar in copied:
            jar.replace(where / jar.name)  # same file system: atomic, a jar is never half there
        for old in where.glob("*.jar"):  # other versions, from an older pom
            if old.name not in {jar.name for jar in copied}:
                old.unlink(missing_ok=True)
        listing = staging / MANIFEST
        listing.write_text("".join(f"{text}\n" for text in [_stamp(declared.pom), *(jar.name for jar in copied)]))
        listing.replace(where / MANIFEST)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if jars := cached(where, declared.pom):
        return jars
    raise EnvironmentSetupError(f"{what} fetched into {where} went missing")  # removed meanwhile
