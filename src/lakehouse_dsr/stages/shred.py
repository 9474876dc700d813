"""Crypto-shredding: erase a person from `action: shred` tables by deleting their vault entry.

The tables themselves are not rewritten: their rows keep the pseudonym and the ciphertexts, which
nothing links to the person or decrypts once the entry (their pseudonym and data key) is gone from
the vault's live rows, its history and its storage. So the cost follows the vault (one small
copy-on-write commit, an expiry of its old snapshots), not the size of the tables.

Steps, each safe to repeat after a crash: capture the batch's entries (from every file the vault's
retained snapshots reference, so entries an interrupted run already deleted are still found while
its history lasts) -> delete them (one MERGE) -> journal -> purge the vault's history -> verify.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from .. import faults
from ..config import PurgeSettings
from ..datamap.model import PSEUDONYM_PREFIX, DataMap, TableMapping
from ..exceptions import first_line
from ..lake import indriver
from ..lake.hmac import with_keyring_hashes
from ..lake.lakehouse import Lake
from ..lake.table import only_current, same_file
from ..vault import vault
from ..vault.risk import assess_table
from .erase import TableErasure, TablePlan
from .verify import TableVerification

_FOUND = ("key_hash", "key_id", "pseudonym", "key_check")


@dataclass
class Shred:
    """What a run's shred did: one vault commit for the batch, shared by every shred table."""

    erasures: dict[str, TableErasure]
    entries: DataFrame  # (request_id, pseudonym, key_check) of the batch, captured before the delete
    probes: DataFrame  # (request_id, key_type, key_value, key_hash, key_id): the batch's identifiers
    snapshot_before: int | None = None
    snapshot_id: int | None = None
    purge: vault.VaultPurge | None = None
    deleted: dict[str, int] = field(default_factory=dict)  # identifier type -> entries this run deleted


def shred(lake: Lake, datamap: DataMap, vault_table: vault.VaultTable, keys: DataFrame, vault_keys: vault.Keys
          ) -> Shred:
    """Delete the vault entries of the batch's subjects (`keys`: identity.resolve's request_id,
    key_type, key_value) for the identifier types the shred tables hold, then purge the vault.

    Cost: one HMAC per identifier and key of the ring, one read of the files the vault's retained
    snapshots reference (the vault is one row per subject), one copy-on-write MERGE rewriting the
    files that held the entries, an expiry of the vault's old snapshots and an orphan listing.
    """
    spark = lake.spark
    start = time.perf_counter()
    mappings = datamap.shredded
    types = sorted({_shred_key(m)[1] for m in mappings.values()})
    probes = with_keyring_hashes(spark, keys.where(F.col("key_type").isin(*types)), "key_value",
                                 vault_keys.ring.keys())
    entries = _captured(vault_table, probes)
    table = vault_table.name
    before = lake.table(table).current_snapshot()
    result = Shred({}, entries, probes, before.snapshot_id if before else None)
    per_request: dict[tuple[str, str], int] = {}
    found: dict[str, int] = {}
    for r in entries.groupBy("request_id", "identifier", "live").count().collect():
        per_request[(r.request_id, r.identifier)] = per_request.get((r.request_id, r.identifier), 0) + r["count"]
        if r.live:
            found[r.identifier] = found.get(r.identifier, 0) + r["count"]
    result.deleted = found
    commit = None
    if found:
        view = f"dsr_shred_{id(entries):x}"
        entries.select("pseudonym").distinct().createOrReplaceTempView(view)
        try:
            lake.with_conflict_retries("the vault: shredding", lambda: spark.sql(
                f"DELETE FROM {vault_table.quoted} WHERE pseudonym IN (SELECT pseudonym FROM {view})"))
        finally:
            spark.catalog.dropTempView(view)
        commit = lake.table(table).own_commit_since(result.snapshot_before)  # ours, not a concurrent writer's
        result.snapshot_id = commit.snapshot_id if commit else None
    seconds = round(time.perf_counter() - start, 3)
    for name, mapping in mappings.items():
        key, identifier = _shred_key(mapping)
        current = lake.table(name).current_snapshot()
        matches = {rid: n for (rid, ident), n in per_request.items() if ident == identifier}
        plan = TablePlan(name, key, identifier, "shred", "vault", "none", 0, sum(matches.values()),
                         matches, current.snapshot_id if current else None,
                         reason=f"{found.get(identifier, 0)} vault entries deleted; the table is not rewritten")
        erasure = TableErasure(plan, seconds=seconds)
        if commit is not None:
            erasure.data_files_rewritten = commit.stats.files_removed
            erasure.bytes_rewritten = int(commit.summary.get("removed-files-size", 0))
        result.erasures[name] = erasure
    return result


