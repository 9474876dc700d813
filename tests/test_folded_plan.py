"""A plan folded into the rewrite (stages/erase.py's `folds`): where no metadata narrows a table's
files and a sampled file holds several requests' rows, the plan reads no rows; the rewrite of
every file counts the requested rows itself, and its counts are the plan's (the run's evidence per
request). A sorted table, or a batch the sample does not find spread, keeps its plan; a rewrite
that finds no one commits nothing and leaves no file behind.

Which rows hold whom is counted independently, with pyarrow over the table's files before the run;
what is left is read with pyiceberg (delta-rs for the Delta table).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from helpers import SEED, delta_rows, event_log_conf, event_logs, make_settings, write_config
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


def spread_lake(spark, tmp_path: Path, table_format: str = "iceberg", **erase):
    """The events table alone, appended in four batches (every user in every file, in no order),
    read and rewritten by Spark as a large table is (a Delta table without a change data feed, so
    the engine rewrites its files itself). `erase`: more erase settings."""
    mapping = {"key": "user_id", **({"format": "delta"} if table_format == "delta" else {})}
    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0}, erase={"in_driver_max_bytes": 0, **erase},
                             delta={"warehouse": str(tmp_path / "delta")},
                             datamap={"subject": "user_id", "identifiers": {}, "tables": {EVENTS: mapping}})
    attach(spark, settings)
    synth.generate(spark, settings, users=30, events=2400, seed=SEED, batches=4)
    if table_format == "delta":
        spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')")
    assert len(file_rows(settings)) >= 4
    return settings


def file_rows(settings) -> list[int]:
    """Rows per live data file of the events table, from pyiceberg's or delta-rs's metadata."""
    delta = settings.delta_tables().get(EVENTS)
    if delta is not None:
        return DeltaTable(delta).get_add_actions(flatten=True).column("num_records").to_pylist()
    return [f["record_count"] for f in open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()]


def rows_per_user(settings) -> collections.Counter:
    """Live rows per user_id, read with pyiceberg or delta-rs."""
    delta = settings.delta_tables().get(EVENTS)
    if delta is not None:
        return collections.Counter(delta_rows(delta).column("user_id").to_pylist())
    ids = open_catalog(settings).load_table(EVENTS).scan(selected_fields=("user_id",)).to_arrow().column("user_id")
    return collections.Counter(ids.to_pylist())


def erase_run(spark, settings, subjects: list[str]):
    """A run erasing `subjects`; (its report, each subject's request id)."""
    created = Ledger(settings).submit([RequestInput(s, "erase") for s in subjects]).created
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    return report, dict(zip(subjects, created, strict=True))


@pytest.mark.parametrize("beyond_the_driver", [False, True], ids=["values-in-driver", "values-beyond-driver"])
@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_batch_in_every_file_is_erased_in_one_read_with_the_plans_counts(spark, tmp_path, monkeypatch, table_format,
                                                                           beyond_the_driver):
    """`beyond_the_driver`: a batch too large to hold in the driver's JVM (a million ids; here
    MAX_VALUES and the batch's limit lowered): the rewrite counts requested rows by their values'
    positions in the batch's Arrow rows, and the sample is read by a Spark job."""
    if beyond_the_driver:
        monkeypatch.setattr(skipping, "MAX_VALUES", 0)
    settings = spread_lake(spark, tmp_path, table_format,
                           **({"in_driver_max_requests": 0} if beyond_the_driver else {}))
    before = rows_per_user(settings)
    rows_of_files = file_rows(settings)
    subjects = sorted(before)[:6]
    report, ids = erase_run(spark, settings, subjects)
    erased = report.tables[EVENTS]["erase"]
    assert erased["strategy"] == "rewrite_files" and erased["folded"] and erased["rows_scanned"] == 0
    assert erased["collateral"]["ok"] and erased["data_files_rewritten"] == erased["skipping"]["total_files"]
    assert erased["rows_matched"] == erased["rows_changed"] == sum(before[s] for s in subjects)
    # The erase stage read each row once (the rewrite), the new files once (the check) and the sampled
    # file's keys (in the driver, or a Spark job on Delta), where a plan would have read every key first.
    total, matched = sum(before.values()), erased["rows_matched"]
    extra = report.cost["erase"]["rows_read"] - (total + total - matched)
    # Delta: Spark also reads the log's JSON commits as text lines, far fewer than the keys a plan reads
    assert 0 < extra <= max(rows_of_files) if table_format == "iceberg" else 0 < extra < total // 2
    assert report.cost["erase"]["driver_files"] == (1 if table_format == "iceberg" and not beyond_the_driver else 0)
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
    raw["spark"]["conf"].update(event_log_conf(tmp_path / "events"))
    config.write_text(yaml.safe_dump(raw))
    (tmp_path / "events").mkdir()
    Ledger(settings).submit([RequestInput(s, "erase") for s in subjects])
    out = dsr_output(config, "run", "--report", str(tmp_path / "report.json"))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tables"][EVENTS]["erase"]["folded"]
    logs = event_logs(tmp_path / "events")
    assert any("counting" in log for log in logs)  # the counting rewrite is in the plans
    for subject in subjects:
        assert subject not in out and not any(subject in log for log in logs)
