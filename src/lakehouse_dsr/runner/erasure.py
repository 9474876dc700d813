"""A run's erase requests as one batch: resolve -> erase -> propagate -> purge -> prove.

`ErasureBatch` holds what those stages share; each stage returns its results and the outcome
rules (rules.py) turn them into per-request outcomes. Under `purge.policy: batched` a run whose
requests are not yet near their deadline proves live data only and leaves them `erased`; the run
that reaches the earliest purge deadline purges once for every waiting request and proves them
all (live, history, storage).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from typing import cast

import pyarrow as pa
from pyspark.sql import DataFrame

from .. import faults
from ..config import KafkaSettings
from ..datamap import DataMap
from ..exceptions import CommitConflictError, first_line
from ..keys import key_id
from ..lake import frames
from ..lake.hashsum import StageDone
from ..lake.hmac import with_keyed_hash
from ..lake.kafka import Cluster
from ..ledger.journal import Step
from ..ledger.ledger import Outcome
from ..stages import (
    access,
    collateral,
    erase,
    files,
    matching,
    propagate,
    purge,
    refs,
    resurrection,
    shred,
    topics,
    verify,
)
from ..vault import vault
from . import rules
from .context import Context
from .exports import SharedExport
from .proof import Prover
from .work import Work

PIPELINE_POLL_SECONDS = 1.0  # how often a run looks whether the pipelines have carried its deletes


@dataclass
class Erased:
    """What the erase stages did: each table's erasure (rounds folded in), the vault's shred, and
    the batch's keys per table (for proofs and propagation)."""

    erasures: dict[str, erase.TableErasure] = field(default_factory=dict)
    shredded: shred.Shred | None = None
    key_sets: dict[str, matching.TableKeys] = field(default_factory=dict)


@dataclass(frozen=True)
class ErasureResult:
    outcomes: list[Outcome] = field(default_factory=list)
    tables: dict[str, dict] = field(default_factory=dict)  # the report's per-table evidence
    collateral_failures: dict[str, str] = field(default_factory=dict)
    purged: bool = False
    waiting: dict[str, date] = field(default_factory=dict)  # requests left waiting for a purge -> due by
    resurrections: dict[str, dict] = field(default_factory=dict)  # tables where erased people came back -> evidence
    topics: dict[str, dict] = field(default_factory=dict)  # the report's entry per topic settled


@dataclass(frozen=True)
class Committed:
    """A wave's erase commits whose content checks still have fingerprints to read (`pending`)."""

    key_sets: dict[str, matching.TableKeys]
    erasures: dict[str, erase.TableErasure] = field(default_factory=dict)
    pending: dict[str, collateral.Pending] = field(default_factory=dict)


