"""`dsr run`: every open request in one batch per type.

Access requests first (a person asking for a copy and erasure gets the copy): resolve -> export
-> checksum check. Then erase requests: resolve -> erase -> purge -> verify. Then opt-out and
opt-in requests and the data map's shares (stages/share.py): consent recorded, every share
refreshed without opted-out or erased subjects, purged and verified. Then one ledger commit for
all outcomes and the ledger's own purge. A request completes only when its proof holds (package
checksum, or every table's and share's verification); otherwise it stays open (status failed,
retried by the next run) with the reasons.

Under `purge.policy: batched` a run whose requests are not yet near their deadline verifies the
live data only and leaves them `erased`; the run that reaches the earliest purge deadline purges
once for every waiting request and proves them all (live, history, storage).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession

from . import faults
from .config import Settings
from .evidence.report import RequestResult, RunReport
from .exceptions import CommitConflictError, first_line
from .inventory.check import KeyTypes, check_against_catalog
from .keys import key_id
from .lake import iceberg, skipping
from .lake.hmac import with_keyed_hash
from .lake.metrics import IoCost, StageMeter
from .ledger.journal import Step
from .ledger.lease import Lease
from .ledger.ledger import OPEN_STATUSES, Ledger, Outcome
from .ledger.requests import utc_now
from .progress import Progress, Silent
from .stages import access, collateral, erase, files, identity, matching, propagate, purge, share, shred, verify
from .vault import vault


@contextmanager
def _timed(report: RunReport, stage: str, spark: SparkSession | None = None) -> Iterator[None]:
    """Add the block's seconds, and with Spark its I/O (rows, bytes read/written, shuffled), to the stage's totals."""
    meter = StageMeter(spark) if spark is not None else None
    mark = meter.mark() if meter else None
    start = time.perf_counter()
    try:
        yield
    finally:
        report.seconds[stage] = round(report.seconds.get(stage, 0.0) + time.perf_counter() - start, 3)
        if meter:
            report.cost[stage] = IoCost(**report.cost.get(stage, {})).add(meter.since(mark)).as_dict()


@dataclass
class _Work:
    """What the ledger holds for this run, from one read of requests and one of the journal."""

    access: dict[str, dict]  # request id -> ledger row (subject id included: stays in this process and Spark)
    erase: dict[str, dict]  # empty while a table is on hold
    waiting: dict[str, date]  # logically erased, purge due by
    steps: list[Step]
    interrupted: list[str]  # runs that lapsed without returning the lease: their work is ours now
    deadlines: dict[str, date]  # purge deadline of each erase request, waiting or new
    purge_now: bool
    ledger_purge: bool  # the ledger's own history still holds plaintext of completed requests
    consent: dict[str, dict]  # opt_out and opt_in requests (stages/share.py)
    shares: bool  # the data map declares shares: every run refreshes them

    @property
    def ids(self) -> list[str]:
        return [*self.access, *self.erase, *self.consent]

    @property
    def needs_lease(self) -> bool:
        return bool(self.ids or self.purge_now or self.ledger_purge or self.shares)


def run(spark: SparkSession | Callable[[], SparkSession], settings: Settings, progress: Progress | None = None,
        today: date | None = None) -> RunReport:
    """Process every open request (access, erase, opt_out, opt_in) and refresh the data map's shares;
    returns the run report (no identifiers).

    `spark`: a session, or a function making one: called only when there is work for Spark, so a
    run with nothing to do costs two small pyiceberg reads, writes nothing and starts no JVM (with
    shares declared there is always something to do: their refresh).
    `today` (default: the current UTC date) is the day purge deadlines are compared with.
    A run with work takes the ledger's lease (ledger/lease.py) and reads the ledger again under it:
    another live holder makes this one wait or raise LedgerBusyError, per `run.concurrent`.
    """
    progress = progress or Silent()
    faults.armed()  # a misspelt failpoint fails before anything changes
    started = utc_now()
    today = today or started.date()
    report = RunReport(f"run-{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}", started.isoformat())
    ledger = Ledger(settings)
    with _timed(report, "ledger"):
        work = _read_work(ledger, settings, today, (), report)
    if not work.needs_lease:
        report.purge_schedule = _schedule(settings, False, work.waiting)
        return report
    lease = Lease(ledger.store, report.run_id, settings.run.lease_seconds)
    waited: list[str] = []

    def waiting(other) -> None:  # a stage of its own, so the bar says why nothing moves
        waited.append(other.run_id)
        progress.stage("wait for the ledger", 1)
        progress.step(f"run {other.run_id} holds it")

    with _timed(report, "ledger"):
        holder = lease.acquire(settings.run.concurrent == "wait", notify=waiting)
    if waited:
        progress.done()
    try:
        with _timed(report, "ledger"):
            work = _read_work(ledger, settings, today, holder.interrupted, report)  # as it is now we hold it
            if work.ids:
                lease.working_on(work.ids)
        if not work.ids and not work.purge_now and not work.shares:
            report.purge_schedule = _schedule(settings, False, work.waiting)
            if work.ledger_purge:
                _purge_ledger(ledger, report)
            return report
        for run_id in ledger.unrecorded_runs(work.interrupted):
            # packages a killed run wrote but never checked or recorded: personal data nobody owns
            shutil.rmtree(Path(settings.export.directory) / run_id, ignore_errors=True)
        session = spark() if callable(spark) else spark
        faults.failpoint("after_start")
        with _timed(report, "ledger", session):
            key_types = check_against_catalog(session, settings.datamap, settings.table)  # before anything changes
            # a wrong or missing vault master key fails here, before anything changes
            vault_keys = vault.open_keys(session, settings) if settings.datamap.shredded else None
        outcomes = _run_access(session, settings, key_types, report, progress, work, vault_keys)
        if not report.held:  # a table on hold stops every erasure and purge until `dsr release`
            outcomes += _run_erasure(session, settings, ledger, key_types, report, progress, work, vault_keys)
        if work.shares or work.consent:  # consent recorded, every share refreshed without opted-out or erased people
            with _timed(report, "shares", session):
                outcomes, shared = share.process(session, settings, ledger, work.consent, outcomes,
                                                 {*work.erase, *work.waiting}, set(report.held), progress,
                                                 report.run_id)
            report.shares = {name: s.as_dict() for name, s in shared.items()}
        faults.failpoint("after_verify")
        with _timed(report, "ledger"):
            lease.check()  # a run that lost its lease must not record anything: its successor acts
            ledger.finish(outcomes, report.run_id, started)
            faults.failpoint("after_finish")
            # Completion drops plaintext ids from the current snapshot only; history keeps them until the
            # ledger is purged too (under the batched policy, with the tables). Owed also when a run was
            # killed between recording outcomes and this purge.
            if any(o.status == "completed" for o in outcomes) or work.ledger_purge:
                if settings.purge.policy == "immediate" or report.purge_schedule.get("purged"):
                    _purge_ledger(ledger, report)
        report.requests = [RequestResult(o.request_id, o.status, o.reason) for o in outcomes]
        ledger.record_run(report.record(utc_now()))  # the dashboard's run history: one append
        return report
    finally:
        skipping.release()
        lease.release()


def _read_work(ledger: Ledger, settings: Settings, today: date, interrupted: tuple[str, ...], report: RunReport
               ) -> _Work:
    """One read of the open requests and one of the journal (plus, when a purge happened, one pruned
    read of requests completed since); sets the report's held tables and the requests this version
    records but does not process."""
    rows = ledger.requests(OPEN_STATUSES)
    steps = ledger.journal.steps()
    report.held = {t: s.detail.get("reason", "") for t, s in ledger.journal.holds(steps).items()}
    report.not_processed = {}
    by_type: dict[str, dict[str, dict]] = {"access": {}, "erase": {}, "opt_out": {}, "opt_in": {}}
    waiting: dict[str, date] = {}
    for r in rows:
        if r["status"] == "erased":
            waiting[r["request_id"]] = r["purge_by"]
        elif r["request_type"] in by_type:
            by_type[r["request_type"]][r["request_id"]] = r
        else:
            report.not_processed[r["request_type"]] = report.not_processed.get(r["request_type"], 0) + 1
    erase = {} if report.held else by_type["erase"]
    deadlines = {**waiting, **{rid: purge.purge_deadline(today, r["due_date"], settings.purge)
                               for rid, r in erase.items()}}
    return _Work(by_type["access"], erase, waiting, steps, list(interrupted), deadlines,
                 not report.held and purge.purge_due(deadlines.values(), today),
                 settings.purge.policy == "immediate" and ledger.purge_owed(steps),
                 {**by_type["opt_out"], **by_type["opt_in"]}, bool(settings.datamap.shares))


def _purge_ledger(ledger: Ledger, report: RunReport) -> None:
    """Purge the ledger's own history (old snapshots hold plaintext subject ids) and prove it."""
    report.ledger_purge = ledger.purge_history()
    ledger.journal.record([Step(report.run_id, ledger.requests_table, "purged")])


