"""What the ledger holds for a run: one read each of the open requests, the step journal and the legal holds."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from datetime import date

import pyarrow as pa

from ..config import Settings
from ..lake import plainfiles
from ..lake.catalog import current_versions
from ..ledger.holds import active_holds
from ..ledger.journal import Step
from ..ledger.ledger import OPEN_STATUSES, Ledger
from ..stages import purge, resurrection


@dataclass(frozen=True)
class Work:
    """The open requests by type, the journal, and what they make due."""

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
    held: dict[str, str]  # tables on a collateral hold (`dsr release` lifts it) -> why
    # Legal holds (ledger/holds.py). Tables under one -> the hold: neither erased nor purged, and a
    # request whose subject they hold waits as `held`.
    legal_tables: dict[str, str]
    # Erase requests of subjects under a legal hold whose status this run changes to `held` -> the
    # hold (left out of the batch; those already held for the same hold are left out and not listed).
    legal_subjects: dict[str, str]
    not_processed: dict[str, int]  # request types this version records but does not process -> how many
    # Keyed tables that moved since their last resurrection check, looked up only when nothing else
    # makes the run start Spark: a run is due for them (stages/resurrection.py).
    unchecked: tuple[str, ...] = ()
    retention: bool = False  # the data map has `expire:` rules: every run enforces them (stages/retention.py)
    # The open requests as read (Arrow): a batch's columns come from it without a dict per request.
    read: pa.Table | None = field(default=None, compare=False, repr=False)

    @property
    def ids(self) -> list[str]:
        return [*self.access, *self.erase, *self.consent]

    @property
    def needs_lease(self) -> bool:
        return self.needs_spark or bool(self.ledger_purge or self.legal_subjects)

    @property
    def needs_spark(self) -> bool:
        """Requests to act on, a purge due, shares to refresh, an unchecked table or retention rules."""
        return bool(self.ids or self.purge_now or self.shares or self.unchecked or self.retention)


def read_work(ledger: Ledger, settings: Settings, today: date, interrupted: tuple[str, ...] = ()) -> Work:
    """The run's Work: one read of the open requests, one of the journal and one of the legal holds.
    A table on a collateral hold stops every erasure and purge (its erase requests wait); an erase
    request of a subject under a legal hold is left out of the batch. Cost: three small ledger reads,
    and one HMAC per open erase request and key while a subject hold is active."""
    rows, read = ledger.work_requests(OPEN_STATUSES)
    steps = ledger.journal.steps()
    held = {t: s.detail.get("reason", "") for t, s in ledger.journal.holds(steps).items()}
    legal = active_holds(ledger, today)
    legal_subjects: dict[str, str] = {}
    not_processed: dict[str, int] = {}
    by_type: dict[str, dict[str, dict]] = {"access": {}, "erase": {}, "opt_out": {}, "opt_in": {}}
    waiting: dict[str, date] = {}
    for r in rows:
        if r["status"] == "erased":  # already out of live data: a hold placed since does not stop the purge
            waiting[r["request_id"]] = r["purge_by"]
        elif r["request_type"] == "erase" and (hold := legal.subject(r["subject_id"])) is not None:
            if (r["status"], r["status_reason"]) != ("held", hold.why):
                legal_subjects[r["request_id"]] = hold.why
        elif r["request_type"] in by_type:
            by_type[r["request_type"]][r["request_id"]] = r
        else:
            not_processed[r["request_type"]] = not_processed.get(r["request_type"], 0) + 1
    erase = {} if held else by_type["erase"]
    deadline = functools.cache(lambda due: purge.purge_deadline(today, due, settings.purge))  # per due day
    deadlines = {**waiting, **{rid: deadline(r["due_date"]) for rid, r in erase.items()}}
    work = Work(by_type["access"], erase, waiting, steps, list(interrupted), deadlines,
                not held and purge.purge_due(deadlines.values(), today),
                settings.purge.policy == "immediate" and ledger.purge_owed(steps),
                {**by_type["opt_out"], **by_type["opt_in"]}, bool(settings.datamap.shares), held,
                {t: h.why for t, h in legal.tables.items()}, legal_subjects, not_processed,
                retention=bool(settings.datamap.expiring), read=read)
    if work.needs_lease or held:
        return work
    return replace(work, unchecked=tuple(_moved_since_checked(ledger, settings, steps, work.legal_tables)))


def _moved_since_checked(ledger: Ledger, settings: Settings, steps: list[Step], legal_tables: dict[str, str]
                         ) -> list[str]:
    """Keyed tables whose current snapshot is not the one their last resurrection check saw, and
    `files:` datasets holding files their last check did not see, once some erase request was
    completed (before that nobody can come back). Cost: two small ledger reads, one metadata read
    per keyed Iceberg table (pyiceberg), one listing per Delta log and per dataset (pyarrow; a scheme
    pyarrow does not know, such as s3a://, is checked only by runs that start Spark): no JVM."""
    if not ledger.erased_ids():
        return []
    tables = [t for t in settings.datamap.keyed if t not in legal_tables]
    files = {d: plainfiles.listing(m.path) for d, m in settings.datamap.files.items() if d not in legal_tables}
    return resurrection.unchecked(resurrection.checkpoints(steps),
                                  current_versions(settings, tables),
                                  resurrection.dataset_checkpoints(steps),
                                  {d: names for d, names in files.items() if names is not None})