class ErasureBatch:
    """The run's erase requests (and, when a purge is due, every request waiting for one). `export`:
    the run's access export, run between the first wave's commits and their content checks
    (runner/exports.py's SharedExport)."""

    def __init__(self, ctx: Context, work: Work, export: SharedExport | None = None):
        self.ctx, self.work, self.export = ctx, work, export
        self.spark, self.settings, self.ledger, self.lake = ctx.spark, ctx.settings, ctx.ledger, ctx.lake
        self.request_ids = sorted(work.erase)
        self._hashes: DataFrame | None = None
        self._hashed_ids: list[str] | None = None  # whose hashes `_hashes` holds
        self._hash_keys: verify.HashKeys | None = None
        self._checked_at: dict[str, int] = {}  # table -> the snapshot the resurrection check saw
        self._came_back: dict[str, dict] = {}  # table -> evidence of people erased earlier found again
        self._proven: refs.ErasedHashes | None = None  # who the run proves erased: no branch or tag may keep them
        self._in_driver_max = self.settings.erase.in_driver_max_requests
        self._carried: dict[str, float] = {}  # pipelined tables found clean -> seconds after the run's start

    def run(self) -> ErasureResult:
        """Erase, purge when due, prove, and decide each request's outcome. A collateral failure stops
        the run before the purge (the pre-erase snapshots stay for a rollback) and holds the table."""
        work = self.work
        scopes, found = self._resurrected()
        if not self.request_ids and not work.purge_now and not found:
            self._record(self._checkpoints(scopes, {}))
            return ErasureResult(waiting=work.waiting)
        erased = self.erase_subjects(found)
        # What interrupted runs erased: re-erasing finds nothing, so their commits are the evidence.
        resumed = {s.table: s for s in work.steps if s.run_id in work.interrupted and s.step == "erased"}
        faults.failpoint("after_erase")
        damaged = self._hold_damaged(erased.erasures)
        stop_reason = ("run stopped before the purge: collateral check failed in " + ", ".join(sorted(damaged))
                       if damaged else None)
        # Rows that came back are purged at once: their request's deadline has passed already.
        purge_now = (work.purge_now or bool(found)) and not damaged
        proven = self.request_ids + (sorted(work.waiting) if purge_now else [])
        prior = self.ledger.evidence(sorted(work.waiting)) if purge_now and work.waiting else {}
        hashed = proven + self._resurrected_ids(found)
        if hashed == self._hashed_ids:  # the erasure's read serves (a million hashes read again cost 1.5 s)
            hashes, hash_keys = self._stored_hashes()
        else:
            hashes = verify.stored_hashes(self.spark, self.ledger, hashed, self._in_driver_max)
            hash_keys = verify.keys_for(self.settings.key_file(), hashes, self.ledger.keyring)
        self._proven = refs.ErasedHashes(hashes, hash_keys, self.ctx.key_types)
        purges = self._purge(erased, prior, resumed, scopes) if purge_now else {}
        erasures, purges = self._with_shred(erased, purges)
        prover = Prover(self.ctx, erasures, erased.shredded, self.request_ids, proven, purge_now, hashes,
                        self._purge_table,
                        erased.key_sets if len(proven) == len(self.request_ids) else {})
        verifications, repurged = prover.prove_all()
        purges = {**purges, **repurged}
        tables = {table: self._evidence(table, erasures, purges, v) for table, v in verifications.items()}
        outcomes = rules.erasure_outcomes(
            proven, erasures, purges, verifications, self.ctx.run_id, datetime.now(UTC).isoformat(), prior, resumed,
            {} if purge_now or stop_reason else work.deadlines, stop_reason, work.legal_tables,
            work.exempt_tables)
        settled = {}
        if self.settings.datamap.topics and not damaged:
            settled = self._settle_topics(hashes, hash_keys)
            outcomes = rules.with_topics(outcomes, settled, self._dues(proven))
        waiting = {**({} if purge_now else work.waiting),
                   **{o.request_id: o.purge_by for o in outcomes if o.status == "erased" and o.purge_by}}
        if not damaged and not purge_now:  # a purge records them (a table on hold keeps its own: checked again)
            self._record(self._checkpoints(scopes, purges))
        return ErasureResult(outcomes, tables, damaged, purge_now, waiting, self._came_back,
                             {name: t.as_dict() for name, t in settled.items()})

    # -- topics --------------------------------------------------------------------------------------

    def _settle_topics(self, hashes: DataFrame, hash_keys: verify.HashKeys) -> dict[str, topics.TopicSettlement]:
        """Every topic of the data map settled for the requests of `hashes` (the proven ones, and those
        whose people came back: tombstoned too) and read back (stages/topics.py)."""
        mapped = self.settings.datamap.topics
        cluster = Cluster(cast(KafkaSettings, self.settings.kafka))  # a data map with topics requires it
        settled = {}
        with self.ctx.timed("topics"):
            self.ctx.progress.stage("topics", len(mapped))
            for name, topic in mapped.items():
                self.ctx.progress.step(name)
                settled[name] = topics.settle(self.spark, cluster, name, topic, hashes, hash_keys.keys)
            self.ctx.progress.done()
        return settled

    def _dues(self, proven: list[str]) -> dict[str, date]:
        """Each proven request's due date (a request waiting for a batched purge: its purge deadline)."""
        rows = self.work.erase.table
        dues = dict(zip(rows.column("request_id").to_pylist(), rows.column("due_date").to_pylist(), strict=True))
        waiting = self.work.waiting
        return {rid: dues.get(rid) or waiting[rid] for rid in proven if rid in dues or rid in waiting}

    # -- resurrection --------------------------------------------------------------------------------

    def _resurrected(self) -> tuple[list[resurrection.Scope], resurrection.Found]:
        """The rows of people erased before that were added again to a keyed table since its last
        check (stages/resurrection.py). Cost: metadata per table; the key columns of the new files,
        read in the driver where they are small, else by Spark jobs (one per UNION_WIDTH tables),
        only when some erase request was completed and some table has new files."""
        datamap = self.settings.datamap
        tables = [t for t in [*datamap.keyed, *datamap.files] if t not in self.work.kept_tables]
        checked = resurrection.checkpoints(self.work.steps)
        listed = resurrection.dataset_checkpoints(self.work.steps)
        completed = self.ledger.erased_ids()  # expired records' kept hashes included

        def scope(t: str) -> resurrection.Scope:
            if t in datamap.files:
                return resurrection.dataset_scope(self.spark, datamap, t, listed.get(t), plan=bool(completed))
            return resurrection.scope(self.lake, datamap, t, checked.get(t), plan=bool(completed))

        scopes = self.ctx.each_table("check for erased people added again", tables, scope)
        self._checked_at = {t: s.snapshot.snapshot_id for t, s in scopes.items() if s.snapshot is not None}
        reading = [s for s in scopes.values() if s.reads]
        if not reading:
            return list(scopes.values()), resurrection.Found()
        with self.ctx.timed("resurrection"):
            hashes = verify.stored_hashes(self.spark, self.ledger, completed, self._in_driver_max)
            found = resurrection.find(self.spark, datamap, reading, hashes,
                                      verify.keys_for(self.settings.key_file(), hashes, self.ledger.keyring),
                                      self.settings.run.parallel_tables, self.ctx.key_types,
                                      self.settings.erase.in_driver_max_bytes)
            # read now: the purge expires the commits that brought them back
            self._came_back = {s.table: resurrection.evidence(self.lake, s, found)
                               for s in reading if s.table in found.by_request}
        return list(scopes.values()), found

    @staticmethod
    def _resurrected_ids(found: resurrection.Found) -> list[str]:
        return sorted({rid for requests in found.by_request.values() for rid in requests})

    def _record(self, steps: list[Step]) -> None:
        if steps:
            self.ledger.journal.record(steps)

    def _checkpoints(self, scopes: list[resurrection.Scope], purges: dict[str, purge.TablePurge]) -> list[Step]:
        """The journal steps of the tables whose resurrection checkpoint moved."""
        before, listed = resurrection.checkpoints(self.work.steps), resurrection.dataset_checkpoints(self.work.steps)
        files = self.settings.datamap.files
        datasets = [s for s in scopes if s.table in files]
        after = {s.table: resurrection.checkpoint_after(self.lake, s, purges.get(s.table))
                 for s in scopes if s.table not in files}
        moved = [*(Step(self.ctx.run_id, t, resurrection.CHECKED, c.snapshot_id, {"sequence": c.sequence})
                   for t, c in after.items() if c is not None and c != before.get(t)),
                 # a dataset's files as they were when checked: what this run rewrote is read next time
                 *(Step(self.ctx.run_id, s.table, resurrection.CHECKED, None, {"files": list(s.listing)})
                   for s in datasets if frozenset(s.listing) != listed.get(s.table))]
        return moved

    def _evidence(self, table: str, erasures: dict[str, erase.TableErasure], purges: dict[str, purge.TablePurge],
                  v: verify.TableVerification) -> dict:
        return {**({"aggregate": True} if table in self.settings.datamap.aggregates else {}),
                "erase": erasures[table].as_dict() if table in erasures else {},
                "purge": purges[table].as_dict() if table in purges else {},
                "verification": v.as_dict()}

    def _hold_damaged(self, erasures: dict[str, erase.TableErasure]) -> dict[str, str]:
        """Tables whose erase commit changed rows nobody asked about -> why; a conclusive finding puts
        the table on hold in the journal (nothing is erased or purged there until `dsr release`)."""
        damaged = {t: e.collateral for t, e in erasures.items() if e.collateral and not e.collateral.ok}
        if damaged:
            self.ledger.journal.record([Step(self.ctx.run_id, t, "held", erasures[t].plan.snapshot_before,
                                             {"reason": c.detail}) for t, c in damaged.items() if c.conclusive])
        return {t: c.detail or "" for t, c in damaged.items()}

    # -- erase -------------------------------------------------------------------------------------

    def erase_subjects(self, found: resurrection.Found | None = None) -> Erased:
        """Resolve the batch's identifiers, record their hashes, and erase them from every mapped table
        and file dataset, then shred the vault and propagate to the derived tables. Each wave's
        commits go to the step journal before the next wave starts, so a run killed in between leaves
        a record of what its successor must finish. `found`: people erased before whose rows came back
        (stages/resurrection.py), erased again in the same commits."""
        again = found.keys if found else None
        if not self.request_ids and again is None:
            return Erased()
        resolved = self._resolve() if self.request_ids else None
        parts = [part for part in (resolved, again) if part is not None]
        keys = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        hashed_ids = self.request_ids + (self._resurrected_ids(found) if found else [])
        with ThreadPoolExecutor(1, thread_name_prefix="dsr-keys") as pool:
            recorded = pool.submit(self._record_keys, resolved) if resolved is not None else None
            # the batch's own rows serve its key sets only when they are all the keys (no one came back)
            subjects = self.ctx.batch_rows(self.request_ids) if again is None else None
            erased = self._erase_sources(keys, subjects, partial(self._keys_stored, recorded, hashed_ids))
        erased.shredded = self._shred(keys, erased.erasures)
        if self.settings.datamap.derived:
            faults.failpoint("before_propagate")
            self._propagate(erased)
        return erased

    def _resolve(self) -> DataFrame:
        """The batch's identifiers (linked ones included)."""
        ctx = self.ctx
        with ctx.timed("resolve"):
            ctx.progress.stage("resolve identifiers", 1)
            ctx.progress.step(f"{len(self.request_ids)} subjects")
            keys = ctx.identifiers(self.request_ids)
            ctx.progress.done()
        return keys

    def _record_keys(self, keys: DataFrame) -> None:
        """The keyed hashes of the batch's identifiers stored in the ledger, on a thread while the
        erasure plans (linked identifiers are read from tables the erasure empties: the hashes must be
        stored before anything is erased). Hashed in Spark: only hashes reach the driver."""
        with self.ctx.timed("resolve", beside_the_run="record the identifiers' keyed hashes"):
            hashed = with_keyed_hash(self.spark, keys, "key_value", self.ledger.key).select(
                "request_id", "key_type", "key_hash")
            rows = frames.to_arrow(hashed)
            self.ledger.record_keys(rows.append_column("key_id", pa.array([key_id(self.ledger.key)] * rows.num_rows,
                                                                          pa.string())))

    def _keys_stored(self, recorded: Future[None] | None, request_ids: list[str]) -> None:
        """Wait for `_record_keys` (a failure raises here, before anything is erased), then read the
        stored hashes of `request_ids` back for the verification."""
        if recorded is not None:
            recorded.result()
        self._hashes = verify.stored_hashes(self.spark, self.ledger, request_ids, self._in_driver_max)
        self._hashed_ids = request_ids

    def _erase_sources(self, keys: DataFrame, subjects: pa.Table | None, stored: Callable[[], None]) -> Erased:
        """Erase the mapped tables wave by wave (tables identifiers are resolved through go last, so a
        resumed run can still resolve from them; a wave's tables side by side), then the file
        datasets, then late rows other writers appended meanwhile. `subjects`: the batch's rows, when
        `keys` are theirs alone (matching.key_sets groups them in Arrow). `stored()` waits for the keyed
        hashes to be stored, once the first wave is planned. A shared export (`export`) runs once
        the first wave has committed, before that wave's collateral verdicts, and is timed as the
        export."""
        datamap, ctx = self.settings.datamap, self.ctx
        erased = Erased()
        waves = datamap.erase_waves()
        waves = waves[:len(waves) - len(datamap.derived_levels())]
        with ctx.timed("erase"):
            erased.key_sets = matching.key_sets(datamap, keys, ctx.key_types, [*datamap.keyed, *datamap.files],
                                                subjects)
            plans = self._plan_tables(waves[0] if waves else [], erased.key_sets)
        stored()
        export, self.export = self.export, None
        sharing = export is not None and any(self._may_share(export, p, erased.key_sets[t]) for t, p in plans.items())
        if export is not None and not sharing:  # nothing to share: the export an export run first does
            export.run({})
        with ctx.timed("erase"):
            first = self._commit_planned("erase", plans, erased.key_sets)
            if sharing:  # a run killed during the export leaves a record of these commits
                self._journal(first.erasures)
        after = self._export_between(cast(SharedExport, export), first) if sharing else {}
        with ctx.timed("erase"):
            erased.erasures.update(self._conclude(first, after))
            for wave in waves[1:]:
                erased.erasures.update(self._erase_tables("erase", wave, erased.key_sets))
            if datamap.files:
                datasets = [d for d in datamap.files if d not in self.work.kept_tables]
                erased.erasures.update(ctx.each_table("erase files", datasets, lambda d: files.erase_dataset(
                    self.spark, datamap, d, erased.key_sets[d])))
            self._late_rounds(erased, list(datamap.keyed))
        return erased

    def _may_share(self, export: SharedExport, plan: erase.TablePlan, keys: matching.TableKeys) -> bool:
        """Whether the plan's commit will leave the content check new files to read that the export may
        read for it: Spark's rewrite of files too large for the driver, changing no access request's row."""
        settings = self.settings.erase
        return (settings.collateral_check == "content" and plan.strategy == "rewrite_files"
                and (plan.rows_matched > 0 or plan.folded)
                and (plan.skipping or {}).get("bytes", 0) > settings.in_driver_max_bytes
                and export.unchanged_by(plan.table, keys))

    def _export_between(self, export: SharedExport, first: Committed) -> dict[str, collateral.Split]:
        """Run the shared export after the first wave's commits: each table those commits erased is
        read as before them, or, where the content check still has to read the commit's new files and
        no access request's row was changed, through those files with the check's "after" side
        observed on the same scan. Returns the sides observed once that scan has completed: the export
        goes on grouping and writing its packages meanwhile (SharedExport.run's `background`)."""
        shared = {t: p.observe_after() for t, p in first.pending.items()
                  if p.after_shareable and export.unchanged_by(t, first.key_sets[t])}
        read_at = {**{t: access.ReadAt(e.plan.snapshot_before) for t, e in first.erasures.items()
                      if e.snapshot_id is not None},
                   **{t: access.ReadAt(first.erasures[t].snapshot_id, frame, first.pending[t].added_files)
                      for t, (frame, _) in shared.items()}}
        if not shared:
            export.run(read_at)
            return {}
        with StageDone(self.spark, [s for _, sums in shared.values() for s in (sums.other, sums.requested)]) as read:
            export.run(read_at, background=True)
            read.wait(export.finished)
        return {t: split for t, (_, sums) in shared.items()
                if (split := collateral.after_split(sums, first.pending[t].added_rows)) is not None}

    def _shred(self, keys: DataFrame, erasures: dict[str, erase.TableErasure]) -> shred.Shred | None:
        """Shred the subjects' vault entries (`action: shred` tables), journal them with the erase
        commits, and purge the vault's history (whatever the purge policy)."""
        shredded = None
        if self.settings.datamap.shredded:
            faults.failpoint("before_shred")
            with self.ctx.timed("shred"):
                self.ctx.progress.stage("shred", 1)
                self.ctx.progress.step("vault entries")
                assert self.ctx.vault_keys is not None, "the run opens the vault's keys when a table is shredded"
                shredded = shred.shred(self.lake, self.settings.datamap, self.ctx.vault_table, keys,
                                       self.ctx.vault_keys)
        self._journal(erasures, shredded=(self.ctx.vault_table.name, shredded) if shredded else None)
        if shredded is not None:
            with self.ctx.timed("shred"):
                shred.purge_vault(self.ctx.vault_table, self.settings.purge, shredded)
                self.ctx.progress.done()
        return shredded

    def _propagate(self, erased: Erased) -> None:
        """Bring the derived tables in line level by level (a level reads only tables erased before
        it): keyed ones erased by key, aggregates recomputed from what changed (stages/propagate.py)."""
        datamap = self.settings.datamap
        stale = stale_aggregates(self.settings.datamap, self.work.steps)
        with self.ctx.timed("propagate"):
            for level in datamap.derived_levels():
                keyed = [t for t in level if t in datamap.keyed]
                self._carried.update(self._await_pipelines(keyed, erased.key_sets))
                if keyed:
                    erased.erasures.update(self._erase_tables("propagate", keyed, erased.key_sets))
                    self._note_clean(keyed, erased.erasures)

                def derive(table: str) -> erase.TableErasure | None:
                    changes = self._changes(table, erased)
                    if not changes and table not in stale:
                        return None  # nothing it reads changed
                    return propagate.refresh(self.lake, datamap, table, changes, table in stale)
                done = self.ctx.each_table("propagate", [t for t in level if t not in datamap.keyed
                                                         and t not in self.work.kept_tables], derive)
                erased.erasures.update({t: e for t, e in done.items() if e is not None})
                self.ctx.report.clean_after_seconds.update(dict.fromkeys(
                    (t for t, e in done.items() if e is not None), self._since_start()))
                self._late_rounds(erased, keyed)
                faults.failpoint("during_propagate")
                self._journal({t: erased.erasures[t] for t in level if t in erased.erasures},
                              propagated=[t for t in level if t in datamap.aggregates])

    def _await_pipelines(self, tables: list[str], key_sets: dict[str, matching.TableKeys]) -> dict[str, float]:
        """Wait for the company's pipelines to carry the sources' deletes to `tables` of `propagation:
        pipeline`: their live data is checked for the batch's people (one job for all, as the late
        rounds do) every PIPELINE_POLL_SECONDS, each table until it holds none of them or its
        `wait_seconds` have passed. Returns {table: seconds since the run's start} of those found
        clean; the others are left to the erasure that follows."""
        datamap = self.settings.datamap
        waiting = [t for t in tables if t in datamap.pipelined and t not in self.work.kept_tables]
        carried: dict[str, float] = {}
        if not waiting:
            return carried
        hashes, hash_keys = self._stored_hashes()
        started = time.monotonic()
        self.ctx.progress.stage("wait for the pipelines", len(waiting))
        while waiting:
            found = verify.live_found(self.lake, datamap, self.settings.erase, waiting, hashes, hash_keys,
                                      key_sets, parallel_tables=self.settings.run.parallel_tables)
            for table in [t for t in waiting if not found[t]]:
                carried[table] = self._since_start()
                self.ctx.progress.step(table)
            waited = time.monotonic() - started
            waiting = [t for t in waiting if found[t] and waited < datamap.derived[t].wait_seconds]
            if waiting:
                time.sleep(PIPELINE_POLL_SECONDS)
        self.ctx.progress.done()
        return carried

    def _note_clean(self, tables: list[str], erasures: dict[str, erase.TableErasure]) -> None:
        """When each of the keyed derived `tables` was clean (now, for those the engine erased), and in a
        pipelined table's plan who took the batch's people out of it."""
        datamap, now = self.settings.datamap, self._since_start()
        for table in [t for t in tables if t in erasures]:
            plan = erasures[table].plan
            self.ctx.report.clean_after_seconds[table] = self._carried.get(table, now)
            if table in self._carried:
                plan.reason = f"carried by the pipeline: clean {self._carried[table]:.1f} s after the run started"
            elif table in datamap.pipelined:
                waited = datamap.derived[table].wait_seconds
                plan.reason = f"the pipeline had not carried the erasure after {waited:g} s: erased by the engine"

    def _since_start(self) -> float:
        """Seconds since the run started."""
        return round((datetime.now(UTC) - datetime.fromisoformat(self.ctx.report.started_at)).total_seconds(), 3)

    def _changes(self, table: str, erased: Erased) -> dict[str, propagate.Upstream | None]:
        """The sources of an aggregate this run changed: erased by key (traceable rows) or, for an
        aggregate source or one a pipeline carried the erasure to, changed as a whole (None)."""
        datamap = self.settings.datamap
        changes: dict[str, propagate.Upstream | None] = {}
        for source in datamap.aggregates[table].sources:
            if source in self._carried:  # the pipeline's commits changed it: not traceable to our keys
                changes[source] = None
                continue
            e = erased.erasures.get(source)
            if e is None or e.snapshot_id is None:
                continue
            keyed = source in datamap.keyed
            changes[source] = propagate.Upstream(e.plan.snapshot_before, erased.key_sets[source],
                                                 datamap.keyed[source].action) if keyed else None
        return changes

    def _erase_tables(self, stage: str, tables: list[str], key_sets: dict[str, matching.TableKeys]
                      ) -> dict[str, erase.TableErasure]:
        """Erase `tables`: planned in one Spark job (erase.plan_many), committed side by side, and their
        commits checked for collateral damage together (the content check's fingerprints in one job).
        Each table's `seconds` is its commit and count check; the shared plan and check are the stage's.
        Tables under a legal hold are left out."""
        return self._conclude(self._commit_planned(stage, self._plan_tables(tables, key_sets), key_sets), {})

    def _plan_tables(self, tables: list[str], key_sets: dict[str, matching.TableKeys]) -> dict[str, erase.TablePlan]:
        """The plans of `tables` not under a legal hold, in one Spark job (erase.plan_many)."""
        tables = [t for t in tables if t not in self.work.kept_tables]
        if not tables:
            return {}
        return erase.plan_many(self.lake, self.settings.datamap, self.settings.erase, tables, key_sets,
                               self.work.purge_now, parallel_tables=self.settings.run.parallel_tables)

    def _commit_planned(self, stage: str, plans: dict[str, erase.TablePlan], key_sets: dict[str, matching.TableKeys]
                        ) -> Committed:
        """`_erase_tables` up to the content check's fingerprints: committed side by side, checked by
        counts or as far as metadata takes the content check."""
        settings, datamap, tables = self.settings, self.settings.datamap, list(plans)
        if not tables:
            return Committed(key_sets)
        # The content check reads what a commit changed: where a format cannot say (capabilities), counts.
        content = {t for t in tables if settings.erase.collateral_check == "content"
                   and self.lake.table(t).capabilities.commit_files}

        def commit(table: str) -> erase.TableErasure:
            start, keys = time.perf_counter(), key_sets[table]
            try:
                erasure = erase.apply(self.lake, datamap, settings.erase, plans[table], keys,
                                      observe=keys if table in content else None)
            except Exception as exc:  # recorded; verification then shows what is left
                erasure = erase.TableErasure(plans[table], error=first_line(exc, with_type=True))
            if erasure.snapshot_id is not None and table not in content:
                erasure.collateral = collateral.check_counts(self.lake.table(table), erasure.plan.snapshot_before,
                                                             erasure.snapshot_id, erasure.plan.expected_rows_after,
                                                             erasure.rows_after)
            erasure.seconds = round(time.perf_counter() - start, 3)
            return erasure

        erasures = self.ctx.each_table(stage, tables, commit)
        if not content:
            return Committed(key_sets, erasures)
        committed = [collateral.Commit(t, key_sets[t], e.plan.snapshot_before, e.snapshot_id, e.observed,
                                       None if e.plan.folded else  # a folded plan counted no file's rows
                                       collateral.Planned(frozenset(e.plan.candidate_files), e.plan.requested_by_file))
                     for t, e in erasures.items() if e.snapshot_id is not None and t in content]
        decided, pending = collateral.prepare_many(self.lake, datamap, settings.erase, committed,
                                                   parallel_tables=settings.run.parallel_tables)
        for table, result in decided.items():
            erasures[table].collateral = result
        return Committed(key_sets, erasures, pending)

    def _conclude(self, committed: Committed, after: dict[str, collateral.Split]) -> dict[str, erase.TableErasure]:
        """The content check's verdicts of `committed` (`after`: "after" sides observed already)."""
        for table, result in collateral.conclude_many(committed.pending, after,
                                                      parallel_tables=self.settings.run.parallel_tables).items():
            committed.erasures[table].collateral = result
        return committed.erasures

    def _late_rounds(self, erased: Erased, tables: list[str]) -> None:
        """At most `erase.max_rounds - 1` more rounds for rows of the batch's subjects that other
        writers appended after our commits: only tables that took commits since are checked (one
        live-data job for all of them), and each round folds into the table's erasure."""
        for _ in range(self.settings.erase.max_rounds - 1):
            moved = [t for t in tables if t in erased.erasures and not erased.erasures[t].error
                     and self._changed_since(t, erased.erasures[t])]
            if not moved:
                return
            hashes, hash_keys = self._stored_hashes()
            found = verify.live_found(self.lake, self.settings.datamap, self.settings.erase, moved, hashes, hash_keys,
                                      erased.key_sets, parallel_tables=self.settings.run.parallel_tables)
            late = [t for t in moved if found[t]]
            if not late:
                return
            for table, later in self._erase_tables("erase late rows", late, erased.key_sets).items():
                erased.erasures[table].absorb(later)

    def _stored_hashes(self) -> tuple[DataFrame, verify.HashKeys]:
        """The batch's keyed hashes (read once the identifiers were resolved) and the keys that made
        them (looked up when first needed)."""
        assert self._hashes is not None, "the batch's identifiers are resolved first"
        if self._hash_keys is None:
            self._hash_keys = verify.keys_for(self.settings.key_file(), self._hashes, self.ledger.keyring)
        return self._hashes, self._hash_keys

    def _changed_since(self, table: str, erasure: erase.TableErasure) -> bool:
        current = self.lake.table(table).current_snapshot()
        ours = erasure.snapshot_id if erasure.snapshot_id is not None else erasure.plan.snapshot_before
        return current is not None and current.snapshot_id != ours

    def _journal(self, erasures: dict[str, erase.TableErasure], propagated: Sequence[str] = (),
                 shredded: tuple[str, shred.Shred] | None = None) -> None:
        """One journal commit: each commit of `erasures` (step `erased`), the aggregates brought in
        line with their sources (step `propagated`, committed or not), and the vault's shred commit."""
        run_id = self.ctx.run_id
        self.ledger.journal.record([*(Step(run_id, t, "erased", e.snapshot_id,
                                           {"rows": e.plan.matches_by_request, "rounds": e.rounds})
                                      for t, e in erasures.items() if e.snapshot_id is not None),
                                    *(Step(run_id, t, "propagated") for t in propagated),
                                    *([Step(run_id, shredded[0], "shredded", shredded[1].snapshot_id,
                                            {"tables": sorted(shredded[1].erasures),
                                             "snapshot_before": shredded[1].snapshot_before})] if shredded else [])])

    # -- purge -------------------------------------------------------------------------------------

    def _purge(self, erased: Erased, prior: dict[str, dict], resumed: dict[str, Step],
               scopes: list[resurrection.Scope]) -> dict[str, purge.TablePurge]:
        """Purge every table erased by this run, by an interrupted one, or by the earlier runs whose
        requests wait for this purge; journaled (step `purged`) in one commit with the resurrection
        checkpoints the purge settles (a purge the proof repeats later only rewrites what was checked)."""
        with self.ctx.timed("purge"):
            erased_earlier = {t for e in prior.values() for t, d in e.get("tables", {}).items() if d.get("snapshot_id")}
            to_purge = [t for t in self.settings.datamap.erase_order() if t in erased_earlier or t in resumed
                        or (t in erased.erasures and erased.erasures[t].snapshot_id is not None)]
            purges = self.ctx.each_table("purge", to_purge, self._purge_table)
        self._record([*(Step(self.ctx.run_id, t, "purged", None, {"bytes_rewritten": p.bytes_rewritten})
                        for t, p in purges.items() if not p.error), *self._checkpoints(scopes, purges)])
        faults.failpoint("after_purge")
        return purges

    def _purge_table(self, table: str) -> purge.TablePurge:
        """Purge one table; a purge step that another writer's commit invalidated is run again (every
        step is safe to repeat). When the retries run out, verification reports what is left. A table
        under a legal hold is not purged (its old snapshots may be what the hold preserves), nor is an exempt one."""
        if table in self.work.kept_tables:
            return purge.TablePurge(table, error=f"not purged: {self.work.kept_tables[table]}")
        start = time.perf_counter()
        try:
            result = self.lake.with_conflict_retries(f"table {table}: the purge", lambda: purge.purge_table(
                self.lake, self.settings.datamap, self.settings.purge, table, self._checked_at.get(table),
                self._proven))[0]
        except CommitConflictError as exc:
            result = purge.TablePurge(table, error=str(exc))
        result.seconds = round(time.perf_counter() - start, 3)
        return result

    def _with_shred(self, erased: Erased, purges: dict[str, purge.TablePurge]
                    ) -> tuple[dict[str, erase.TableErasure], dict[str, purge.TablePurge]]:
        """The erasures and purges with the shredded tables': the vault was purged in the shred step,
        whatever the policy."""
        if erased.shredded is None:
            return erased.erasures, purges
        p = erased.shredded.purge
        vault_purge = {t: purge.TablePurge(vault.table_name(self.settings), snapshots_expired=p.snapshots_expired,
                                           files_deleted=p.files_deleted, orphans_removed=p.orphans_removed,
                                           seconds=p.seconds) for t in erased.shredded.erasures} if p else {}
        return {**erased.erasures, **erased.shredded.erasures}, {**purges, **vault_purge}


def stale_aggregates(datamap: DataMap, steps: list[Step]) -> set[str]:
    """Aggregates a source of which was erased after their last propagation (a run killed or failed in
    between): the erased rows can no longer be read from the journal, so they are recomputed whole."""
    last: dict[tuple[str, str], datetime] = {}
    for s in steps:
        if s.step in ("erased", "propagated") and s.at is not None:
            last[(s.table, s.step)] = s.at
    stale = set()
    for name, mapping in datamap.aggregates.items():
        done = last.get((name, "propagated"))
        if any((src, "erased") in last and (done is None or last[(src, "erased")] > done) for src in mapping.sources):
            stale.add(name)
    return stale
