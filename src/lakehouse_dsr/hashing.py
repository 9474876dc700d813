"""Keyed hashes (HMAC-SHA256) of identifiers: what the ledger keeps once a request is complete.

The same HMAC is computed in Python (for submitted identifiers) and as a Spark expression (for
table values), so completed requests can be re-verified without any plaintext identifier.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from .exceptions import ConfigError

KEY_ENV = "DSR_SECRET_KEY"
_BLOCK = 64  # SHA-256 block size in bytes


def load_key(key_file: Path) -> bytes:
    """The HMAC key: $DSR_SECRET_KEY if set, else the key file (created 0600 with 32 random bytes)."""
    env = os.environ.get(KEY_ENV)
    if env:
        return env.encode("utf-8")
    if key_file.exists():
        if key_file.stat().st_mode & 0o077:
            raise ConfigError(f"key file {key_file} is readable by others; run: chmod 600 {key_file}")
        return bytes.fromhex(key_file.read_text().strip())
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32))
    return bytes.fromhex(key_file.read_text().strip())


def keyed_hash(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode("utf-8"), hashlib.sha256).hexdigest()


def _pads(key: bytes) -> tuple[bytes, bytes]:
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def with_keyed_hash(spark: SparkSession, df: DataFrame, column: str, key: bytes, out: str = "key_hash") -> DataFrame:
    """Add `out` = HMAC-SHA256(key, UTF-8 of `column` cast to string), computed by Spark.

    The key pads travel as a one-row broadcast DataFrame, never as literals in the query plan.
    """
    inner, outer = _pads(key)
    pads = spark.createDataFrame([(inner, outer)], "dsr_ipad binary, dsr_opad binary")
    value = F.col(column).cast("string").cast("binary")
    return (
        df.crossJoin(F.broadcast(pads))
        .withColumn(out, _hmac(value))
        .drop("dsr_ipad", "dsr_opad")
    )


def _hmac(message: Column) -> Column:
    inner = F.unhex(F.sha2(F.concat(F.col("dsr_ipad"), message), 256))
    return F.sha2(F.concat(F.col("dsr_opad"), inner), 256)
