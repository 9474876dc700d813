"""The intake service's durable queue: every acknowledged request, in a SQLite file, before the ledger.

A 202 is sent only after the request's row is committed and synced to disk, so a server killed
right after answering still has it. Commits are grouped: one thread owns the connection, takes
every operation waiting at that moment, runs each in a savepoint of one transaction and commits
once (one fsync for many requests under load, none of them waiting for a timer). The rows keep a
request's plaintext identifiers only until it is in the ledger (secure_delete overwrites them); a
request never verified or locked is deleted after `records.keep_unverified_days` by `dsr run` and
`dsr expire-records` (ledger/records.py reads and deletes its rows, so keep their columns stable).
The same file holds the other tools' ids of requests they handed over (`external_refs`) and the
webhooks' outbox and delivery log (webhooks.py), none of them with a subject identifier.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS intake (
    request_id      TEXT PRIMARY KEY,
    idempotency_key TEXT UNIQUE,
    fingerprint     TEXT NOT NULL,   -- keyed hash of what was asked: a replayed key must ask the same
    request_type    TEXT NOT NULL,
    regulation      TEXT NOT NULL,
    subject_id      TEXT,            -- plaintext until the request is in the ledger
    email           TEXT,            -- where the verification code goes, until it came back
    received_at     TEXT NOT NULL,
    state           TEXT NOT NULL,   -- identity_unverified | received | locked
    reason          TEXT,
    code_hash       TEXT,
    code_expires    REAL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    mail_due        INTEGER NOT NULL DEFAULT 0,
    ingested_at     TEXT             -- when it reached the ledger; NULL before
);
CREATE INDEX IF NOT EXISTS intake_waiting ON intake (ingested_at, state);
CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL);  -- /readyz writes here: the file takes writes
CREATE INDEX IF NOT EXISTS intake_mail ON intake (mail_due);
-- Requests another privacy tool handed over (POST /api/v1/operator/requests/batch), by the tool's own id:
-- one request per (source, external_id). Kept after ingestion: the status endpoints and webhooks show it.
CREATE TABLE IF NOT EXISTS external_refs (
    source       TEXT NOT NULL,
    external_id  TEXT NOT NULL,
    request_id   TEXT NOT NULL UNIQUE,
    fingerprint  TEXT NOT NULL,      -- keyed hash of what was asked: the same id again must ask the same
    PRIMARY KEY (source, external_id)
);
-- The webhooks' outbox (service/webhooks.py): events of status changes (no subject identifier in any
-- column), one delivery per event and endpoint, every attempt in the log, and the audit watermark.
CREATE TABLE IF NOT EXISTS webhook_events (
    event_id    TEXT PRIMARY KEY,    -- the ledger's audit event id, or a fresh one (verified)
    request_id  TEXT NOT NULL,
    event       TEXT NOT NULL,       -- received | verified | held | completed | failed
    reason      TEXT,
    repeat      INTEGER NOT NULL DEFAULT 0,  -- the request's last event again (a held request each run): not sent
    occurred    TEXT NOT NULL,
    payload     TEXT                 -- the JSON body sent (NULL: a repeat, or no endpoint wants it)
);
CREATE INDEX IF NOT EXISTS webhook_events_request ON webhook_events (request_id, occurred);
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    event_id    TEXT NOT NULL,
    endpoint    TEXT NOT NULL,       -- the endpoint's name in `webhooks:`
    state       TEXT NOT NULL,       -- pending | delivered | given_up
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     REAL NOT NULL,       -- unix time of the next attempt
    PRIMARY KEY (event_id, endpoint)
);
CREATE INDEX IF NOT EXISTS webhook_due ON webhook_deliveries (state, next_at);
CREATE TABLE IF NOT EXISTS webhook_log (
    id          INTEGER PRIMARY KEY,
    event_id    TEXT NOT NULL,
    endpoint    TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    event       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    at          TEXT NOT NULL,
    http_status INTEGER,             -- NULL: no answer (refused, timed out)
    error       TEXT,                -- the exception's type, or "HTTP <status>"; NULL when delivered
    seconds     REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_state (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class _Op:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any]):
        self.fn = fn
        self.future: Future[Any] = Future()


class IntakeQueue:
    """One SQLite file and the thread that owns its connection. Use `run(fn)`: `fn(connection)` runs
    inside the next group commit and its Future resolves once that commit is on disk."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._connection = self._connect()  # here, so a file that cannot be opened fails `dsr serve` at once
        self._thread = threading.Thread(target=self._loop, name="intake-queue", daemon=True)
        self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        # The file holds identifiers until ingested: owner-only, like the key files.
        self.path.touch(mode=0o600, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.row_factory = sqlite3.Row
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "secure_delete=ON", "busy_timeout=10000"):
            connection.execute(f"PRAGMA {pragma}")
        connection.executescript(SCHEMA)
        return connection

    def run(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        op = _Op(fn)
        self._ops.put(op)
        return op.future

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`run` and wait: for threads that are not the event loop."""
        return self.run(fn).result()

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on a read-only connection of its own, beside the group commits (WAL lets it
        read while they write): for reads that may take a while, such as a scrape's pass over every
        row. Cost: opening the file (about a millisecond) and `fn`."""
        connection = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        connection.row_factory = sqlite3.Row
        try:
            return fn(connection)
        finally:
            connection.close()

    def close(self) -> None:
        self._ops.put(None)
        self._thread.join(timeout=30)
        self._connection.close()

    def _loop(self) -> None:
        connection = self._connection
        while True:
            first = self._ops.get()
            batch = [first]
            while first is not None:
                try:
                    batch.append(self._ops.get_nowait())
                except queue.Empty:
                    break
            ops = [op for op in batch if op is not None]
            if ops:
                self._commit(connection, ops)
            if None in batch:
                return

    @staticmethod
    def _commit(connection: sqlite3.Connection, ops: list[_Op]) -> None:
        results: list[tuple[_Op, Any, BaseException | None]] = []
        try:
            connection.execute("BEGIN IMMEDIATE")
            for op in ops:
                connection.execute("SAVEPOINT op")
                try:
                    results.append((op, op.fn(connection), None))
                    connection.execute("RELEASE op")
                except Exception as exc:  # this operation's writes are undone, the group's are not
                    connection.execute("ROLLBACK TO op")
                    connection.execute("RELEASE op")
                    results.append((op, None, exc))
            connection.execute("COMMIT")
        except Exception as exc:  # the commit itself failed (disk full, I/O): nothing was acknowledged
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(exc)
            return
        for op, result, error in results:
            if op.future.cancelled():  # its caller stopped waiting (a stop's grace ran out): committed, unanswered
                continue
            if error is not None:
                op.future.set_exception(error)
            else:
                op.future.set_result(result)