def _shred_key(mapping: TableMapping) -> tuple[str, str]:
    """A shred table's key column and the identifier it holds (both given once the data map is validated)."""
    return cast(str, mapping.key), cast(str, mapping.identifier)


def purge_vault(vault_table: vault.VaultTable, purge: PurgeSettings, result: Shred) -> None:
    """The vault's own purge: its older snapshots (which still hold the deleted entries) expire."""
    faults.failpoint("during_shred")
    start = time.perf_counter()
    result.purge = vault_table.purge_history(purge.orphan_min_age_minutes)
    result.purge.seconds = round(time.perf_counter() - start, 3)
    faults.failpoint("after_shred")


def _captured(vault_table: vault.VaultTable, probes: DataFrame) -> DataFrame:
    """(request_id, identifier, pseudonym, key_check, live) of every entry of the probed identifiers
    held by a file some retained vault snapshot references: the live ones (in a file of the current
    snapshot: the vault has no delete files), and those a killed run deleted while its history is
    kept. One read of those files; kept on the executors (one row per subject and identifier)."""
    spark = vault_table.lake.spark
    empty = indriver.local_rows(spark, [], "request_id string, identifier string, pseudonym string, key_check string, "
                                           "live boolean")
    if not vault_table.exists():
        return empty
    paths, current = vault_table.lake.table(vault_table.name).retained_files()
    if not paths:
        return empty
    stored = vault_table.lake.table(vault_table.name).read_raw(paths, _schema(("identifier", *_FOUND))).withColumn(
        "live", F.regexp_replace(F.input_file_name(), "^file:/+", "/").isin(*{same_file(p) for p in current}))
    return (stored.join(F.broadcast(probes), ["key_hash", "key_id"])
            .where(F.col("identifier") == F.col("key_type"))
            .groupBy("request_id", "identifier", "pseudonym", "key_check").agg(F.max("live").alias("live"))
            .localCheckpoint())


def _schema(columns) -> StructType:
    return StructType([StructField(c, StringType()) for c in columns])


def verify(lake: Lake, datamap: DataMap, vault_table: vault.VaultTable, table: str, result: Shred,
           request_ids: list[str]) -> TableVerification:
    """Prove a shred for one table:

    - live, history, storage: no vault row (current snapshot; every file a retained snapshot
      references; every Parquet file under the vault's location) holds a subject's entry, found by
      the identifier's keyed hash, by the captured pseudonym or by the data key's check value (so
      no entry left holds the same key). When the retained snapshots and the storage listing hold
      exactly the current files (the state the vault's purge leaves), the live read stands for all.
    - no file of the table holds a plaintext identifier in its key column: every data file any
      retained snapshot references has key bounds (Iceberg's column metrics) that start with the
      pseudonym prefix, so every value in it does; files without such bounds, and files on storage
      no snapshot references, are read and their keys compared with the subjects' identifiers.
    - with `min_k`: the table is k-anonymous over its quasi-identifiers (else the rows may still
      single the person out, and the shred does not count as an erasure).
    Also reported: whether the table still is at the snapshot it had before the shred (its rows all
    kept, now unlinkable). Cost: metadata and one listing per table, one small read of the vault;
    no read of the table's rows unless a file lacks key bounds (and, with min_k, one aggregation).
    """
    mapping = datamap.shredded[table]
    key, identifier = _shred_key(mapping)
    check = TableVerification(table, physical=True)
    probes = result.probes.where(F.col("key_type") == identifier)
    entries = result.entries.where(F.col("identifier") == identifier)
    _prove_vault(vault_table, table, check, probes, entries)
    unproven = lake.table(table).files_not_within(key, PSEUDONYM_PREFIX)
    if unproven:
        stored = lake.table(table).read_raw(unproven, _schema([key]))
        plain = stored.join(F.broadcast(probes.select("request_id", F.col("key_value").alias(key))),
                            key).groupBy("request_id").count().collect()
        for r in plain:
            check.fail(r.request_id, f"{table}: {r['count']} stored rows hold the subject's identifier in plaintext")
    erasure = result.erasures.get(table)
    current = lake.table(table).current_snapshot()
    check.details = {
        "method": "crypto-shred: vault entry deleted and purged",
        "vault_entries_deleted": result.deleted.get(identifier, 0),
        "pseudonyms_checked": erasure.plan.rows_matched if erasure else 0,
        "files_read_for_plaintext": len(unproven),
        "table_snapshot_unchanged": erasure is not None and erasure.plan.snapshot_before == (
            current.snapshot_id if current else None),
        "rows_kept": lake.table(table).live_rows(current.snapshot_id) if current else 0,
    }
    if mapping.min_k:
        _check_k(lake, datamap, table, check, request_ids)
    return check


