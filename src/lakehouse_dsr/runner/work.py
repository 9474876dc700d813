"""What the ledger holds for a run: one read each of the open requests, the step journal and the legal holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import date
from functools import cache, cached_property
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from ..config import Settings
from ..lake import plainfiles
from ..lake.catalog import current_versions
from ..ledger.holds import ActiveHolds, active_holds
from ..ledger.journal import Step
from ..ledger.ledger import OPEN_STATUSES, Ledger
from ..stages import purge, resurrection


class RequestRows(Mapping[str, dict]):
    """Requests as the ledger read them (`table`: Arrow, the ledger's WORK_COLUMNS), by request id. A
    batch takes its columns from `table`; a request is made a dict (`rows[id]`) on the first lookup
    only, for all at once: a million dicts cost 2 s that `dsr plan` and a run's batch never pay.
    Iterating gives the ids in the order read."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @classmethod
    def of(cls, *parts: RequestRows) -> RequestRows:
        """The requests of `parts` (read with the same columns), in their order."""
        return cls(pa.concat_tables([p.table for p in parts]))

    def __len__(self) -> int:
        return self.table.num_rows

    def __iter__(self) -> Iterator[str]:
        return iter(cast(list[str], self.table.column("request_id").to_pylist()))

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    @cached_property
    def _ids(self) -> frozenset[str]:
        return frozenset(self)

    def __getitem__(self, request_id: str) -> dict:
        return self._rows[request_id]

    @cached_property
    def _rows(self) -> dict[str, dict]:
        return {r["request_id"]: r for r in self.table.to_pylist()}


@dataclass(frozen=True)
class Work:
    """The open requests by type, the journal, and what they make due."""

    access: RequestRows  # request id -> ledger row (subject id included: stays in this process and Spark)
    erase: RequestRows  # empty while a table is on hold
    waiting: dict[str, date]  # logically erased, purge due by
    steps: list[Step]
    interrupted: list[str]  # runs that lapsed without returning the lease: their work is ours now
    purge_deadline: Callable[[date], date]  # an erase request's purge deadline by its due date
    purge_now: bool
    ledger_purge: bool  # the ledger's own history still holds plaintext of completed requests
    consent: RequestRows  # opt_out and opt_in requests (stages/share.py), in that order
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
    # Tables the data map exempts from erasure (`exempt:`) -> the exemption: neither erased nor purged,
    # and a request whose subject they hold completes with those rows kept (runner/rules.py).
    exempt_tables: dict[str, str] = field(default_factory=dict)

    @cached_property
    def kept_tables(self) -> dict[str, str]:
        """Tables this run neither erases nor purges -> why: those under a legal hold, and exempt ones."""
        return {**{t: f"exempt: {why}" for t, why in self.exempt_tables.items()}, **self.legal_tables}

    @property
    def ids(self) -> list[str]:
        return [*self.access, *self.erase, *self.consent]

    @cached_property
    def deadlines(self) -> dict[str, date]:
        """The purge deadline of each erase request, waiting or new (a million: 0.3 s, paid by a run
        that keeps its erased requests waiting).."""
        table, deadlines = self.erase.table, dict(self.waiting)
        for due in cast(list[date], pc.unique(table.column("due_date")).to_pylist()):  # a few days
            ids = _where(table, pc.equal(table.column("due_date"), pa.scalar(due, pa.date32()))).column("request_id")
            deadlines.update(dict.fromkeys(cast(list[str], ids.to_pylist()), self.purge_deadline(due)))
        return deadlines

    @property
    def needs_lease(self) -> bool:
        return self.needs_spark or bool(self.ledger_purge or self.legal_subjects)

    @property
    def needs_spark(self) -> bool:
        """Requests to act on, a purge due, shares to refresh, an unchecked table or retention rules."""
        return bool(self.access or self.erase or self.consent or self.purge_now or self.shares or self.unchecked
                    or self.retention)


def read_work(ledger: Ledger, settings: Settings, today: date, interrupted: tuple[str, ...] = ()) -> Work:
    """The run's Work: one read of the open requests, one of the journal and one of the legal holds.
    A table on a collateral hold stops every erasure and purge (its erase requests wait); an erase
    request of a subject under a legal hold is left out of the batch. Cost: three small ledger reads,
    and one HMAC per open erase request and key while a subject hold is active."""
    read = ledger.work_requests(OPEN_STATUSES)
    steps = ledger.journal.steps()
    held = {t: s.detail.get("reason", "") for t, s in ledger.journal.holds(steps).items()}
    legal = active_holds(ledger, today)
    erased = pc.equal(read.column("status"), pa.scalar("erased"))
    waiting = dict(zip(*(_where(read, erased).column(c).to_pylist() for c in ("request_id", "purge_by")),
                       strict=True))
    rest = _where(read, pc.invert(erased))
    legal_subjects, rest = _legally_held(rest, legal)
    kind = rest.column("request_type")
    by_type = {t: RequestRows(_where(rest, pc.equal(kind, pa.scalar(t))).drop_columns(
        [] if t in ("opt_out", "opt_in") else ["received_at"])) for t in ("access", "erase", "opt_out", "opt_in")}
    others = _where(rest, pc.invert(pc.is_in(kind, pa.array(list(by_type))))).column("request_type")
    not_processed = dict(Counter(cast(list[str], others.to_pylist())))
    erase = by_type["erase"] if not held else RequestRows(by_type["erase"].table.slice(0, 0))
    deadline = cache(lambda due: purge.purge_deadline(today, due, settings.purge))  # per due day
    dues = pc.unique(erase.table.column("due_date")).to_pylist()
    work = Work(by_type["access"], erase, waiting, steps, list(interrupted), deadline,
                not held and purge.purge_due([*waiting.values(), *map(deadline, dues)], today),
                settings.purge.policy == "immediate" and ledger.purge_owed(steps),
                RequestRows.of(by_type["opt_out"], by_type["opt_in"]), bool(settings.datamap.shares), held,
                {t: h.why for t, h in legal.tables.items()}, legal_subjects, not_processed,
                retention=bool(settings.datamap.expiring), exempt_tables=settings.datamap.exempt)
    if work.needs_lease or held:
        return work
    return replace(work, unchecked=tuple(_moved_since_checked(ledger, settings, steps, work.kept_tables)))


def _where(rows: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """`rows` where `mask` holds, not copied when it holds everywhere or nowhere (a batch of a million
    erase requests is most of what a run reads: a filter would copy every string of it, 0.6 s)."""
    true = pc.sum(mask).as_py() or 0
    return rows if true == rows.num_rows else rows.slice(0, 0) if true == 0 else rows.filter(mask)


def _legally_held(rows: pa.Table, legal: ActiveHolds) -> tuple[dict[str, str], pa.Table]:
    """The erase requests of `rows` whose subject is under a legal hold and not yet `held` for it ->
    the hold, and `rows` without any erase request so held. Cost: one HMAC per erase request and key
    while a subject hold is active; nothing otherwise."""
    if not any(h.kind == "subject" for h in legal.holds):
        return {}, rows
    erases = _where(rows, pc.equal(rows.column("request_type"), pa.scalar("erase")))
    changed: dict[str, str] = {}
    kept_out: list[str] = []
    for r in erases.select(["request_id", "subject_id", "status", "status_reason"]).to_pylist():
        if (hold := legal.subject(r["subject_id"])) is not None:
            kept_out.append(r["request_id"])
            if (r["status"], r["status_reason"]) != ("held", hold.why):
                changed[r["request_id"]] = hold.why
    kept = pa.array(kept_out, rows.schema.field("request_id").type)
    return changed, rows.filter(pc.invert(pc.is_in(rows.column("request_id"), kept)))


def _moved_since_checked(ledger: Ledger, settings: Settings, steps: list[Step], kept_tables: dict[str, str]
                         ) -> list[str]:
    """Keyed tables whose current snapshot is not the one their last resurrection check saw, and
    `files:` datasets holding files their last check did not see, once some erase request was
    completed (before that nobody can come back). Cost: two small ledger reads, one metadata read
    per keyed Iceberg table (pyiceberg), one listing per Delta log and per dataset (pyarrow; a scheme
    pyarrow does not know, such as s3a://, is checked only by runs that start Spark): no JVM."""
    if not ledger.erased_ids():
        return []
    tables = [t for t in settings.datamap.keyed if t not in kept_tables]
    files = {d: plainfiles.listing(m.path) for d, m in settings.datamap.files.items() if d not in kept_tables}
    return resurrection.unchecked(resurrection.checkpoints(steps),
                                  current_versions(settings, tables),
                                  resurrection.dataset_checkpoints(steps),
                                  {d: names for d, names in files.items() if names is not None})
