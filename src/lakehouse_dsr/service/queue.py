"""The intake service's durable queue: every acknowledged request, before the ledger. Two backends, one
interface (`Queue`): a SQLite file (`IntakeQueue`, the embedded default, `intake.queue_file`) or a
PostgreSQL server that several `dsr serve` instances share (`PostgresQueue`, `intake.queue_url`);
`open_queue` picks the one the settings name.

A 202 is sent only after the request's row is committed and synced to disk, so a server killed
right after answering still has it. Commits are grouped: one thread owns the connection, takes
every operation waiting at that moment, runs each in a savepoint of one transaction and commits
once (one fsync for many requests under load, none of them waiting for a timer). The rows keep a
request's plaintext identifiers only until it is in the ledger (SQLite: secure_delete overwrites
them; PostgreSQL: the ingester vacuums the table, so the old row versions go too); a request never
verified or locked is deleted after `records.keep_unverified_days` by `dsr run` and `dsr expire-records`
(ledger/records.py reads and deletes its rows, so keep their columns stable).
The same store holds the other tools' ids of requests they handed over (`external_refs`) and the
webhooks' outbox and delivery log (webhooks.py), none of them with a subject identifier.

Operations are plain SQL with `?` placeholders, written once for both backends (the PostgreSQL
connection translates the placeholders; rows read by name or position on both). Beside the rows,
a queue hands out leases (`Queue.lease`: one ingester, or one webhook round, at a time across every
process sharing the queue) and the rate limit (`Queue.rate_limit`: per process on SQLite, shared by
every instance on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..config import Settings
from ..exceptions import DsrError, first_line
from .guard import RateLimit

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
log = logging.getLogger("lakehouse_dsr.service")

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


# PostgreSQL reads the same schema with two differences: its REAL is 4 bytes (unix times need 8), and only
# SQLite numbers an INTEGER PRIMARY KEY's rows by itself. Plus what only a shared queue needs.
POSTGRES_ONLY = """
-- The shared rate limit (PostgresQueue.rate_limit): a token bucket per client address, on the server's clock.
-- Unlogged (no write-ahead log, emptied after a crash: counters need no durability); a row goes 2 minutes
-- after its address was last seen.
CREATE UNLOGGED TABLE IF NOT EXISTS rate_buckets (
    client  TEXT PRIMARY KEY,
    tokens  DOUBLE PRECISION NOT NULL,
    at      DOUBLE PRECISION NOT NULL,   -- unix time of the last request
    granted BOOLEAN NOT NULL             -- whether the last request was let through
);
"""
_LOG_ID = "id          INTEGER PRIMARY KEY,"


def postgres_schema() -> str:
    """`SCHEMA` as PostgreSQL reads it, and the tables only a shared queue has."""
    assert _LOG_ID in SCHEMA
    text = re.sub(r"\bREAL\b", "DOUBLE PRECISION", SCHEMA)
    return text.replace(_LOG_ID, "id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,") + POSTGRES_ONLY


CONNECT_SECONDS = 3  # a PostgreSQL queue that does not answer within this is unavailable (/readyz: 5 s)
RATE_FALLBACK_SECONDS = 5.0  # an unreachable shared rate limit is replaced by this process's own for this long


class QueueUnavailableError(DsrError):
    """The queue cannot be reached or written now: nothing of the operation was acknowledged. Its
    message names the queue (never a password); the HTTP answer (503) does not."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What an operation gets: sqlite3's connection, or PostgreSQL's behind the same two calls
    (`?` placeholders; rows read by position or by column name)."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...


class Lease:
    """Held by one process at a time among all that share the queue (one ingest round, one webhook
    round). A process that dies loses it at once: the other instances take over at their next tick."""

    def acquire(self) -> bool:
        """Take it if it is free (never waits); True if this process holds it now."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release it if held and drop what it keeps open."""

    @contextlib.contextmanager
    def hold(self, wait: float = 0.0) -> Iterator[bool]:
        """Whether it was taken within `wait` seconds; held until the block ends."""
        deadline = time.monotonic() + wait
        while not (held := self.acquire()) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            yield held
        finally:
            if held:
                self.release()


