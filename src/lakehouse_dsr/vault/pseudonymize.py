"""Pseudonymize on the way in, re-identify for authorised use.

`pseudonymize` swaps a DataFrame's subject key for the subject's pseudonym and encrypts the listed
columns with the subject's own data key (AES-256-GCM, random IV, the pseudonym as associated data,
so a ciphertext moved under another pseudonym does not decrypt). All of it is Spark's own
expressions over a join with the vault: no Python on the row path. Because every subject has a
key of their own, deleting their vault entry (shred.py) makes exactly their values unreadable and
their rows unlinkable, whatever the size of the tables holding them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType

from ..config import Settings
from ..datamap.model import PSEUDONYMIZED_PROPERTY, check_table_name
from ..exceptions import DataMapError, DsrError
from ..lake.indriver import local_rows
from ..lake.lakehouse import Lake
from . import vault

# Up to this many subjects in a batch (about 100 bytes each), their links are broadcast to the rows
BROADCAST_SUBJECTS = 500_000
PROPERTY = PSEUDONYMIZED_PROPERTY  # the table property of a pseudonymized table (datamap/model.py)


class VaultError(DsrError):
    """A pseudonym has no vault entry, or the vault cannot serve a request."""


def _check(df: DataFrame, key: str, encrypt: list[str]) -> dict[str, str]:
    """{encrypted column: its type} after checking the columns; DataMapError naming the column."""
    types = {f.name: f.dataType for f in df.schema.fields}
    if key not in types:
        raise DataMapError(f"key column {key!r} does not exist (has: {', '.join(types)})")
    out = {}
    for column in encrypt:
        if column not in types:
            raise DataMapError(f"encrypt: column {column!r} does not exist (has: {', '.join(types)})")
        if column == key:
            raise DataMapError(f"encrypt: {column!r} is the key column; it is replaced by the pseudonym")
        if not isinstance(types[column], StringType | BinaryType):
            raise DataMapError(f"encrypt: column {column!r} is a {types[column].simpleString()}; only string or "
                               "binary columns can be encrypted")
        out[column] = types[column].simpleString()
    return out


def pseudonymize(df: DataFrame, settings: Settings, key: str = "user_id", identifier: str | None = None,
                 encrypt: list[str] | tuple[str, ...] = ()) -> DataFrame:
    """`df` with `key` holding each subject's pseudonym and the `encrypt` columns as AES-GCM binary.

    Subjects seen for the first time get vault entries first, in one commit for the whole batch
    (this reads `df`'s distinct keys once, and keeps them on the executors). The result is lazy:
    writing it reads `df` again and joins it with the batch's entries. A row with no key keeps NULL
    in the key and the encrypted columns (no subject, no key to encrypt with). `identifier`: the
    identifier type the key holds (default: the data map's subject).
    """
    return _pseudonymized(df, settings, key, identifier or settings.datamap.subject, encrypt)[0]


def _pseudonymized(df: DataFrame, settings: Settings, key: str, identifier: str, encrypt: list[str] | tuple[str, ...]
                   ) -> tuple[DataFrame, int, dict[str, str]]:
    """`pseudonymize`, how many vault entries it created, and the encrypted columns' types."""
    spark = df.sparkSession
    encrypted = _check(df, key, list(encrypt))
    keys = vault.open_keys(spark, settings, create=True)
    # read once: the entries are created and looked up from the same distinct keys
    values = df.select(F.col(key).cast("string").alias("value")).where(F.col("value").isNotNull()).distinct() \
        .localCheckpoint()
    created = vault.ensure_entries(spark, settings, values, identifier, keys)
    link = vault.links(spark, settings, values, identifier, keys).select(
        F.col("value").alias("dsr_value"), F.col("pseudonym").alias("dsr_pseudonym"),
        F.col("data_key").alias("dsr_data_key")).localCheckpoint()
    if values.count() <= BROADCAST_SUBJECTS:  # Spark cannot size a checkpoint: say it is small
        link = F.broadcast(link)
    joined = df.join(link, df[key].cast("string") == link["dsr_value"], "left")
    pseudonym, data_key = F.col("dsr_pseudonym"), F.col("dsr_data_key")
    out = []
    for column in df.columns:
        if column == key:
            out.append(pseudonym.alias(column))
        elif column in encrypted:
            out.append(vault.gcm_encrypt(F.col(f"`{column}`").cast("binary"), data_key, pseudonym).alias(column))
        else:
            out.append(F.col(f"`{column}`"))
    return joined.select(*out), created, encrypted


def reidentify(df: DataFrame, settings: Settings, key: str = "user_id", decrypt: Sequence[str] | dict[str, str] = (),
               unlinkable: str = "error") -> DataFrame:
    """The reverse of `pseudonymize`: `key` back to the identifier, `decrypt` columns to plaintext
    (a list: as strings; a dict: {column: "string" | "binary"}).

    `unlinkable`: what to do with rows whose pseudonym has no vault entry (shredded, or never issued):
    "error" (VaultError, found by one count before anything is returned), "drop", or "keep" (NULLs).
    Cost: the entries of the pseudonyms present are unwrapped (one AES per subject) and joined.
    """
    if unlinkable not in ("error", "drop", "keep"):
        raise ValueError("unlinkable must be error, drop or keep")
    spark = df.sparkSession
    types = dict.fromkeys(decrypt, "string") if not isinstance(decrypt, dict) else dict(decrypt)
    _check(df, key, [])
    keys = vault.open_keys(spark, settings)
    present = df.select(F.col(key).alias("pseudonym")).distinct()
    entries = vault.rows(spark, settings).join(present, "pseudonym", "left_semi") if vault.exists(spark, settings) \
        else None
    link = (vault.unwrapped(spark, settings, keys, entries) if entries is not None else
            local_rows(spark, [], "pseudonym string, data_key binary, sealed_identifier binary"))
    link = link.select(F.col("pseudonym").alias("dsr_pseudonym"), F.col("data_key").alias("dsr_data_key"),
                       F.col("sealed_identifier").alias("dsr_sealed"))
    joined = df.join(link, df[key] == link["dsr_pseudonym"], "left")
    if unlinkable == "error":
        missing = joined.where(F.col(f"`{key}`").isNotNull() & F.col("dsr_pseudonym").isNull()).count()
        if missing:
            raise VaultError(f"{missing} row(s) carry a pseudonym with no vault entry (shredded, or not issued by "
                             "this vault); pass unlinkable='drop' or 'keep' to read the others")
    elif unlinkable == "drop":
        joined = joined.where(F.col("dsr_pseudonym").isNotNull() | F.col(f"`{key}`").isNull())
    pseudonym, data_key = F.col("dsr_pseudonym"), F.col("dsr_data_key")
    out = []
    for column in df.columns:
        if column == key:
            out.append(vault.gcm_decrypt(F.col("dsr_sealed"), data_key, pseudonym).cast("string").alias(column))
        elif column in types:
            plain = vault.gcm_decrypt(F.col(f"`{column}`"), data_key, pseudonym)
            out.append((plain.cast("string") if types[column] == "string" else plain).alias(column))
        else:
            out.append(F.col(f"`{column}`"))
    return joined.select(*out)


@dataclass(frozen=True)
class Pseudonymized:
    source: str
    target: str
    key: str
    identifier: str
    encrypted: dict[str, str]
    rows: int
    entries_created: int
    table_format: Literal["iceberg", "delta"] = "iceberg"

    def datamap_entry(self) -> dict:
        """What to put under `tables:` in the data map for the new table."""
        entry: dict[str, str | list[str]] = {"key": self.key, "identifier": self.identifier, "action": "shred"}
        if self.encrypted:
            entry["encrypted"] = list(self.encrypted)
        if self.table_format == "delta":
            entry["format"] = "delta"
        return {self.target: entry}


def pseudonymize_table(spark: SparkSession, settings: Settings, source: str, target: str, key: str,
                       identifier: str | None = None, encrypt: list[str] | tuple[str, ...] = (),
                       table_format: Literal["iceberg", "delta"] = "iceberg") -> Pseudonymized:
    """Write `target`, a new table: `source` pseudonymized (same columns, the key holding pseudonyms,
    encrypted columns as binary); an Iceberg table of the catalog, or (`table_format` delta) a Delta
    table at `<delta.warehouse>/<namespace>/<table>`. Refuses an existing target. Cost: reads
    `source` twice (its distinct keys, then the copy), one vault commit, one table write."""
    for name in (source, target):
        check_table_name(name)
    delta = {**settings.delta_tables(), **({target: settings.delta_location(target)} if table_format == "delta"
                                            else {})}
    lake = Lake(spark, settings.catalog, delta=delta)
    if lake.table(target).exists():
        raise DataMapError(f"{target} already exists; choose a new table name (nothing was written)")
    df = spark.table(settings.table(source))
    identifier = identifier or _identifier_of(settings, source, key)
    out, created, encrypted = _pseudonymized(df, settings, key, identifier, list(encrypt))
    meta = json.dumps({"key": key, "identifier": identifier, "encrypted": encrypted})
    lake.create_table(target, out, {PROPERTY: meta})
    written = lake.table(target).current_snapshot()
    rows = lake.table(target).live_rows(written.snapshot_id) if written else 0
    return Pseudonymized(source, target, key, identifier, encrypted, rows, created, table_format)


def _identifier_of(settings: Settings, source: str, key: str) -> str:
    """The identifier the data map says `key` of `source` holds, else the subject."""
    try:
        mapping = settings.datamap.mapping(source)
    except KeyError:
        return settings.datamap.subject
    return next((g.identifier for g in mapping.groups if g.column == key), settings.datamap.subject)
