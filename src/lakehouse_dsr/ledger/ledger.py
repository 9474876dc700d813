"""The request ledger: Iceberg tables `<ns>.requests`, `<ns>.request_keys`, `<ns>.audit` (plus the step
journal, the run lease and the run history `<ns>.runs`), read and written without a JVM (store.py).

Lifecycle: received -> in_progress -> completed | failed (failed stays open and is retried).
An erase request a legal hold stops (holds.py) is `held`, with the hold as its reason, until a run
after the hold ends erases it.
Under the batched purge policy an erase request goes in_progress -> erased (logically erased,
live data verified, physical purge scheduled by `purge_by`) -> completed once purged and proven.
A request is in progress while a run holding the lease works on it (lease.py). While open, a
request holds its subject id in plaintext (needed to act on it); on completion only the HMAC
remains, and the ledger's own history is purged (`purge_history`). A completed request's record
expires after `records.keep_completed_months` (records.py); an erase request's keyed hashes outlive
it in `<ns>.erased_keys`, so `erased_ids`, `key_hashes` and `suppression_hashes` include them.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from ..config import Settings
from ..exceptions import ConfigError, LedgerError
from ..keys import Keyring, keyed_hash, load_key, load_retired
from .journal import Journal, Step
from .lease import current_holder
from .requests import REQUEST_TYPES, RequestBatch, RequestInput, due_date, utc_now, utc_text
from .store import SCHEMAS, Among, EqualTo, GreaterThan, In, NotNull, Store

TIMESTAMP = SCHEMAS["requests"].field("updated_at").type  # the ledger's times: UTC, microseconds

# Picked up by the next run. held: a legal hold stopped an erase request (ledger/holds.py); each run
# looks again, and the first one after the hold ends erases.
ACTIONABLE_STATUSES = ("received", "in_progress", "failed", "held")
OPEN_STATUSES = (*ACTIONABLE_STATUSES, "erased")  # erased: waiting for the physical purge
LEDGER_TABLES = ("requests", "request_keys", "audit", "steps", "lease", "runs", "consent", "holds", "erased_keys",
                 "record_years")


def new_request_id(taken: set[str]) -> str:
    """`req-` and 21 hex digits: the creation time in ms (11), so ids sort by age and the ledger's file
    statistics let a run skip files of long-completed requests, then 40 random bits. Never one of
    `taken` (the ids made so far in this batch, which share milliseconds by the hundred); the id is
    added to it."""
    return next(new_request_ids(taken, 1))


def new_request_ids(taken: set[str], draw: int = 4096) -> Iterator[str]:
    """`new_request_id`s without end, their random bits drawn from the system `draw` ids at a time
    (one call per id was a third of `dsr submit` of a million requests)."""
    while True:
        bits = os.urandom(5 * draw).hex()
        made = f"req-{int(time.time() * 1000):011x}"  # per draw: ids made in one millisecond share it anyway
        for start in range(0, len(bits), 10):
            request_id = made + bits[start:start + 10]
            if request_id not in taken:
                taken.add(request_id)
                yield request_id


def _new_requests(schema: pa.Schema, batch: RequestBatch, fresh: list[int], hashes: list[str], ids: list[str],
                  now: datetime) -> pa.Table:
    """The requests of `batch` at positions `fresh` (each with its subject's hash) as the requests
    table's rows, built column by column; a deadline is computed once per day received, regulation
    and type. Columns not set here are null."""
    pick = (lambda column: column) if len(fresh) == len(batch) else (lambda column: [column[i] for i in fresh])
    kinds, regulations = pick(batch.request_type), pick(batch.regulation)
    received = [t or now for t in pick(batch.received_at)]
    deadline = functools.cache(lambda day, regulation, kind: due_date(day, regulation, request_type=kind))
    n = len(fresh)
    columns: dict[str, Any] = {
        "request_id": pa.array(ids, pa.string()), "subject_id": pa.array(pick(batch.subject_id), pa.string()),
        "subject_hash": pa.array(pick(hashes), pa.string()),
        # few distinct values among many: each converted once (a million datetimes converted one by one cost seconds)
        "request_type": _few(kinds, pa.string()), "regulation": _few(regulations, pa.string()),
        "status": pa.repeat(pa.scalar("received"), n), "received_at": _few(received, TIMESTAMP),
        "extended": pa.repeat(pa.scalar(False), n), "updated_at": pa.repeat(pa.scalar(now, TIMESTAMP), n),
        "due_date": _few(list(map(deadline, (t.date() for t in received), regulations, kinds)), pa.date32()),
        "drop_work_items": pa.array([json.dumps(list(w)) if w else None for w in pick(batch.drop_work_items)],
                                    pa.string())}
    return pa.table([columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema],
                    schema=schema)


# What a run reads of its open requests (Ledger.work_requests).
WORK_COLUMNS = ("request_id", "request_type", "regulation", "subject_id", "status", "status_reason",
                "received_at", "due_date", "purge_by")


def _evidence_texts(outcomes: list[Outcome]) -> list[str]:
    """Each outcome's evidence as JSON, written once per evidence object: a batch's outcomes share
    them where equal (runner/rules.py)."""
    written: dict[int, str] = {}
    for o in outcomes:
        if id(o.evidence) not in written:
            written[id(o.evidence)] = json.dumps(o.evidence, sort_keys=True)
    return [written[id(o.evidence)] for o in outcomes]


def _few(values: list, kind: pa.DataType) -> pa.DictionaryArray:
    """`values`, few distinct among many (a batch's outcomes share their statuses, reasons and
    evidence), dictionary-encoded: each distinct value converted to `kind` once, a position per value.
    Taking rows of it moves positions only; a cast to `kind` writes each value out once (a million
    evidence texts, 800 MB, were converted one by one, then copied by every take)."""
    index: dict = {}
    positions = pa.array([index.setdefault(v, len(index)) for v in values], pa.int32())
    return pa.DictionaryArray.from_arrays(positions, pa.array(list(index), kind))


def _ids_stored(loaded: Table, ids: list[str]) -> set[str]:
    """Which of `ids` the requests table holds (`Among`: a batch of new ids skips every older file)."""
    return {str(i) for i in Among("request_id", ids).read(loaded, ("request_id",)).column("request_id").to_pylist()}


class Ledger:
    """Handle on the ledger tables of one catalog; cheap to create (the catalog opens on first use)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = Store(settings)
        self.journal = Journal(self.store)
        ns = settings.ledger_namespace
        self.requests_table, self.keys_table, self.audit_table = f"{ns}.requests", f"{ns}.request_keys", f"{ns}.audit"
        self._key: bytes | None = None
        self._keyring: Keyring | None = None

    @property
    def key(self) -> bytes:
        if self._key is None:
            try:
                key = load_key(self.settings.key_file())
            except (ValueError, OSError) as exc:  # not hex, a directory, unreadable, ...
                raise ConfigError(f"the key file {self.settings.key_file()} cannot be used: {exc}") from None
            if not key:
                raise ConfigError(f"the key file {self.settings.key_file()} is empty")
            self._key = key
        return self._key

    @property
    def keyring(self) -> Keyring:
        """The active key and the retired ones (`<key file>.retired`), which still check the hashes they made."""
        if self._keyring is None:
            self._keyring = Keyring(self.key, load_retired(self.settings.key_file()))
        return self._keyring

    def tables(self) -> list[str]:
        return [self.store.name(t) for t in LEDGER_TABLES]

    def ensure(self) -> None:
        """Create the namespace and tables if missing (metadata only). The first touch of the catalog:
        one that cannot be reached raises CatalogUnavailableError naming it."""
        for table in LEDGER_TABLES:
            self.store.load(table)

    # -- submission -------------------------------------------------------------------------
    def submit(self, inputs: Sequence[RequestInput] | RequestBatch, now: datetime | None = None) -> SubmitResult:
        """Add requests; a request matching an open one (same subject and type) is not added twice.

        One read of the open requests and one append, in one commit that asserts the state it read
        (a concurrent submission makes it look again, so duplicates never slip in between), then one
        audit append; every few submissions the table is compacted (Store.compact). An open request
        submitted before a key rotation holds its subject's hash under a retired key: each new subject
        is hashed under every key of the ring to find it.

        Requests that come with an id (acknowledged by the intake service under it) are added exactly
        once by that id, whatever else is open for the subject: the person holds a status token for
        each. Their ids cost one more read, pruned to the files that may hold them.

        Cost in Python, per request: one keyed hash per key of the ring (0.7 µs) and a set lookup; the
        rows are built column by column (`RequestBatch`: a million requests in a few seconds).
        """
        now = now or utc_now()
        batch = inputs if isinstance(inputs, RequestBatch) else RequestBatch.of(inputs)
        given = [i for i in batch.request_id if i]
        created: list[str] = []

        def attempt(loaded) -> None:
            keys = self.keyring.keys()  # after the catalog answered: an unreachable one leaves no key file behind
            snapshot = loaded.current_snapshot()
            # Requests with an id are matched by it alone: the open requests are read only for those without.
            rows = loaded.scan(row_filter=In("status", OPEN_STATUSES), selected_fields=("subject_hash", "request_type")
                               ).to_arrow() if snapshot and len(given) < len(batch) else None
            seen = {kind: set() if rows is None else set(rows.column("subject_hash").filter(  # per type: no tuples
                pc.equal(rows.column("request_type"), pa.scalar(kind))).to_pylist()) for kind in REQUEST_TYPES}
            stored = _ids_stored(loaded, given) if snapshot and given else set()
            hashes = [list(map(functools.partial(keyed_hash, k), batch.subject_id)) for k in keys.values()]
            retired = hashes[1:]
            fresh: list[int] = []  # positions of the new requests
            for i, (request_id, subject, kind) in enumerate(zip(batch.request_id, hashes[0], batch.request_type,
                                                                strict=True)):
                same = seen[kind]
                if request_id:
                    if request_id in stored:
                        continue
                    stored.add(request_id)
                elif subject in same or (retired and any(h[i] in same for h in retired)):
                    continue
                same.add(subject)
                fresh.append(i)
            ids = new_request_ids(set(given))
            created[:] = [batch.request_id[i] or next(ids) for i in fresh]
            if fresh:
                loaded.append(_new_requests(loaded.schema().as_arrow(), batch, fresh, hashes[0], created, now))

        self.store.compact(self.store.transact("requests", attempt))
        n = len(created)
        self._append_audit({"request_id": created, "run_id": pa.nulls(n, pa.string()),
                            "at": pa.repeat(pa.scalar(now, TIMESTAMP), n), "event": ["submitted"] * n,
                            "detail": [_NO_DETAIL] * n})
        return SubmitResult(created, len(batch) - n)

    # -- reading ------------------------------------------------------------------------------
    def requests(self, statuses: tuple[str, ...] | None = None) -> list[dict]:
        """Raw request rows (subject ids included: for the run, never for display). One read."""
        return self.store.rows("requests", In("status", statuses) if statuses else None)

    def work_requests(self, statuses: tuple[str, ...]) -> pa.Table:
        """The rows a run works on (`WORK_COLUMNS`) as Arrow: a run's batch takes its columns without a
        dict per request (runner/work.py's RequestRows). One read."""
        return self.store.arrow("requests", In("status", statuses), WORK_COLUMNS)

    def work_version(self) -> tuple[int | None, ...]:
        """The snapshots of the tables a run's work is read from (requests, journal, holds): equal
        versions, equal work. Cost: three metadata reads."""
        return tuple(self.store.snapshot_id(table) for table in ("requests", "steps", "holds"))

    def statuses(self, today: date | None = None, request_id: str | None = None) -> list[RequestStatus]:
        """Every request (or one) without its subject: for `dsr status`. Requests a run holding the
        lease works on show as in progress. Two small reads."""
        today = today or utc_now().date()
        rows = self.store.rows("requests", In("request_id", [request_id]) if request_id else None)
        holder = current_holder(self.store)
        working = set(holder.requests) if holder else set()
        rows.sort(key=lambda r: (r["received_at"], r["request_id"]))
        return [_status(r, today, r["request_id"] in working) for r in rows]

    def request(self, request_id: str) -> RequestStatus:
        found = self.statuses(request_id=request_id)
        if not found:
            raise LedgerError(f"no request {request_id!r} in the ledger")
        return found[0]

    def evidence(self, request_ids: list[str]) -> dict[str, dict]:
        rows = self.store.rows("requests", Among("request_id", request_ids))
        return {r["request_id"]: json.loads(r["evidence"]) if r["evidence"] else {} for r in rows}

    def unrecorded_runs(self, run_ids: list[str]) -> list[str]:
        """Those of `run_ids` that recorded no outcome (a run killed after `finish` did). One small read."""
        recorded = {r["run_id"] for r in self.store.rows("requests", Among("run_id", run_ids), ("run_id",))} \
            if run_ids else set()
        return [r for r in run_ids if r not in recorded]

    def completed_ids(self, request_type: str) -> list[str]:
        """Requests of that type completed and still on record. One read."""
        return sorted(r["request_id"] for r in self.requests(("completed",)) if r["request_type"] == request_type)

    def erased_ids(self) -> list[str]:
        """Every erase request whose subject must stay out: completed ones on record, and those whose
        record expired with their keyed hashes kept (records.py). Two small reads."""
        kept = {r["request_id"] for r in self.store.rows("erased_keys", columns=("request_id",))}
        return sorted(kept.union(self.completed_ids("erase")))

    # -- run history (the operator dashboard) ----------------------------------------------------
    def record_run(self, record: RunRecord) -> None:
        """Add a run that did work to the run history: one append (one commit)."""
        self.store.append("runs", [{
            "run_id": record.run_id, "started_at": record.started_at, "finished_at": record.finished_at,
            "seconds": json.dumps(record.seconds, sort_keys=True), "tables": json.dumps(record.tables, sort_keys=True),
            "requests_completed": record.completed, "requests_failed": record.failed,
            "requests_erased": record.erased}])

    def runs(self, limit: int = 20) -> list[dict]:
        """The last `limit` recorded runs, newest first: run_id, started_at and finished_at (ISO-8601),
        seconds ({stage: s}), tables ({table: {action, rows, bytes_rewritten, files_rewritten}}),
        requests_completed, requests_failed, requests_erased (awaiting the batched purge). No
        identifiers. Cost: one read of the runs table (one small row per run)."""
        rows = sorted(self.store.rows("runs"), key=lambda r: (r["started_at"], r["run_id"]), reverse=True)[:limit]
        return [{**r, "started_at": r["started_at"].isoformat(), "finished_at": r["finished_at"].isoformat(),
                 "seconds": json.loads(r["seconds"]), "tables": json.loads(r["tables"])} for r in rows]

    def table_totals(self) -> list[dict]:
        """Per table, over every recorded run: rows erased or redacted, bytes rewritten, and the number
        of runs that worked on it (erased, purged or verified there); sorted by table. Cost: one read
        of the runs table's `tables` column."""
        totals: dict[str, dict] = {}
        for row in self.store.rows("runs", columns=("tables",)):
            for table, figures in json.loads(row["tables"]).items():
                t = totals.setdefault(table, {"table": table, "rows": 0, "bytes_rewritten": 0, "runs": 0})
                t["rows"] += figures["rows"]
                t["bytes_rewritten"] += figures["bytes_rewritten"]
                t["runs"] += 1
        return [totals[t] for t in sorted(totals)]

    # -- keys -----------------------------------------------------------------------------------
    def record_keys(self, hashed: pa.Table | list[tuple[str, str, str, str]]) -> None:
        """Store (request_id, key_type, key_hash, key_id) of a batch's resolved identifiers; what is
        already stored is not stored twice. One read of these requests' keys, one append, in Arrow."""
        schema = SCHEMAS["request_keys"]  # request_id, key_type, key_hash, key_id
        if isinstance(hashed, list):
            hashed = pa.Table.from_pylist([dict(zip(schema.names, h, strict=True)) for h in hashed], schema=schema)
        if not hashed.num_rows:
            return
        same = schema.names[:3]
        new = hashed.select(schema.names).group_by(schema.names).aggregate([])  # distinct rows
        ids: list[str] = pc.unique(new["request_id"]).to_pylist()  # type: ignore[assignment]  # never null
        stored = self.store.arrow("request_keys", Among("request_id", ids), tuple(same)).cast(
            pa.schema([schema.field(c) for c in same]))  # pyiceberg may read strings as large_string
        if stored.num_rows:
            new = new.join(stored, same, join_type="left anti")
        self.store.append_arrow("request_keys", new)

    def key_hashes(self, request_ids: list[str]) -> list[dict]:
        """`key_hashes_arrow` as dicts."""
        return self.key_hashes_arrow(request_ids).to_pylist()

    def key_hashes_arrow(self, request_ids: list[str]) -> pa.Table:
        """(request_id, key_type, key_hash, key_id) of the given requests' identifiers, expired erase
        requests' kept hashes included; key_id names the key that made each hash (NULL: the key in use
        before rotation existed). Two reads pruned to those ids."""
        among, schema = Among("request_id", request_ids), SCHEMAS["request_keys"]
        return pa.concat_tables([self.store.arrow(table, among, tuple(schema.names)).cast(schema)
                                 for table in ("request_keys", "erased_keys")])

    def suppression_hashes(self, identifier: str) -> list[dict]:
        """(key_hash, key_id) of every `identifier` value acted on for an erase request, any status, and
        of expired erase requests whose hashes were kept (records.py). Three reads."""
        erasures = self.store.rows("requests", EqualTo("request_type", "erase"), ("request_id",))
        erase = {r["request_id"] for r in erasures}
        columns = ("request_id", "key_hash", "key_id")
        keys = [r for r in self.store.rows("request_keys", EqualTo("key_type", identifier), columns)
                if r["request_id"] in erase]
        keys += self.store.rows("erased_keys", EqualTo("key_type", identifier), columns)
        return list({(r["key_hash"], r["key_id"]): {"key_hash": r["key_hash"], "key_id": r["key_id"]}
                     for r in keys}.values())

    # -- transitions ------------------------------------------------------------------------
    def finish(self, outcomes: list[Outcome], run_id: str, started_at: datetime | None = None) -> None:
        """Record outcomes in one commit of the requests table, and the run's audit events (in progress
        since `started_at`, then the outcome) in one more. Completed requests lose their plaintext.
        Cost: reads the files that may hold these requests, rewrites them; column by column in Arrow,
        one JSON text per request (its evidence)."""
        if not outcomes:
            return
        now = utc_now()
        ids = [o.request_id for o in outcomes]
        decided = pa.table({
            "status": _few([o.status for o in outcomes], pa.string()),
            "status_reason": _few([o.reason for o in outcomes], pa.string()),
            "evidence": _few(_evidence_texts(outcomes), pa.string()),
            "purge_by": _few([o.purge_by for o in outcomes], pa.date32())})

        def change(loaded: Table, rows: pa.Table) -> pa.Table:
            mine = decided.take(pc.index_in(rows.column("request_id"), value_set=pa.array(ids, pa.string())))
            done = pc.equal(mine.column("status").cast(pa.string()), pa.scalar("completed"))
            stamp = pa.scalar(now, TIMESTAMP)
            columns = {**{name: mine.column(name) for name in decided.column_names},
                       "run_id": pa.repeat(run_id, rows.num_rows), "updated_at": pa.repeat(stamp, rows.num_rows),
                       "completed_at": pc.if_else(done, stamp, pa.scalar(None, TIMESTAMP)),
                       "subject_id": pc.if_else(done, pa.scalar(None, pa.string()), rows.column("subject_id"))}
            for name, values in columns.items():
                rows = rows.set_column(rows.schema.get_field_index(name), name, values)
            return rows

        self.store.replace_arrow("requests", "request_id", ids, change)
        details: dict[tuple, str] = {}  # a batch's outcomes share a handful of details
        events = {"request_id": ids, "event": [o.status for o in outcomes],
                  "detail": [details.get((o.reason, o.purge_by)) or details.setdefault((o.reason, o.purge_by),
                                                                                     _audit_detail(o))
                             for o in outcomes],
                  "at": pa.repeat(pa.scalar(now, TIMESTAMP), len(ids))}
        if started_at:  # each request's run began when the run did
            events = {"request_id": [*ids, *ids], "event": [*["in_progress"] * len(ids), *events["event"]],
                      "detail": [*[_NO_DETAIL] * len(ids), *events["detail"]],
                      "at": pa.concat_arrays([pa.repeat(pa.scalar(started_at, TIMESTAMP), len(ids)),
                                              events["at"]])}
        self._append_audit({**events, "run_id": pa.repeat(pa.scalar(run_id, pa.string()), len(events["event"]))})

    def extend(self, request_id: str, reason: str, now: datetime | None = None) -> RequestStatus:
        """Apply the regulation's one allowed extension to an open request."""
        if not reason.strip():
            raise LedgerError("an extension needs a reason (it is told to the data subject)")

        def change(rows: list[dict]) -> list[dict]:
            if not rows:
                raise LedgerError(f"no request {request_id!r} in the ledger")
            (r,) = rows
            if r["status"] == "completed":
                raise LedgerError(f"request {request_id} is already completed")
            if r["extended"]:
                raise LedgerError(f"request {request_id} was already extended; the law allows one extension")
            due = due_date(r["received_at"].date(), r["regulation"], True, r["request_type"])  # CCPA opt-outs: none
            r.update(due_date=due, extended=True,
                     extension_reason=reason, updated_at=now or utc_now())
            return rows

        self.store.replace("requests", "request_id", [request_id], change)
        self.audit([(request_id, None, "extended", {"reason": reason})], now)
        return self.request(request_id)

    def withdraw(self, request_ids: list[str], reason: str, now: datetime | None = None) -> list[str]:
        """Take the requests of `request_ids` not carried out yet (not completed, not erased) out of the
        ledger, their subject with them, in one commit; each gets an audit event `withdrawn` with the
        reason. Returns the ids taken out. For a request its source cancelled (a DROP work item its
        `Removed` file names) before any run acted on it."""
        taken: list[str] = []

        def change(loaded: Table, rows: pa.Table) -> pa.Table:
            done = pc.is_in(rows.column("status"), value_set=pa.array(["completed", "erased"]))
            taken[:] = [str(i) for i in rows.filter(pc.invert(done)).column("request_id").to_pylist()]
            return rows.filter(done)

        self.store.replace_arrow("requests", "request_id", request_ids, change)
        self.audit([(rid, None, "withdrawn", {"reason": reason}) for rid in taken], now)
        return taken

    def audit(self, events: list[tuple], now: datetime | None = None) -> None:
        """Append audit events (request_id, run_id, event, detail[, at]); details never hold identifiers.
        One append, built column by column (a run records two events per request)."""
        if not events:
            return
        at = now or utc_now()
        self._append_audit({"request_id": [e[0] for e in events], "run_id": [e[1] for e in events],
                            "at": pa.array([e[4] if len(e) > 4 else at for e in events], TIMESTAMP),
                            "event": [e[2] for e in events],
                            "detail": [json.dumps(e[3]) if e[3] else _NO_DETAIL for e in events]})

    def _append_audit(self, columns: dict) -> None:
        """Append audit events given column by column (details as JSON text), each with a new id."""
        n = len(columns["event"])
        ids = os.urandom(16 * n).hex()  # uuid4().hex's randomness, drawn at once
        self.store.append_arrow("audit", pa.table({"event_id": [ids[32 * i:32 * i + 32] for i in range(n)],
                                                   **columns}))

    # -- the ledger's own history ---------------------------------------------------------------
    def purge_owed(self, steps: list[Step]) -> bool:
        """A request completed after the ledger's last purge (per the journal `steps`): its plaintext
        is still in old files. Cost: one read pruned to files of requests completed since."""
        last = max((s.at for s in steps if s.step == "purged" and s.table == self.requests_table and s.at),
                   default=None)  # recorded steps all have their time
        since = GreaterThan("completed_at", last.isoformat()) if last else NotNull("completed_at")
        return bool(self.store.rows("requests", since, ("request_id",)))

    def purge_history(self) -> dict:
        """Purge the requests table's history (old snapshots and files hold plaintext subject ids of
        requests completed since) and prove it: no stored file holds the plaintext of a completed
        request, by keyed hash. The other ledger tables lose their orphan files (a write a full disk
        cut short leaves a torn one); the lease's own return purges its table. Cost: metadata, a
        listing per ledger table, and the subject column of the ledger's files."""
        window = self.settings.purge.orphan_min_age_minutes
        result = self.store.purge_history("requests", window)
        result.orphans_removed += sum(self.store.remove_orphans(table, window) for table in LEDGER_TABLES
                                      if table not in ("requests", "lease"))
        completed = {r["subject_hash"] for r in self.store.rows("requests", EqualTo("status", "completed"),
                                                                ("subject_hash",))}
        keys = list(self.keyring.keys().values())
        found = sum(1 for value in set(self.store.column_values("requests", "subject_id"))
                    if any(keyed_hash(k, value) in completed for k in keys))
        return {**result.__dict__, "plaintext_found": found, "passed": found == 0}


def _status(r: dict, today: date, working: bool) -> RequestStatus:
    status = "in_progress" if working and r["status"] in ACTIONABLE_STATUSES else r["status"]
    return RequestStatus(
        r["request_id"], r["request_type"], r["regulation"], status, r["status_reason"],
        utc_text(r["received_at"]), r["due_date"].isoformat(),
        (r["due_date"] - today).days if r["status"] != "completed" else None, bool(r["extended"]),
        utc_text(r["completed_at"]) if r["completed_at"] else None,
        r["purge_by"].isoformat() if r["purge_by"] else None)


@dataclass
class SubmitResult:
    created: list[str]
    duplicates: int


@dataclass(frozen=True)
class RunRecord:
    """One row of the run history: a run that did work."""

    run_id: str
    started_at: datetime
    finished_at: datetime
    seconds: dict[str, float]  # per stage
    tables: dict[str, dict]  # per table: action, rows (erased or redacted), bytes_rewritten, files_rewritten
    completed: int
    failed: int
    erased: int  # logically erased, awaiting the batched purge


@dataclass(slots=True)  # a batch makes one per request
class Outcome:
    request_id: str
    status: Literal["completed", "failed", "erased", "held"]
    reason: str | None = None
    evidence: dict = field(default_factory=dict)
    purge_by: date | None = None  # status erased: the physical purge is due by this day


_NO_DETAIL = json.dumps({})


def _audit_detail(outcome: Outcome) -> str:
    """The outcome's audit detail as JSON text: its reason and purge deadline."""
    detail: dict = {"reason": outcome.reason} if outcome.reason else {}
    if outcome.purge_by:
        detail["purge_by"] = outcome.purge_by.isoformat()
    return json.dumps(detail) if detail else _NO_DETAIL


@dataclass(frozen=True)
class RequestStatus:
    request_id: str
    request_type: str
    regulation: str
    status: str
    status_reason: str | None
    received: str
    due_date: str
    days_left: int | None
    extended: bool
    completed: str | None
    purge_by: str | None = None

