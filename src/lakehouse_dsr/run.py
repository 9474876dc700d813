"""`dsr run`: every open request in one batch per type.

Access requests first (a person asking for a copy and erasure gets the copy): resolve -> export
-> checksum check. Then erase requests: resolve -> erase -> purge -> verify. Then one ledger
commit for all outcomes and the ledger's own purge. A request completes only when its proof
holds (package checksum, or every table's verification); otherwise it stays open (status
failed, retried by the next run) with the reasons.

Under `purge.policy: batched` a run whose requests are not yet near their deadline verifies the
live data only and leaves them `erased`; the run that reaches the earliest purge deadline purges
once for every waiting request and proves them all (live, history, storage).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType

from . import faults
from .config import Settings
from .datamap.check import check_against_catalog
from .evidence.report import RequestResult, RunReport
from .exceptions import CommitConflictError
from .lake import iceberg
from .lake.metrics import IoCost, StageMeter
from .ledger.journal import Step
from .ledger.ledger import OPEN_STATUSES, Ledger, Outcome
from .progress import Progress, Silent
from .stages import access, collateral, erase, identity, purge, verify


@contextmanager
def _timed(report: RunReport, stage: str, spark: SparkSession) -> Iterator[None]:
    """Add the block's seconds and Spark I/O (rows, bytes read/written, shuffled) to the stage's totals."""
    meter = StageMeter(spark)
    mark = meter.mark()
    start = time.perf_counter()
    try:
        yield
    finally:
        report.seconds[stage] = round(report.seconds.get(stage, 0.0) + time.perf_counter() - start, 3)
        report.cost[stage] = IoCost(**report.cost.get(stage, {})).add(meter.since(mark)).as_dict()


def run(spark: SparkSession, settings: Settings, progress: Progress | None = None,
        today: date | None = None) -> RunReport:
    """Process every open access and erase request; returns the run report (no identifiers).

    `today` (default: the current UTC date) is the day purge deadlines are compared with.
    """
    progress = progress or Silent()
    faults.armed()  # a misspelt failpoint fails before anything changes
    started = datetime.now(UTC)
    today = today or started.date()
    report = RunReport(f"run-{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}", started.isoformat())
    ledger = Ledger(spark, settings)
    with _timed(report, "ledger", spark):
        ledger.ensure()
        key_types = check_against_catalog(spark, settings.datamap, settings.table)  # before anything changes
        requests = spark.table(settings.table(ledger.requests_table)).where(F.col("status").isin(*OPEN_STATUSES))
        report.not_processed = {r.request_type: r["count"] for r in requests.where(F.col("request_type") == "opt_out")
                                .groupBy("request_type").count().collect()}
        report.held = {t: s.detail.get("reason", "") for t, s in ledger.journal.holds().items()}
        batches, interrupted = _start_batches(ledger, report.run_id,
                                              ("access",) if report.held else ("access", "erase"))
    faults.failpoint("after_start")
    outcomes = _run_access(spark, settings, ledger, key_types, report, progress, *batches["access"], interrupted)
    if not report.held:  # a table on hold stops every erasure and purge until `dsr release`
        outcomes += _run_erasure(spark, settings, ledger, key_types, report, progress, today, *batches["erase"],
                                 interrupted)
    faults.failpoint("after_verify")
    with _timed(report, "ledger", spark):
        if outcomes:
            ledger.finish(outcomes, report.run_id)
        faults.failpoint("after_finish")
        # Completion drops plaintext ids from the current snapshot only; history keeps them until the
        # ledger is purged too (under the batched policy, with the tables). Owed also when a run was
        # killed between recording outcomes and this purge.
        if _ledger_purge_owed(ledger) and (settings.purge.policy == "immediate"
                                           or report.purge_schedule.get("purged")):
            report.ledger_purge = purge_ledger(spark, settings, ledger)
            ledger.journal.record([Step(report.run_id, ledger.requests_table, "purged")])
    report.requests = [RequestResult(o.request_id, o.status, o.reason) for o in outcomes]
    return report


def _ledger_purge_owed(ledger: Ledger) -> bool:
    """A request completed after the ledger's last purge (metadata-sized reads)."""
    completed = ledger.last_completion()
    if completed is None:
        return False
    purges = ledger.journal.steps(step="purged", table=ledger.requests_table)
    return not purges or purges[-1].at < completed


def _start_batches(ledger: Ledger, run_id: str, types: tuple[str, ...]
                   ) -> tuple[dict[str, tuple[DataFrame, dict[str, date]]], list[str]]:
    """The requests of `types` this run acts on, checkpointed (they hold plaintext subjects) and marked
    in progress in one commit: ({type: (requests, {request id: due date})}, runs that were killed
    while working on any of them)."""
    pending = ledger.pending(types).localCheckpoint()
    due: dict[str, dict[str, date]] = {"access": {}, "erase": {}}
    for r in pending.select("request_id", "request_type", "due_date").collect():
        due[r.request_type][r.request_id] = r.due_date
    ids = [*due["access"], *due["erase"]]
    interrupted = ledger.interrupted_runs(ids) if ids else []
    if ids:
        ledger.start(ids, run_id)
    return {t: (pending.where(F.col("request_type") == t), due[t]) for t in due}, interrupted


