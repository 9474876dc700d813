"""The vault: the only link between a person and the pseudonym their rows carry.

One Iceberg table, `<ledger namespace>.vault`, one row per (identifier type, subject):

- `key_hash`, `key_id`: the identifier's keyed hash (keys.py) and the HMAC key that made it:
  how a subject's entry is found. The plaintext identifier is stored nowhere in the clear.
- `pseudonym`: `psn:` + a random UUID drawn on the executors (java.util.UUID.randomUUID, a
  SecureRandom): the join key fact tables carry. Random, not derived: nobody holding every key of
  ours can compute it from the identifier, so deleting the entry really unlinks the rows.
- `wrapped_key`: the subject's random 256-bit data key, AES-GCM-encrypted by the master key
  (vault/keys.py) named by `master_key_id`, with the pseudonym as associated data.
- `key_check`: 16 hex digits of the data key's SHA-256: lets verification show that no entry left
  holds a shredded subject's key without unwrapping anything.
- `sealed_identifier`: the identifier encrypted with the data key (how `reidentify` gets it back).

The table is copy-on-write and keeps no column statistics, so deleting an entry rewrites the small
file that held it and no manifest keeps a prefix of a hash or pseudonym; shred.py then expires the
old snapshots so no older file keeps the entry either.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..datamap.model import PSEUDONYM_PREFIX
from ..exceptions import ConfigError
from ..keys import Keyring, as_keyring, load_key
from ..lake.hmac import join_on_key, with_keyed_hash, with_keyring_hashes
from ..lake.indriver import local_rows
from ..lake.lakehouse import Lake
from .keys import MasterKeys, drop_retired, load_master_keys, new_master_key

_COLUMNS = ("identifier string, key_hash string, key_id string, pseudonym string, wrapped_key binary, "
            "master_key_id string, key_check string, sealed_identifier binary, created_at timestamp")
_PROPS = {"format-version": "2", "write.delete.mode": "copy-on-write", "write.update.mode": "copy-on-write",
          "write.merge.mode": "copy-on-write", "write.metadata.metrics.default": "none",
          "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "1"}


def table_name(settings: Settings) -> str:
    """The vault's `namespace.table`, in the ledger's namespace."""
    return f"{settings.ledger_namespace}.vault"


def exists(spark: SparkSession, settings: Settings) -> bool:
    return VaultTable.of(spark, settings).exists()


@dataclass(frozen=True)
class VaultTable:
    """The vault's table in a lake (`namespace.vault`, table_name): what the stages reading or
    purging it need, without the settings (`VaultTable.of(spark, settings)`, or the run's lake and
    `table_name(settings)`). The module's functions taking (spark, settings) call these."""

    lake: Lake
    name: str  # namespace.table

    @classmethod
    def of(cls, spark: SparkSession, settings: Settings) -> VaultTable:
        return cls(Lake.of(spark, settings), table_name(settings))

    @property
    def quoted(self) -> str:
        return self.lake.quoted(self.name)

    def exists(self) -> bool:
        return self.lake.iceberg(self.name).exists()

    def rows(self, snapshot_id: int | None = None) -> DataFrame:
        """The vault's entries as stored (wrapped keys), now or at a snapshot."""
        return self.lake.iceberg(self.name).read_at(snapshot_id)

    def unwrapped(self, keys: Keys, entries: DataFrame | None = None) -> DataFrame:
        """Vault entries (all, or `entries`: vault rows) with `data_key` unwrapped. Cost: one AES-GCM
        decryption per entry; the master keys join as a broadcast row."""
        entries = self.rows() if entries is None else entries
        return (entries.join(F.broadcast(_masters(self.lake.spark, keys.masters)), "master_key_id")
                .withColumn("data_key", gcm_decrypt(F.col("wrapped_key"), F.col("master_key"), F.col("pseudonym")))
                .drop("master_key", "wrapped_key"))

    def links(self, values: DataFrame, identifier: str, keys: Keys) -> DataFrame:
        """(value, pseudonym, data_key) for the identifier values in `values` (column `value`, strings)
        that have an entry. Cost: one HMAC per value and key of the ring; the entries of that identifier
        type are joined (broadcast) on hash and key id."""
        if not self.exists():
            return values.select("value", F.lit(None).cast("string").alias("pseudonym"),
                                 F.lit(None).cast("binary").alias("data_key")).limit(0)
        hashed = with_keyring_hashes(self.lake.spark, values.select("value"), "value", keys.ring.keys())
        stored = self.rows().where(F.col("identifier") == identifier).select(
            "key_hash", "key_id", "pseudonym", "wrapped_key", "master_key_id")
        found = join_on_key(hashed, stored).select("value", "pseudonym", "wrapped_key", "master_key_id")
        return self.unwrapped(keys, found).select("value", "pseudonym", "data_key")

    def purge_history(self, orphan_min_age_minutes: float) -> VaultPurge:
        """Expire every snapshot but the current one, deleting the files only they held (the files a
        copy-on-write delete replaced), and remove unreferenced files older than the orphan window.
        No delete files and no column statistics exist here, so nothing else can hold an old entry.
        Cost: reads the vault's metadata, lists its location."""
        expired = self.lake.iceberg(self.name).expire_snapshots_before_current()
        orphans = self.lake.iceberg(self.name).remove_orphan_files(orphan_min_age_minutes)
        return VaultPurge(expired.snapshots_expired, expired.files_deleted, orphans)


