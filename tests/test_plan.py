"""`dsr plan` against the run it plans: what it predicts to touch (candidate files and bytes, rows,
strategy, files matched, bytes rewritten) is what the run then touches, and planning changes no table
and no ledger table (snapshot ids read by pyiceberg and delta-rs); every data-map problem is listed
with exit code 2 while the tables without one are still planned; `--json`'s fields."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import dsr_in_process, make_settings, snapshot_ids, write_config
from lakehouse_dsr.config import Settings
from lakehouse_dsr.datamap import DataMap
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import plan as plan_module
from lakehouse_dsr.runner import run
from lakehouse_dsr.runner.plan import measured_rates, plan

USERS = 12
TABLES = ["app.users", "app.mail", "app.events"]


def email(i: int) -> str:
    return f"person{i}@example.com"


def _datamap(table_format: str) -> dict:
    return {"subject": "user_id",
            "identifiers": {"email": {"table": "app.users", "subject_column": "user_id", "column": "email"}},
            "tables": {"app.users": {"key": "user_id", "format": table_format},
                       "app.mail": {"key": "address", "identifier": "email", "format": table_format},
                       "app.events": {"key": "user_id", "format": table_format}}}


def _lake(spark, root: Path, table_format: str, policy: str = "immediate") -> Settings:
    """Three tables: users (one file), mail by email (two files), events in three files by ranges of
    user ids (so data skipping leaves one of them for the first users)."""
    settings = make_settings(root, delta={"warehouse": str(root / "delta")},
                             purge={"orphan_min_age_minutes": 0, "policy": policy}, datamap=_datamap(table_format))
    attach(spark, settings)
    lake = Lake.of(spark, settings)
    lake.create_table("app.users", spark.createDataFrame(
        [(f"u{i:02d}", email(i), i) for i in range(USERS)], "user_id string, email string, n int").coalesce(1), {})
    lake.create_table("app.mail", spark.createDataFrame(
        [(email(i % USERS), f"subject {i}") for i in range(3 * USERS)], "address string, title string"
    ).coalesce(2), {})
    lake.create_table("app.events", spark.createDataFrame(
        [(f"u{i % USERS:02d}", i) for i in range(5 * USERS)], "user_id string, n int"
    ).repartitionByRange(3, "user_id").sortWithinPartitions("user_id"), {})
    return settings


def _ledger_state(spark, settings: Settings) -> tuple:
    ledger = Ledger(settings)
    return snapshot_ids(spark, settings, ledger.tables()), ledger.statuses()


# The batched policy: a run that purges nothing, planned so (and a Delta purge is a minute on 2 cores).
@pytest.mark.parametrize("table_format, policy", [  # a run on Delta costs 30-40 s here: make test stays under 10 min
    ("iceberg", "immediate"), pytest.param("delta", "batched", marks=pytest.mark.slow)])
def test_the_plan_predicts_what_the_run_touches_and_changes_nothing(spark, tmp_path, table_format, policy):
    settings = _lake(spark, tmp_path, table_format, policy)
    created = Ledger(settings).submit([RequestInput(s, "erase") for s in ("u00", "u01", "nobody")]).created
    tables_before, ledger_before = snapshot_ids(spark, settings, TABLES), _ledger_state(spark, settings)

    planned = plan(spark, settings)

    assert snapshot_ids(spark, settings, TABLES) == tables_before  # no commit to a table
    assert _ledger_state(spark, settings) == ledger_before  # nor to the ledger (its audit, lease, runs ...)
    assert planned.problems == [] and planned.not_planned == {}
    assert planned.requests.erase == 3 and planned.purge == (policy == "immediate")
    assert list(planned.tables) == ["app.events", "app.mail", "app.users"]  # the run's erase order
    assert [planned.tables[t].rows for t in TABLES] == [2, 6, 10]
    events = planned.tables["app.events"]
    assert (events.files, events.total_files, events.matched_files) == (1, 3, 1)  # skipping left one file
    assert planned.rates.rewrite_bytes_per_second.source == "default"  # no run recorded yet
    rates = planned.rates
    assert events.estimated_seconds == pytest.approx(events.rewrite_bytes / rates.rewrite_bytes_per_second.value)
    assert planned.estimated_seconds == pytest.approx(rates.fixed_seconds.value + 3 * rates.seconds_per_request.value
                                                      + sum(t.estimated_seconds for t in planned.tables.values()))

    report = run(spark, settings)

    done = "completed" if policy == "immediate" else "erased"  # batched: erased, waiting for the purge
    assert sorted(r.request_id for r in report.requests if r.status == done) == sorted(created), report.failed
    for table in TABLES:
        erased, forecast = report.tables[table]["erase"], planned.tables[table]
        assert (forecast.strategy, forecast.rows, forecast.files, forecast.bytes, forecast.total_files,
                forecast.total_bytes) == (erased["strategy"], erased["rows_matched"], erased["skipping"]["files"],
                                          erased["skipping"]["bytes"], erased["skipping"]["total_files"],
                                          erased["skipping"]["total_bytes"]), table
        assert forecast.matched_files == report.per_table[table]["files_rewritten"], table
        assert forecast.rewrite_bytes == report.per_table[table]["bytes_rewritten"] > 0, table

    after = plan(spark, settings)  # the run is on record: the model is scaled to how long it took
    recorded = Ledger(settings).runs()[0]
    took = (datetime.fromisoformat(recorded["finished_at"]) - datetime.fromisoformat(recorded["started_at"]))
    modelled = rates.fixed_seconds.value + len(created) * rates.seconds_per_request.value + sum(
        f["bytes_rewritten"] for f in report.per_table.values()) / rates.rewrite_bytes_per_second.value
    assert (after.rates.fixed_seconds.source, after.rates.fixed_seconds.runs) == ("measured", 1)
    assert after.rates.scale == pytest.approx(took.total_seconds() / modelled, rel=1e-3)
    assert after.requests.erase == 0 and after.tables == {}
    assert after.requests.waiting_for_purge == (0 if policy == "immediate" else 3)


def test_every_data_map_problem_is_listed_the_other_tables_planned_and_the_cli_exits_2(spark, tmp_path, monkeypatch,
                                                                                       capsys):
    settings = _lake(spark, tmp_path, "iceberg")
    Lake.of(spark, settings).create_table("app.tags", spark.createDataFrame(
        [(["u00", "u03"], 1)], "owners array<string>, n int"), {})
    datamap = _datamap("iceberg")
    datamap["tables"].update({
        "app.events": {"key": "uid"},  # an unknown column
        "app.missing": {"key": "user_id"},  # no such table
        "app.tags": {"key": "owners"},  # an array mapped as one identifier
    })
    datamap["shares"] = {"partner.feed": {"from": "app.users", "key": "user_id",
                                         "sql": "SELECT user_id, nope FROM app.users"}}
    broken = settings.replace(datamap=DataMap.model_validate(datamap))
    Ledger(broken).submit([RequestInput("u00", "erase")])
    before = snapshot_ids(spark, settings, TABLES), _ledger_state(spark, settings)

    planned = plan(spark, broken)

    assert sorted(p.table for p in planned.problems) == ["app.events", "app.missing", "app.tags", "partner.feed"]
    said = {p.table: p.text for p in planned.problems}
    assert "has no column 'uid'" in said["app.events"] and "cannot be read" in said["app.missing"]
    assert "which cannot hold an identifier (an array of identifiers is written owners[])" in said["app.tags"]
    assert said["partner.feed"].startswith("shares partner.feed:")
    assert set(planned.not_planned) == {"app.events", "app.missing", "app.tags"}
    assert sorted(planned.tables) == ["app.mail", "app.users"]  # planned all the same
    assert planned.tables["app.users"].rows == 1 and planned.tables["app.mail"].rows == 3
    config = write_config(broken, tmp_path / "broken.yaml")
    code, out = dsr_in_process(monkeypatch, capsys, "-c", str(config), "plan")
    assert code == 2 and "app.users" in out and "the defaults: no recorded run" in out
    assert all(f"problem: {p.text}" in out for p in planned.problems), out
    assert (snapshot_ids(spark, settings, TABLES), _ledger_state(spark, settings)) == before

    with pytest.raises(DataMapError) as refused:  # the run stops at every one of them
        run(spark, broken)
    assert all(p.text in str(refused.value) for p in planned.problems)


def test_plan_json_is_a_stable_document(spark, tmp_path, monkeypatch, capsys):
    settings = _lake(spark, tmp_path, "iceberg")
    Ledger(settings).submit([RequestInput("u05", "erase"), RequestInput("u06", "access")])
    config = write_config(settings, tmp_path / "dsr.yaml")

    code, out = dsr_in_process(monkeypatch, capsys, "-c", str(config), "plan", "--json")

    assert code == 0, out
    doc = json.loads(out)
    assert set(doc) == {"requests", "purge", "tables", "not_planned", "problems", "rates", "estimated_seconds",
                        "seconds"}
    assert doc["requests"] == {"erase": 1, "access": 1, "consent": 0, "held": 0, "waiting_for_purge": 0}
    assert list(doc["tables"]) == ["app.events", "app.mail", "app.users"] and doc["problems"] == []
    for table in doc["tables"].values():
        assert set(table) == {"action", "strategy", "files", "bytes", "total_files", "total_bytes", "rows",
                              "matched_files", "rewrite_bytes", "estimated_seconds"}
    assert doc["tables"]["app.events"]["rows"] == 5 and doc["tables"]["app.mail"]["rows"] == 3
    assert {name: rate["source"] if isinstance(rate, dict) else None for name, rate in doc["rates"].items()} == {
        "rewrite_bytes_per_second": "default", "seconds_per_request": "default", "fixed_seconds": "default",
        "scale": None}
    assert "u05" not in out and email(5) not in out  # counts and request ids only


def _recorded(took: float, completed: int, rewritten: int, erased: int = 0) -> dict:
    """A run as Ledger.runs gives it (the fields the model reads)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return {"started_at": start.isoformat(), "finished_at": (start + timedelta(seconds=took)).isoformat(),
            "requests_completed": completed, "requests_failed": 0, "requests_erased": erased,
            "tables": {"a.t": {"bytes_rewritten": rewritten}, "a.u": {"bytes_rewritten": 0}}}


