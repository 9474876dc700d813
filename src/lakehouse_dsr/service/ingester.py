"""Moving acknowledged requests from the intake queue into the ledger, in a process of its own.

A ledger commit (a read of the open requests, hashing, Parquet, manifests, the catalog) is seconds of
Python under load; in the server's process it would hold the interpreter lock while people wait for
their 202 (measured: p99 of a filing from 57 to 104 ms with 20 clients). So `dsr serve` starts one
child process that does only this, every `intake.ingest_interval_seconds` and when woken.

The child runs in a process group of its own, so a signal to the server's group (a supervisor's
stop, Ctrl-C in a terminal) is the server's to act on: the server then closes its end of a pipe to
the child, which is also how the child learns of its server's death (kill -9 included). SIGTERM or
SIGINT sent to the child itself (systemd signals every process of the service's control group) stop
it the same way. Either way the child starts no batch later than `STOP_SECONDS` after the ask, and
exits 0; what is left stays in the durable queue for the next start. A batch still in hand
`ABANDON_SECONDS` after the ask (a starved child: it runs at nice +10, so on a busy host it may get a
few percent of a core) is abandoned where it stands, and the child exits 0 all the same: that is as
safe as a crash, since a request is marked ingested only once the ledger has it, and the ledger adds an
id once. The child tells its server when it is ready to ingest (the queue and the ledger opened), and
`/readyz` counts it alive from then on. A child that crashed is started again; one that exited 0 was
asked to stop and is not (`/readyz` says so).
With `webhooks:` configured, the child also delivers them (webhooks.py), in a thread of its own.

Several instances sharing a PostgreSQL queue each run such a child; each round takes the queue's
`ingest` lease first (a PostgreSQL advisory lock; a file lock beside a SQLite queue), so one ingester
moves requests at a time. A round that finds the lease taken leaves the work to its holder; a holder
killed mid-round loses the lease with its connection, and the next tick of any instance moves what it
had not marked (the ledger adds each id once, so nothing is added twice). A round with work logs when
it took the lease, and when it released it with the number of requests moved (under steady load a
round lasts as long as requests keep coming).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

from .. import faults
from ..config import Settings
from ..exceptions import first_line
from ..ledger.ledger import Ledger
from ..ledger.requests import RequestInput, utc_now
from .queue import Connection, Cursor, Lease, Queue, open_queue
from .webhooks import WebhookWorker

log = logging.getLogger("lakehouse_dsr.service")
INGEST_BATCH = 5_000
INGESTER_NICENESS = 10  # added to the server's (nice(2)); its lag is `dsr_intake_ingester_lag_seconds`
STOP_SECONDS = 3.0  # once asked to stop, no batch starts later than this
# A batch still in hand this long after the ask is abandoned: below the server's wait for the child
# (intake.CLOSE_SECONDS - intake.MAIL_STOP_SECONDS), so the child exits 0 before its server would kill it.
ABANDON_SECONDS = STOP_SECONDS + 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ingest(queue: Queue, ledger: Ledger, may_start: Callable[[], bool] | None = None) -> int:
    """Move every acknowledged, verified request into the ledger: one ledger commit (and one audit
    commit) per `INGEST_BATCH`, then the queue forgets their identifiers. Exactly once: the ledger
    adds an id only if it is not there yet, so a crash between the two steps adds nothing twice.
    `may_start`: asked before each batch (a stopping ingester's deadline); none starts once it says no.
    Returns requests moved. Takes no lease: `ingest_leased` does."""
    moved = 0
    while may_start is None or may_start():
        # Reads on a connection of their own: through the group commits, they would wait for the write
        # lock that the server's filings hold most of the time under load.
        rows = queue.read(lambda c: c.execute(
            "SELECT request_id, request_type, regulation, subject_id, received_at FROM intake"
            " WHERE ingested_at IS NULL AND state = 'received' ORDER BY received_at LIMIT ?", (INGEST_BATCH,)
        ).fetchall())
        if not rows:
            return moved
        ledger.submit([RequestInput(r["subject_id"], r["request_type"], r["regulation"],
                                    datetime.fromisoformat(r["received_at"]), r["request_id"]) for r in rows])
        faults.failpoint("after_intake_ledger_commit")
        done = [(utc_now().isoformat(), r["request_id"]) for r in rows]

        def mark_ingested(c: Connection, done: list[tuple[str, str]] = done) -> Cursor:
            return c.executemany(
                "UPDATE intake SET ingested_at = ?, subject_id = NULL, email = NULL WHERE request_id = ?", done)

        queue.call(mark_ingested)
        moved += len(rows)
    if moved:
        queue.scrub()
    return moved


def _waiting(c: Connection) -> bool:
    return c.execute("SELECT 1 FROM intake WHERE ingested_at IS NULL AND state = 'received' LIMIT 1"
                     ).fetchone() is not None


def ingest_leased(queue: Queue, ledger: Ledger, may_start: Callable[[], bool] | None = None, wait: float = 0.0,
                  lease: Lease | None = None) -> int:
    """`ingest` under the queue's `ingest` lease (one ingester at a time across every process sharing the
    queue), if anything waits: 0 when nothing does, or when the lease stays taken for `wait` seconds (its
    holder moves them). Cost with nothing waiting: one indexed query, no lease taken."""
    if not queue.read(_waiting):
        return 0
    owned = lease is None
    lease = lease or queue.lease("ingest")
    try:
        with lease.hold(wait) as held:
            if not held:
                return 0
            log.info("intake ingest: lease taken at %s", utc_now().isoformat())
            moved = 0
            try:
                moved = ingest(queue, ledger, may_start)
            finally:
                log.info("intake ingest: %d request(s) moved into the ledger; lease released at %s", moved,
                         utc_now().isoformat())
            return moved
    finally:
        if owned:
            lease.close()


class Ingester:
    """The child process, the pipe that wakes and stops it, and a thread that starts it again if it crashes."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the pipe's write end is replaced when a child is started again
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None  # the write end of the pipe to the child
        self._ready: int | None = None  # the read end of the child's pipe saying it is ready; None once it has
        self.restarts = 0  # children started again after a crash (`/metrics`)
        self._watch = threading.Thread(target=self._keep_alive, name="intake-ingester-watch", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._watch.start()

    def alive(self) -> bool:
        """The child runs, is ready to ingest (its queue and ledger opened) and is not being stopped."""
        if self._stopping.is_set() or self._process is None or self._process.poll() is not None:
            return False
        with self._lock:
            if self._ready is not None:
                try:
                    os.read(self._ready, 1)  # a byte once ready; end of file if it died before
                except BlockingIOError:
                    return False
                os.close(self._ready)
                self._ready = None
        return self._process.poll() is None

    def wake(self) -> None:
        """Ingest now rather than at the next tick. Never blocks: a full pipe already holds a wake-up."""
        with self._lock:
            if self._pipe is not None:
                try:
                    os.write(self._pipe, b"w")
                except (BlockingIOError, BrokenPipeError):  # a wake-up is waiting, or the child is gone
                    pass

    def stop(self, timeout: float = 6) -> None:
        """Ask the child to stop and wait for it: it starts no batch after `STOP_SECONDS` and abandons one
        still in hand after `ABANDON_SECONDS`. After `timeout` (a child that does not get as far as its
        exit) it is killed, which is as safe: a request is marked ingested only once the ledger has it,
        and the ledger adds an id once."""
        self._stopping.set()
        if self._watch.is_alive():
            self._watch.join(timeout)
        with self._lock:
            if self._pipe is not None:
                os.close(self._pipe)  # the child reads end of file: what it can move in time, then it exits
                self._pipe = None
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("intake ingester still busy after %.0f s: killed (its requests stay queued)", timeout)
                self._process.kill()
                self._process.wait()

    def _spawn(self) -> None:
        reader, writer = os.pipe()
        os.set_blocking(writer, False)
        ready_reader, ready_writer = os.pipe()
        os.set_blocking(ready_reader, False)
        # A fresh interpreter (the server has threads: never fork it) in a process group of its own.
        process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                   pass_fds=(reader, ready_writer), process_group=0)
        os.close(reader)
        os.close(ready_writer)
        assert process.stdin is not None
        try:
            with process.stdin:
                process.stdin.write(pickle.dumps((self.settings, os.getpid(), reader, ready_writer)))
        except BrokenPipeError:  # it died at once: the watch sees it and starts another
            pass
        with self._lock:
            for previous in (self._pipe, self._ready):
                if previous is not None:
                    os.close(previous)
            self._process, self._pipe, self._ready = process, writer, ready_reader

    def _keep_alive(self) -> None:
        while not self._stopping.wait(max(1.0, self.settings.intake.ingest_interval_seconds)):
            process = self._process
            if process is None or process.poll() is None:
                continue
            if process.returncode == 0:  # asked to stop by a signal of its own: not ours to undo
                log.warning("intake ingester stopped on a signal; acknowledged requests stay queued until the "
                            "service starts again")
                return
            log.warning("intake ingester ended (exit %s); starting it again", process.returncode)
            self.restarts += 1
            self._spawn()