def _create(spark: SparkSession, settings: Settings) -> None:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.namespace(settings.ledger_namespace)}")
    props = ", ".join(f"'{k}'='{v}'" for k, v in _PROPS.items())
    spark.sql(f"CREATE TABLE IF NOT EXISTS {settings.table(table_name(settings))} ({_COLUMNS}) USING iceberg "
              f"TBLPROPERTIES ({props})")


def rows(spark: SparkSession, settings: Settings, snapshot_id: int | None = None) -> DataFrame:
    """The vault's entries as stored (wrapped keys), now or at a snapshot."""
    return VaultTable.of(spark, settings).rows(snapshot_id)


@dataclass(frozen=True)
class Keys:
    """Everything the vault needs: the HMAC keyring (finds entries) and the master keys (unwrap them)."""

    ring: Keyring
    masters: MasterKeys


def open_keys(spark: SparkSession, settings: Settings, create: bool = False) -> Keys:
    """Load the keys and prove the master keys unwrap every stored entry (by the master key ids the
    vault names), before anything changes. `create`: a vault with no entries may get a new master
    key file (the first pseudonymization); one with entries never does."""
    key_file = settings.key_file()
    ring = as_keyring(load_key(key_file), key_file)
    used = ({r.master_key_id for r in rows(spark, settings).select("master_key_id").distinct().collect()}
            if exists(spark, settings) else set())
    masters = load_master_keys(settings, create=create and not used)
    missing = sorted(used - set(masters.keys()))
    if missing:
        raise ConfigError(f"wrong vault master key: the vault's entries are wrapped under master key(s) "
                          f"{', '.join(missing)}, which the configured key ({masters.active_id}) and its retired "
                          "keys are not; nothing was changed")
    return Keys(ring, masters)


def _masters(spark: SparkSession, masters: MasterKeys, active_only: bool = False) -> DataFrame:
    """(master_key_id, master_key) as a tiny DataFrame: keys travel as data, never as literals in SQL."""
    keys = {masters.active_id: masters.active} if active_only else masters.keys()
    return local_rows(spark, list(keys.items()), "master_key_id string, master_key binary")


def gcm_encrypt(value: Column, key: Column, aad: Column) -> Column:
    """AES-256-GCM with a random IV per value (Spark's aes_encrypt): IV, ciphertext and tag in one binary."""
    return F.aes_encrypt(value, key, F.lit("GCM"), F.lit("DEFAULT"), F.lit(b""), aad)


def gcm_decrypt(value: Column, key: Column, aad: Column) -> Column:
    """The plaintext of `gcm_encrypt`; NULL when the key or the associated data is not the one used."""
    return F.try_aes_decrypt(value, key, F.lit("GCM"), F.lit("DEFAULT"), aad)


def unwrapped(spark: SparkSession, settings: Settings, keys: Keys, entries: DataFrame | None = None) -> DataFrame:
    """Vault entries (all, or `entries`: vault rows) with `data_key` unwrapped (VaultTable.unwrapped)."""
    return VaultTable.of(spark, settings).unwrapped(keys, entries)


def links(spark: SparkSession, settings: Settings, values: DataFrame, identifier: str, keys: Keys) -> DataFrame:
    """(value, pseudonym, data_key) for the identifier values in `values` that have an entry (VaultTable.links)."""
    return VaultTable.of(spark, settings).links(values, identifier, keys)


