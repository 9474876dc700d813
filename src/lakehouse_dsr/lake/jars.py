"""The Spark-side jars (Iceberg's runtime, Delta Lake, and on request Hadoop's S3A connector), from
Maven Central through `mvn`, cached once per machine.

What each Spark line needs is declared as a Maven pom in this package (lake/jars/spark-<line>.xml):
its dependencies are the table formats' jars, its profile `s3a` adds hadoop-aws and the AWS SDK
bundle that hadoop-aws declares. Only those top-level jars are copied (`-DexcludeTransitive=true`):
their transitive closure brings Jackson, Hadoop client, log4j... versions that clash with the jars
PySpark ships. Spark's own resolver (`spark.jars.packages`, Ivy) cannot reach Maven Central on every
machine `mvn` can, hence `mvn`; a cluster that brings its own jars sets `spark.format_jars: provided`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..exceptions import EnvironmentSetupError

LINES = ("3.5", "4.1")  # Spark lines with a declared pom: lake/jars/spark-<line>.xml
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
    """The jars of a Spark line (default: the installed PySpark's), with the S3A profile's when `s3a`.

    From a complete cache (folder()): no `mvn`, no network, a few file checks. Otherwise, when
    `fetch`, one `mvn` run copies the declared jars from Maven Central (or ~/.m2/repository) into a
    staging folder beside the cache, and they are moved in with the manifest last, so a fetch cut
    short never leaves a cache that looks complete: about 10 s with Maven's repository warm, the
    download otherwise (formats ~55 MB; S3A adds ~280 MB on 3.5, ~640 MB on 4.1).
    Raises EnvironmentSetupError when `mvn` is missing or fails, or (`fetch=False`) when the cache
    is incomplete.
    """
    line = line or spark_line()
    declared, where = pom(line), folder(line, s3a)
    if jars := cached(where, declared):
        return jars
    what = f"the Spark {line} jars{' with S3A' if s3a else ''}"
    if not fetch:
        raise EnvironmentSetupError(f"{what} are not in {where}: run `dsr fetch-jars{' --s3a' if s3a else ''}` "
                                    "(make install does)")
    mvn = shutil.which(MVN)
    if mvn is None:
        raise EnvironmentSetupError(
            f"Maven (`mvn`) was not found, and it fetches {what} from Maven Central: install Maven "
            "(Debian/Ubuntu: apt-get install maven), or give your own jars with spark.conf spark.jars / "
            "spark.jars.packages in dsr.yaml and `spark.format_jars: provided`"
        )
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{where.name}-staging-", dir=where.parent))
    try:
        shutil.copyfile(declared, staging / "pom.xml")  # mvn never writes beside the installed pom
        command = [mvn, "-q", "-B", "-f", str(staging / "pom.xml"), *(["-P", "s3a"] if s3a else []),
                   "dependency:copy-dependencies", "-DexcludeTransitive=true", "-DincludeScope=runtime",
                   f"-DoutputDirectory={staging / 'jars'}"]
        done = subprocess.run(command, capture_output=True, text=True)
        fetched = sorted((staging / "jars").glob("*.jar"))
        if done.returncode != 0 or not fetched:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-_MVN_TAIL_LINES:])
            raise EnvironmentSetupError(f"mvn could not fetch {what} (exit {done.returncode}) declared in "
                                        f"{declared}:\n{tail}")
        where.mkdir(exist_ok=True)
        (where / MANIFEST).unlink(missing_ok=True)  # incomplete from here until the new manifest is in
        for jar in fetched:
            jar.replace(where / jar.name)  # same file system: atomic, a jar is never half there
        for old in where.glob("*.jar"):  # other versions, from an older pom
            if old.name not in {jar.name for jar in fetched}:
                old.unlink(missing_ok=True)
        listing = staging / MANIFEST
        listing.write_text("".join(f"{text}\n" for text in [_stamp(declared), *(jar.name for jar in fetched)]))
        listing.replace(where / MANIFEST)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if jars := cached(where, declared):
        return jars
    raise EnvironmentSetupError(f"{what} fetched into {where} went missing")  # removed meanwhile