def _batch(spark: SparkSession, rows: dict[str, dict]) -> DataFrame:
    """(request_id, subject_id, regulation) of a batch as a small DataFrame: identifiers travel as data,
    never as SQL text."""
    return spark.createDataFrame([(rid, r["subject_id"], r["regulation"]) for rid, r in sorted(rows.items())],
                                 "request_id string, subject_id string, regulation string")


def _run_access(spark: SparkSession, settings: Settings, key_types: KeyTypes, report: RunReport,
                progress: Progress, work: _Work, vault_keys: vault.Keys | None) -> list[Outcome]:
    request_ids = sorted(work.access)
    if not request_ids:
        return []
    out_dir = Path(settings.export.directory) / report.run_id
    with _timed(report, "export", spark):
        progress.stage("export", 1)
        progress.step(f"{len(request_ids)} package(s), {settings.export.format}")
        try:
            batch = _batch(spark, work.access)
            keys = identity.resolve(spark, settings, batch)
            result = access.export(spark, settings, batch, out_dir, settings.export.format, key_types, keys, vault_keys)
            checked = access.checked_packages(result)
        except Exception as exc:  # every request of the batch stays open with the reason
            return [Outcome(rid, "failed", f"export failed: {first_line(exc, with_type=True)}") for rid in request_ids]
        finally:
            progress.done()
    report.export = {"directory": result.directory, "manifest": result.manifest, "format": settings.export.format,
                     "packages": len(result.packages),
                     "rows": {t: sum(p.rows.get(t, 0) for p in result.packages)
                              for t in [*settings.datamap.keyed, *settings.datamap.files, *settings.datamap.shredded]}}
    packages = {p.request_id: p for p in result.packages}
    outcomes = []
    for rid in request_ids:
        p = packages.get(rid)
        evidence = {"run_id": report.run_id, "file": str(Path(result.directory) / p.file), "sha256": p.sha256,
                    "bytes": p.bytes, "rows": p.rows, "manifest": result.manifest} if p else {"run_id": report.run_id}
        ok = checked.get(rid, False)
        outcomes.append(Outcome(rid, "completed" if ok else "failed",
                                None if ok else "export package missing or its checksum does not match the manifest",
                                evidence))
    return outcomes


