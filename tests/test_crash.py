"""Crash and resume: `dsr run` killed (SIGKILL) at every named failpoint and at random moments.

Each kill is a real subprocess; the next run must finish the work: no request lost, none
completed without proof, no export of a killed run left behind, the ledger's history purged.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from helpers import SEED, dsr_run, snapshot_ids
from lakehouse_dsr import synth
from lakehouse_dsr.datamap import KeyGroup
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.stages.verify import verify_completed, verify_table

pytestmark = pytest.mark.slow
DEMO = ["demo.users", "demo.events", "demo.newsletter", "demo.orders"]
ERASED = [synth.user_id(SEED, i) for i in (1, 2, 3)]
COPIED = synth.user_id(SEED, 5)


@pytest.fixture
def lakehouse(spark, disk_lakehouse):
    settings, config = disk_lakehouse
    Ledger(settings).submit([RequestInput(s, "erase") for s in ERASED] + [RequestInput(COPIED, "access")])
    return settings, config


def statuses(spark, settings) -> dict[str, str]:
    return {r.request_id: r.status for r in Ledger(settings).statuses()}


def subject_rows(spark, settings) -> int:
    events = spark.table(settings.table("demo.events"))
    return events.where(F.col("user_id").isin(*ERASED)).count()


def export_runs(settings) -> list[str]:
    root = Path(settings.export.directory)
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def check_final_state(spark, settings, other_events: int) -> None:
    """Everything completed with proof, nothing else touched, nothing left behind."""
    ledger = Ledger(settings)
    assert set(statuses(spark, settings).values()) == {"completed"}
    assert subject_rows(spark, settings) == 0
    events = spark.table(settings.table("demo.events"))
    assert events.where(~F.col("user_id").isin(*ERASED)).count() == other_events
    assert all(not reasons for reasons in verify_completed(spark, settings).values())
    assert not ledger.purge_owed(ledger.journal.steps())
    completed = spark.createDataFrame([(r["request_id"], "user_id", r["subject_hash"])
                                       for r in ledger.requests(("completed",))],
                                      "request_id string, key_type string, key_hash string")
    plaintext = verify_table(Lake.of(spark, settings), settings.key_file(), ledger.requests_table,
                             [KeyGroup("subject_id", "user_id")], {"subject_id": StringType()}, completed, ledger.key)
    assert plaintext.live == plaintext.history == plaintext.storage == 0
    assert len(export_runs(settings)) == 1  # the run that completed the access request; killed runs' removed


def test_every_failpoint_then_resume(spark, lakehouse):
    settings, config = lakehouse
    ledger = Ledger(settings)
    before = snapshot_ids(spark, settings, DEMO)
    other_events = spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*ERASED)).count()
    assert subject_rows(spark, settings) > 0

    assert dsr_run(config, "after_start") == -signal.SIGKILL
    assert set(statuses(spark, settings).values()) == {"in_progress"}
    assert snapshot_ids(spark, settings, DEMO) == before

    assert dsr_run(config, "during_export") == -signal.SIGKILL
    assert set(statuses(spark, settings).values()) == {"in_progress"}
    assert snapshot_ids(spark, settings, DEMO) == before
    [killed_export] = export_runs(settings)
    assert list((Path(settings.export.directory) / killed_export).glob("req-*"))  # a package was written

    assert dsr_run(config, "after_erase") == -signal.SIGKILL
    assert set(statuses(spark, settings).values()) == {"in_progress"}
    assert subject_rows(spark, settings) == 0  # erased and committed, never recorded as done
    erased_by = {s.run_id for s in ledger.journal.steps(step="erased")}
    assert len(erased_by) == 1 and killed_export not in export_runs(settings)

    for failpoint in ("after_purge", "after_verify"):
        assert dsr_run(config, failpoint) == -signal.SIGKILL
        assert set(statuses(spark, settings).values()) == {"in_progress"}

    assert dsr_run(config, "after_finish") == -signal.SIGKILL
    assert set(statuses(spark, settings).values()) == {"completed"}
    assert ledger.purge_owed(ledger.journal.steps())  # outcomes recorded, plaintext still in the ledger's history

    assert dsr_run(config) == 0
    check_final_state(spark, settings, other_events)
    evidence = ledger.evidence(list(statuses(spark, settings)))
    erase_evidence = [e for e in evidence.values() if "tables" in e]
    # The killed run's commits stay the proof: the resumed runs found nothing left to erase.
    assert {e["tables"]["demo.events"]["erased_in_run"] for e in erase_evidence} == erased_by
    assert all(e["tables"]["demo.events"]["rows"] > 0 for e in erase_evidence)


def test_random_kills_then_a_clean_run(spark, lakehouse):
    settings, config = lakehouse
    other_events = spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*ERASED)).count()
    seed = int(os.environ.get("DSR_KILL_SEED", time.time()))
    rng = random.Random(seed)
    kills = [round(rng.uniform(4, 30), 1) for _ in range(3)]
    for delay in kills:
        dsr_run(config, kill_after=delay)
    assert dsr_run(config) == 0, f"kills after {kills} s (DSR_KILL_SEED={seed})"
    check_final_state(spark, settings, other_events)
