"""HMAC-SHA256 as a Spark expression: the same keyed hash keys.py computes in Python, over
table values, so stored hashes can be matched without any plaintext identifier."""

from __future__ import annotations

import hashlib

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from .indriver import is_local, keyed_hashes, local_rows

_BLOCK = 64  # SHA-256 block size in bytes


def pads(key: bytes) -> tuple[bytes, bytes]:
    """HMAC-SHA256's inner and outer pads of `key`."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def with_keyed_hash(spark: SparkSession, df: DataFrame, column: str, key: bytes, out: str = "key_hash") -> DataFrame:
    """Add `out` = HMAC-SHA256(key, UTF-8 of `column` cast to string), computed by Spark, or in the
    driver's JVM when `df` is held there (a local relation: a batch's identifiers).

    The key pads travel as a one-row broadcast DataFrame, never as literals in the query plan.
    """
    return _hashed(spark, df, column, {"": key}, out).drop("dsr_key_id")


def with_keyring_hashes(spark: SparkSession, df: DataFrame, column: str, keys: dict[str, bytes],
                        out: str = "key_hash", id_out: str = "key_id") -> DataFrame:
    """One row per row of `df` and key of `keys` ({key_id: key}): `id_out` = the key's id,
    `out` = the HMAC under that key. Cost: one HMAC per row and key (one key: as `with_keyed_hash`)."""
    return _hashed(spark, df, column, keys, out).withColumnRenamed("dsr_key_id", id_out)


def join_on_key(candidates: DataFrame, hashes: DataFrame, how: str = "inner") -> DataFrame:
    """`candidates` (key_id, key_hash from `with_keyring_hashes`) joined with `hashes` (key_hash and,
    if it has one, the key_id that made each hash; broadcast when held in the driver) on hash and key: a stored hash is
    only compared with candidates of its own key. A NULL key_id (written before key ids were
    recorded) matches a candidate of any key. `how`: inner, or left_semi to keep `candidates` only."""
    made_by = F.col("key_id") if "key_id" in hashes.columns else F.lit(None).cast("string")
    stored = hashes.select(*[c for c in hashes.columns if c != "key_id"], made_by.alias("dsr_made_by"))
    # Hashes too many for the driver (not held there: lake/frames.py) are joined by a shuffle.
    build = F.broadcast(stored) if is_local(hashes) else stored
    same_key = F.col("dsr_made_by").isNull() | (F.col("dsr_made_by") == candidates["key_id"])
    if how == "left_semi":
        return candidates.join(build, (candidates["key_hash"] == stored["key_hash"]) & same_key, "left_semi")
    if how != "inner":
        raise ValueError(f"join_on_key: how must be inner or left_semi, not {how!r}")
    return candidates.join(build, "key_hash").where(same_key).drop("dsr_made_by")


def _hashed(spark: SparkSession, df: DataFrame, column: str, keys: dict[str, bytes], out: str) -> DataFrame:
    key_pads = local_rows(spark, [(kid, *pads(key)) for kid, key in keys.items()],
                          "dsr_key_id string, dsr_ipad binary, dsr_opad binary")
    if is_local(df):  # a batch's identifiers, held in the driver: hashed there, no job
        return keyed_hashes(df, column, key_pads, out)
    value = F.col(column).cast("string").cast("binary")
    return (
        df.crossJoin(F.broadcast(key_pads))
        .withColumn(out, keyed_hash(value, F.col("dsr_ipad"), F.col("dsr_opad")))
        .drop("dsr_ipad", "dsr_opad")
    )


def keyed_hash(message: Column, inner_pad: Column, outer_pad: Column) -> Column:
    """HMAC-SHA256 of `message` (binary) as hex, from the key's `pads` held in columns."""
    inner = F.unhex(F.sha2(F.concat(inner_pad, message), 256))
    return F.sha2(F.concat(outer_pad, inner), 256)