class _Op:
    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Connection], Any]):
        self.fn = fn
        self.future: Future[Any] = Future()


class Queue:
    """The interface both backends share: `run(fn)` (`fn(connection)` runs inside the next group
    commit, its Future resolves once that commit is durable), `call`, `read`, `lease`, `rate_limit`,
    `close`. `label` names the queue in messages and logs (a path, or a URL without its password)."""

    BEGIN = "BEGIN"
    SAVEPOINTS = True  # every operation in a savepoint from the start (SQLite: they cost nothing)
    WRITERS = 1  # threads taking group commits, each on a connection of its own (SQLite: one writer at a time)

    def __init__(self, label: str):
        self.label = label
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, name=f"intake-queue-{n}", daemon=True)
                         for n in range(self.WRITERS)]

    def run(self, fn: Callable[[Connection], T]) -> Future[T]:
        op = _Op(fn)
        self._ops.put(op)
        return op.future

    def call(self, fn: Callable[[Connection], T]) -> T:
        """`run` and wait: for threads that are not the event loop."""
        return self.run(fn).result()

    def read(self, fn: Callable[[Connection], T]) -> T:
        """`fn(connection)` on a connection of its own, beside the group commits: for reads that may take
        a while, such as a scrape's pass over every row."""
        raise NotImplementedError

    def lease(self, name: str) -> Lease:
        """The lease called `name` (`ingest`, `webhooks`) among every process sharing this queue."""
        raise NotImplementedError

    def rate_limit(self, per_minute: int) -> RateLimit:
        """The per-client rate limit of the instances sharing this queue: by default this process's own."""
        return RateLimit(per_minute)

    def scrub(self) -> None:
        """After identifiers were cleared from rows: make sure no old copy of them stays readable."""

    def close(self) -> None:
        self._ops.put(None)  # each writer puts it back for the next before it ends
        for thread in self._threads:
            thread.join(timeout=30)

    def _start(self) -> None:
        for thread in self._threads:
            thread.start()

    # -- the backend's part -----------------------------------------------------------------------
    def _connection(self) -> Connection:
        """The group commits' connection (opened again if it was lost)."""
        raise NotImplementedError

    def _abort(self) -> None:
        """A group commit failed: roll back what is open (and drop a connection that broke)."""
        raise NotImplementedError

    def _failure(self, exc: Exception) -> Exception:
        """What an operation's Future gets when its group commit failed."""
        return exc

    def _broken(self, exc: Exception) -> bool:
        """The connection itself failed (no savepoint can be rolled back to)."""
        return False

    def _transient(self, exc: Exception) -> bool:
        """The transaction was rolled back by the server and may simply be run again."""
        return False

    # -- the group commits ------------------------------------------------------------------------
    def _loop(self) -> None:
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
                self._commit(ops)
            if None in batch:
                self._ops.put(None)
                return

    def _commit(self, ops: list[_Op]) -> None:
        for attempt in range(3):
            if self._group(ops, savepoints=self.SAVEPOINTS or attempt > 0, last=attempt == 2):
                return

    def _group(self, ops: list[_Op], savepoints: bool, last: bool) -> bool:
        """One transaction for `ops`; each in a savepoint if `savepoints`. Returns False, having rolled
        the group back, when it should run again: an operation failed and there were no savepoints, or
        (unless `last`) the server rolled the transaction back (a deadlock between two instances' groups,
        say). Operations only compute and run SQL, so running one again, the first rolled back, is safe."""
        results: list[tuple[_Op, Any, BaseException | None]] = []
        try:
            connection = self._connection()
            connection.execute(self.BEGIN)
            for op in ops:
                if savepoints:
                    connection.execute("SAVEPOINT op")
                try:
                    results.append((op, op.fn(connection), None))
                    if savepoints:
                        connection.execute("RELEASE op")
                except Exception as exc:  # this operation's writes are undone, the group's are not
                    if self._broken(exc):
                        raise
                    if not savepoints:
                        self._abort()
                        return False
                    connection.execute("ROLLBACK TO op")
                    connection.execute("RELEASE op")
                    results.append((op, None, exc))
            connection.execute("COMMIT")
        except Exception as exc:  # the commit itself failed (disk full, I/O, the server): nothing was acknowledged
            self._abort()
            if self._transient(exc) and not last:
                return False
            failure = self._failure(exc)
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(failure)
            return True
        for op, result, error in results:
            if op.future.cancelled():  # its caller stopped waiting (a stop's grace ran out): committed, unanswered
                continue
            if error is not None:
                op.future.set_exception(error)
            else:
                op.future.set_result(result)
        return True