def _run_erasure(spark: SparkSession, settings: Settings, ledger: Ledger, key_types: KeyTypes,
                 report: RunReport, progress: Progress, work: _Work, vault_keys: vault.Keys | None) -> list[Outcome]:
    request_ids = sorted(work.erase)
    waiting, deadlines, purge_now = work.waiting, work.deadlines, work.purge_now
    if not request_ids and not purge_now:
        report.purge_schedule = _schedule(settings, False, waiting)
        return []
    tables = settings.datamap.erase_order()
    erasures, shredded, key_sets = _erase(spark, settings, ledger, work, request_ids, key_types, report, progress,
                                          vault_keys)
    # What interrupted runs erased: re-erasing finds nothing, so their commits are the evidence.
    resumed = {s.table: s for s in work.steps if s.run_id in work.interrupted and s.step == "erased"}
    faults.failpoint("after_erase")

    damaged = {t: e.collateral for t, e in erasures.items() if e.collateral and not e.collateral.ok}
    stop_reason = None
    if damaged:  # stop before the purge: the pre-erase snapshots stay, so a rollback is possible
        stop_reason = "run stopped before the purge: collateral check failed in " + ", ".join(sorted(damaged))
        ledger.journal.record([Step(report.run_id, t, "held", erasures[t].plan.snapshot_before,
                                    {"reason": c.detail}) for t, c in damaged.items() if c.conclusive])
        report.collateral_failures = {t: c.detail for t, c in damaged.items()}
        purge_now = False
    proven = request_ids + (sorted(waiting) if purge_now else [])
    prior = ledger.evidence(sorted(waiting)) if purge_now and waiting else {}
    purges: dict[str, purge.TablePurge] = {}
    if purge_now:
        with _timed(report, "purge", spark):
            erased_earlier = {t for e in prior.values() for t, d in e.get("tables", {}).items() if d.get("snapshot_id")}
            to_purge = [t for t in tables if t in erased_earlier or t in resumed
                        or (t in erasures and erasures[t].snapshot_id is not None)]
            purges = _each_table(settings, progress, "purge", to_purge, lambda t: _purge(spark, settings, t))
        ledger.journal.record([Step(report.run_id, t, "purged", None, {"bytes_rewritten": p.bytes_rewritten})
                               for t, p in purges.items() if not p.error])
        faults.failpoint("after_purge")
    if shredded is not None:  # the vault was purged in the shred step, whatever the policy
        erasures.update(shredded.erasures)
        p = shredded.purge
        purges.update({t: purge.TablePurge(vault.table_name(settings), snapshots_expired=p.snapshots_expired,
                                           files_deleted=p.files_deleted, orphans_removed=p.orphans_removed,
                                           seconds=p.seconds) for t in shredded.erasures})

    hashes = verify.stored_hashes(spark, ledger, proven)
    hash_keys = verify.keys_for(settings, hashes, ledger.keyring)  # once, for every table
    # Plaintext keys exist for this run's batch only: requests erased earlier are proven unpruned.
    prune = key_sets if len(proven) == len(request_ids) else {}
    # Files the collateral check read whole, by the same keys, and found clean: the live scan skips
    # them while the table's history still runs through the erase commit (a rollback could bring
    # back rows that deletes had hidden).
    clean = {t: e.collateral.clean_files for t, e in erasures.items()
             if e.collateral and e.collateral.clean_files and t in prune
             and iceberg.descends_from(spark, settings, t, e.snapshot_id)}
    keyed = [t for t in tables if t in settings.datamap.keyed]
    live: dict[str, dict[str, int]] = {}

    def prove(table: str) -> verify.TableVerification:
        if table in settings.datamap.shredded:
            return shred.verify(spark, settings, table, shredded, request_ids)
        e = erasures.get(table)
        def check(physical: bool, found: dict[str, int] | None = None) -> verify.TableVerification:
            if table in settings.datamap.aggregates:
                return propagate.verify_aggregate(spark, settings, table, e, proven, physical)
            return _verify(spark, settings, hash_keys, table, hashes, key_types, physical, prune.get(table), found,
                           clean.get(table))
        checked = check(purge_now, live.get(table))
        if checked.live and e is not None and e.plan.strategy == "subtract_groups":
            propagate.catch_up(spark, settings, table, e)
            checked = check(purge_now)
        if purge_now and not checked.live and (checked.history or checked.storage):
            # Left over from an earlier, interrupted run: purge now and prove again.
            purges[table] = _purge(spark, settings, table)
            checked = check(True)
        if table in erasures:
            _check_collateral(erasures[table], checked)
        return checked

    def timed(table: str) -> verify.TableVerification:
        start = time.perf_counter()
        checked = prove(table)
        checked.seconds = round(time.perf_counter() - start, 3)
        checked.details.setdefault("method", _proof_method(settings, table, checked))
        return checked

    with _timed(report, "verify", spark):
        if len(keyed) > 1:  # every keyed table's live check in one Spark job
            live.update(verify.live_found(spark, settings, keyed, hashes, hash_keys, prune, clean))
        verifications = _each_table(settings, progress, "verify" if purge_now else "verify live data (purge not run)",
                                    [*tables, *settings.datamap.files,
                                     *(settings.datamap.shredded if shredded is not None else [])], timed)

    for table in verifications:
        report.tables[table] = {
            **({"aggregate": True} if table in settings.datamap.aggregates else {}),
            "erase": erasures[table].as_dict() if table in erasures else {},
            "purge": purges[table].as_dict() if table in purges else {},
            "verification": verifications[table].as_dict(),
        }
    outcomes = _outcomes(proven, erasures, purges, verifications, report.run_id, prior, resumed,
                         {} if purge_now or stop_reason else deadlines, stop_reason)
    report.purge_schedule = _schedule(settings, purge_now, {
        **({} if purge_now else waiting), **{o.request_id: o.purge_by for o in outcomes if o.status == "erased"}})
    return outcomes


