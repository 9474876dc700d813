"""Our own records expire too: completed requests, access packages and unverified intake requests are
kept for a set period (`records:` in dsr.yaml), then removed; the yearly figures survive them.

**Completed requests** (`keep_completed_months`, default 24: CCPA, Cal. Code Regs. tit. 11, § 7101)
leave the ledger once completed that long ago. "Removed" means, per ledger table:

- `requests`: the request's row (type, dates, status, evidence) is deleted;
- `request_keys`: its keyed hashes are deleted; an *erase* request's hashes move to `erased_keys`
  first (unless `keep_erased_hashes: false`), because suppression and the resurrection check need
  them to keep the erased person out of new data. They are HMACs, not identifiers; with the key
  they only recognise the person when their data shows up again. Their request id stays with them
  so a resurrection can name the past erasure; nothing else of the request remains;
- `audit`: every event of the request is deleted;
- `steps`: a step describes a table's commit and stays; the request's id leaves its per-request
  row counts;
- `consent`: a subject's standing opt-out stays (it must keep being honoured); its link to the
  request (`request_id`) is cleared;
- `drop_items`: a DROP work item stays, ID, hash and status: its hash is on the suppression list
  the law requires. The expired ids leave its `request_ids` (an empty list then still says requests
  were filed, so the item is not matched again);
- `holds`, `runs`, `lease`: hold no request id of a completed request.

**DROP work items withdrawn** by DROP's `Removed` file leave `drop_items` (ID and hash) once
withdrawn `keep_completed_months` ago, unless `drop.keep_withdrawn`. The downloads and uploads
recorded (`drop_downloads`, `drop_uploads`: names, checksums, counts) are the record of each access
of DROP and hold no hash: they stay.

Each changed table's history is then purged (Store.purge_history: old snapshots, the files only they
held, orphans past the window) and proven: no stored Parquet file of those tables still names an
expired request. Before anything goes, the records are added to `record_years` (per year received,
regulation and type: received, complied with, days to respond), so `dsr metrics --year` still gives
a year's CCPA § 7102 figures after its records expired.

**Access packages** (`keep_packages_days`, default 30) are deleted that many days after their file
was written; each deletion is an audit event of its request (run id, file name: no identifier) and
a line of the report. **Intake requests** never verified or locked after wrong codes
(`keep_unverified_days`) are deleted from the intake queue with their subject id and e-mail
(secure_delete overwrites them, and the write-ahead log is checkpointed), and counted as denied.

Crash safety: every step is safe to repeat. The figures are folded first, with watermarks (the
cutoffs folded up to); a record or intake row older than its watermark is removed without being
counted again, and `metrics` ignores records the fold already counted. No JVM.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from ..config import Settings
from ..exceptions import RequestInputError
from .ledger import Ledger
from .requests import REQUEST_TYPES, add_months, utc_now
from .store import Among, EqualTo, LessThan, Store

log = logging.getLogger("lakehouse_dsr.records")
# where an expiring request's id is -> the column that names it
_TABLES = {"requests": "request_id", "request_keys": "request_id", "audit": "request_id", "steps": "detail",
           "consent": "request_id", "drop_items": "request_ids"}
_REQUEST_ID = re.compile(r"req-[0-9a-f]{21}")
# The intake queue's states of a request that never reached the ledger and never will by itself
# (service/queue.py's schema; its rows are read here because the run, below the service, drops them).
_STALE_INTAKE = ("identity_unverified", "locked")
# CCPA § 7102 names the request types: to know, to delete, to opt out (opt-ins are counted too).
LABELS = {"erase": "delete", "access": "know", "opt_out": "opt-out", "opt_in": "opt-in"}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PackageDeletion(_Model):
    request_id: str
    export_run: str = Field(description="the run that wrote the package (its folder)")
    file: str = Field(description="the package's file name")


class RecordExpiry(_Model):
    """What one pass of record expiry removed (counts and request ids, never an identifier)."""

    run_id: str = Field(description="the run (or `dsr expire-records` pass) that removed them")
    dry_run: bool = Field(description="nothing was removed: what would go")
    completed_before: str = Field(description="requests completed before this (ISO-8601) have expired")
    requests_expired: dict[str, int] = Field(description="records removed, per request type")
    hashes_kept: int = Field(description="keyed hashes of expired erase requests kept in erased_keys")
    packages_before: str = Field(description="access packages written before this (ISO-8601) were deleted")
    packages_deleted: list[PackageDeletion]
    intake_before: str = Field(description="unverified or locked intake requests received before this (ISO-8601)")
    intake_dropped: int = Field(description="intake requests dropped with their identifiers")
    drop_withdrawn_removed: int = Field(0, description="DROP work items withdrawn before `completed_before`, "
                                                       "removed with their hash")
    history: dict[str, dict[str, int]] = Field(description="per ledger table: snapshots expired, files deleted, "
                                                           "orphans removed")
    ids_found: int = Field(description="stored files of those tables still naming an expired request (0: proven)")

    @property
    def removed_anything(self) -> bool:
        return bool(self.requests_expired or self.packages_deleted or self.intake_dropped
                    or self.drop_withdrawn_removed)

    def summary(self) -> str:
        """One line for the console: counts only."""
        verb = "would remove" if self.dry_run else "removed"
        proof = "" if self.dry_run or not self.requests_expired else (
            ", none left in the ledger's files" if self.ids_found == 0 else
            f", [red]{self.ids_found} stored row(s) still name one[/]")
        return (f"records: {verb} {sum(self.requests_expired.values())} completed request record(s) "
                f"({self.hashes_kept} erase hash(es) kept for suppression){proof}, "
                f"{len(self.packages_deleted)} access package(s), {self.intake_dropped} unverified intake request(s)"
                + (f", {n} withdrawn DROP work item(s)" if (n := self.drop_withdrawn_removed) else ""))


@dataclass(frozen=True)
class Cutoffs:
    completed: datetime
    packages: datetime
    intake: datetime

    @staticmethod
    def of(settings: Settings, now: datetime) -> Cutoffs:
        keep = settings.records
        midnight = datetime.combine(add_months(now.date(), -keep.keep_completed_months), datetime.min.time(), UTC)
        return Cutoffs(midnight, now - timedelta(days=keep.keep_packages_days),
                       now - timedelta(days=keep.keep_unverified_days))


def expire_records(settings: Settings, dry_run: bool = False, run_id: str | None = None,
                   now: datetime | None = None) -> RecordExpiry:
    """Remove what is past its period (module docstring): packages, then intake requests, then
    completed records, each table's history purged and proven. `dry_run`: only report what would go.

    Cost with nothing due: one ledger read pruned to old completed requests, a listing of the export
    folder and one indexed query of the intake queue; no write. Otherwise per table one commit that
    rewrites the files holding expiring rows, its history purge (manifests, a listing) and a read
    of the request id column of its stored files.
    """
    now = now or utc_now()
    run_id = run_id or f"records-{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    cut = Cutoffs.of(settings, now)
    ledger = Ledger(settings)
    old = EqualTo("status", "completed") & LessThan("completed_at", cut.completed.isoformat())
    expiring = ledger.store.rows("requests", old, ("request_id", "request_type", "regulation", "received_at",
                                                   "completed_at"))
    packages = _old_packages(Path(settings.export.directory), cut.packages)
    stale = _stale_intake(settings, cut.intake)
    withdrawn = [] if settings.drop.keep_withdrawn else _withdrawn_items(ledger.store, cut.completed)
    result = RecordExpiry(
        run_id=run_id, dry_run=dry_run, completed_before=cut.completed.isoformat(),
        requests_expired=dict(Counter(r["request_type"] for r in expiring)), hashes_kept=0,
        packages_before=cut.packages.isoformat(), packages_deleted=[p.deletion for p in packages],
        intake_before=cut.intake.isoformat(),
        intake_dropped=len(stale), drop_withdrawn_removed=len(withdrawn), history={}, ids_found=0)
    if dry_run:
        return result
    _delete_packages(ledger, packages, run_id)
    if expiring or stale:
        _fold(ledger.store, expiring, stale, cut)
    if stale:
        _drop_intake(settings, cut.intake)
    if withdrawn:
        ledger.store.delete("drop_items", Among("work_item_id", withdrawn))
    if not expiring:
        history = {"drop_items": ledger.store.purge_history("drop_items", settings.purge.orphan_min_age_minutes
                                                            ).__dict__} if withdrawn else {}
        return result.model_copy(update={"history": history})
    kept, history, found = _remove(ledger, expiring)
    return result.model_copy(update={"hashes_kept": kept, "history": history, "ids_found": found})


def _withdrawn_items(store: Store, before: datetime) -> list[str]:
    """The DROP work items withdrawn before `before`. Cost: a read of the items' withdrawal column,
    pruned to files that may hold one."""
    rows = store.arrow("drop_items", LessThan("withdrawn_at", before.isoformat()), ("work_item_id",))
    return sorted(str(i) for i in rows.column("work_item_id").to_pylist())


# -- access packages ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Package:
    path: Path
    deletion: PackageDeletion


def _old_packages(directory: Path, before: datetime) -> list[_Package]:
    """Packages (`<run>/<request id>.<format>`) whose file was written before `before`. Cost: a listing."""
    if not directory.is_dir():
        return []
    cutoff = before.timestamp()
    return sorted((_Package(f, PackageDeletion(request_id=f.name.split(".", 1)[0], export_run=f.parent.name,
                                               file=f.name))
                   for f in directory.glob("*/*") if _REQUEST_ID.fullmatch(f.name.split(".", 1)[0])
                   and f.is_file() and f.stat().st_mtime < cutoff), key=lambda p: str(p.path))


def _delete_packages(ledger: Ledger, packages: list[_Package], run_id: str) -> None:
    """Delete the packages, then one audit event each; a run folder left with its manifest only goes
    too (the manifest lists request ids, files and checksums: nothing to keep once they are gone)."""
    for p in packages:
        p.path.unlink(missing_ok=True)
    for folder in {p.path.parent for p in packages}:
        if not any(_REQUEST_ID.fullmatch(f.name.split(".", 1)[0]) for f in folder.iterdir()):
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
    ledger.audit([(p.deletion.request_id, run_id, "package_deleted",
                   {"export_run": p.deletion.export_run, "file": p.deletion.file}) for p in packages])


# -- the intake queue ---------------------------------------------------------------------------------

_STALE_SQL = ("SELECT request_type, regulation, received_at FROM intake WHERE ingested_at IS NULL AND state IN (?, ?)"
              " AND received_at < ?")
_DROP_SQL = "DELETE FROM intake WHERE ingested_at IS NULL AND state IN (?, ?) AND received_at < ?"


def _postgres_queue(url: str, sql: str, before: datetime) -> list[tuple]:
    """`sql` on the intake queue of a PostgreSQL server (`intake.queue_url`), in one transaction; a
    server that does not answer, or has no queue yet, is logged (never with the password) and read as
    holding nothing: its stale requests are dropped by a later run."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=10, application_name="dsr records") as connection:
            cursor = connection.execute(sql.replace("?", "%s").encode(), (*_STALE_INTAKE, before.isoformat()))
            return cursor.fetchall() if cursor.description else []
    except psycopg.errors.UndefinedTable:
        return []
    except psycopg.Error as exc:
        host = url.rpartition("@")[2]
        log.warning("records: the intake queue on %s cannot be read (%s): its stale requests wait for a later run",
                    host, type(exc).__name__)
        return []