def ensure_entries(spark: SparkSession, settings: Settings, values: DataFrame, identifier: str, keys: Keys) -> int:
    """Give every identifier value in `values` (column `value`) that has none an entry: a random
    pseudonym and data key, in one MERGE commit (none when every value has one). Returns the number
    created. Cost: one HMAC per distinct value and key, an anti-join with the vault, and a rewrite of
    nothing (inserts only); a concurrent creator of the same entry makes the commit conflict and it
    is recomputed (lake/table.py's with_conflict_retries)."""
    lake = Lake.of(spark, settings)
    _create(spark, settings)
    distinct = values.select(F.col("value").cast("string").alias("value")).where(F.col("value").isNotNull()).distinct()

    def attempt() -> int:
        hashed = with_keyring_hashes(spark, distinct, "value", keys.ring.keys())
        stored = rows(spark, settings).where(F.col("identifier") == identifier).select("key_hash", "key_id")
        known = join_on_key(hashed, stored, "left_semi").select("value")
        uuid = F.expr("reflect('java.util.UUID', 'randomUUID')")
        fresh = with_keyed_hash(spark, distinct.join(known, "value", "left_anti"), "value", keys.ring.active)
        # Drawn once and kept on the executors: the commit and any retry see the same random values.
        drawn = fresh.select("value", "key_hash", F.concat(F.lit(PSEUDONYM_PREFIX), uuid).alias("pseudonym"),
                             F.unhex(F.sha2(F.concat(uuid, uuid, uuid), 256)).alias("data_key")).localCheckpoint()
        created = drawn.count()
        if not created:
            return 0
        pseudonym = F.col("pseudonym")
        entries = drawn.crossJoin(F.broadcast(_masters(spark, keys.masters, active_only=True))).select(
            F.lit(identifier).alias("identifier"), "key_hash", F.lit(keys.ring.active_id).alias("key_id"), pseudonym,
            gcm_encrypt(F.col("data_key"), F.col("master_key"), pseudonym).alias("wrapped_key"), "master_key_id",
            F.substring(F.sha2(F.col("data_key"), 256), 1, 16).alias("key_check"),
            gcm_encrypt(F.col("value"), F.col("data_key"), pseudonym).alias("sealed_identifier"),
            F.current_timestamp().alias("created_at"))
        view = f"dsr_vault_new_{id(entries):x}"
        entries.createOrReplaceTempView(view)
        try:
            spark.sql(f"MERGE INTO {settings.table(table_name(settings))} t USING {view} s "
                      "ON t.identifier = s.identifier AND t.key_hash = s.key_hash AND t.key_id = s.key_id "
                      "WHEN NOT MATCHED THEN INSERT *")
        finally:
            spark.catalog.dropTempView(view)
        return created

    return lake.with_conflict_retries("the vault: new entries", attempt)[0]


@dataclass
class VaultPurge:
    snapshots_expired: int = 0
    files_deleted: int = 0
    orphans_removed: int = 0
    seconds: float = 0.0


def purge_history(spark: SparkSession, settings: Settings) -> VaultPurge:
    """VaultTable.purge_history with `purge.orphan_min_age_minutes`."""
    return VaultTable.of(spark, settings).purge_history(settings.purge.orphan_min_age_minutes)


@dataclass(frozen=True)
class MasterRotation:
    old_id: str
    new_id: str
    entries_rewrapped: int
    retired_dropped: int


def rotate_master_key(spark: SparkSession, settings: Settings) -> MasterRotation:
    """Wrap every data key under a new master key, without touching a fact table. (With
    $DSR_VAULT_KEY: under the key it holds now, unwrapping with the retired keys listed in the file.)

    Order (each step safe to repeat after a crash): the old key goes to the retired keyring, the new
    key replaces the key file, every entry not yet under the new key is re-wrapped in one MERGE
    commit, the vault's history (entries wrapped under the old key) is expired, and retired keys no
    entry needs any more are dropped. Cost: one decryption and encryption per entry, a rewrite of
    the vault's files.
    """
    current = open_keys(spark, settings)
    # With $DSR_VAULT_KEY the operator has set the new key already (the old one in the retired file)
    masters = current.masters if current.masters.from_env else new_master_key(settings, current.masters)
    keys = Keys(current.ring, masters)
    rewrapped = 0
    if exists(spark, settings):
        stale = rows(spark, settings).where(F.col("master_key_id") != masters.active_id)
        fresh = unwrapped(spark, settings, keys, stale).crossJoin(
            F.broadcast(_masters(spark, masters, active_only=True).withColumnRenamed("master_key_id", "new_id")))
        wrapped = gcm_encrypt(F.col("data_key"), F.col("master_key"), F.col("pseudonym"))
        fresh = fresh.select("pseudonym", F.col("new_id").alias("master_key_id"), wrapped.alias("wrapped_key")
                             ).localCheckpoint()
        rewrapped = fresh.count()
        if rewrapped:
            view = f"dsr_vault_rewrap_{id(fresh):x}"
            fresh.createOrReplaceTempView(view)
            try:
                Lake.of(spark, settings).with_conflict_retries("the vault: re-wrapping", lambda: spark.sql(
                    f"MERGE INTO {settings.table(table_name(settings))} t USING {view} s ON t.pseudonym = s.pseudonym "
                    "WHEN MATCHED THEN UPDATE SET t.wrapped_key = s.wrapped_key, t.master_key_id = s.master_key_id"))
            finally:
                spark.catalog.dropTempView(view)
        purge_history(spark, settings)
        still = {r.master_key_id for r in rows(spark, settings).select("master_key_id").distinct().collect()}
    else:
        still = set()
    dropped = drop_retired(settings, still - {masters.active_id})
    return MasterRotation(current.masters.active_id, masters.active_id, rewrapped, dropped)