def _schedule(settings: Settings, purged: bool, waiting: dict[str, date]) -> dict:
    return {"policy": settings.purge.policy, "purged": purged, "waiting": len(waiting),
            "next_purge_by": min(waiting.values()).isoformat() if waiting else None}


def _record_keys(spark: SparkSession, ledger: Ledger, keys: DataFrame) -> None:
    """Store the keyed hashes of a batch's resolved identifiers before anything is erased (linked
    identifiers are read from tables the erasure empties). Hashed in Spark: only hashes reach the driver."""
    hashed = with_keyed_hash(spark, keys, "key_value", ledger.key).select("request_id", "key_type", "key_hash")
    made_by = key_id(ledger.key)
    ledger.record_keys([(r.request_id, r.key_type, r.key_hash, made_by) for r in hashed.collect()])


def _erase(spark: SparkSession, settings: Settings, ledger: Ledger, work: _Work, request_ids: list[str],
           key_types: KeyTypes, report: RunReport, progress: Progress, vault_keys: vault.Keys | None
           ) -> tuple[dict[str, erase.TableErasure], shred.Shred | None, dict[str, matching.TableKeys]]:
    """Resolve the batch's identifiers, record their hashes, and erase them from every mapped table
    and file dataset, then propagate to the derived tables level by level (a level reads only
    tables erased before it): keyed ones erased by key, aggregates recomputed (stages/propagate.py).
    Each wave's commits go to the step journal before the next wave starts, so a run killed in
    between leaves a record of what its successor must finish.

    Tables holding keys get at most `erase.max_rounds - 1` more rounds for rows of these subjects
    that other writers appended meanwhile: only tables that took commits after ours are checked.
    Then the subjects' vault entries are shredded (`action: shred` tables, stages/shred.py), journaled
    with the erase commits, and the vault's history purged.
    """
    if not request_ids:
        return {}, None, {}
    with _timed(report, "resolve", spark):
        progress.stage("resolve identifiers", 1)
        progress.step(f"{len(request_ids)} subjects")
        keys = identity.resolve(spark, settings, _batch(spark, {rid: work.erase[rid] for rid in request_ids}))
        _record_keys(spark, ledger, keys)
        progress.done()

    datamap = settings.datamap
    hashes = verify.stored_hashes(spark, ledger, request_ids)
    late = _LateRows(spark, settings, ledger, hashes, work.purge_now)
    erasures: dict[str, erase.TableErasure] = {}
    with _timed(report, "erase", spark):
        key_sets = matching.key_sets(settings, keys, key_types, [*datamap.keyed, *datamap.files])
        # Tables that identifiers are resolved through go last (datamap.erase_waves): a resumed run can
        # still resolve from them. Within a wave, tables are erased side by side.
        waves = datamap.erase_waves()
        for wave in waves[:len(waves) - len(datamap.derived_levels())]:
            erasures.update(_erase_tables(spark, settings, progress, "erase", wave, key_sets, work.purge_now))
        if datamap.files:
            erasures.update(_each_table(settings, progress, "erase files", list(datamap.files),
                                        lambda d: files.erase_dataset(spark, settings, d, key_sets[d])))
        late.erase(progress, erasures, list(datamap.keyed), key_sets)
    shredded = None
    if datamap.shredded:
        faults.failpoint("before_shred")
        with _timed(report, "shred", spark):
            progress.stage("shred", 1)
            progress.step("vault entries")
            shredded = shred.shred(spark, settings, keys, vault_keys)
    _record_erasures(ledger, report.run_id, erasures, shredded=shredded and (vault.table_name(settings), shredded))
    if shredded is not None:
        with _timed(report, "shred", spark):
            shred.purge_vault(spark, settings, shredded)
            progress.done()
    if not datamap.derived:
        return erasures, shredded, key_sets
    faults.failpoint("before_propagate")
    stale = _stale_aggregates(settings, work.steps)
    with _timed(report, "propagate", spark):
        for level in datamap.derived_levels():
            keyed = [t for t in level if t in datamap.keyed]
            if keyed:  # derived keyed tables: erased by key, like the sources
                erasures.update(_erase_tables(spark, settings, progress, "propagate", keyed, key_sets, work.purge_now))

            def derive(table: str) -> erase.TableErasure | None:
                changes = _changes(settings, table, erasures, key_sets)
                if not changes and table not in stale:
                    return None  # nothing it reads changed
                return propagate.refresh(spark, settings, table, changes, table in stale)
            done = _each_table(settings, progress, "propagate", [t for t in level if t not in datamap.keyed], derive)
            erasures.update({t: e for t, e in done.items() if e is not None})
            late.erase(progress, erasures, [t for t in level if t in datamap.keyed], key_sets)
            faults.failpoint("during_propagate")
            _record_erasures(ledger, report.run_id, {t: erasures[t] for t in level if t in erasures},
                             propagated=[t for t in level if t in datamap.aggregates])
    return erasures, shredded, key_sets


