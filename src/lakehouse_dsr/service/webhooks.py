"""Signed webhooks on request status changes: received, verified, held, completed, failed.

Nothing that changes a status waits for a webhook. The changes are already durable where they
happen, and are copied from there into an outbox in the intake queue's file (queue.py), from which
deliveries are made and retried:

- received, held, completed, failed: the ledger's audit table holds an event for each (`submitted`
  when the ingester or `dsr submit` adds a request, the outcome `Ledger.finish` records for a run).
  `collect` reads the audit events since its watermark (less `LOOKBACK`, for an event whose commit
  landed after a later one's; event ids make it count once) and appends them to the outbox.
- verified: the intake queue's own transaction that accepts the code appends it (`record`).

`deliver` POSTs every delivery that is due, per endpoint in a thread of its own (an endpoint that
hangs delays no other), each attempt bounded by the endpoint's `timeout_seconds`, and logs every
attempt (`webhook_log`: event, endpoint, attempt, HTTP status or error type, when; never a subject
identifier, never the URL). A failed attempt is tried again after `backoff_seconds`, doubled each
time, until `max_attempts`; then the delivery is given up. Delivery is at least once: the event id
tells a receiver it has seen one before. `dsr serve` runs both every `POLL_SECONDS` in its ingester
process (a ledger read is seconds of Python under load: not in the process that answers people);
`dsr webhooks deliver` runs one round, for deployments without the service. A round holds the queue's
`webhooks` lease: instances sharing a PostgreSQL queue never collect or deliver at the same time.

Signature (as Stripe's): `X-DSR-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`
under the endpoint's secret, beside `X-DSR-Event` and `X-DSR-Event-Id`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from pydantic import BaseModel, ConfigDict

from ..config import Settings, WebhookEvent, WebhookSettings
from ..evidence.certificate import build_certificate, certificate_digest
from ..evidence.handoff import CertificateReference, EventRequest, ExternalReference, WebhookEventDocument
from ..exceptions import LedgerError, first_line
from ..ledger.ledger import Ledger
from ..ledger.requests import utc_now, utc_text
from ..ledger.store import Among, GreaterThan
from .queue import Connection, Queue, QueueUnavailableError, open_queue

log = logging.getLogger("lakehouse_dsr.service")
POLL_SECONDS = 5.0
LOOKBACK = timedelta(minutes=10)  # audit events are read again this far back: a commit can land late
MAX_BACKOFF_SECONDS = 6 * 3600.0
ROUND_SIZE = 200  # deliveries taken per round: the rest waits for the next one
KEEP_EVENTS_DAYS = 30  # sent (or given up) events leave the outbox after this; the log stays
# The ledger's audit events that are status changes, and the webhook event each is.
LEDGER_EVENTS: dict[str, WebhookEvent] = {"submitted": "received", "held": "held", "completed": "completed",
                                          "failed": "failed"}
_STATUS = {"received": "received", "verified": "received", "held": "held", "completed": "completed",
           "failed": "failed"}
_WATERMARK = "audit_since"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-DSR-Signature` header's value for `body` sent at `timestamp` (unix seconds)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def external_references(connection: Connection, request_ids: list[str]) -> dict[str, ExternalReference]:
    """The other tools' ids of those requests that came in a batch. Cost: one indexed lookup per 500 ids."""
    found: dict[str, ExternalReference] = {}
    for start in range(0, len(request_ids), 500):
        chunk = request_ids[start:start + 500]
        for row in connection.execute("SELECT request_id, source, external_id FROM external_refs WHERE request_id IN"
                                      f" ({','.join('?' * len(chunk))})", chunk):
            found[row[0]] = ExternalReference(source=row[1], id=row[2])
    return found