def _prove_vault(vault_table: vault.VaultTable, table: str, check: TableVerification,
                 probes: DataFrame, entries: DataFrame) -> None:
    lake, name = vault_table.lake, vault_table.name
    handle = lake.table(name)
    paths, current = handle.retained_files()
    stored = handle.data_files_on_storage()
    check.one_scan = only_current(current, paths, stored)
    schema = _schema(_FOUND)
    sources: dict[str, DataFrame | None] = {"live": vault_table.rows().select(*_FOUND)}
    if not check.one_scan:
        sources["history"] = handle.read_raw(paths, schema) if paths else None
        sources["storage"] = handle.read_raw(stored, schema) if stored else None
    what = {"live": "vault entries in its current snapshot", "history": "vault entries in files its snapshots keep",
            "storage": "vault entries in files on storage (incl. orphans)"}
    tagged = [rows.select(*_FOUND, F.lit(where).alias("dsr_where")) for where, rows in sources.items() if rows]
    for part in tagged[1:]:
        tagged[0] = tagged[0].unionByName(part)
    found = _vault_hits(tagged[0], probes, entries)
    for (request_id, where), n in sorted(found.items()):
        check.fail(request_id, f"{table}: {n} {what[where]}")
    for where in ("live", "history", "storage"):
        counted = where if where in sources else "live"
        setattr(check, where, sum(n for (_, w), n in found.items() if w == counted))


def _vault_hits(rows: DataFrame, probes: DataFrame, entries: DataFrame) -> dict[tuple[str, str], int]:
    """Vault rows naming a subject, per (request, where the row was read: `dsr_where`): by keyed hash
    (with its key id), pseudonym or key check, a row counted once. One Spark job over every source."""
    marks = (probes.select("request_id", F.concat_ws("/", "key_hash", "key_id").alias("dsr_mark"))
             .unionByName(entries.select("request_id", F.col("pseudonym").alias("dsr_mark")))
             .unionByName(entries.select("request_id", F.col("key_check").alias("dsr_mark"))))
    stored = rows.select("pseudonym", "dsr_where", F.explode(F.array(
        F.concat_ws("/", "key_hash", "key_id"), F.col("pseudonym"), F.col("key_check"))).alias("dsr_mark"))
    hits = stored.join(F.broadcast(marks), "dsr_mark").select("request_id", "pseudonym", "dsr_where").distinct()
    return {(r.request_id, r.dsr_where): r["count"] for r in hits.groupBy("request_id", "dsr_where").count().collect()}


def _check_k(lake: Lake, datamap: DataMap, table: str, check: TableVerification,
             request_ids: list[str]) -> None:
    mapping = datamap.shredded[table]
    k: int | None
    reason: str | None
    try:
        report = assess_table(lake, datamap, table, mapping.quasi_identifiers,
                              k=cast(int, mapping.min_k))  # has min_k
    except Exception as exc:
        reason = f"{table}: k-anonymity cannot be measured ({first_line(exc)})"
        k = None
    else:
        k = report.smallest_class
        reason = (None if report.k_anonymous else
                  f"{table}: k-anonymity {k} over {', '.join(mapping.quasi_identifiers)} is below min_k "
                  f"{mapping.min_k}: the remaining columns can still single people out, so the shred does not count "
                  "as an erasure; generalise or drop columns (see dsr risk)")
    check.details["k_anonymity"] = {"k": k, "min_k": mapping.min_k, "quasi_identifiers": mapping.quasi_identifiers}
    if reason:
        for request_id in request_ids:
            check.fail(request_id, reason)