class IntakeQueue(Queue):
    """The embedded default: one SQLite file, and the thread that owns its connection."""

    BEGIN = "BEGIN IMMEDIATE"

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._sqlite = self._connect()  # here, so a file that cannot be opened fails `dsr serve` at once
        self._start()

    def _connect(self) -> sqlite3.Connection:
        # The file holds identifiers until ingested: owner-only, like the key files.
        self.path.touch(mode=0o600, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.row_factory = sqlite3.Row
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "secure_delete=ON", "busy_timeout=10000"):
            connection.execute(f"PRAGMA {pragma}")
        connection.executescript(SCHEMA)
        return connection

    def read(self, fn: Callable[[Connection], T]) -> T:
        """A read-only connection of its own (WAL lets it read while the group commits write). Cost:
        opening the file (about a millisecond) and `fn`."""
        connection = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        connection.row_factory = sqlite3.Row
        try:
            return fn(connection)
        finally:
            connection.close()

    def lease(self, name: str) -> Lease:
        """An exclusive lock (flock) on a file beside the queue's: processes sharing the file on one host."""
        return _FileLease(self.path.with_name(f"{self.path.name}.{name}.lease"))

    def close(self) -> None:
        super().close()
        self._sqlite.close()

    def _connection(self) -> Connection:
        return self._sqlite

    def _abort(self) -> None:
        if self._sqlite.in_transaction:
            self._sqlite.execute("ROLLBACK")


class _FileLease(Lease):
    def __init__(self, path: Path):
        self.path, self._fd = path, -1

    def acquire(self) -> bool:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1


# -- PostgreSQL -----------------------------------------------------------------------------------------