def _record_erasures(ledger: Ledger, run_id: str, erasures: dict[str, erase.TableErasure],
                     propagated: list[str] = (), shredded: tuple[str, shred.Shred] | None = None) -> None:
    """One journal commit: each commit of `erasures` (step `erased`), the aggregates brought in
    line with their sources (step `propagated`, committed or not), and the vault's shred commit."""
    ledger.journal.record([*(Step(run_id, t, "erased", e.snapshot_id,
                                  {"rows": e.plan.matches_by_request, "rounds": e.rounds})
                             for t, e in erasures.items() if e.snapshot_id is not None),
                           *(Step(run_id, t, "propagated") for t in propagated),
                           *([Step(run_id, shredded[0], "shredded", shredded[1].snapshot_id,
                                   {"tables": sorted(shredded[1].erasures),
                                    "snapshot_before": shredded[1].snapshot_before})] if shredded else [])])


def _stale_aggregates(settings: Settings, steps: list[Step]) -> set[str]:
    """Aggregates a source of which was erased after their last propagation (a run killed or failed in
    between): the erased rows can no longer be read from the journal, so they are recomputed whole."""
    last: dict[tuple[str, str], datetime] = {}
    for s in steps:
        if s.step in ("erased", "propagated") and s.at is not None:
            last[(s.table, s.step)] = s.at
    stale = set()
    for name, mapping in settings.datamap.aggregates.items():
        done = last.get((name, "propagated"))
        if any((src, "erased") in last and (done is None or last[(src, "erased")] > done) for src in mapping.sources):
            stale.add(name)
    return stale


