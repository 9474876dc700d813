"""The request ledger: Iceberg tables `<ns>.requests`, `<ns>.request_keys` and `<ns>.audit`.

Lifecycle: received -> in_progress -> completed | failed (failed stays open and is retried).
Under the batched purge policy an erase request goes in_progress -> erased (logically erased,
live data verified, physical purge scheduled by `purge_by`) -> completed once purged and proven.
While open, a request holds its subject id in plaintext (needed to act on it); on completion
only the HMAC remains, and the ledger's own history is purged like any table (see purge.py).
Every write is one small Iceberg commit; identifiers travel as DataFrames, never as SQL text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal

from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..exceptions import CatalogUnavailableError, ConfigError, LedgerError
from ..lake.hmac import with_keyed_hash
from .journal import Journal
from .keys import Keyring, key_id, keyed_hash, load_key, load_retired
from .requests import RequestInput, due_date, utc_now

ACTIONABLE_STATUSES = ("received", "in_progress", "failed")  # picked up by the next run
OPEN_STATUSES = (*ACTIONABLE_STATUSES, "erased")  # erased: waiting for the physical purge
NOT_YET_PROCESSED = {"opt_out": "recorded; opt-out requests are not yet processed by this version"}

REQUESTS_SCHEMA = (
    "request_id string, request_type string, regulation string, subject_id string, subject_hash string, "
    "status string, status_reason string, received_at timestamp, due_date date, extended boolean, "
    "extension_reason string, updated_at timestamp, completed_at timestamp, run_id string, evidence string, "
    "purge_by date"
)
# key_id: the key that made key_hash (hashing.key_id); NULL: the key in use before key rotation existed.
KEYS_SCHEMA = "request_id string, key_type string, key_hash string, key_id string"
AUDIT_SCHEMA = "event_id string, request_id string, run_id string, at timestamp, event string, detail string"
# Copy-on-write so a nulled identifier never lingers in a data file behind a delete file, and no
# column bounds for subject_id so manifests never carry an identifier.
_LEDGER_PROPS = {
    "format-version": "2",
    "write.delete.mode": "copy-on-write",
    "write.update.mode": "copy-on-write",
    "write.merge.mode": "copy-on-write",
}
_SUBJECT_METRICS = {"write.metadata.metrics.column.subject_id": "counts"}


def _jvm_error(exc: Exception) -> str:
    """The first line of a JVM error and of its root cause, without package names or stack."""
    java = getattr(exc, "java_exception", None)
    if java is None:  # AnalysisException and the like: their message is already plain
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    chain = [java]
    while len(chain) < 20 and chain[-1].getCause() is not None:
        chain.append(chain[-1].getCause())
    first, root = (re.sub(r"^[\w.$]*\.(?=\w+(:|$))", "", str(e.toString()).strip().splitlines()[0])
                   for e in (chain[0], chain[-1]))
    return first if first == root else f"{first} ({root})"


class Ledger:
    """Handle on the ledger tables of one catalog; cheap to create."""

    def __init__(self, spark: SparkSession, settings: Settings):
        self.spark, self.settings = spark, settings
        ns = settings.ledger_namespace
        self.requests_table, self.keys_table, self.audit_table = f"{ns}.requests", f"{ns}.request_keys", f"{ns}.audit"
        self._key: bytes | None = None
        self._keyring: Keyring | None = None
        self.journal = Journal(spark, settings)

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

    def q(self, table: str) -> str:
        return self.settings.table(table)

    def ensure(self) -> None:
        """Create the namespace and tables if missing (metadata only).

        The engine's first touch of the catalog: one that cannot be reached (server down, warehouse that
        cannot be created) raises CatalogUnavailableError naming it."""
        try:
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.settings.namespace(self.settings.ledger_namespace)}")
        except (Py4JJavaError, CapturedException) as exc:
            raise CatalogUnavailableError(
                f"catalog {self.settings.catalog.name} cannot be reached: {_jvm_error(exc)}") from exc
        for table, schema, extra in ((self.requests_table, REQUESTS_SCHEMA, _SUBJECT_METRICS),
                                     (self.keys_table, KEYS_SCHEMA, {}), (self.audit_table, AUDIT_SCHEMA, {})):
            props = ", ".join(f"'{k}' = '{v}'" for k, v in {**_LEDGER_PROPS, **extra}.items())
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self.q(table)} ({schema}) USING iceberg TBLPROPERTIES ({props})"
            )
        self.journal.ensure()
        if "purge_by" not in self._table(self.requests_table).columns:  # ledger written by an earlier version
            self.spark.sql(f"ALTER TABLE {self.q(self.requests_table)} ADD COLUMN purge_by date")
        if "key_id" not in self._table(self.keys_table).columns:  # ledger written before key rotation existed
            self.spark.sql(f"ALTER TABLE {self.q(self.keys_table)} ADD COLUMN key_id string")

    # -- submission -------------------------------------------------------------------------
    def submit(self, inputs: list[RequestInput], now: datetime | None = None) -> SubmitResult:
        """Add requests; a request matching an open one (same subject and type) is not added twice.

        One join against the open requests (by subject hash) and one append commit. An open request
        submitted before a key rotation holds its subject's hash under a retired key: each new subject
        is hashed under every key of the ring to find it.
        """
        now = now or utc_now()
        inputs = [r.validated() for r in inputs]
        self.ensure()
        retired = [k for kid, k in self.keyring.keys().items() if kid != self.keyring.active_id]
        rows, probes, seen = [], [], set()
        for r in inputs:
            subject_hash = keyed_hash(self.key, r.subject_id)
            if (subject_hash, r.request_type) in seen:
                continue
            seen.add((subject_hash, r.request_type))
            received = r.received_at or now
            request_id = f"req-{uuid.uuid4().hex[:16]}"
            rows.append((
                request_id, r.request_type, r.regulation, r.subject_id, subject_hash, "received",
                NOT_YET_PROCESSED.get(r.request_type), received, due_date(received.date(), r.regulation), False,
                None, now, None, None, None, None,
            ))
            probes += [(request_id, r.request_type, h)
                       for h in (subject_hash, *(keyed_hash(k, r.subject_id) for k in retired))]
        new = self.spark.createDataFrame(rows, REQUESTS_SCHEMA)
        open_ = self._table(self.requests_table).where(F.col("status").isin(*OPEN_STATUSES))
        duplicates = (
            self.spark.createDataFrame(probes, "request_id string, request_type string, subject_hash string")
            .join(open_.select("subject_hash", "request_type"), ["subject_hash", "request_type"], "left_semi")
        )
        fresh = new.join(duplicates.select("request_id"), "request_id", "left_anti")
        fresh = fresh.select(*new.columns).localCheckpoint()
        kept = {r.request_id for r in fresh.select("request_id").collect()}
        created = [row[0] for row in rows if row[0] in kept]  # in input order
        if created:
            fresh.writeTo(self.q(self.requests_table)).append()
            self.audit([(rid, None, "submitted", {}) for rid in created])
        return SubmitResult(created, len(inputs) - len(created))

    # -- reading ------------------------------------------------------------------------------
    def _table(self, table: str) -> DataFrame:
        return self.spark.table(self.q(table))

    def pending(self, request_types: tuple[str, ...]) -> DataFrame:
        """Requests the next run acts on: request_id, request_type, subject_id, regulation, due_date (small)."""
        return (
            self._table(self.requests_table)
            .where(F.col("status").isin(*ACTIONABLE_STATUSES) & F.col("request_type").isin(*request_types))
            .select("request_id", "request_type", "subject_id", "regulation", "due_date")
        )

    def awaiting_purge(self) -> dict[str, date]:
        """Logically erased requests waiting for the physical purge: {request_id: purge_by}."""
        rows = (self._table(self.requests_table).where(F.col("status") == "erased")
                .select("request_id", "purge_by").collect())
        return {r.request_id: r.purge_by for r in rows}

    def statuses(self, today: date | None = None, request_id: str | None = None) -> list[RequestStatus]:
        """Every request (or one) without its subject: for `dsr status`."""
        today = today or utc_now().date()
        requests = self._table(self.requests_table)
        if request_id is not None:
            requests = requests.where(F.col("request_id") == request_id)
        rows = (
            requests
            .select("request_id", "request_type", "regulation", "status", "status_reason", "due_date", "extended",
                    F.date_format("received_at", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("received"),
                    F.date_format("completed_at", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("completed"), "purge_by")
            .orderBy("received_at", "request_id")
            .collect()
        )
        return [
            RequestStatus(
                r.request_id, r.request_type, r.regulation, r.status, r.status_reason, r.received,
                r.due_date.isoformat(), (r.due_date - today).days if r.status != "completed" else None,
                bool(r.extended), r.completed, r.purge_by.isoformat() if r.purge_by else None,
            )
            for r in rows
        ]

    def request(self, request_id: str) -> RequestStatus:
        found = self.statuses(request_id=request_id)
        if not found:
            raise LedgerError(f"no request {request_id!r} in the ledger")
        return found[0]

    def evidence(self, request_ids: list[str]) -> dict[str, dict]:
        rows = (
            self._table(self.requests_table)
            .where(F.col("request_id").isin(*request_ids)).select("request_id", "evidence").collect()
        )
        return {r.request_id: json.loads(r.evidence) if r.evidence else {} for r in rows}

    def interrupted_runs(self, request_ids: list[str]) -> list[str]:
        """Runs that started some of these requests and were killed before recording their outcome
        (an `in_progress` audit event without an outcome event of the same run). Reads the audit log."""
        outcome = F.array(*(F.lit(s) for s in ("completed", "failed", "erased")))
        events = (self._table(self.audit_table).where(F.col("request_id").isin(*request_ids))
                  .groupBy("run_id").agg(F.collect_set("event").alias("events"))
                  .where(F.array_contains("events", "in_progress") & ~F.arrays_overlap("events", outcome)))
        return sorted(r.run_id for r in events.select("run_id").collect())

    def last_completion(self) -> datetime | None:
        return self._table(self.requests_table).agg(F.max("completed_at").alias("at")).first().at

    def completed_ids(self, request_type: str) -> list[str]:
        done = (F.col("status") == "completed") & (F.col("request_type") == request_type)
        return [r.request_id for r in self._table(self.requests_table).where(done).select("request_id").collect()]

    # -- keys -----------------------------------------------------------------------------------
    def record_keys(self, keys: DataFrame) -> None:
        """Store HMACs of a batch's resolved identifiers (request_id, key_type, key_value); idempotent."""
        hashed = with_keyed_hash(self.spark, keys, "key_value", self.key).select(
            "request_id", "key_type", "key_hash", F.lit(key_id(self.key)).alias("key_id"))
        hashed.createOrReplaceTempView("dsr_new_keys")
        try:
            self.spark.sql(
                f"MERGE INTO {self.q(self.keys_table)} t USING dsr_new_keys s "
                "ON t.request_id = s.request_id AND t.key_type = s.key_type AND t.key_hash = s.key_hash "
                "WHEN NOT MATCHED THEN INSERT *"
            )
        finally:
            self.spark.catalog.dropTempView("dsr_new_keys")

    def key_hashes(self, request_ids: list[str]) -> DataFrame:
        """(request_id, key_type, key_hash, key_id) of the given requests' identifiers; key_id names the key
        that made each hash (NULL: the key in use before rotation existed). Check them with the keyring."""
        return self._table(self.keys_table).where(F.col("request_id").isin(*request_ids))

    # -- transitions ------------------------------------------------------------------------
    def _update(self, rows: list[tuple], assignments: str) -> None:
        """MERGE per-request values into the requests table in one commit."""
        if not rows:
            return
        update = self.spark.createDataFrame(
            rows, "request_id string, status string, status_reason string, run_id string, evidence string, "
            "purge_by date"
        )
        update.createOrReplaceTempView("dsr_ledger_update")
        try:
            self.spark.sql(
                f"MERGE INTO {self.q(self.requests_table)} t USING dsr_ledger_update s "
                f"ON t.request_id = s.request_id WHEN MATCHED THEN UPDATE SET {assignments}"
            )
        finally:
            self.spark.catalog.dropTempView("dsr_ledger_update")

    def start(self, request_ids: list[str], run_id: str) -> None:
        self._update([(rid, "in_progress", None, run_id, None, None) for rid in request_ids],
                     "t.status = s.status, t.run_id = s.run_id, t.updated_at = current_timestamp()")
        self.audit([(rid, run_id, "in_progress", {}) for rid in request_ids])

    def finish(self, outcomes: list[Outcome], run_id: str) -> None:
        """Record outcomes in one commit. Completed requests lose their plaintext subject id."""
        rows = [(o.request_id, o.status, o.reason, run_id, json.dumps(o.evidence, sort_keys=True), o.purge_by)
                for o in outcomes]
        self._update(rows, (
            "t.status = s.status, t.status_reason = s.status_reason, t.run_id = s.run_id, t.evidence = s.evidence, "
            "t.purge_by = s.purge_by, t.updated_at = current_timestamp(), "
            "t.subject_id = CASE WHEN s.status = 'completed' THEN NULL ELSE t.subject_id END, "
            "t.completed_at = CASE WHEN s.status = 'completed' THEN current_timestamp() ELSE NULL END"
        ))
        self.audit([(o.request_id, run_id, o.status, _audit_detail(o)) for o in outcomes])

    def extend(self, request_id: str, reason: str, now: datetime | None = None) -> RequestStatus:
        """Apply the regulation's one allowed extension to an open request."""
        if not reason.strip():
            raise LedgerError("an extension needs a reason (it is told to the data subject)")
        current = self.request(request_id)
        if current.status == "completed":
            raise LedgerError(f"request {request_id} is already completed")
        if current.extended:
            raise LedgerError(f"request {request_id} was already extended; the law allows one extension")
        received = datetime.fromisoformat(current.received.replace("Z", "+00:00")).date()
        update = self.spark.createDataFrame(
            [(request_id, due_date(received, current.regulation, extended=True), reason)],
            "request_id string, due_date date, extension_reason string",
        )
        update.createOrReplaceTempView("dsr_ledger_extend")
        try:
            self.spark.sql(
                f"MERGE INTO {self.q(self.requests_table)} t USING dsr_ledger_extend s ON t.request_id = s.request_id "
                "WHEN MATCHED THEN UPDATE SET t.due_date = s.due_date, t.extended = true, "
                "t.extension_reason = s.extension_reason, t.updated_at = current_timestamp()"
            )
        finally:
            self.spark.catalog.dropTempView("dsr_ledger_extend")
        self.audit([(request_id, None, "extended", {"reason": reason})], now)
        return self.request(request_id)

    def audit(self, events: list[tuple[str, str | None, str, dict]], now: datetime | None = None) -> None:
        """Append audit events (request_id, run_id, event, detail); details never hold identifiers."""
        if not events:
            return
        at = now or utc_now()
        rows = [(uuid.uuid4().hex, rid, run, at, event, json.dumps(detail)) for rid, run, event, detail in events]
        self.spark.createDataFrame(rows, AUDIT_SCHEMA).writeTo(self.q(self.audit_table)).append()

    def tables(self) -> list[str]:
        return [self.requests_table, self.keys_table, self.audit_table, self.journal.table]


@dataclass
class SubmitResult:
    created: list[str]
    duplicates: int


@dataclass
class Outcome:
    request_id: str
    status: Literal["completed", "failed", "erased"]
    reason: str | None = None
    evidence: dict = field(default_factory=dict)
    purge_by: date | None = None  # status erased: the physical purge is due by this day


def _audit_detail(outcome: Outcome) -> dict:
    detail: dict = {"reason": outcome.reason} if outcome.reason else {}
    if outcome.purge_by:
        detail["purge_by"] = outcome.purge_by.isoformat()
    return detail


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
