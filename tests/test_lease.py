"""One run at a time: the lease on the ledger, between threads, processes and (simulated) hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from helpers import SEED, make_settings
from lakehouse_dsr import synth
from lakehouse_dsr.exceptions import LedgerBusyError
from lakehouse_dsr.ledger.lease import Holder, Lease, current_holder
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(make_settings(tmp_path))


def _foreign_holder(ledger: Ledger, seconds: float) -> Holder:
    """A lease held by a run on another host (its process cannot be probed from here)."""
    now = datetime.now(UTC)
    holder = Holder("run-elsewhere", "another-host", 4242, now, now, now + timedelta(seconds=seconds), ("req-x",))
    assert ledger.store.compare_and_set("lease", ledger.store.snapshot_id("lease"), [holder.row()])
    return holder


def test_a_second_holder_is_refused_with_who_holds_it(ledger):
    first = Lease(ledger.store, "run-a", 60)
    assert first.acquire(wait=False).interrupted == ()
    try:
        with pytest.raises(LedgerBusyError, match=r"another run \(run-a, started at 20\d\d-.* UTC on .*\) holds "
                                                  "the ledger"):
            Lease(ledger.store, "run-b", 60).acquire(wait=False)
        first.working_on(["req-1", "req-2"])
        assert current_holder(ledger.store).requests == ("req-1", "req-2")
    finally:
        first.release()
    assert current_holder(ledger.store) is None
    second = Lease(ledger.store, "run-b", 60)
    assert second.acquire(wait=False).interrupted == ()  # returned properly: nothing to take over
    second.release()


def test_requests_of_the_holder_show_in_progress(ledger):
    created = ledger.submit([RequestInput("alice", "erase"), RequestInput("bob", "erase")]).created
    lease = Lease(ledger.store, "run-a", 60)
    lease.acquire(wait=False)
    lease.working_on(created[:1])
    try:
        assert {s.request_id: s.status for s in ledger.statuses()} == {created[0]: "in_progress",
                                                                       created[1]: "received"}
    finally:
        lease.release()
    assert {s.status for s in ledger.statuses()} == {"received"}


def test_a_lapsed_foreign_lease_is_taken_over_and_its_run_named_interrupted(ledger):
    _foreign_holder(ledger, seconds=2.5)
    with pytest.raises(LedgerBusyError, match="run-elsewhere"):
        Lease(ledger.store, "run-b", 60).acquire(wait=False)
    waited: list[str] = []
    start = time.monotonic()
    lease = Lease(ledger.store, "run-b", 60)
    holder = lease.acquire(wait=True, poll_seconds=0.2, notify=lambda h: waited.append(h.run_id))
    try:
        assert 1.5 < time.monotonic() - start < 15 and waited == ["run-elsewhere"]
        assert holder.interrupted == ("run-elsewhere",) and holder.requests == ("req-x",)
    finally:
        lease.release()


def test_a_dead_holder_on_this_host_blocks_nobody(ledger):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    now = datetime.now(UTC)
    gone = Holder("run-dead", os.uname().nodename, dead.pid, now, now, now + timedelta(hours=1))
    assert ledger.store.compare_and_set("lease", ledger.store.snapshot_id("lease"), [gone.row()])
    lease = Lease(ledger.store, "run-b", 60)
    try:
        assert lease.acquire(wait=False).interrupted == ("run-dead",)
    finally:
        lease.release()


def test_threads_racing_for_the_lease_get_it_one_at_a_time(ledger):
    ledger.ensure()
    holders: list[str] = []
    overlap: list[bool] = []
    lock = threading.Lock()

    def contend(name: str) -> None:
        lease = Lease(ledger.store, name, 60)
        lease.acquire(wait=True, poll_seconds=0.05)
        with lock:
            overlap.append(bool(holders))
            holders.append(name)
        time.sleep(0.1)
        with lock:
            holders.remove(name)
        lease.release()

    threads = [threading.Thread(target=contend, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(overlap) == 4 and not any(overlap)


@pytest.mark.slow
@pytest.mark.parametrize("concurrent", ["fail", "wait"])
def test_two_dsr_run_processes_started_together(spark, disk_lakehouse, tmp_path, concurrent):
    settings, config = disk_lakehouse
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "run": {"concurrent": concurrent}}))
    erased = [synth.user_id(SEED, i) for i in range(3)]
    created = Ledger(settings).submit([RequestInput(s, "erase") for s in erased]
                                      + [RequestInput(synth.user_id(SEED, 5), "access")]).created
    dsr = str(Path(sys.executable).parent / "dsr")
    procs = [subprocess.Popen([dsr, "-c", str(config), "run", "--report", str(tmp_path / f"r{i}.json")],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    busy = [o for p, o in zip(procs, outs, strict=True) if p.returncode == 3]
    if concurrent == "fail":
        assert codes == [0, 3], outs
        assert "another run (run-" in busy[0] and "holds the ledger" in busy[0] and "Traceback" not in busy[0]
    else:
        assert codes == [0, 0], outs
    # Every request processed once: one run completed them all, the other recorded no outcome.
    reports = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(2)
               if (tmp_path / f"r{i}.json").exists()]
    done = [r["request_id"] for report in reports for r in report["requests"]]
    assert sorted(done) == sorted(created)
    audit = [r for r in Ledger(settings).store.rows("audit") if r["event"] == "completed"]
    assert sorted(r["request_id"] for r in audit) == sorted(created)
    assert current_holder(Ledger(settings).store) is None