def _changes(settings: Settings, table: str, erasures: dict[str, erase.TableErasure],
             key_sets: dict[str, matching.TableKeys]) -> dict[str, propagate.Upstream | None]:
    """The sources of an aggregate this run changed: erased by key (traceable rows) or, for an
    aggregate source, recomputed (None)."""
    changes: dict[str, propagate.Upstream | None] = {}
    for source in settings.datamap.aggregates[table].sources:
        e = erasures.get(source)
        if e is None or e.snapshot_id is None:
            continue
        keyed = source in settings.datamap.keyed
        changes[source] = propagate.Upstream(e.plan.snapshot_before, key_sets[source],
                                             settings.datamap.mapping(source).action) if keyed else None
    return changes


class _LateRows:
    """Later erase rounds: rows of the batch's subjects that other writers appended after our commit."""

    def __init__(self, spark: SparkSession, settings: Settings, ledger: Ledger, hashes: DataFrame, purging: bool):
        self.spark, self.settings, self.ledger, self.hashes, self.purging = spark, settings, ledger, hashes, purging
        self.keys: verify.HashKeys | None = None

    def erase(self, progress: Progress, erasures: dict[str, erase.TableErasure], tables: list[str],
              key_sets: dict[str, matching.TableKeys]) -> None:
        spark, settings = self.spark, self.settings
        for _ in range(settings.erase.max_rounds - 1):
            moved = [t for t in tables if t in erasures and not erasures[t].error
                     and _changed_since(spark, settings, t, erasures[t])]
            if not moved:
                return
            if self.keys is None:
                self.keys = verify.keys_for(settings, self.hashes, self.ledger.keyring)
            found = verify.live_found(spark, settings, moved, self.hashes, self.keys, key_sets)  # one job
            late = [t for t in moved if found[t]]
            if not late:
                return
            again = _erase_tables(spark, settings, progress, "erase late rows", late, key_sets, self.purging)
            for table, later in again.items():
                erasures[table].absorb(later)


