"""A run's access export beside its erasure (runner/exports.py's SharedExport): once the run's
identifiers are resolved, the export runs on a thread of its own while the erasure hashes and plans;
no erase commit starts before it ends, so its packages are those an export run first writes (a
person asking for a copy and erasure together gets the copy). Each stage's meter counts its own
Spark jobs, and the run hands its session back before its ledger commits.

What the packages must hold is read with pyiceberg, before the run."""

from __future__ import annotations

import json
import threading
import time

import pytest
from pyiceberg.expressions import EqualTo

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.lake import skipping
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.metrics import StageMeter
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import exports, run
from lakehouse_dsr.stages import erase

EVENTS = "demo.events"
BOTH, ERASED, ASKED = synth.user_id(SEED, 1), synth.user_id(SEED, 2), synth.user_id(SEED, 3)


def _timed(monkeypatch, module, name: str, log: list) -> None:
    """Record (name, thread, start, end) of each call of module.name."""
    real = getattr(module, name)

    def call(*args, **kwargs):
        start = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            log.append((name, threading.current_thread().name, start, time.monotonic()))
    monkeypatch.setattr(module, name, call)


@pytest.mark.parametrize("check", ["content", "count"])
def test_the_export_runs_beside_the_erasure_and_every_commit_waits_for_it(spark, new_lakehouse, monkeypatch, check):
    settings = new_lakehouse(erase={"collateral_check": check})
    events = open_catalog(settings).load_table(EVENTS)
    wanted = {s: sorted(events.scan(row_filter=EqualTo("user_id", s)).to_arrow().column("event_id").to_pylist())
              for s in (BOTH, ASKED)}
    assert all(wanted.values())
    log: list = []
    _timed(monkeypatch, exports, "export_requests", log)
    _timed(monkeypatch, erase, "plan_many", log)
    _timed(monkeypatch, erase, "apply", log)
    ledger = Ledger(settings)
    submitted = ledger.submit([RequestInput(BOTH, "erase"), RequestInput(ERASED, "erase"),
                               RequestInput(BOTH, "access"), RequestInput(ASKED, "access")]).created
    released: list = []

    def release(session) -> None:  # what the run has done when it hands the session back
        released.append(({s.request_id: s.status for s in Ledger(settings).statuses()}, len(skipping._staged)))

    whole = StageMeter(spark)
    mark = whole.mark()
    report = run(spark, settings, release=release)
    total = whole.since(mark)

    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    [(_, thread, started, ended)] = [e for e in log if e[0] == "export_requests"]
    plans = [e for e in log if e[0] == "plan_many"]
    commits = [e for e in log if e[0] == "apply"]
    assert thread.startswith("dsr-export") and plans and commits
    assert started < plans[0][3]  # beside the erasure's planning, not after it
    assert ended <= min(c[2] for c in commits)  # no erase commit before the export ended
    packages = [json.loads(p.read_text()) for p in (settings.export.directory / report.run_id).glob("req-*.json")]
    got = {p["subject"]["user_id"][0]: sorted(r["event_id"] for r in p["tables"][EVENTS]) for p in packages}
    assert got == wanted  # BOTH's copy too, made before the erasure
    # Each stage counts its own jobs: the export's once, in the export only.
    assert report.cost["export"]["stages"] > 0
    assert sum(c["stages"] for c in report.cost.values()) == total.stages, report.cost
    # The session is handed back once, after the Spark work (task sets released), before the outcomes.
    assert released == [({rid: "in_progress" for rid in submitted}, 0)]