def redacted(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


@functools.lru_cache(maxsize=512)
def _placeholders(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (a literal % doubled). Our statements hold no `?` in a string."""
    return sql.replace("%", "%%").replace("?", "%s")


class Row(tuple):
    """A row read by position or by column name, as sqlite3.Row (`dict(row)` too)."""

    _names: dict[str, int]

    def __getitem__(self, key):
        return super().__getitem__(self._names[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self._names)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row._names = names
        return row

    return make


class _PgConnection:
    """psycopg's connection behind `Connection`'s calls."""

    def __init__(self, raw: psycopg.Connection):
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        if parameters:
            return self.raw.execute(_placeholders(sql), parameters)
        return self.raw.execute(sql)

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor:
        cursor = self.raw.cursor()
        cursor.executemany(_placeholders(sql), parameters)
        return cursor


def _connect(url: str, what: str) -> psycopg.Connection:
    """An autocommit connection (statements as in SQLite's isolation_level=None: BEGIN is ours to send);
    QueueUnavailableError naming the queue if it does not answer within CONNECT_SECONDS."""
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_SECONDS, row_factory=_rows,
                               application_name=f"dsr intake {what}")
    except psycopg.Error as exc:
        raise QueueUnavailableError(f"the intake queue {redacted(url)} cannot be reached: {first_line(exc)}") from None


def _lock_key(name: str) -> int:
    """An advisory lock's key (a signed 64-bit integer) for the lease `name`."""
    return int.from_bytes(hashlib.sha256(f"lakehouse-dsr intake {name}".encode()).digest()[:8], "big", signed=True)


class PostgresQueue(Queue):
    """The queue on a PostgreSQL server (`intake.queue_url`) that several `dsr serve` instances share.

    One connection per process for the group commits (each commit waits for PostgreSQL's fsync, as
    synchronous_commit is on by default), one for reads, one per lease, one for the rate limit. A server
    that does not answer makes every operation fail with QueueUnavailableError (the service answers 503
    and `/readyz` names the queue); the next operation connects again. The schema is created at the
    first connection, under an advisory lock (instances starting together). A group runs without
    savepoints first (each is a round trip to the server); only a group in which an operation fails
    runs again with them. Several writer threads, each on a connection of its own, keep several groups
    in flight: a group waits for the network at each statement, which one thread alone would serialise."""

    SAVEPOINTS = False
    WRITERS = 2

    def __init__(self, url: str):
        import psycopg

        super().__init__(redacted(url))
        self.url, self._psycopg = url, psycopg
        self._writer = threading.local()  # each writer thread's connection (`raw`)
        self._opened: list[psycopg.Connection] = []
        self._reader: psycopg.Connection | None = None
        self._read_lock = threading.Lock()
        self._schema_ready = False
        try:
            self._open("queue").close()  # answers, and has the tables
        except QueueUnavailableError as exc:  # not fatal: `/readyz` says so until it answers
            log.warning("%s; filings are refused (503) until it answers", exc)
        self._start()

    def _open(self, what: str) -> psycopg.Connection:
        raw = _connect(self.url, what)
        if not self._schema_ready:
            try:
                with raw.transaction():
                    raw.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("schema"),))
                    raw.execute(postgres_schema().encode())
            except self._psycopg.Error as exc:
                raw.close()
                raise QueueUnavailableError(f"the intake queue {self.label}: its tables cannot be created: "
                                            f"{first_line(exc)}") from None
            self._schema_ready = True
        return raw

    def _connection(self) -> Connection:
        raw = getattr(self._writer, "raw", None)
        if raw is None or raw.closed:
            raw = self._writer.raw = self._open("queue")
            self._opened = [c for c in self._opened if not c.closed] + [raw]
        return _PgConnection(raw)

    def _abort(self) -> None:
        raw = getattr(self._writer, "raw", None)
        if raw is None or raw.closed:
            return
        try:
            if raw.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
        except self._psycopg.Error:
            raw.close()

    def _broken(self, exc: Exception) -> bool:
        return isinstance(exc, self._psycopg.OperationalError | self._psycopg.InterfaceError)

    def _transient(self, exc: Exception) -> bool:
        return isinstance(exc, self._psycopg.errors.TransactionRollback)  # deadlock, serialization failure

    def _failure(self, exc: Exception) -> Exception:
        if isinstance(exc, QueueUnavailableError):
            return exc
        if isinstance(exc, self._psycopg.Error):
            raw = getattr(self._writer, "raw", None)
            if raw is not None and raw.broken:
                raw.close()
            return QueueUnavailableError(f"the intake queue {self.label} failed: {first_line(exc)}")
        return exc

    def read(self, fn: Callable[[Connection], T]) -> T:
        """On a connection of its own (autocommit: each statement reads what is committed)."""
        with self._read_lock:
            try:
                if self._reader is None or self._reader.closed:
                    self._reader = self._open("reads")
                return fn(_PgConnection(self._reader))
            except self._psycopg.Error as exc:
                if self._reader is not None:
                    self._reader.close()
                raise QueueUnavailableError(f"the intake queue {self.label}: {first_line(exc)}") from None

    def scrub(self) -> None:
        """VACUUM the intake table: the row versions that still held identifiers before ingestion are
        removed (PostgreSQL keeps them until a vacuum; autovacuum would come later)."""
        self.read(lambda c: c.execute("VACUUM intake"))

    def lease(self, name: str) -> Lease:
        """A session-level advisory lock on a connection of the lease's own: PostgreSQL releases it when
        that session ends, which a killed process's does at once (the kernel closes its socket); a host
        that vanishes is noticed by TCP keepalives within about 25 s."""
        return _AdvisoryLease(self, _lock_key(name))

    def rate_limit(self, per_minute: int) -> RateLimit:
        """One token bucket per client address for every instance: a row of `rate_buckets` per address."""
        return SharedRateLimit(self, per_minute)

    def close(self) -> None:
        super().close()
        for raw in (*self._opened, self._reader):
            if raw is not None:
                raw.close()


class _AdvisoryLease(Lease):
    def __init__(self, queue: PostgresQueue, key: int):
        self.queue, self.key = queue, key
        self._raw: psycopg.Connection | None = None

    def acquire(self) -> bool:
        error = self.queue._psycopg.Error
        try:
            if self._raw is None or self._raw.closed:
                self._raw = _connect(self.queue.url, "lease")
                for setting in ("tcp_keepalives_idle = 10", "tcp_keepalives_interval = 5", "tcp_keepalives_count = 3"):
                    self._raw.execute(f"SET {setting}")
            row = self._raw.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except (QueueUnavailableError, error) as exc:
            log.warning("intake lease: %s", first_line(exc, with_type=True))
            self.close()
            return False
        return bool(row and row[0])

    def release(self) -> None:
        if self._raw is None or self._raw.closed:
            return
        try:
            self._raw.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        except self.queue._psycopg.Error:
            self.close()  # the session ends: the lock with it

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None


_BUCKET = """
INSERT INTO rate_buckets AS b (client, tokens, at, granted)
VALUES (%(client)s, %(capacity)s - 1, extract(epoch FROM clock_timestamp()), true)
ON CONFLICT (client) DO UPDATE SET
    tokens = LEAST(%(capacity)s, b.tokens + (excluded.at - b.at) * %(rate)s)
             - CASE WHEN LEAST(%(capacity)s, b.tokens + (excluded.at - b.at) * %(rate)s) >= 1 THEN 1 ELSE 0 END,
    granted = LEAST(%(capacity)s, b.tokens + (excluded.at - b.at) * %(rate)s) >= 1,
    at = excluded.at
RETURNING granted, tokens
"""


class SharedRateLimit(RateLimit):
    """`RateLimit`'s token bucket, kept in the queue's PostgreSQL for every instance (one statement per
    API request, on PostgreSQL's clock). If the server does not answer, this process's own bucket counts
    alone for `RATE_FALLBACK_SECONDS` (logged), then the shared one is tried again."""

    blocking = True  # the Guard calls `wait` off the event loop

    def __init__(self, queue: PostgresQueue, per_minute: int):
        super().__init__(per_minute)
        self.queue = queue
        self._raw: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._local_until = 0.0
        self._sweep_at = 0.0

    def wait(self, client: str, now: float | None = None) -> float:
        if time.monotonic() < self._local_until:
            return super().wait(client, now)
        try:
            with self._lock:
                if self._raw is None or self._raw.closed:
                    self._raw = _connect(self.queue.url, "rate limit")
                    self._raw.execute("SET synchronous_commit = off")
                row = self._raw.execute(_BUCKET, {"client": client, "capacity": self.capacity, "rate": self.rate}
                                        ).fetchone()
                assert row is not None  # RETURNING: one row
                granted, tokens = row
                if time.monotonic() > self._sweep_at:  # addresses whose bucket is full again
                    self._raw.execute("DELETE FROM rate_buckets WHERE at < extract(epoch FROM clock_timestamp()) - 120")
                    self._sweep_at = time.monotonic() + 60
        except (QueueUnavailableError, self.queue._psycopg.Error) as exc:
            log.warning("shared rate limit (%s): %s; this instance counts alone for %.0f s", self.queue.label,
                        type(exc).__name__, RATE_FALLBACK_SECONDS)
            if self._raw is not None:
                self._raw.close()
            self._local_until = time.monotonic() + RATE_FALLBACK_SECONDS
            return super().wait(client, now)
        return 0.0 if granted else (1 - tokens) / self.rate


def open_queue(settings: Settings) -> Queue:
    """The queue the settings name: `intake.queue_url` (PostgreSQL), else the SQLite file."""
    url = settings.intake.queue_url
    return PostgresQueue(url) if url else IntakeQueue(settings.intake_queue_file())