def _changed_since(spark: SparkSession, settings: Settings, table: str, erasure: erase.TableErasure) -> bool:
    current = iceberg.current_snapshot(spark, settings, table)
    ours = erasure.snapshot_id if erasure.snapshot_id is not None else erasure.plan.snapshot_before
    return current is not None and current.snapshot_id != ours


def _erase_tables(spark: SparkSession, settings: Settings, progress: Progress, stage: str, tables: list[str],
                  key_sets: dict[str, matching.TableKeys], purging: bool) -> dict[str, erase.TableErasure]:
    """Erase `tables`: planned in one Spark job (erase.plan_many), committed side by side, and their
    commits checked for collateral damage together (the content check's fingerprints in one job).
    Each table's `seconds` is its commit and count check; the shared plan and check are the stage's."""
    plans = erase.plan_many(spark, settings, tables, key_sets, purging)
    content = settings.erase.collateral_check == "content"

    def commit(table: str) -> erase.TableErasure:
        start, keys = time.perf_counter(), key_sets[table]
        try:
            erasure = erase.apply(spark, settings, plans[table], keys, observe=keys if content else None)
        except Exception as exc:  # recorded; verification then shows what is left
            erasure = erase.TableErasure(plans[table], error=first_line(exc, with_type=True))
        if erasure.snapshot_id is not None and not content:
            erasure.collateral = collateral.check_counts(spark, settings, table, erasure.plan.snapshot_before,
                                                         erasure.snapshot_id, erasure.plan.expected_rows_after,
                                                         erasure.rows_after)
        erasure.seconds = round(time.perf_counter() - start, 3)
        return erasure

    erasures = _each_table(settings, progress, stage, tables, commit)
    if content:
        committed = [collateral.Commit(t, key_sets[t], e.plan.snapshot_before, e.snapshot_id, e.observed)
                     for t, e in erasures.items() if e.snapshot_id is not None]
        for table, result in collateral.check_many(spark, settings, committed).items():
            erasures[table].collateral = result
    return erasures


T = TypeVar("T")


def _each_table(settings: Settings, progress: Progress, stage: str, tables: list[str], work: Callable[[str], T]
                ) -> dict[str, T]:
    """`work(table)` for every table, `run.parallel_tables` at a time on threads sharing the session:
    tables are independent, so their small Spark jobs, commits and procedure calls overlap instead of
    queueing (Spark schedules concurrent jobs side by side). Results in the order of `tables`."""
    if not tables:
        return {}
    progress.stage(stage, len(tables))
    done: dict[str, T] = {}
    with ThreadPoolExecutor(min(settings.run.parallel_tables, len(tables)), thread_name_prefix="dsr-table") as pool:
        futures = {pool.submit(work, table): table for table in tables}
        for future in as_completed(futures):
            progress.step(futures[future])
            done[futures[future]] = future.result()
    progress.done()
    return {table: done[table] for table in tables}


def _purge(spark: SparkSession, settings: Settings, table: str) -> purge.TablePurge:
    """Purge one table; a purge step that another writer's commit invalidated is run again (every
    step is safe to repeat). When the retries run out, verification reports what is left."""
    start = time.perf_counter()
    try:
        result = iceberg.with_conflict_retries(settings, f"table {table}: the purge",
                                               lambda: purge.purge_table(spark, settings, table))[0]
    except CommitConflictError as exc:
        result = purge.TablePurge(table, error=str(exc))
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _verify(spark, settings, keys, table, hashes, key_types, physical=True, prune=None, live=None, clean=None
            ) -> verify.TableVerification:
    return verify.verify_tables(spark, settings, hashes, keys, key_types, [table], physical,
                                {table: prune} if prune else None, {table: live} if live is not None else None,
                                {table: clean} if clean else None)[0]