def test_the_estimate_is_the_model_scaled_by_the_median_recorded_run():
    """The defaults give seed 003's 1M-id case its measured seconds; recorded runs scale every rate by
    the median of took / modelled, so one run slowed by a busy machine moves it little, and runs that
    did no work (nothing requested, nothing rewritten) do not count."""
    default = measured_rates([])
    assert (default.scale, default.fixed_seconds.source, default.seconds_per_request.runs) == (1.0, "default", 0)
    million = default.fixed_seconds.value + 1_000_000 * default.seconds_per_request.value + \
        145_047_389 / default.rewrite_bytes_per_second.value
    assert million == pytest.approx(57, rel=0.05)  # bench/results/delta-10000000-1000000.json's run

    def modelled(requests: int, rewritten: int) -> float:
        return plan_module._modelled(requests, rewritten)

    runs = [_recorded(2 * modelled(100, 10**8), 100, 10**8), _recorded(2 * modelled(5000, 0), 4000, 0, erased=1000),
            _recorded(20 * modelled(10, 10**6), 10, 10**6),  # the outlier
            _recorded(0.5, 0, 0)]  # nothing to do: not counted
    rates = measured_rates(runs)
    assert rates.scale == pytest.approx(2.0) and rates.fixed_seconds.runs == 3
    assert (rates.fixed_seconds.source, rates.seconds_per_request.source, rates.rewrite_bytes_per_second.source) == \
        ("measured",) * 3
    assert rates.fixed_seconds.value == pytest.approx(2 * default.fixed_seconds.value)
    assert rates.seconds_per_request.value == pytest.approx(2 * default.seconds_per_request.value)
    assert rates.rewrite_bytes_per_second.value == pytest.approx(default.rewrite_bytes_per_second.value / 2)
