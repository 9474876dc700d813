"""Deadline-aware purge batching: erase logically at once, purge physically once for many runs,
and never let a request reach its due date (minus the margin) unpurged or unproven."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.config import PurgeSettings
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput, due_date
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.purge import purge_deadline, purge_due

DAY0 = date(2026, 3, 2)
BATCHED = {"policy": "batched", "max_delay_days": 7, "safety_margin_days": 3}


@pytest.mark.parametrize("max_delay, margin", list(itertools.product([0, 1, 7, 30, 90], [0, 3, 10])))
def test_daily_runs_never_let_a_request_pass_its_deadline(max_delay, margin):
    """Simulate a year of daily runs with requests arriving every day under both regulations."""
    policy = PurgeSettings(policy="batched", max_delay_days=max_delay, safety_margin_days=margin)
    waiting: dict[tuple, date] = {}
    purges = 0
    for offset in range(365):
        today = DAY0 + timedelta(days=offset)
        for regulation, extended in (("gdpr", False), ("ccpa", False), ("gdpr", True), ("ccpa", True)):
            received = today - timedelta(days=offset % 5)  # some arrive late in the queue
            due = due_date(received, regulation, extended)
            deadline = purge_deadline(today, due, policy)
            assert deadline <= due - timedelta(days=margin) and deadline <= today + timedelta(days=max_delay)
            waiting[(offset, regulation, extended)] = deadline
        if purge_due(waiting.values(), today):
            purges += 1
            waiting.clear()  # one purge completes every waiting request
        assert all(d > today for d in waiting.values())  # whoever still waits has time left
    if max_delay >= 7:
        assert purges <= 365 // 7 + 1  # batching: far fewer purges than runs


def test_immediate_policy_purges_in_the_same_run():
    assert purge_deadline(DAY0, DAY0 + timedelta(days=30), PurgeSettings()) == DAY0
    assert purge_due([DAY0], DAY0) and not purge_due([], DAY0)


def _submit(spark, settings, index: int, regulation: str = "gdpr", received: date = DAY0) -> str:
    at = datetime.combine(received, datetime.min.time(), tzinfo=UTC)
    request = RequestInput(synth.user_id(SEED, index), "erase", regulation, at)
    return Ledger(settings).submit([request]).created[0]


def _on_schedule(spark, settings, today: date) -> dict[str, str]:
    """Statuses by request; asserts every open request still has time before due date minus margin."""
    margin = timedelta(days=settings.purge.safety_margin_days)
    statuses = {}
    for r in Ledger(settings).statuses(today):
        statuses[r.request_id] = r.status
        if r.status != "completed":
            assert today < date.fromisoformat(r.due_date) - margin, r
        if r.status == "erased":
            purge_by = date.fromisoformat(r.purge_by)
            assert today < purge_by <= date.fromisoformat(r.due_date) - margin
    return statuses


def _rows_of(spark, settings, subject: str, snapshot_id: int | None = None) -> int:
    at = f" VERSION AS OF {snapshot_id}" if snapshot_id else ""
    rows = spark.sql(f"SELECT user_id FROM {settings.table('demo.events')}{at}")
    return rows.where(F.col("user_id") == subject).count()


def _storage_values(settings) -> set:
    values = set()
    for file in settings.catalog.local_warehouse().rglob("*.parquet"):
        for column in pq.read_table(file).itercolumns():
            values.update(v for v in column.to_pylist() if isinstance(v, str))
    return values


def test_batched_policy_purges_once_before_any_deadline(spark, new_lakehouse):
    settings = new_lakehouse(purge=BATCHED)
    subject_a, subject_b = synth.user_id(SEED, 1), synth.user_id(SEED, 2)
    first_snapshot = spark.sql(f"SELECT snapshot_id FROM {settings.table('demo.events')}.snapshots "
                               "ORDER BY committed_at DESC LIMIT 1").first().snapshot_id
    assert _rows_of(spark, settings, subject_a) > 0 and _rows_of(spark, settings, subject_b) > 0

    # Day 0: A is erased logically; the purge is scheduled 7 days out (due date is a month away).
    request_a = _submit(spark, settings, 1)
    report = run(spark, settings, today=DAY0)
    assert [(r.request_id, r.status) for r in report.requests] == [(request_a, "erased")]
    assert report.purge_schedule == {"policy": "batched", "purged": False, "waiting": 1, "next_purge_by": "2026-03-09"}
    assert "purge" not in report.seconds and report.tables["demo.events"]["purge"] == {}
    assert report.tables["demo.events"]["verification"]["physical"] is False
    assert _rows_of(spark, settings, subject_a) == 0  # gone for every reader...
    assert _rows_of(spark, settings, subject_a, first_snapshot) > 0  # ...but still in history: not completed
    assert subject_a in _storage_values(settings)
    assert _on_schedule(spark, settings, DAY0) == {request_a: "erased"}
    assert Ledger(settings).request(request_a).purge_by == "2026-03-09"

    # Day 2: B joins the wait; nothing is purged yet.
    request_b = _submit(spark, settings, 2, received=DAY0 + timedelta(days=2))
    report = run(spark, settings, today=DAY0 + timedelta(days=2))
    assert [(r.request_id, r.status) for r in report.requests] == [(request_b, "erased")]
    assert report.purge_schedule["waiting"] == 2 and report.purge_schedule["next_purge_by"] == "2026-03-09"
    assert _on_schedule(spark, settings, DAY0 + timedelta(days=2)) == {request_a: "erased", request_b: "erased"}

    # Day 5: a run with nothing new and nothing due changes no table.
    before = spark.sql(f"SELECT count(*) n FROM {settings.table('demo.events')}.snapshots").first().n
    report = run(spark, settings, today=DAY0 + timedelta(days=5))
    assert report.requests == [] and report.purge_schedule["waiting"] == 2
    assert spark.sql(f"SELECT count(*) n FROM {settings.table('demo.events')}.snapshots").first().n == before

    # Day 7, A's purge deadline: one purge serves both; both are proven and completed.
    report = run(spark, settings, today=DAY0 + timedelta(days=7))
    assert sorted((r.request_id, r.status) for r in report.requests) == sorted(
        [(request_a, "completed"), (request_b, "completed")])
    assert report.purge_schedule == {"policy": "batched", "purged": True, "waiting": 0, "next_purge_by": None}
    events = report.tables["demo.events"]
    assert events["erase"] == {} and events["purge"]["data_files_rewritten"] > 0
    assert events["verification"]["physical"] and events["verification"]["passed"]
    assert not {subject_a, subject_b} & _storage_values(settings)
    evidence = Ledger(settings).evidence([request_a])[request_a]
    assert evidence["erased_in_run"] != evidence["run_id"]
    assert evidence["tables"]["demo.events"]["purged"] and evidence["tables"]["demo.events"]["rows"] > 0
    assert evidence["tables"]["demo.events"]["checks"] == {"live": True, "history": True, "storage": True,
                                                           "collateral": True}
    assert set(_on_schedule(spark, settings, DAY0 + timedelta(days=7)).values()) == {"completed"}
    assert Ledger(settings).request(request_a).purge_by is None  # set only while a request waits


def test_request_close_to_its_due_date_is_purged_in_the_same_run(spark, new_lakehouse):
    settings = new_lakehouse(purge=BATCHED)
    today = DAY0 + timedelta(days=60)
    # CCPA, received 43 days ago: due in 2 days, inside the 3-day margin.
    request = _submit(spark, settings, 3, "ccpa", received=today - timedelta(days=43))
    report = run(spark, settings, today=today)
    assert [(r.request_id, r.status) for r in report.requests] == [(request, "completed")]
    assert report.purge_schedule["purged"] and report.tables["demo.events"]["verification"]["physical"]
    assert synth.user_id(SEED, 3) not in _storage_values(settings)


def test_request_with_live_rows_left_is_failed_not_erased(spark, new_lakehouse):
    """A logical erasure that leaves live rows is not scheduled for purge: it stays open to be retried."""
    settings = new_lakehouse(purge=BATCHED)
    request = _submit(spark, settings, 4)
    ledger = Ledger(settings)
    report = run(spark, settings, today=DAY0)
    assert report.requests[0].status == "erased"
    # A late backfill brings the subject back before the purge.
    spark.table(settings.table("demo.events")).where(F.col("user_id") == synth.user_id(SEED, 5)) \
        .withColumn("user_id", F.lit(synth.user_id(SEED, 4))).writeTo(settings.table("demo.events")).append()
    report = run(spark, settings, today=DAY0 + timedelta(days=7))
    (result,) = report.requests
    assert result.request_id == request and result.status == "failed"
    assert "rows in the current snapshot" in result.reason
    assert ledger.request(request).status == "failed"
    report = run(spark, settings, today=DAY0 + timedelta(days=8))  # retried: erased again, due date close
    assert [(r.request_id, r.status) for r in report.requests] == [(request, "erased")]