def _check_collateral(erasure: erase.TableErasure, verification: verify.TableVerification) -> None:
    if erasure.error:
        verification.collateral_ok, verification.collateral_detail = False, f"erasure failed: {erasure.error}"
    elif erasure.collateral and not erasure.collateral.ok:
        verification.collateral_ok, verification.collateral_detail = False, erasure.collateral.detail


def _proof_method(settings: Settings, table: str, v: verify.TableVerification) -> str:
    """How `table` was proven, in words for certificates (shredded tables name their own method)."""
    if table in settings.datamap.aggregates:
        return "groups recomputed from the erased sources and compared row for row" + (
            "; no file of an older snapshot and no unreferenced file left" if v.physical else "")
    if table in settings.datamap.files:
        where = "every file of the dataset (its live data, history and storage at once)"
    elif v.physical:
        where = ("the live snapshot, the files of every retained snapshot, every file on storage (unreferenced ones "
                 "included), branches and tags")
        if v.one_scan:
            where += "; history and storage held only the live files, so one scan covered all three"
    else:
        where = "the live snapshot"
    return f"keyed hash (HMAC-SHA256) of every key value, compared with the request's stored hashes, in {where}"


def _outcomes(request_ids: list[str], erasures: dict[str, erase.TableErasure],
              purges: dict[str, purge.TablePurge], verifications: dict[str, verify.TableVerification],
              run_id: str, prior: dict[str, dict], resumed: dict[str, Step], deadlines: dict[str, date],
              stop_reason: str | None) -> list[Outcome]:
    """Per request: completed (proven), failed (with reasons), or erased (live data proven, purge
    due by its deadline). Requests erased in an earlier run keep that run's erase evidence, and so
    do requests an interrupted run erased (from the step journal)."""
    outcomes = []
    for request_id in request_ids:
        reasons, tables = [], {}
        earlier = prior.get(request_id, {})
        for table, v in verifications.items():
            e, p, r = erasures.get(table), purges.get(table), resumed.get(table)
            reasons += v.failing.get(request_id, [])
            if e and not v.collateral_ok and (request_id in e.plan.matches_by_request or e.error):
                reasons.append(f"{table}: collateral check failed ({v.collateral_detail})")
            if e is None:
                entry = dict(earlier.get("tables", {}).get(table, {}))
            elif not e.plan.matches_by_request.get(request_id) and r and r.detail["rows"].get(request_id):
                entry = {"action": e.plan.action, "rows": r.detail["rows"][request_id], "snapshot_id": r.snapshot_id,
                         "erased_in_run": r.run_id}
            else:
                entry = {"action": e.plan.action, "rows": e.plan.matches_by_request.get(request_id, 0),
                         "snapshot_id": e.snapshot_id, "rounds": e.rounds}
            if e is not None and e.plan.action == "recompute":
                entry["strategy"] = e.plan.strategy
            rewritten = (e.data_files_rewritten, e.bytes_rewritten) if e is not None else (
                entry.get("data_files_rewritten", 0), entry.get("bytes_rewritten", 0))  # an earlier run's erase
            entry.update(purge.evidence(p, *rewritten), **v.evidence(request_id))
            tables[table] = entry
        if stop_reason:
            reasons.append(stop_reason)
        evidence = {"run_id": run_id, "verified_at": datetime.now(UTC).isoformat(), "tables": tables}
        if earlier:
            evidence["erased_in_run"] = earlier.get("run_id")
        if reasons:
            outcomes.append(Outcome(request_id, "failed", "; ".join(reasons), evidence))
        elif request_id in deadlines:
            by = deadlines[request_id]
            outcomes.append(Outcome(request_id, "erased", f"logically erased; physical purge due by {by}",
                                    evidence, purge_by=by))
        else:
            outcomes.append(Outcome(request_id, "completed", None, evidence))
    return outcomes
