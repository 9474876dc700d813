"""The proof of an erasure batch, table by table: live data, and after a purge history and storage."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from pyspark.sql import DataFrame

from ..stages import erase, matching, propagate, purge, shred, verify
from . import rules
from .context import Context


class Prover:
    """Verifies every mapped table, file dataset and shredded table for the requests being proven.

    The keyed hashes are looked up once for every table; plaintext keys (`prune`) exist for this
    run's batch only, so requests erased earlier are proven without data skipping. Files the
    collateral check read whole, by the same keys, and found clean are skipped by the live scan
    while the table's history still runs through the erase commit (a rollback could bring back
    rows that deletes had hidden)."""

    def __init__(self, ctx: Context, erasures: dict[str, erase.TableErasure], shredded: shred.Shred | None,
                 request_ids: list[str], proven: list[str], physical: bool, hashes: DataFrame,
                 purge_table: Callable[[str], purge.TablePurge], prune: dict[str, matching.TableKeys]):
        self.ctx, self.spark, self.settings, self.lake = ctx, ctx.spark, ctx.settings, ctx.lake
        self.erasures, self.shredded, self.request_ids, self.proven = erasures, shredded, request_ids, proven
        self.physical, self.hashes, self.purge_table, self.prune = physical, hashes, purge_table, prune
        self.hash_keys = verify.keys_for(self.settings.key_file(), hashes, ctx.ledger.keyring)  # once, for every table
        self.clean = {t: e.collateral.clean_files for t, e in erasures.items()
                      if e.collateral and e.collateral.clean_files and t in prune and e.snapshot_id is not None
                      and self.lake.table(t).descends_from(e.snapshot_id)}
        self.live: dict[str, dict[str, int]] = {}
        self.repurged: dict[str, purge.TablePurge] = {}

    def prove_all(self) -> tuple[dict[str, verify.TableVerification], dict[str, purge.TablePurge]]:
        """Every table's verification, and the purges run again for leftovers of interrupted runs.
        Cost: one live-data job for all keyed tables, then each table's own checks side by side."""
        datamap = self.settings.datamap
        tables = datamap.erase_order()
        keyed = [t for t in tables if t in datamap.keyed]
        with self.ctx.timed("verify"):
            if len(keyed) > 1:  # every keyed table's live check in one Spark job
                self.live.update(verify.live_found(self.lake, datamap, self.settings.erase, keyed, self.hashes,
                                                   self.hash_keys, self.prune, self.clean,
                                                   parallel_tables=self.settings.run.parallel_tables))
            stage = "verify" if self.physical else "verify live data (purge not run)"
            verifications = self.ctx.each_table(stage, [*tables, *datamap.files,
                                                        *(datamap.shredded if self.shredded is not None else [])],
                                                self.timed)
        return verifications, self.repurged

    def timed(self, table: str) -> verify.TableVerification:
        start = time.perf_counter()
        checked = self.prove(table)
        details = dict(checked.details)  # a shredded table names its own method
        details.setdefault("method", rules.proof_method(self.settings.datamap, table, checked))
        return replace(checked, seconds=round(time.perf_counter() - start, 3), details=details)

    def prove(self, table: str) -> verify.TableVerification:
        """One table's proof. A derived table recomputed by groups that still shows the subject is
        caught up and checked again; a table whose live data is clean but whose history or storage
        still holds them, or whose storage holds a file no reader can take (both left over from an
        interrupted run), is purged now and checked again. An exempt table is never purged: only its
        live data is checked (whether it keeps the subject), and nothing is purged again."""
        if table in self.settings.datamap.shredded:
            assert self.shredded is not None, "shredded tables are proven after a shred"
            return shred.verify(self.lake, self.settings.datamap, self.ctx.vault_table, table, self.shredded,
                                self.request_ids)
        e = self.erasures.get(table)
        physical = self.physical and table not in self.settings.datamap.exempt
        checked = self.check(table, physical, self.live.get(table))
        if checked.live and e is not None and e.plan.strategy == "subtract_groups":
            propagate.catch_up(self.lake, self.settings.datamap, table, e)
            checked = self.check(table, physical)
        if physical and not checked.live and (checked.history or checked.storage
                                                   or checked.details.get("unreadable_files")):
            self.repurged[table] = self.purge_table(table)
            checked = self.check(table, True)
        return rules.with_collateral(e, checked)

    def check(self, table: str, physical: bool, found: dict[str, int] | None = None) -> verify.TableVerification:
        if table in self.settings.datamap.aggregates:
            return propagate.verify_aggregate(self.lake, self.settings.datamap, table, self.erasures.get(table),
                                              self.proven, physical)
        prune, clean = self.prune.get(table), self.clean.get(table)
        settings = self.settings
        return verify.verify_tables(self.lake, settings.datamap, settings.erase, settings.key_file(), self.hashes,
                                    self.hash_keys, self.ctx.key_types, [table], physical,
                                    {table: prune} if prune else None,
                                    {table: found} if found is not None else None,
                                    {table: clean} if clean else None,
                                    parallel_tables=settings.run.parallel_tables)[0]