def _stale_intake(settings: Settings, before: datetime) -> list[dict]:
    """(request_type, regulation, received_at) of queued requests unverified or locked since before
    `before`; none without a queue (reading creates nothing). Cost: one indexed query."""
    if settings.intake.queue_url:
        rows = _postgres_queue(settings.intake.queue_url, _STALE_SQL, before)
        return [{"request_type": t, "regulation": g, "received_at": datetime.fromisoformat(r)} for t, g, r in rows]
    queue_file = settings.intake_queue_file()
    if not queue_file.is_file():
        return []
    connection = sqlite3.connect(f"{queue_file.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = connection.execute(_STALE_SQL, (*_STALE_INTAKE, before.isoformat())).fetchall()
    finally:
        connection.close()
    return [{"request_type": t, "regulation": g, "received_at": datetime.fromisoformat(r)} for t, g, r in rows]


def _drop_intake(settings: Settings, before: datetime) -> None:
    """Delete those rows (beside a running service: SQLite serialises the writers), then checkpoint
    the write-ahead log so no copy of the deleted pages stays in it (PostgreSQL: the ingester's next
    VACUUM of the table, or autovacuum, removes the deleted row versions)."""
    if settings.intake.queue_url:
        _postgres_queue(settings.intake.queue_url, _DROP_SQL, before)
        return
    connection = sqlite3.connect(settings.intake_queue_file(), timeout=10.0)
    try:
        connection.execute("PRAGMA secure_delete=ON")
        with connection:
            connection.execute(_DROP_SQL, (*_STALE_INTAKE, before.isoformat()))
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        connection.close()


# -- the yearly figures -------------------------------------------------------------------------------

@dataclass
class _Year:
    received: int = 0
    complied: int = 0
    denied: int = 0
    days: Counter[int] = field(default_factory=Counter)


def _days(request: dict) -> int:
    return (request["completed_at"].date() - request["received_at"].date()).days


def _fold(store: Store, expiring: list[dict], stale: list[dict], cut: Cutoffs) -> None:
    """Add the expiring records (complied with) and the stale intake requests (denied: identity not
    verified) to `record_years`, skipping what an earlier, interrupted pass already counted (older
    than its watermark); one commit that replaces the table's few rows. Cost: one read of them."""
    while True:
        current = store.snapshot_id("record_years")
        rows = store.rows("record_years")
        years, marks = _years(rows)
        done_completed, done_intake = marks
        for r in expiring:
            if done_completed is None or r["completed_at"] >= done_completed:
                y = years.setdefault((r["received_at"].year, r["regulation"], r["request_type"]), _Year())
                y.received, y.complied = y.received + 1, y.complied + 1
                y.days[_days(r)] += 1
        for r in stale:
            if done_intake is None or r["received_at"] >= done_intake:
                y = years.setdefault((r["received_at"].year, r["regulation"], r["request_type"]), _Year())
                y.received, y.denied = y.received + 1, y.denied + 1
        completed_before = max(cut.completed, done_completed) if done_completed else cut.completed
        intake_before = max(cut.intake, done_intake) if done_intake else cut.intake
        new = [{"year": k[0], "regulation": k[1], "request_type": k[2], "received": y.received,
                "complied": y.complied, "denied": y.denied,
                "days": json.dumps({str(d): n for d, n in sorted(y.days.items())}),
                "completed_before": completed_before, "intake_before": intake_before} for k, y in sorted(years.items())]
        if store.compare_and_set("record_years", current, new):
            return
        time.sleep(0.05)  # another pass folded meanwhile: fold again from its result


def _years(rows: list[dict]) -> tuple[dict[tuple[int, str, str], _Year], tuple[datetime | None, datetime | None]]:
    """`record_years` rows as {(year, regulation, type): figures}, and the watermarks they carry."""
    years = {(r["year"], r["regulation"], r["request_type"]): _Year(
        r["received"], r["complied"], r["denied"], Counter({int(d): n for d, n in json.loads(r["days"]).items()}))
        for r in rows}
    return years, (max((r["completed_before"] for r in rows), default=None),
                   max((r["intake_before"] for r in rows), default=None))


# -- removing the records -----------------------------------------------------------------------------

def _remove(ledger: Ledger, expiring: list[dict]) -> tuple[int, dict[str, dict[str, int]], int]:
    """Remove the expiring requests from every ledger table (module docstring), the requests row last
    so a pass cut short is finished by the next; purge each table's history and look for the ids in
    every stored file. Returns (hashes kept, history purge per table, files' rows still naming one)."""
    store = ledger.store
    ids = sorted(r["request_id"] for r in expiring)
    erase_ids = sorted(r["request_id"] for r in expiring if r["request_type"] == "erase")
    kept = _keep_hashes(store, erase_ids) if ledger.settings.records.keep_erased_hashes and erase_ids else 0
    store.delete("request_keys", Among("request_id", ids))
    store.delete("audit", Among("request_id", ids))
    _unlink_steps(store, set(ids))
    store.replace("consent", "request_id", ids, lambda rows: [{**r, "request_id": None} for r in rows])
    _unlink_drop_items(store, set(ids))
    store.delete("requests", Among("request_id", ids))
    window = ledger.settings.purge.orphan_min_age_minutes
    history = {t: store.purge_history(t, window).__dict__ for t in _TABLES}
    gone = set(ids)
    found = sum(1 for t, column in _TABLES.items() for value in store.column_values(t, column)
                if gone.intersection(_REQUEST_ID.findall(value)))
    return kept, history, found


def _unlink_drop_items(store: Store, ids: set[str]) -> None:
    """Take the expiring ids out of the DROP work items' `request_ids` (JSON lists). Cost: one read of
    the items' request ids, one commit if any names one."""
    items = store.arrow("drop_items", columns=("work_item_id", "request_ids"))
    naming = [str(item) for item, text in zip(items.column("work_item_id").to_pylist(),
                                              items.column("request_ids").to_pylist(), strict=True)
              if text and ids.intersection(_REQUEST_ID.findall(text))]

    def unlinked(loaded: object, rows: pa.Table) -> pa.Table:  # from the rows as committed at each attempt
        kept = pa.array([json.dumps([r for r in json.loads(text) if r not in ids]) if text else text
                         for text in rows.column("request_ids").to_pylist()], pa.string())
        return rows.set_column(rows.schema.get_field_index("request_ids"), "request_ids", kept)

    store.replace_arrow("drop_items", "work_item_id", naming, unlinked)


def _keep_hashes(store: Store, erase_ids: list[str]) -> int:
    """Copy the erase requests' keyed hashes to `erased_keys` (those already there from an interrupted
    pass are not copied twice). Cost: two reads pruned to these ids, one append."""
    stored = store.rows("erased_keys", Among("request_id", erase_ids))
    have = {(r["request_id"], r["key_type"], r["key_hash"]) for r in stored}
    keys = store.rows("request_keys", Among("request_id", erase_ids), ("request_id", "key_type", "key_hash", "key_id"))
    store.append("erased_keys", [k for k in keys if (k["request_id"], k["key_type"], k["key_hash"]) not in have])
    return len(keys)


def _unlink_steps(store: Store, ids: set[str]) -> None:
    """Take the expiring ids out of the per-request row counts of the journal's steps (`erased` steps
    record {"rows": {request_id: rows}}). Cost: one read of the journal, one commit if any step names one."""
    naming = [r["step_id"] for r in store.rows("steps", columns=("step_id", "detail"))
              if r["detail"] and ids.intersection(_REQUEST_ID.findall(r["detail"]))]

    def unlinked(rows: list[dict]) -> list[dict]:
        for r in rows:
            detail = json.loads(r["detail"])
            detail["rows"] = {rid: n for rid, n in detail.get("rows", {}).items() if rid not in ids}
            r["detail"] = json.dumps(detail, sort_keys=True)
        return rows

    store.replace("steps", "step_id", naming, unlinked)


# -- the yearly metrics (CCPA § 7102) -----------------------------------------------------------------

class TypeFigures(_Model):
    request_type: str
    label: str = Field(description="as CCPA § 7102 names it: know, delete, opt-out (and opt-in)")
    received: int
    complied: int = Field(description="complied with in whole or in part (completed)")
    denied: int = Field(description="denied: the requester's identity was never verified (dropped from intake)")
    pending: int = Field(description="neither yet: still open")
    median_days: float | None = Field(description="median days from receipt to response, over those complied with")
    mean_days: float | None = Field(description="mean days from receipt to response, over those complied with")


class YearMetrics(_Model):
    """A year's figures, by the year requests were received; no identifiers."""

    year: int
    regulation: str | None = Field(description="only this regulation's requests (null: all)")
    types: list[TypeFigures]
    expired_included: int = Field(description="requests counted from the figures of expired records")


def parse_year(value: str | int, field_name: str = "--year") -> int:
    """A calendar year (1970 to 9999), or RequestInputError naming the field."""
    text = str(value).strip()
    if not re.fullmatch(r"\d{4}", text) or int(text) < 1970:
        raise RequestInputError(f"{field_name}: {value!r} is not a year (expected four digits, e.g. 2025)")
    return int(text)


def metrics(settings: Settings, year: int, regulation: str | None = None) -> YearMetrics:
    """The year's figures per request type: requests on record received that year, plus the figures
    kept for that year's expired records. Cost: one read of the requests table (its type, regulation,
    status and date columns) and one of `record_years` (a few rows per year)."""
    store = Ledger(settings).store
    years, (done_completed, _) = _years(store.rows("record_years", EqualTo("year", year)))
    pending: Counter[str] = Counter()
    by_type: dict[str, _Year] = {}
    expired = 0
    for (_, reg, request_type), y in years.items():
        if regulation in (None, reg):
            _add(by_type.setdefault(request_type, _Year()), y)
            expired += y.received
    for r in _on_record(store, year, done_completed):
        if regulation not in (None, r["regulation"]):
            continue
        y = by_type.setdefault(r["request_type"], _Year())
        y.received += 1
        if r["status"] == "completed":
            y.complied += 1
            y.days[_days(r)] += 1
        else:
            pending[r["request_type"]] += 1
    types = [_figures(t, by_type[t], pending[t]) for t in (*REQUEST_TYPES, *sorted(set(by_type) - set(REQUEST_TYPES)))
             if t in by_type]
    return YearMetrics(year=year, regulation=regulation, types=types, expired_included=expired)


def _on_record(store: Store, year: int, folded_before: datetime | None) -> Iterable[dict]:
    """The requests on record received in `year`, without those an interrupted pass already counted."""
    start, end = datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    that_year = LessThan("received_at", end.isoformat()) & ~LessThan("received_at", start.isoformat())
    rows = store.rows("requests", that_year, ("request_type", "regulation", "status", "received_at", "completed_at"))
    return (r for r in rows if not (folded_before and r["status"] == "completed"
                                    and r["completed_at"] < folded_before))


def _add(total: _Year, y: _Year) -> None:
    total.received += y.received
    total.complied += y.complied
    total.denied += y.denied
    total.days.update(y.days)


def _figures(request_type: str, y: _Year, pending: int) -> TypeFigures:
    days = sorted(y.days.elements())
    return TypeFigures(request_type=request_type, label=LABELS.get(request_type, request_type), received=y.received,
                       complied=y.complied, denied=y.denied, pending=pending,
                       median_days=float(statistics.median(days)) if days else None,
                       mean_days=round(statistics.fmean(days), 2) if days else None)
