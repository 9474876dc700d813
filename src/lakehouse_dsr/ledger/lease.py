"""One run at a time: a lease on the ledger, held in the ledger's own `lease` table.

A run takes the lease before it acts on any request and gives it back at the end. Taking,
renewing and returning are compare-and-set commits on that table (each asserts the snapshot it
read), so two processes, on one host or on many, can never both hold it. A holder renews it
every quarter of `run.lease_seconds` from a background thread; a holder that died (`kill -9`,
lost host) stops renewing and its lease lapses after `run.lease_seconds`, or at once when it ran
on this host and its process is gone (or is this process, which no longer holds it: a return that
failed). A lease that lapsed without being returned names a run that was interrupted: the next
holder finishes its work (see runner/).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from ..exceptions import LedgerBusyError
from .store import Store

TABLE = "lease"
# The runs whose lease this process holds: a lease naming this process and a run not here was not
# returned (its release failed, on a full disk say) and is no one's.
_HELD_HERE: set[str] = set()


@dataclass(frozen=True)
class Holder:
    run_id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    requests: tuple[str, ...] = ()
    # Runs that lapsed without returning the lease, whose work this holder took over (oldest first).
    interrupted: tuple[str, ...] = ()

    def alive(self, now: datetime) -> bool:
        """Still renewing: not lapsed, and, on this host, its process still exists."""
        if now >= self.expires_at:
            return False
        if self.host == socket.gethostname():
            if self.pid == os.getpid():
                return self.run_id in _HELD_HERE
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:  # another user's process: it exists
                return True
        return True

    def row(self) -> dict:
        return {"run_id": self.run_id, "host": self.host, "pid": self.pid, "started_at": self.started_at,
                "heartbeat_at": self.heartbeat_at, "expires_at": self.expires_at,
                "requests": _listed(self.requests), "interrupted": _listed(self.interrupted)}

    @staticmethod
    def of(row: dict) -> Holder:
        return Holder(row["run_id"], row["host"], int(row["pid"]), row["started_at"], row["heartbeat_at"],
                      row["expires_at"], tuple(json.loads(row["requests"] or "[]")),
                      tuple(json.loads(row.get("interrupted") or "[]")))


@functools.lru_cache(maxsize=4)
def _listed(ids: tuple[str, ...]) -> str:
    """`ids` as JSON, encoded once: every heartbeat writes the same list (a million ids: 0.3 s)."""
    return json.dumps(list(ids))


def _holding_run(store: Store) -> str | None:
    """The run named in the lease table, if any. Cost: one read of one small column."""
    rows = store.rows(TABLE, None, ("run_id",))
    return rows[0]["run_id"] if rows else None


def current_holder(store: Store) -> Holder | None:
    """The run holding the lease (alive or lapsed without returning it), if any. Cost: one small read."""
    rows = store.rows(TABLE)
    return Holder.of(rows[0]) if rows else None


class Lease:
    """The lease of one run: `acquire()`, then `renew()` on a heartbeat, `release()` at the end."""

    def __init__(self, store: Store, run_id: str, seconds: float):
        self.store, self.run_id, self.seconds = store, run_id, seconds
        self.holder: Holder | None = None
        self.lost: str | None = None  # set when a renewal found someone else holding it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def acquire(self, wait: bool, poll_seconds: float = 1.0, notify=None) -> Holder:
        """Take the lease; returns this run's holder, whose `interrupted` names the runs that lapsed
        without returning it (and the requests they worked on are in its `requests`): their work is
        this run's to finish, and stays listed until this run returns the lease.

        Another live holder: LedgerBusyError at once (`wait=False`), or wait for it, calling
        `notify(holder)` once. Cost: a read and a commit of a one-row table (plus a poll per second)."""
        told = False
        while True:
            snapshot = self.store.snapshot_id(TABLE)
            previous = current_holder(self.store)
            now = datetime.now(UTC)
            if previous is not None and previous.alive(now) and previous.run_id != self.run_id:
                if not wait:
                    raise LedgerBusyError(f"another run ({previous.run_id}, started at "
                                          f"{previous.started_at:%Y-%m-%d %H:%M:%S} UTC on {previous.host}) holds "
                                          "the ledger; try again when it has finished, or set run.concurrent: wait")
                if notify and not told:
                    notify(previous)
                    told = True
                time.sleep(poll_seconds)
                continue
            inherited = (*previous.interrupted, previous.run_id) if previous else ()
            mine = Holder(self.run_id, socket.gethostname(), os.getpid(), now, now,
                          now + timedelta(seconds=self.seconds), previous.requests if previous else (), inherited)
            if self.store.compare_and_set(TABLE, snapshot, [mine.row()]):
                self.holder = mine
                _HELD_HERE.add(self.run_id)
                self._start_heartbeat()
                return mine
            # another process committed between our read and our commit: look again

    @contextmanager
    def held(self, wait: bool, notify: Callable[[Holder], None] | None = None) -> Iterator[Holder]:
        """`acquire` for the block, `release` after it, whatever happens in it (a lease a crash could
        not return lapses after `run.lease_seconds`)."""
        holder = self.acquire(wait, notify=notify)
        try:
            yield holder
        finally:
            self.release()

    def working_on(self, request_ids: list[str]) -> None:
        """Record which requests this run works on (`dsr status` shows them in progress); those of
        interrupted runs stay listed."""
        holder = cast(Holder, self.holder)  # after acquire()
        self._write(requests=tuple(sorted({*holder.requests, *request_ids})))

    def renew(self) -> None:
        self._write()

    def _write(self, **changes) -> None:
        with self._lock:
            if self.holder is None or self.lost:
                return
            now = datetime.now(UTC)
            updated = Holder(**{**self.holder.__dict__, "heartbeat_at": now,
                                "expires_at": now + timedelta(seconds=self.seconds), **changes})
            committed = self._commit_while_ours([updated.row()])
            if committed is False:
                self.lost = "the run's lease on the ledger was taken over (its heartbeat lapsed)"
            elif committed:
                self.holder = updated

    def _commit_while_ours(self, rows: list[dict]) -> bool | None:
        """Make `rows` the lease table's content if this run still holds the lease: True when committed,
        False when another run holds it, None when other commits kept winning (the next beat retries)."""
        for _ in range(5):
            snapshot = self.store.snapshot_id(TABLE)
            if _holding_run(self.store) != self.run_id:
                return False
            if self.store.compare_and_set(TABLE, snapshot, rows):
                return True
        return None

    def check(self) -> None:
        """Raise if the lease was lost (then this run must not record anything)."""
        self.renew()
        if self.lost:
            raise LedgerBusyError(self.lost)

    def release(self) -> None:
        """Give the lease back (only if still ours) and drop the lease table's old snapshots."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        with self._lock:
            if self.holder is None:
                return
            try:
                self._commit_while_ours([])
            finally:  # not returned (a full disk): no longer held here either, so the next run takes it over
                _HELD_HERE.discard(self.run_id)
                self.holder = None
        self.store.purge_history(TABLE, orphan_min_age_minutes=60)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.seconds / 4):
                try:
                    self.renew()
                except Exception:  # a failed renewal is retried on the next beat; lapsing is the safe outcome
                    continue

        self._thread = threading.Thread(target=beat, name=f"lease-{self.run_id}", daemon=True)
        self._thread.start()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
