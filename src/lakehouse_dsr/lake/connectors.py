"""The S3A connector jars, fetched from a registry we can reach when Maven Central is not.

`hadoop-aws` and the AWS SDK v1 bundle it was built against come from the `sagemaker-pyspark`
source distribution on PyPI: downloaded once, the two jars extracted into a cache directory and
checked against pinned SHA-256 sums. (JDBC drivers come from Debian packages: see the examples.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO, cast

from ..exceptions import EnvironmentSetupError

SAGEMAKER_PYSPARK = "sagemaker-pyspark==1.4.5"
# The pair Spark 3.5's Hadoop 3.3 client works with; sums of the jars inside the pinned sdist.
S3A_JARS = {
    "hadoop-aws-3.3.1.jar": "6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e",
    "aws-java-sdk-bundle-1.11.901.jar": "b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead",
}


def cache_dir(kind: str) -> Path:
    """~/.cache/lakehouse-dsr/<kind> (or under $XDG_CACHE_HOME): what a machine fetches or records once."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lakehouse-dsr" / kind


def default_cache_dir() -> Path:
    return cache_dir("jars")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cached(cache_dir: Path) -> list[Path] | None:
    jars = [cache_dir / name for name in S3A_JARS]
    if all(jar.is_file() for jar in jars):
        return jars
    return None


def s3a_jars(cache_dir: Path | None = None, fetch: bool = True) -> list[Path]:
    """Paths of the S3A jars in `cache_dir`, downloading and extracting them first if missing.

    Costs one download of the 180 MB sdist the first time; afterwards only a file check.
    Raises EnvironmentSetupError when pip cannot fetch the sdist or a jar's checksum is wrong.
    """
    cache_dir = cache_dir or default_cache_dir()
    if jars := _cached(cache_dir):
        return jars
    if not fetch:
        raise EnvironmentSetupError(f"the S3A jars are not in {cache_dir}: run `dsr fetch-jars` (make jars)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             SAGEMAKER_PYSPARK, "--dest", tmp],
            capture_output=True, text=True,
        )
        sdists = list(Path(tmp).glob("sagemaker_pyspark-*.tar.gz"))
        if download.returncode != 0 or not sdists:
            raise EnvironmentSetupError(f"could not download {SAGEMAKER_PYSPARK}: {download.stderr.strip()[-500:]}")
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                name = Path(member.name).name
                if name not in S3A_JARS or "/deps/jars/" not in member.name:
                    continue
                staged = Path(tmp) / name
                # a jar under deps/jars/ is a regular file: extractfile returns None for directories and links
                with cast(IO[bytes], sdist.extractfile(member)) as src, staged.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                if _sha256(staged) != S3A_JARS[name]:
                    raise EnvironmentSetupError(f"{name} from {SAGEMAKER_PYSPARK} does not match its pinned checksum")
                staged.replace(cache_dir / name)  # atomic: a half-written jar is never found as cached
    if jars := _cached(cache_dir):
        return jars
    raise EnvironmentSetupError(f"{SAGEMAKER_PYSPARK} did not contain {', '.join(S3A_JARS)}")

