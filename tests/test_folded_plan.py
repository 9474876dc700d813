"""A plan folded into the rewrite (stages/erase.py's `folds`): where no metadata narrows a table's
files and a sampled file holds several requests' rows, the plan reads no rows; the rewrite of
every file counts the requested rows itself, and its counts are the plan's (the run's evidence per
request). A sorted table, or a batch the sample does not find spread, keeps its plan; a rewrite
that finds no one commits nothing and leaves no file behind.

Which rows hold whom is counted independently, with pyarrow over the table's files before the run;
what is left is read with pyiceberg.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from helpers import SEED, make_settings, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.datamap import KeyGroup
from lakehouse_dsr.lake import skipping
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from test_skipping import clustered_lake, dsr_output, live_files

EVENTS = "demo.events"


def spread_lake(spark, tmp_path: Path):
    """The events table alone, appended in four batches (every user in every file, in no order),
    read and rewritten by Spark as a large table is."""
    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0}, erase={"in_driver_max_bytes": 0},
                             datamap={"subject": "user_id", "identifiers": {}, "tables": {EVENTS: {"key": "user_id"}}})
    attach(spark, settings)
    synth.generate(spark, settings, users=30, events=2400, seed=SEED, batches=4)
    assert len(live_files(settings)) >= 4
    return settings


def rows_per_user(settings) -> collections.Counter:
    """Live rows per user_id, read with pyiceberg and pyarrow."""
    ids = open_catalog(settings).load_table(EVENTS).scan(selected_fields=("user_id",)).to_arrow().column("user_id")
    return collections.Counter(ids.to_pylist())


def erase_run(spark, settings, subjects: list[str]):
    """A run erasing `subjects`; (its report, each subject's request id)."""
    created = Ledger(settings).submit([RequestInput(s, "erase") for s in subjects]).created
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    return report, dict(zip(subjects, created, strict=True))


def test_a_batch_in_every_file_is_erased_in_one_read_with_the_plans_counts(spark, tmp_path):
    settings = spread_lake(spark, tmp_path)
    before = rows_per_user(settings)
    file_rows = [f["record_count"] for f in open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()]
    subjects = sorted(before)[:6]
    report, ids = erase_run(spark, settings, subjects)
    erased = report.tables[EVENTS]["erase"]
    assert erased["strategy"] == "rewrite_files" and erased["folded"] and erased["rows_scanned"] == 0
    assert erased["collateral"]["ok"] and erased["data_files_rewritten"] == erased["skipping"]["total_files"]
    assert erased["rows_matched"] == erased["rows_changed"] == sum(before[s] for s in subjects)
    # The erase stage read each row once (the rewrite), the new files once (the check) and the sampled
    # file's keys in the driver, where a plan would have read every key first.
    total, matched = sum(before.values()), erased["rows_matched"]
    assert 0 < report.cost["erase"]["rows_read"] - (total + total - matched) <= max(file_rows)
    assert report.cost["erase"]["driver_files"] == 1
    evidence = Ledger(settings).evidence([ids[s] for s in subjects])
    assert {s: evidence[ids[s]]["tables"][EVENTS]["rows"] for s in subjects} == {s: before[s] for s in subjects}
    after = rows_per_user(settings)
    assert not set(after) & set(subjects) and after == {u: n for u, n in before.items() if u not in subjects}


def test_a_batch_the_sample_does_not_find_spread_keeps_its_plan(spark, tmp_path):
    settings = spread_lake(spark, tmp_path)
    before = rows_per_user(settings)
    subject = sorted(before)[0]  # one request: a sampled file cannot show the batch spread
    erased = erase_run(spark, settings, [subject])[0].tables[EVENTS]["erase"]
    assert not erased["folded"] and erased["rows_scanned"] == sum(before.values())
    assert erased["rows_matched"] == before[subject] and rows_per_user(settings)[subject] == 0


def test_a_sorted_table_keeps_its_plan_and_rewrites_only_the_files_holding_the_batch(spark, tmp_path):
    settings = clustered_lake(spark, tmp_path)
    before, files = rows_per_user(settings), live_files(settings)
    subjects = sorted(before)[:6]
    erased = erase_run(spark, settings, subjects)[0].tables[EVENTS]["erase"]
    assert not erased["folded"] and erased["rows_matched"] == sum(before[s] for s in subjects)
    assert 0 < erased["data_files_rewritten"] < len(files)


def test_a_rewrite_that_finds_no_one_commits_nothing_and_leaves_no_file(spark, tmp_path):
    settings = spread_lake(spark, tmp_path)
    table = Lake.of(spark, settings).table(EVENTS)
    snapshot = table.current_snapshot()
    data_dir = Path(open_catalog(settings).load_table(EVENTS).location().removeprefix("file:")) / "data"
    on_disk = set(data_dir.rglob("*.parquet"))
    candidates = skipping.plan(table, snapshot.snapshot_id, (KeyGroup("user_id", "user_id"),), (None,))  # every file
    asked = []
    committed = table.overwrite_files(candidates, skipping.read(candidates),
                                      commit_if=lambda: asked.append(True) or False)
    assert asked == [True] and committed is False
    assert table.current_snapshot().snapshot_id == snapshot.snapshot_id
    assert set(data_dir.rglob("*.parquet")) == on_disk  # the written files were deleted
    assert sum(pq.read_metadata(p).num_rows for p in on_disk) == sum(rows_per_user(settings).values())


def test_no_identifier_in_the_event_log_of_a_run_whose_rewrite_counts(spark, tmp_path):
    """A folded run as a process, with Spark's event log on: the counting rewrite's plans, its
    accumulators and the process's output name no subject."""
    settings = spread_lake(spark, tmp_path)
    subjects = sorted(rows_per_user(settings))[:6]
    config = write_config(settings, tmp_path / "dsr.yaml")
    raw = yaml.safe_load(config.read_text())
    raw["spark"]["conf"].update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(tmp_path / "events")})
    config.write_text(yaml.safe_dump(raw))
    (tmp_path / "events").mkdir()
    Ledger(settings).submit([RequestInput(s, "erase") for s in subjects])
    out = dsr_output(config, "run", "--report", str(tmp_path / "report.json"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tables"][EVENTS]["erase"]["folded"]
    logs = [p.read_text(errors="replace") for p in (tmp_path / "events").iterdir()]
    assert any("counting" in log for log in logs)  # the counting rewrite is in the plans
    for subject in subjects:
        assert subject not in out and not any(subject in log for log in logs)