class _Stop:
    """The child's stop, asked by a signal of its own or by its server closing the pipe (the pipe's
    bytes are wake-ups): from the ask on, no batch starts after `STOP_SECONDS`, and one still in hand
    after `ABANDON_SECONDS` is abandoned (see the module). A thread reads the pipe, so the clock starts
    when the server closes it, even while the child is busy with a batch."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self._until: float | None = None

    @property
    def asked(self) -> bool:
        return self._until is not None

    def may_start(self) -> bool:
        return self._until is None or time.monotonic() < self._until

    def ask(self) -> None:
        if self._until is None:
            self._until = time.monotonic() + STOP_SECONDS
            self.wake.set()
            abandon = threading.Timer(ABANDON_SECONDS, self._abandon)
            abandon.daemon = True
            abandon.start()

    def watch(self, pipe: int) -> None:
        while os.read(pipe, 4096):
            self.wake.set()
        self.ask()  # end of file: the server stops (or died)

    @staticmethod
    def _abandon() -> None:
        log.warning("intake ingester: the batch in hand is not done %.0f s after the stop; abandoned (its "
                    "requests stay queued for the next start)", ABANDON_SECONDS)
        logging.shutdown()
        os._exit(0)  # no clean-up waits on the batch: the queue and the ledger are safe as after a crash


def _child(settings: Settings, parent: int, pipe: int, ready: int) -> None:
    # Below the server's priority: a filing waits on the server, nobody waits on a batch. On a busy host
    # the scheduler then gives the server its share first, and the ingester the rest.
    os.nice(INGESTER_NICENESS)
    stop = _Stop()
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, lambda _signal, _frame: stop.ask())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    queue, ledger = open_queue(settings), Ledger(settings)
    lease = queue.lease("ingest")
    # Webhooks here too, for the same reason: their ledger reads would hold up the server's answers.
    webhooks = WebhookWorker(settings, queue, ledger) if settings.webhooks else None
    if webhooks:
        webhooks.start()
    threading.Thread(target=stop.watch, args=(pipe,), name="intake-ingester-pipe", daemon=True).start()
    os.write(ready, b"r")
    os.close(ready)
    try:
        while os.getppid() == parent:  # an orphan (its server was killed) stops before touching anything
            stop.wake.clear()
            try:
                ingest_leased(queue, ledger, stop.may_start, lease=lease)
            except Exception as exc:  # the catalog is down, say: everything stays queued, tried next tick
                log.warning("intake ingest: %s", first_line(exc, with_type=True))
            if stop.asked:
                return
            stop.wake.wait(settings.intake.ingest_interval_seconds)
    finally:
        if webhooks:
            webhooks.stop()
        lease.close()
        queue.close()


if __name__ == "__main__":  # the child: what to ingest from, and its server, come pickled on stdin
    _child(*pickle.load(sys.stdin.buffer))