def record(connection: Connection, settings: Settings, event_id: str, event: WebhookEvent,
           occurred: datetime, request_id: str, request_type: str, regulation: str, reason: str | None = None,
           certificate: CertificateReference | None = None) -> bool:
    """Append an event to the outbox with a delivery for every endpoint that wants it, inside the
    caller's transaction of the queue. An event seen before is not added again; the request's last
    event again (a held request at every run, a failure repeated), or one no endpoint wants, is noted
    but sent to no one. Returns whether deliveries were added. Cost: four indexed statements."""
    if connection.execute("SELECT 1 FROM webhook_events WHERE event_id = ?", (event_id,)).fetchone():
        return False
    endpoints = [w.name for w in settings.webhooks if event in w.events]
    last = connection.execute("SELECT event, reason FROM webhook_events WHERE request_id = ? AND repeat = 0"
                              " ORDER BY occurred DESC LIMIT 1", (request_id,)).fetchone()
    repeat = last is not None and tuple(last) == (event, reason)
    document = WebhookEventDocument.model_validate({
        "id": event_id, "event": event, "occurred": utc_text(occurred), "certificate": certificate,
        "request": EventRequest.model_validate({
            "request_id": request_id, "type": request_type, "regulation": regulation, "status": _STATUS[event],
            "reason": reason, "external_reference": external_references(connection, [request_id]).get(request_id)})})
    sent = endpoints and not repeat
    connection.execute("INSERT INTO webhook_events (event_id, request_id, event, reason, repeat, occurred, payload)"
                       " VALUES (?,?,?,?,?,?,?)", (event_id, request_id, event, reason, int(repeat),
                                                   occurred.isoformat(), document.model_dump_json() if sent else None))
    if not sent:
        return False
    connection.executemany("INSERT INTO webhook_deliveries (event_id, endpoint, state, next_at) VALUES (?,?,?,?)",
                           [(event_id, name, "pending", time.time()) for name in endpoints])
    return True


def new_event_id() -> str:
    return uuid.uuid4().hex