def _run_access(spark: SparkSession, settings: Settings, ledger: Ledger, key_types: dict[str, DataType],
                report: RunReport, progress: Progress, batch: DataFrame, due: dict[str, date],
                interrupted: list[str]) -> list[Outcome]:
    request_ids = sorted(due)
    if not request_ids:
        return []
    for run_id in interrupted:  # a killed run's packages were never checked or recorded: personal data, unowned
        shutil.rmtree(Path(settings.export.directory) / run_id, ignore_errors=True)
    out_dir = Path(settings.export.directory) / report.run_id
    with _timed(report, "export", spark):
        progress.stage("export", 1)
        progress.step(f"{len(request_ids)} package(s), {settings.export.format}")
        try:
            keys = identity.resolve(spark, settings, batch)
            result = access.export(spark, settings, batch, out_dir, settings.export.format, key_types, keys)
            checked = access.checked_packages(result)
        except Exception as exc:  # every request of the batch stays open with the reason
            return [Outcome(rid, "failed", f"export failed: {_first_line(exc)}") for rid in request_ids]
        finally:
            progress.done()
    report.export = {"directory": result.directory, "manifest": result.manifest, "format": settings.export.format,
                     "packages": len(result.packages),
                     "rows": {t: sum(p.rows.get(t, 0) for p in result.packages) for t in settings.datamap.tables}}
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


