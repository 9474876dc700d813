"""`run`: every open request in one batch per type, under the ledger's lease."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from datetime import date, datetime
from pathlib import Path
from typing import cast

from pyspark.sql import SparkSession

from .. import faults
from ..config import KafkaSettings, Settings
from ..drop.items import unmatched_items
from ..drop.matching import match_waiting
from ..evidence.report import RunReport
from ..inventory.check import check_against_catalog, check_formats
from ..lake import skipping
from ..lake.kafka import Cluster
from ..lake.lakehouse import Lake
from ..lake.spark import require_classic, starting
from ..lake.workers import start_python_workers
from ..ledger.holds import active_holds
from ..ledger.journal import Step
from ..ledger.lease import Holder, Lease
from ..ledger.ledger import Ledger, Outcome
from ..ledger.records import expire_records
from ..ledger.requests import utc_now
from ..progress import Progress, Silent
from ..stages import retention, share
from ..vault import vault
from . import rules
from .context import Context, batch_rows, resolved, timed
from .erasure import ErasureBatch
from .exports import Exported, SharedExport, export_requests
from .work import RequestRows, Work, read_work


def run(spark: SparkSession | Callable[[], SparkSession], settings: Settings, progress: Progress | None = None,
        today: date | None = None, release: Callable[[SparkSession], None] | None = None) -> RunReport:
    """Process every open request (access, erase, opt_out, opt_in) and refresh the data map's shares;
    returns the run report (no identifiers).

    `spark`: a session, or a function making one: called only when there is work for Spark (on a
    thread, as soon as the first read of the ledger finds some), so a run with nothing to do costs
    two small pyiceberg reads, writes nothing and starts no JVM (with shares declared there is always
    something to do: their refresh).
    Every run first removes our own records past their period (ledger/records.py: completed
    requests, access packages, unverified intake requests); with nothing due that is one more
    small read, a listing of the export folder and one query of the intake queue.
    `today` (default: the current UTC date) is the day purge deadlines are compared with.
    `release`: called with the session once the run's Spark work is over, before its ledger commits
    (a process that started its own JVM can let it exit meanwhile: lake/spark.py's `close_gateway`).
    A run with work takes the ledger's lease (ledger/lease.py) and reads the ledger again under it:
    another live holder makes this one wait or raise LedgerBusyError, per `run.concurrent`.
    """
    progress = progress or Silent()
    if not callable(spark):
        require_classic(spark)  # a Spark Connect session is refused before anything changes
    faults.armed()  # a misspelt failpoint fails before anything changes
    settings.datamap  # noqa: B018  (so does a config without a `datamap:` section: a ConfigError naming it)
    started = utc_now()
    today = today or started.date()
    report = RunReport(f"run-{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}", started.isoformat())
    ledger = Ledger(settings)
    with timed(report, "ledger"):  # the ledger's own upkeep: its evidence is the report's `records`
        report.records = expire_records(settings, run_id=report.run_id, now=started)
    drop_items = unmatched_items(ledger) if settings.datamap.drop else None
    if drop_items is not None and drop_items.num_rows:  # matched first: the requests they file are this run's work
        with timed(report, "drop"):
            report.drop = match_waiting(spark, settings, ledger, drop_items)
    with timed(report, "ledger"):
        version = ledger.work_version()
        work = _noted(report, read_work(ledger, settings, today))
    if not work.needs_lease:
        report.purge_schedule = rules.schedule(settings.purge.policy, False, work.waiting)
        return report
    session_start = starting(spark) if work.needs_spark else None
    lease = Lease(ledger.store, report.run_id, settings.run.lease_seconds)
    waited: list[str] = []

    def waiting(other: Holder) -> None:  # a stage of its own, so the bar says why nothing moves
        waited.append(other.run_id)
        progress.stage("wait for the ledger", 1)
        progress.step(f"run {other.run_id} holds it")

    with ExitStack() as held:
        with timed(report, "ledger"):
            holder = held.enter_context(lease.held(settings.run.concurrent == "wait", notify=waiting))
        if waited:
            progress.done()
        with timed(report, "ledger"):
            if ledger.work_version() == version:  # nothing changed while the lease was taken: the same work
                work = replace(work, interrupted=list(holder.interrupted))
            else:  # read again as it is now we hold it
                work = _noted(report, read_work(ledger, settings, today, holder.interrupted))
            if work.ids:
                lease.working_on(work.ids)
        if not work.needs_spark:
            report.purge_schedule = rules.schedule(settings.purge.policy, False, work.waiting)
            if work.legal_subjects:  # requests newly held: recorded without Spark
                _finish(ledger, lease, report, work, [], started)
            elif work.ledger_purge:
                _purge_ledger(ledger, report)
            return report
        for run_id in ledger.unrecorded_runs(work.interrupted):
            # packages a killed run wrote but never checked or recorded: personal data nobody owns
            shutil.rmtree(Path(settings.export.directory) / run_id, ignore_errors=True)
        session = (session_start or starting(spark)).result()
        if work.access and settings.export.format != "json":
            # zip packages are written in Python workers: started while the driver plans
            start_python_workers(session)
        try:
            requests = RequestRows.of(work.access, work.erase)
            outcomes = _process(_context(session, settings, ledger, report, progress, requests), work, today)
        finally:
            skipping.release()
        if release is not None:
            release(session)
        _finish(ledger, lease, report, work, outcomes, started)
    report.document()  # checked against its published schema before anyone reads it
    return report


def _noted(report: RunReport, work: Work) -> Work:
    """`work`, with the tables on hold (collateral and legal) and the request types not processed noted
    in the report."""
    report.held, report.not_processed = dict(work.held), dict(work.not_processed)
    report.legal_holds = dict(work.legal_tables)
    return work


def _context(spark: SparkSession, settings: Settings, ledger: Ledger, report: RunReport, progress: Progress,
             requests: RequestRows) -> Context:
    """The run's Context: the catalog's key types are checked, and a wrong or missing vault master key
    fails, before anything changes. The requests' identifiers are resolved on a thread meanwhile: the
    run's first query pays for the JVM's first use of Spark's SQL engine (0.8 s at 1,100 requests on
    this machine), the check for reading each table's metadata (0.3 s at four tables), and either
    leaves a core idle."""
    faults.failpoint("after_start")
    rows = batch_rows(requests)
    with ThreadPoolExecutor(1, thread_name_prefix="dsr-resolve") as pool:
        keys = pool.submit(resolved, spark, settings, report, rows) if requests else None
        with timed(report, "ledger", spark):
            check_formats(Lake.of(spark, settings))
            key_types = check_against_catalog(spark, settings.datamap, settings.table)
            if settings.datamap.topics and requests:  # a topic missing from the cluster fails before any erase
                Cluster(cast(KafkaSettings, settings.kafka)).check(list(settings.datamap.topics))
            vault_keys = vault.open_keys(spark, settings) if settings.datamap.shredded else None
        # A resolution that failed is left to the stage that needs it, which fails as it would have.
        return Context(spark, settings, ledger, key_types, report, progress, vault_keys, requests, rows,
                       [keys.result()] if keys is not None and keys.exception() is None else [])


def _process(ctx: Context, work: Work, today: date) -> list[Outcome]:
    """Access requests first (a person asking for a copy and erasure gets the copy), then erase
    requests unless a table is on hold (`dsr release` lifts it), then the data map's retention rules
    (`expire:`, stages/retention.py; not after a collateral failure, whose pre-erase snapshots the
    purge would expire), then consent requests and the data map's shares: each share refreshed
    without opted-out or erased subjects (stages/share.py). With both kinds of request and the
    content check, the erasure runs the export (SharedExport): before its first commits, or after
    them where it can share the check's read of their new files; either way it writes the packages
    an export run first would."""
    report = ctx.report
    erasing = bool(work.erase) and not report.held
    in_erasure = (SharedExport(ctx, work.access) if work.access and erasing
                  and ctx.settings.erase.collateral_check == "content" else None)
    exported = export_requests(ctx, work.access) if in_erasure is None else Exported()
    outcomes: list[Outcome] = []
    if not report.held:
        erased = ErasureBatch(ctx, work, in_erasure).run()
        outcomes += erased.outcomes
        report.tables.update(erased.tables)
        report.collateral_failures = dict(erased.collateral_failures)
        report.resurrections = dict(erased.resurrections)
        report.topics = dict(erased.topics)
        report.purge_schedule = rules.schedule(ctx.settings.purge.policy, erased.purged, erased.waiting)
        if in_erasure is not None:  # nothing erased before the export had its turn: it runs now
            exported = in_erasure.exported or export_requests(ctx, work.access)
        if work.retention and not report.collateral_failures:
            with ctx.timed("retention"):
                report.retention = retention.enforce(ctx.lake, ctx.settings.datamap, ctx.settings.purge, ctx.ledger,
                                                     active_holds(ctx.ledger, today), today, ctx.run_id)
    if exported.summary is not None:
        report.export = exported.summary
    outcomes = [*exported.outcomes, *outcomes]
    if work.shares or work.consent:
        with ctx.timed("shares"):
            outcomes, shared = share.process(ctx.lake, ctx.settings.datamap, ctx.settings.purge, ctx.ledger,
                                             work.consent, outcomes,
                                             {*work.erase, *work.waiting}, set(report.held), ctx.progress,
                                             report.run_id)
        report.shares = {name: s.as_dict() for name, s in shared.items()}
    faults.failpoint("after_verify")
    return outcomes


def _finish(ledger: Ledger, lease: Lease, report: RunReport, work: Work, outcomes: list[Outcome],
            started: datetime) -> None:
    """One ledger commit for every outcome, those of the requests a legal hold stops included (only
    while the lease is still ours: a run that lost it must not record anything, its successor acts),
    the ledger's own purge when owed, and the run's record for the dashboard."""
    outcomes = [*(Outcome(rid, "held", why) for rid, why in sorted(work.legal_subjects.items())), *outcomes]
    with timed(report, "ledger"):
        lease.check()
        ledger.finish(outcomes, report.run_id, started)
        faults.failpoint("after_finish")
        # Completion drops plaintext ids from the current snapshot only; history keeps them until the
        # ledger is purged too (under the batched policy, with the tables). Owed also when a run was
        # killed between recording outcomes and this purge.
        if any(o.status == "completed" for o in outcomes) or work.ledger_purge:
            if ledger.settings.purge.policy == "immediate" or report.purge_schedule.get("purged"):
                _purge_ledger(ledger, report)
    report.requests = outcomes
    ledger.record_run(report.record(utc_now()))  # the dashboard's run history: one append


def _purge_ledger(ledger: Ledger, report: RunReport) -> None:
    """Purge the ledger's own history (old snapshots hold plaintext subject ids) and prove it."""
    report.ledger_purge = ledger.purge_history()
    ledger.journal.record([Step(report.run_id, ledger.requests_table, "purged")])
