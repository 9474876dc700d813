"""Intake: what the service does with a request a person files, without HTTP (service/app.py is the
HTTP shell around it) and without a JVM.

A filing is acknowledged once it is in the durable queue (queue.py). Then a thread mails
verification codes (when `intake.verification` is `email_code`), and a process of its own
(ingester.py) moves acknowledged requests into the ledger in groups — one ledger commit for
everything that arrived since the last one, never one per HTTP request — and, at start-up, whatever
a crash left behind. A request reaches the ledger exactly once, under the id it was acknowledged with.

Status tokens and codes are keyed hashes (HMAC under purpose keys derived from the engine's key),
so the service stores neither: a token is recomputed from the request id, and a code is checked
against its hash.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

from pyiceberg.exceptions import NoSuchTableError

from ..config import Settings
from ..evidence.handoff import BatchItemResult, BatchResult, ExternalReference, RequestBatch
from ..exceptions import DsrError, LedgerError, RequestInputError, first_line
from ..keys import derive_key, keyed_hash
from ..ledger.ledger import OPEN_STATUSES, Ledger, RequestStatus, new_request_id
from ..ledger.requests import SPACE, RequestInput, due_date, utc_now, utc_text
from .ingester import Ingester, ingest_leased
from .mail import MailError, send_code
from .queue import Connection, open_queue
from .webhooks import external_references, new_event_id, record

log = logging.getLogger("lakehouse_dsr.service")
CLOSE_SECONDS = 6.0  # a stop's budget for the mail thread, the ingester's last pass and the queue
MAIL_STOP_SECONDS = 1.0
READY_TIMEOUT_SECONDS = 5.0
INGEST_WAIT_SECONDS = 30.0  # an operator's ingest waits this long for the ingest lease
VERIFIED_TYPES = ("erase", "access", "opt_in")  # never opt-outs: CCPA regulations forbid verifying them
EMAIL = f"^[^@{SPACE}]{{1,64}}@[^@{SPACE}]+\\.[^@{SPACE}]+$"
EMAIL_MAX_LENGTH = 254
_EMAIL = re.compile(EMAIL)
# The earliest `received_at` of a handed-over request: answers show 4-digit years (models.Timestamp)
EARLIEST_RECEIPT = datetime(1000, 1, 1, tzinfo=UTC)


class IntakeError(DsrError):
    """A filing, token or code the service refuses; `http_status` says how (the message never holds
    an identifier)."""

    def __init__(self, message: str, http_status: int = 422, field: str | None = None):
        super().__init__(message)
        self.http_status, self.field = http_status, field


@dataclass(frozen=True)
class Filing:
    """A request as a person files it."""

    request_type: str
    subject_id: str
    regulation: str = "gdpr"
    email: str | None = None  # where the verification code goes (erase and access, under email_code)


@dataclass(frozen=True)
class Acknowledgement:
    request_id: str
    status: str
    due_date: str
    status_token: str
    # Sec-GPC: 1 on the filing: the CCPA opt-out recorded beside it (None when the filing is that opt-out).
    gpc_opt_out_request_id: str | None = None
    replayed: bool = False  # an Idempotency-Key seen before: the first answer, again


class Intake:
    """The queue, the keys and the ledger of one service process."""

    def __init__(self, settings: Settings, ledger: Ledger | None = None):
        self.settings, self.config = settings, settings.intake
        self.ledger = ledger or Ledger(settings)
        keys = self.ledger.keyring.keys()  # active first; retired keys still check older tokens and codes
        self._keys = {purpose: [derive_key(k, f"dsr intake {purpose}") for k in keys.values()]
                      for purpose in ("token", "code", "filing")}
        self.queue = open_queue(settings)
        self._stop, self._wake_mail = threading.Event(), threading.Event()
        self._mailer = threading.Thread(target=self._mail, name="intake-mail", daemon=True)
        self._ingester = Ingester(settings)

    # -- life ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start mailing codes, and the process that moves requests into the ledger (at once: a crash
        may have left some)."""
        self._mailer.start()
        self._ingester.start()

    def close(self) -> None:
        """Stop mailing and ingesting, then flush and close the queue: within about `CLOSE_SECONDS`.
        The ingester moves what waits for a few seconds more; anything left stays in the queue for the
        next start. A code being mailed is left to its thread: it was stored before it was sent, and the
        mail is sent again at the next start."""
        self._stop.set()
        self._wake_mail.set()
        if self._mailer.is_alive():
            self._mailer.join(timeout=MAIL_STOP_SECONDS)
        self._ingester.stop(timeout=CLOSE_SECONDS - MAIL_STOP_SECONDS)
        self.queue.close()

    @property
    def ingester_restarts(self) -> int:
        return self._ingester.restarts

    def ingester_alive(self) -> bool:
        return self._ingester.alive()

    def readiness(self) -> dict[str, bool]:
        """Whether each part this service needs works now: the queue takes a write (one small commit),
        the ledger's catalog answers (one table load), the ingester process runs and is ready. Each check is
        bounded by the queue's and the catalog's own timeouts; failures are logged by type only."""
        checks: dict[str, bool] = {}
        for part, check in (("queue", self._queue_writable), ("ledger", self._ledger_reachable),
                            ("ingester", self._ingester.alive)):
            try:
                checks[part] = bool(check())
            except Exception as exc:
                log.warning("readiness of the %s: %s", part, type(exc).__name__)
                checks[part] = False
        return checks

    def _queue_writable(self) -> bool:
        self.queue.run(lambda c: c.execute("INSERT INTO probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE"
                                           " SET at = excluded.at", (time.time(),))
                       ).result(timeout=READY_TIMEOUT_SECONDS)
        return True

    def _ledger_reachable(self) -> bool:
        # In a thread of its own: a catalog that does not answer must not hold the probe longer than
        # READY_TIMEOUT_SECONDS (the thread ends with the catalog client's own timeout).
        answered: list[bool] = []

        def load() -> None:
            try:
                self.ledger.store.load("requests", create=False)
            except NoSuchTableError:  # the catalog answered: the first ingest creates the table
                pass
            except Exception as exc:
                log.warning("readiness of the ledger: %s", type(exc).__name__)
                return
            answered.append(True)

        probe = threading.Thread(target=load, name="intake-ledger-probe", daemon=True)
        probe.start()
        probe.join(READY_TIMEOUT_SECONDS)
        return bool(answered)

    def _mail(self) -> None:
        while not self._stop.is_set():
            try:
                self.send_due_codes()
            except Exception as exc:  # the queue's disk: tried again on the next tick
                log.warning("intake mail: %s", first_line(exc, with_type=True))
            self._wake_mail.wait(self.config.ingest_interval_seconds)
            self._wake_mail.clear()

    # -- tokens -------------------------------------------------------------------------------------
    def status_token(self, request_id: str) -> str:
        return _token(self._keys["token"][0], request_id)

    def check_token(self, request_id: str, token: str | None) -> None:
        # as bytes: compare_digest refuses str with non-ASCII characters, which anyone may send
        given = (token or "").encode()
        keys = self._keys["token"]
        if not given or not any(hmac.compare_digest(_token(k, request_id).encode(), given) for k in keys):
            raise IntakeError("the status token does not match this request", 403)

    # -- filing -------------------------------------------------------------------------------------
    def file(self, filing: Filing, idempotency_key: str | None = None, gpc: bool = False) -> Future[Acknowledgement]:
        """Validate (raises IntakeError at once) and queue a request; the Future resolves once it is on
        disk. `gpc`: the browser sent Sec-GPC: 1, which also records a CCPA opt-out for the subject."""
        try:
            request = RequestInput(filing.subject_id, filing.request_type, filing.regulation).validated()
        except RequestInputError as exc:
            raise IntakeError(str(exc), 422, "subject_id") from None  # type and regulation: checked by the app
        verify = self.config.verification == "email_code" and request.request_type in VERIFIED_TYPES
        if verify and not filing.email:
            raise IntakeError("an e-mail address is needed to verify who is asking", 422, "email")
        if filing.email is not None and (len(filing.email) > EMAIL_MAX_LENGTH or not _EMAIL.fullmatch(filing.email)
                                         or not _encodable(filing.email)):
            raise IntakeError("the e-mail address is not valid", 422, "email")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
            raise IntakeError("the Idempotency-Key header must be 1 to 200 characters", 422, "Idempotency-Key")
        extra_opt_out = gpc and not (request.request_type == "opt_out" and request.regulation == "ccpa")
        fingerprint = keyed_hash(self._keys["filing"][0], "\0".join(
            (request.request_type, request.regulation, request.subject_id, filing.email or "", str(extra_opt_out))))
        now = utc_now()

        def insert(connection: Connection) -> Acknowledgement:
            try:  # the insert first: a new key (the usual case) costs one statement
                request_id = self._insert(connection, request, now, idempotency_key, fingerprint, verify,
                                          filing.email if verify else None)
            except _KeyTaken:  # filed before under this key (by any instance): the first answer, again
                seen = connection.execute("SELECT * FROM intake WHERE idempotency_key = ?", (idempotency_key,)
                                          ).fetchone()
                return self._replay(connection, seen, fingerprint)
            gpc_id = None
            if extra_opt_out:
                gpc_key = f"{idempotency_key}:gpc" if idempotency_key else None
                opt_out = RequestInput(request.subject_id, "opt_out", "ccpa")
                gpc_id = self._insert(connection, opt_out, now, gpc_key, fingerprint, False, None)
            state = "identity_unverified" if verify else "received"
            return self._acknowledge(request_id, state, now, request.regulation, request.request_type, gpc_id)

        future = self.queue.run(insert)
        if verify:
            future.add_done_callback(lambda _: self._wake_mail.set())
        return future

    @staticmethod
    def _insert(connection: Connection, request: RequestInput, now: datetime, idempotency_key: str | None,
                fingerprint: str, verify: bool, email: str | None) -> str:
        """Insert the request's row under a fresh id; _KeyTaken if a request holds `idempotency_key`
        already. ON CONFLICT DO NOTHING rather than an error: on PostgreSQL a failed statement voids the
        transaction, and there another instance may be filing under the same key at the same moment (the
        insert waits for its commit, then does nothing)."""
        while True:
            request_id = new_request_id(set())
            inserted = connection.execute(
                "INSERT INTO intake (request_id, idempotency_key, fingerprint, request_type, regulation,"
                " subject_id, email, received_at, state, reason, mail_due) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT DO NOTHING",
                (request_id, idempotency_key, fingerprint, request.request_type, request.regulation,
                 request.subject_id, email, now.isoformat(), "identity_unverified" if verify else "received",
                 "a verification code is being sent to the e-mail address given" if verify else None,
                 1 if verify else 0)).rowcount
            if inserted:
                return request_id
            if idempotency_key is not None and connection.execute(
                    "SELECT 1 FROM intake WHERE idempotency_key = ?", (idempotency_key,)).fetchone() is not None:
                raise _KeyTaken
            # an id collision (1 in 2^40 within a millisecond): another id

    def _replay(self, connection: Connection, seen: Any, fingerprint: str) -> Acknowledgement:
        if not hmac.compare_digest(seen["fingerprint"], fingerprint):
            raise IntakeError("this Idempotency-Key was used for a different request", 409, "Idempotency-Key")
        gpc = connection.execute("SELECT request_id FROM intake WHERE idempotency_key = ?",
                                 (f"{seen['idempotency_key']}:gpc",)).fetchone()
        received = datetime.fromisoformat(seen["received_at"])
        state = seen["state"] if seen["ingested_at"] is None else "received"
        return self._acknowledge(seen["request_id"], state, received, seen["regulation"], seen["request_type"],
                                 gpc["request_id"] if gpc else None, replayed=True)

    def _acknowledge(self, request_id: str, state: str, received: datetime, regulation: str, request_type: str,
                     gpc_id: str | None, replayed: bool = False) -> Acknowledgement:
        due = due_date(received.date(), regulation, request_type=request_type)
        return Acknowledgement(request_id, state, due.isoformat(), self.status_token(request_id), gpc_id, replayed)

    def file_batch(self, batch: RequestBatch) -> Future[BatchResult]:
        """Queue requests another privacy tool received (and verified: none waits for a code), each under
        the tool's id, in one group commit; the Future resolves once they are on disk. An external id
        handed over before answers its request (`existing`), or `conflict` if it asked something else.
        Raises IntakeError at once, filing nothing: 422 for a subject id or a time the library refuses,
        409 for an external id twice in the batch (`field` names the position, never the value)."""
        now, first_at, requests = utc_now(), dict[str, int](), list[RequestInput]()
        for n, item in enumerate(batch.requests):
            if item.external_id in first_at:
                raise IntakeError(f"requests.{n}.external_id is also requests.{first_at[item.external_id]}'s: "
                                  "each request of a batch needs an id of its own; nothing was filed", 409,
                                  f"requests.{n}.external_id")
            first_at[item.external_id] = n
            received = _received_at(item.received_at, now, f"requests.{n}.received_at")
            try:
                requests.append(RequestInput(item.subject_id, item.type, item.regulation, received).validated())
            except RequestInputError:
                raise IntakeError(f"requests.{n}.subject_id: not a valid subject id", 422,
                                  f"requests.{n}.subject_id") from None
        fingerprints = [keyed_hash(self._keys["filing"][0], "\0".join((r.request_type, r.regulation, r.subject_id)))
                        for r in requests]

        def insert(connection: Connection) -> BatchResult:
            answers = []
            for n, (item, request, fingerprint) in enumerate(zip(batch.requests, requests, fingerprints, strict=True)):
                seen = connection.execute("SELECT request_id, fingerprint FROM external_refs WHERE source = ? AND"
                                          " external_id = ?", (batch.source, item.external_id)).fetchone()
                if seen is None:
                    request_id = self._insert(connection, request, request.received_at or now, None, fingerprint,
                                              False, None)
                    if not connection.execute("INSERT INTO external_refs VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                                              (batch.source, item.external_id, request_id, fingerprint)).rowcount:
                        # another instance filed this external id since the look above: nothing of this
                        # batch is kept (its savepoint), and the same batch again answers `existing`
                        raise IntakeError(f"requests.{n}.external_id was filed by another request at the same "
                                          "moment; nothing was filed: send the batch again", 409,
                                          f"requests.{n}.external_id")
                    result: Literal["created", "existing", "conflict"] = "created"
                else:
                    request_id = seen["request_id"]
                    result = "existing" if hmac.compare_digest(seen["fingerprint"], fingerprint) else "conflict"
                # the deadline of the request on record (an existing one's may differ from what came now)
                filed = connection.execute("SELECT received_at, regulation, request_type FROM intake WHERE"
                                           " request_id = ?", (request_id,)).fetchone()
                due = due_date(datetime.fromisoformat(filed["received_at"]).date(), filed["regulation"],
                               request_type=filed["request_type"])
                answers.append(BatchItemResult(external_id=item.external_id, request_id=request_id, result=result,
                                               due_date=due.isoformat()))
            return BatchResult(source=batch.source, requests=answers,
                               **{k: sum(a.result == r for a in answers) for k, r in (
                                   ("created", "created"), ("existing", "existing"), ("conflicts", "conflict"))})

        future = self.queue.run(insert)
        future.add_done_callback(lambda _: self._ingester.wake())
        return future

    def external_references(self, request_ids: list[str]) -> dict[str, ExternalReference]:
        """The other tools' ids of those requests that came in a batch. Cost: one queue lookup per 500 ids."""
        return self.queue.call(lambda c: external_references(c, request_ids))

    # -- status -------------------------------------------------------------------------------------
    def status(self, request_id: str, token: str | None, today: date | None = None) -> RequestStatus:
        """The request's status for the person holding its token: from the queue until it is in the
        ledger, from the ledger after. Cost: one queue lookup, then (if ingested) two small ledger reads."""
        self.check_token(request_id, token)
        row = self.queue.call(lambda c: c.execute("SELECT * FROM intake WHERE request_id = ?", (request_id,)
                                                  ).fetchone())
        if row is not None and row["ingested_at"] is None:
            return _queued_status(row, today or utc_now().date())
        try:
            return self.ledger.request(request_id)
        except LedgerError:
            raise IntakeError("no such request", 404) from None

    def waiting(self, today: date | None = None) -> list[RequestStatus]:
        """Acknowledged requests not in the ledger yet (unverified, locked, or moments old)."""
        rows = self.queue.call(lambda c: c.execute("SELECT * FROM intake WHERE ingested_at IS NULL").fetchall())
        return [_queued_status(r, today or utc_now().date()) for r in rows]

    def requests(self, status: str | None = None, request_type: str | None = None, regulation: str | None = None
                 ) -> list[RequestStatus]:
        """Every request, queued or in the ledger, without subject ids; `status` "open" means any not
        completed. Sorted by days left (most urgent first)."""
        stored = self.ledger.statuses()
        known = {r.request_id for r in stored}
        found = [*(r for r in self.waiting() if r.request_id not in known), *stored]
        wanted = (*OPEN_STATUSES, "identity_unverified", "locked") if status == "open" else (status,)
        found = [r for r in found if (status is None or r.status in wanted)
                 and (request_type is None or r.request_type == request_type)
                 and (regulation is None or r.regulation == regulation)]
        return sorted(found, key=lambda r: (r.days_left is None, r.days_left or 0, r.received))

    # -- verification -------------------------------------------------------------------------------
    def verify(self, request_id: str, code: str) -> RequestStatus:
        """Check a code: right → the request is received (the code and e-mail address are forgotten);
        wrong → one try fewer, and after `intake.max_code_attempts` the request is locked."""
        if not isinstance(code, str) or not re.fullmatch(r"\d{6}", code.strip()):
            raise IntakeError("the code is six digits", 422, "code")
        code, limit = code.strip(), self.config.max_code_attempts

        def check(connection: Connection) -> tuple[str, int]:
            row = connection.execute("SELECT * FROM intake WHERE request_id = ?", (request_id,)).fetchone()
            if row is None:
                return "unknown", 0
            if row["state"] != "identity_unverified":
                return row["state"], 0
            if row["code_hash"] is None:
                return "no_code", 0
            if row["code_expires"] < time.time():  # before the comparison: a late code costs no try
                return "expired", 0
            if not any(hmac.compare_digest(keyed_hash(k, f"{request_id}:{code}"), row["code_hash"])
                       for k in self._keys["code"]):
                attempts = row["attempts"] + 1
                locked = attempts >= limit
                connection.execute("UPDATE intake SET attempts = ?, state = ?, reason = ? WHERE request_id = ?", (
                    attempts, "locked" if locked else "identity_unverified",
                    "locked after too many wrong verification codes" if locked else row["reason"], request_id))
                return ("locked" if locked else "wrong"), limit - attempts
            connection.execute("UPDATE intake SET state = 'received', reason = NULL, code_hash = NULL, email = NULL,"
                               " code_expires = NULL, mail_due = 0 WHERE request_id = ?", (request_id,))
            if self.settings.webhooks:  # in this transaction: a verified request always has its event
                record(connection, self.settings, new_event_id(), "verified", utc_now(), request_id,
                       row["request_type"], row["regulation"])
            return "verified", 0

        outcome, left = self.queue.call(check)
        refusals = {
            "unknown": ("no such request", 404),
            "received": ("the identity is already verified (a code works once)", 409),
            "locked": ("the request is locked after too many wrong codes", 423),
            "no_code": ("no code has been sent for this request yet", 409),
            "expired": ("the code has expired; ask for a new one", 410),
            "wrong": (f"wrong code; {left} {'try' if left == 1 else 'tries'} left", 400),
        }
        if outcome in refusals:
            raise IntakeError(*refusals[outcome])
        self._ingester.wake()
        return self.status(request_id, self.status_token(request_id))

    def resend_code(self, request_id: str, token: str | None) -> RequestStatus:
        """Mail a new code (the old one stops working) for an unverified request."""
        self.check_token(request_id, token)
        changed = self.queue.call(lambda c: c.execute(
            "UPDATE intake SET mail_due = 1 WHERE request_id = ? AND state = 'identity_unverified'", (request_id,)
        ).rowcount)
        if not changed:
            raise IntakeError("this request is not waiting for a verification code", 409)
        self._wake_mail.set()
        return self.status(request_id, token)

    def send_due_codes(self) -> int:
        """Mail a fresh code for every request that needs one; a mail server that is down leaves the
        request waiting with the reason, and it is tried again on the next tick. Returns codes sent."""
        due = self.queue.call(lambda c: c.execute(
            "SELECT request_id, email FROM intake WHERE mail_due = 1 AND state = 'identity_unverified'").fetchall())
        sent = 0
        for row in due:
            request_id, code = row["request_id"], f"{secrets.randbelow(10**6):06d}"
            # Stored before it is sent: a code that reached the person always checks.
            self._update(request_id, code_hash=keyed_hash(self._keys["code"][0], f"{request_id}:{code}"),
                         code_expires=time.time() + self.config.code_ttl_minutes * 60)
            try:
                send_code(self.config.smtp, row["email"], request_id, code, self.config.code_ttl_minutes)
            except MailError as exc:
                self._update(request_id, reason=f"the verification e-mail could not be sent yet: {exc}; "
                                                "it is tried again")
                continue
            self._update(request_id, mail_due=0, reason="a verification code was sent to the e-mail address given")
            sent += 1
        return sent

    def _update(self, request_id: str, **columns) -> None:
        """Set `columns` (names from this module, never from input) of one queued request."""
        assignments = ", ".join(f"{name} = ?" for name in columns)
        self.queue.call(lambda c: c.execute(f"UPDATE intake SET {assignments} WHERE request_id = ?",
                                            (*columns.values(), request_id)))

    # -- into the ledger ----------------------------------------------------------------------------
    def ingest(self) -> int:
        """Move acknowledged requests into the ledger now, from this process (ingester.ingest), once the
        ingest lease is free (an ingester of any instance sharing the queue may be at it: waited for up to
        `INGEST_WAIT_SECONDS`, after which what it has not moved yet is counted as 0 here)."""
        return ingest_leased(self.queue, self.ledger, wait=INGEST_WAIT_SECONDS)


class _KeyTaken(Exception):
    """A request was filed under this Idempotency-Key before."""


def _queued_status(row: Any, today: date) -> RequestStatus:
    received = datetime.fromisoformat(row["received_at"])
    due = due_date(received.date(), row["regulation"], request_type=row["request_type"])
    return RequestStatus(row["request_id"], row["request_type"], row["regulation"], row["state"], row["reason"],
                         utc_text(received), due.isoformat(), (due - today).days, False, None)


def _received_at(value: str | None, now: datetime, field: str) -> datetime | None:
    """A batch item's `received_at` (its shape is checked by the schema): in UTC, never in the future
    nor before `EARLIEST_RECEIPT`."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:  # the pattern's shape, not a real time: month 13, say
        raise IntakeError(f"{field}: not a date and time", 422, field) from None
    except OverflowError:  # in UTC before the year 1
        moment = datetime.min.replace(tzinfo=UTC)
    if moment > now:
        raise IntakeError(f"{field}: in the future", 422, field)
    if moment < EARLIEST_RECEIPT:
        raise IntakeError(f"{field}: before {EARLIEST_RECEIPT:%Y-%m-%d}", 422, field)
    return moment


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from JSON's \ud800
        return False
    return True


def _token(key: bytes, request_id: str) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, request_id.encode(), hashlib.sha256).digest()[:18]).decode()