def _run_erasure(spark: SparkSession, settings: Settings, ledger: Ledger, key_types: dict[str, DataType],
                 report: RunReport, progress: Progress, today: date, batch: DataFrame, due: dict[str, date],
                 interrupted: list[str]) -> list[Outcome]:
    request_ids = sorted(due)
    waiting = ledger.awaiting_purge()
    deadlines = {**waiting, **{rid: purge.purge_deadline(today, d, settings.purge) for rid, d in due.items()}}
    purge_now = purge.purge_due(deadlines.values(), today)
    if not request_ids and not purge_now:
        report.purge_schedule = _schedule(settings, False, waiting)
        return []
    tables = settings.datamap.erase_order()
    erasures = _erase(spark, settings, ledger, batch, request_ids, tables, key_types, report, progress)
    # What interrupted runs erased: re-erasing finds nothing, so their commits are the evidence.
    resumed = {s.table: s for s in ledger.journal.steps(interrupted, "erased")}
    ledger.journal.record([Step(report.run_id, t, "erased", e.snapshot_id,
                                {"rows": e.plan.matches_by_request, "rounds": e.rounds})
                           for t, e in erasures.items() if e.snapshot_id is not None])
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
            progress.stage("purge", len(to_purge))
            for table in to_purge:
                progress.step(table)
                purges[table] = _purge(spark, settings, table)
            progress.done()
        ledger.journal.record([Step(report.run_id, t, "purged", None, {"bytes_rewritten": p.bytes_rewritten})
                               for t, p in purges.items() if not p.error])
        faults.failpoint("after_purge")

    hashes = ledger.key_hashes(proven).localCheckpoint()
    with _timed(report, "verify", spark):
        progress.stage("verify" if purge_now else "verify live data (purge not run)", len(tables))
        verifications = {}
        for table in tables:
            progress.step(table)
            verifications[table] = _verify(spark, settings, ledger, table, hashes, key_types, purge_now)
            if purge_now and not verifications[table].live and (verifications[table].history
                                                                 or verifications[table].storage):
                # Left over from an earlier, interrupted run: purge now and prove again.
                purges[table] = _purge(spark, settings, table)
                verifications[table] = _verify(spark, settings, ledger, table, hashes, key_types)
            if table in erasures:
                _check_collateral(erasures[table], verifications[table])
        progress.done()

    for table in tables:
        report.tables[table] = {
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


def _erase(spark: SparkSession, settings: Settings, ledger: Ledger, batch: DataFrame, request_ids: list[str],
           tables: list[str], key_types: dict[str, DataType], report: RunReport, progress: Progress
           ) -> dict[str, erase.TableErasure]:
    """Resolve the batch's identifiers, record their hashes, and erase them from every table.

    Then, in at most `erase.max_rounds - 1` more rounds, erase rows of these subjects that other
    writers appended meanwhile: only tables that took commits after ours are checked (live scan).
    """
    if not request_ids:
        return {}
    with _timed(report, "resolve", spark):
        progress.stage("resolve identifiers", 1)
        progress.step(f"{len(request_ids)} subjects")
        keys = identity.resolve(spark, settings, batch)
        ledger.record_keys(keys)
        progress.done()

    progress.stage("erase", len(tables))
    erasures: dict[str, erase.TableErasure] = {}
    for table in tables:
        progress.step(table)
        erasures[table] = _erase_table(spark, settings, table, keys, key_types[table], report)
    progress.done()
    hashes = ledger.key_hashes(request_ids)
    for _ in range(settings.erase.max_rounds - 1):
        with _timed(report, "erase", spark):
            moved = [t for t, e in erasures.items() if not e.error and _changed_since(spark, settings, t, e)]
            late = [t for t in moved if _verify(spark, settings, ledger, t, hashes, key_types, physical=False).live]
        if not late:
            break
        progress.stage("erase late rows", len(late))
        for table in late:
            progress.step(table)
            erasures[table].absorb(_erase_table(spark, settings, table, keys, key_types[table], report))
        progress.done()
    return erasures


def _changed_since(spark: SparkSession, settings: Settings, table: str, erasure: erase.TableErasure) -> bool:
    current = iceberg.current_snapshot(spark, settings, table)
    ours = erasure.snapshot_id if erasure.snapshot_id is not None else erasure.plan.snapshot_before
    return current is not None and current.snapshot_id != ours


def _erase_table(spark: SparkSession, settings: Settings, table: str, keys: DataFrame, key_type: DataType,
                 report: RunReport) -> erase.TableErasure:
    """Plan, fingerprint (collateral check), commit, and check one table."""
    start = time.perf_counter()
    mapping = settings.datamap.tables[table]
    nulled = frozenset(mapping.redact) if mapping.action == "redact" else frozenset()
    with _timed(report, "erase", spark):
        table_plan = erase.plan(spark, settings, table, keys, key_type)
    # Its own scan, not folded into the plan's: the plan reads the key column only, and a table
    # where nothing matches is never committed to, so it needs no fingerprint of every column.
    content = settings.erase.collateral_check == "content" and table_plan.rows_matched > 0
    if content:
        with _timed(report, "collateral", spark):
            hits = erase.hits(keys, mapping, key_type)
            table_plan.other_before, table_plan.requested_after = collateral.split(
                iceberg.read_at(spark, settings, table, table_plan.snapshot_before), mapping.key, hits, nulled)
    with _timed(report, "erase", spark):
        try:
            erasure = erase.apply(spark, settings, table_plan, keys, key_type)
        except Exception as exc:  # recorded; verification then shows what is left
            erasure = erase.TableErasure(table_plan, error=_first_line(exc))
    if erasure.snapshot_id is not None:
        with _timed(report, "collateral", spark):
            erasure.collateral = collateral.check(
                spark, settings, table, mapping.key, hits, nulled, table_plan.snapshot_before, erasure.snapshot_id,
                table_plan.other_before, table_plan.requested_after,
            ) if content else collateral.check_counts(
                spark, settings, table, table_plan.snapshot_before, erasure.snapshot_id,
                table_plan.expected_rows_after, erasure.rows_after)
    erasure.seconds = round(time.perf_counter() - start, 3)
    return erasure


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


def _verify(spark, settings, ledger, table, hashes, key_types, physical=True) -> verify.TableVerification:
    return verify.verify_tables(spark, settings, hashes, ledger.keyring, key_types, [table], physical)[0]


def _check_collateral(erasure: erase.TableErasure, verification: verify.TableVerification) -> None:
    if erasure.error:
        verification.collateral_ok, verification.collateral_detail = False, f"erasure failed: {erasure.error}"
    elif erasure.collateral and not erasure.collateral.ok:
        verification.collateral_ok, verification.collateral_detail = False, erasure.collateral.detail


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
            if e is not None:  # batch-wide costs of this table's erase + purge (shared by the batch's requests)
                entry["data_files_rewritten"] = e.data_files_rewritten
                entry["bytes_rewritten"] = e.bytes_rewritten
            entry["purged"] = p is not None
            entry["data_files_rewritten"] = entry.get("data_files_rewritten", 0) + (p.data_files_rewritten if p else 0)
            entry["bytes_rewritten"] = entry.get("bytes_rewritten", 0) + (p.bytes_rewritten if p else 0)
            entry["snapshots_expired"] = p.snapshots_expired if p else 0
            entry["checks"] = {"live": v.live == 0, "collateral": v.collateral_ok,
                               **({"history": v.history == 0, "storage": v.storage == 0} if v.physical else {})}
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


def purge_ledger(spark: SparkSession, settings: Settings, ledger: Ledger) -> dict:
    """Purge the ledger's own history (old snapshots hold plaintext subject ids) and prove it."""
    result = _purge(spark, settings, ledger.requests_table).as_dict()
    completed = (
        spark.table(settings.table(ledger.requests_table)).where(F.col("status") == "completed")
        .select("request_id", F.col("subject_hash").alias("key_hash"))
    )
    check = verify.verify_column(spark, settings, ledger.requests_table, "subject_id", StringType(), completed,
                                 ledger.keyring)
    result["plaintext_found"] = check.live + check.history + check.storage
    result["passed"] = check.passed
    return result


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]