def collect(queue: Queue, ledger: Ledger, settings: Settings) -> int:
    """Copy the ledger's status changes since the watermark into the outbox; returns events added.
    The first call only sets the watermark: events before webhooks were configured are not sent.
    Cost: one read of the audit table pruned to files with events since the watermark (less
    `LOOKBACK`), one read of the requests those events are about, and a certificate (one pruned read)
    per completed request."""
    if not settings.webhooks:
        return 0
    stored = queue.call(lambda c: c.execute("SELECT value FROM webhook_state WHERE name = ?", (_WATERMARK,)
                                            ).fetchone())
    if stored is None:
        now = utc_now().isoformat()
        queue.call(lambda c: c.execute("INSERT INTO webhook_state (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                       (_WATERMARK, now)))
        return 0
    since = datetime.fromisoformat(stored[0])
    rows = sorted((r for r in ledger.store.rows("audit", GreaterThan("at", (since - LOOKBACK).isoformat()),
                                                ("event_id", "request_id", "at", "event", "detail"))
                   if r["event"] in LEDGER_EVENTS and r["request_id"]), key=lambda r: (r["at"], r["event_id"]))
    known = queue.call(lambda c: {e for (e,) in c.execute(
        "SELECT event_id FROM webhook_events WHERE occurred >= ?", ((since - 2 * LOOKBACK).isoformat(),))})
    fresh = [r for r in rows if r["event_id"] not in known]
    if not fresh:
        return 0
    requests = {r["request_id"]: r for r in ledger.store.rows(
        "requests", Among("request_id", sorted({r["request_id"] for r in fresh})),
        ("request_id", "request_type", "regulation"))}
    certificates = {r["request_id"]: _certificate(ledger, r["request_id"]) for r in fresh
                    if r["event"] == "completed" and r["request_id"] in requests}
    latest = max(since, rows[-1]["at"])

    def write(connection: Connection) -> int:
        added = 0
        for r in fresh:
            request = requests.get(r["request_id"])
            if request is None:  # its record expired since (ledger/records.py): nothing left to tell
                continue
            reason = _reason(r["detail"])
            added += record(connection, settings, r["event_id"], LEDGER_EVENTS[r["event"]], r["at"], r["request_id"],
                            request["request_type"], request["regulation"], reason,
                            certificates.get(r["request_id"]) if r["event"] == "completed" else None)
        connection.execute("INSERT INTO webhook_state (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE"
                           " SET value = excluded.value", (_WATERMARK, latest.isoformat()))
        _forget_old(connection)
        return added

    return queue.call(write)


def _reason(detail: str | None) -> str | None:
    return json.loads(detail).get("reason") if detail else None


def _certificate(ledger: Ledger, request_id: str) -> CertificateReference | None:
    try:
        document = build_certificate(ledger, request_id)
    except LedgerError:  # not completed any more, or its record expired: no certificate to name
        return None
    return CertificateReference(id=request_id, digest=certificate_digest(document),
                                key_id=document["signature"]["key_id"])


def _forget_old(connection: Connection) -> None:
    """Events past `KEEP_EVENTS_DAYS` with nothing left to send leave the outbox (the log keeps every attempt)."""
    before = (utc_now() - timedelta(days=KEEP_EVENTS_DAYS)).isoformat()
    connection.execute("DELETE FROM webhook_deliveries WHERE state != 'pending' AND event_id IN"
                       " (SELECT event_id FROM webhook_events WHERE occurred < ?)", (before,))
    connection.execute("DELETE FROM webhook_events WHERE occurred < ? AND event_id NOT IN"
                       " (SELECT event_id FROM webhook_deliveries)", (before,))


class DeliveryRound(BaseModel):
    """What one round of deliveries did."""

    model_config = ConfigDict(frozen=True)

    attempted: int = 0
    delivered: int = 0
    failed: int = 0  # attempts that failed (tried again later, or given up)
    given_up: int = 0


@dataclass(frozen=True)
class _Due:
    event_id: str
    endpoint: str
    attempts: int
    request_id: str
    event: str
    payload: str


def deliver(queue: Queue, settings: Settings) -> DeliveryRound:
    """Attempt every delivery that is due (at most `ROUND_SIZE`): one thread per endpoint, which stops
    at its first failure (the rest waits for the backoff rather than for one timeout each). Cost: per
    attempt one HTTP POST (at most the endpoint's timeout) and one queue commit. Deliveries to an
    endpoint no longer configured stay pending."""
    endpoints = {w.name: w for w in settings.webhooks}
    due = queue.call(lambda c: [_Due(*row) for row in c.execute(
        "SELECT d.event_id, d.endpoint, d.attempts, e.request_id, e.event, e.payload FROM webhook_deliveries d"
        " JOIN webhook_events e USING (event_id) WHERE d.state = 'pending' AND d.next_at <= ?"
        " ORDER BY d.next_at LIMIT ?", (time.time(), ROUND_SIZE))])
    per_endpoint: dict[str, list[_Due]] = {}
    for d in due:
        if d.endpoint in endpoints:
            per_endpoint.setdefault(d.endpoint, []).append(d)
    if not per_endpoint:
        return DeliveryRound()
    with ThreadPoolExecutor(len(per_endpoint), thread_name_prefix="webhook") as pool:
        rounds = list(pool.map(lambda name: _deliver_to(queue, endpoints[name], per_endpoint[name]), per_endpoint))
    return DeliveryRound(**{field: sum(getattr(r, field) for r in rounds) for field in DeliveryRound.model_fields})


def _deliver_to(queue: Queue, endpoint: WebhookSettings, due: list[_Due]) -> DeliveryRound:
    attempted = delivered = failed = given_up = 0
    with httpx.Client(timeout=endpoint.timeout_seconds, follow_redirects=False) as client:
        for d in due:
            status, error, seconds = _post(client, endpoint, d)
            attempt = d.attempts + 1
            state = "delivered" if error is None else "given_up" if attempt >= endpoint.max_attempts else "pending"
            wait = min(endpoint.backoff_seconds * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS)

            def note(c: Connection, d: _Due = d, attempt: int = attempt, state: str = state,
                     status: int | None = status, error: str | None = error, seconds: float = seconds,
                     wait: float = wait) -> None:
                c.execute("INSERT INTO webhook_log (event_id, endpoint, request_id, event, attempt, at, http_status,"
                          " error, seconds) VALUES (?,?,?,?,?,?,?,?,?)", (d.event_id, d.endpoint, d.request_id,
                                                                          d.event, attempt, utc_now().isoformat(),
                                                                          status, error, round(seconds, 3)))
                c.execute("UPDATE webhook_deliveries SET state = ?, attempts = ?, next_at = ? WHERE event_id = ?"
                          " AND endpoint = ?", (state, attempt, time.time() + wait, d.event_id, d.endpoint))

            queue.call(note)
            attempted += 1
            if error is None:
                delivered += 1
                continue
            failed += 1
            given_up += state == "given_up"
            log.warning("webhook %s: %s of %s, attempt %d: %s%s", endpoint.name, d.event, d.request_id, attempt,
                        error, "; given up" if state == "given_up" else "")
            break
    return DeliveryRound(attempted=attempted, delivered=delivered, failed=failed, given_up=given_up)


def _post(client: httpx.Client, endpoint: WebhookSettings, due: _Due) -> tuple[int | None, str | None, float]:
    """One attempt: (HTTP status or None, error or None when delivered (2xx), seconds)."""
    body, started = due.payload.encode(), time.monotonic()
    headers = {"content-type": "application/json", "user-agent": "lakehouse-dsr-webhooks/1",
               "x-dsr-event": due.event, "x-dsr-event-id": due.event_id,
               "x-dsr-signature": signature(endpoint.secret, int(time.time()), body)}
    try:
        answer = client.post(endpoint.url, content=body, headers=headers)
    except httpx.HTTPError as exc:  # refused, timed out, reset: the type only (a message may quote the URL)
        return None, type(exc).__name__, time.monotonic() - started
    ok = 200 <= answer.status_code < 300
    return answer.status_code, None if ok else f"HTTP {answer.status_code}", time.monotonic() - started


def delivery_log(queue: Queue, limit: int = 100) -> list[dict]:
    """The last `limit` attempts, newest first (no subject identifier: ids, names, statuses, times)."""
    return queue.read(lambda c: [dict(r) for r in c.execute(
        "SELECT event_id, endpoint, request_id, event, attempt, at, http_status, error, seconds FROM webhook_log"
        " ORDER BY id DESC LIMIT ?", (limit,))])


def deliver_once(settings: Settings) -> dict:
    """`dsr webhooks deliver`: collect the ledger's new status changes, then attempt what is due, once.
    Returns {"collected": events, "attempted", "delivered", "failed", "given_up"}."""
    queue = open_queue(settings)
    lease = queue.lease("webhooks")
    try:
        with lease.hold(wait=60) as held:
            if not held:
                raise QueueUnavailableError("another process has held the webhooks lease for a minute (a round "
                                            "of `dsr serve`'s): try again later")
            collected = collect(queue, Ledger(settings), settings)
            return {"collected": collected, **deliver(queue, settings).model_dump()}
    finally:
        lease.close()
        queue.close()


class WebhookWorker:
    """`dsr serve`'s deliveries: a thread (in the ingester process) that collects and delivers every
    `POLL_SECONDS`. A failure of either is logged by type and tried again at the next tick."""

    def __init__(self, settings: Settings, queue: Queue, ledger: Ledger):
        self.settings, self.queue, self.ledger = settings, queue, ledger
        self.lease = queue.lease("webhooks")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop after the attempt in hand, waiting at most `timeout`: an attempt cut short is not logged
        and is made again at the next start (delivery is at least once)."""
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.lease.hold() as held:  # not held: another instance's round; ours at a later tick
                for step, run in (("collect", lambda: collect(self.queue, self.ledger, self.settings)),
                                  ("deliver", lambda: deliver(self.queue, self.settings))):
                    if not held:
                        break
                    try:
                        run()
                    except Exception as exc:  # the catalog or the disk: tried again at the next tick
                        log.warning("webhooks %s: %s", step, first_line(exc, with_type=True))
            self._stop.wait(POLL_SECONDS)
        self.lease.close()
