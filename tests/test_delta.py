"""Delta Lake tables through the same run: a lake whose demo tables are all Delta, and one that mixes
Delta and Iceberg tables in one data map, checked by delta-rs (`deltalake`), pyarrow over the raw
files and a byte scan of `_delta_log` (pyiceberg and the run's own proof for the Iceberg tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import DELTA_LAYOUTS, SEED, delta_rows, delta_settings, delta_traces, subscribed, values_of
from lakehouse_dsr import synth
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.verify import verify_completed

USERS = 30
# "metastore": the mixed layout's Delta tables registered by name in the session's metastore
# (spark_catalog, Delta's DeltaCatalog) and mapped by name (`delta.catalog`), not by path
LAYOUTS = {**{layout: tables for layout, tables in DELTA_LAYOUTS.items() if tables},
           "metastore": DELTA_LAYOUTS["mixed"]}


def _by_name(spark, settings, tables: list[str]):
    """`settings` with `tables` (Delta tables by path) registered in spark_catalog under their names and
    mapped by name instead."""
    for name in tables:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS spark_catalog.{name.split('.')[0]}")
        spark.sql(f"DROP TABLE IF EXISTS spark_catalog.{name}")  # an external table: its files stay
        spark.sql(f"CREATE TABLE spark_catalog.{name} USING delta LOCATION '{settings.delta_tables()[name]}'")
    return settings.replace(delta={"catalog": "spark_catalog"})


@pytest.fixture(scope="module", params=[pytest.param(layout, marks=pytest.mark.slow) if layout == "metastore"
                                        else layout for layout in LAYOUTS])  # metastore: make test-slow
def erased_lake(spark, tmp_path_factory, request):
    root = tmp_path_factory.mktemp(f"delta-{request.param}")
    settings = delta_settings(root, LAYOUTS[request.param])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=500, seed=SEED, batches=2)
    if request.param == "metastore":
        settings = _by_name(spark, settings, LAYOUTS["metastore"])
        assert not settings.delta_tables() and settings.table("demo.events") == "`spark_catalog`.`demo`.`events`"
    locations = {name: path.removeprefix("file:") for name, path in Lake.of(spark, settings).delta.items()}
    ids, emails = subscribed(settings, spark)
    kept = synth.user_id(SEED, USERS - 1)
    ledger = Ledger(settings)
    submitted = ledger.submit([RequestInput(s, "erase", "gdpr") for s in ids]).created
    (access,) = ledger.submit([RequestInput(kept, "access", "gdpr")]).created
    events = delta_rows(locations["demo.events"]).to_pylist()  # before the run: delta-rs's view
    report = run(spark, settings)
    return {"settings": settings, "locations": locations, "ids": ids, "emails": emails, "kept": kept, "report": report,
            "submitted": submitted, "layout": request.param, "ledger": ledger, "access": access,
            "kept_events": sorted(r["event_id"] for r in events if r["user_id"] == kept)}


def _needles(lake) -> list[bytes]:
    """What no byte may hold: the ids, the 32-character prefix Delta keeps in string statistics, the emails."""
    return [n.encode() for n in (*lake["ids"], *(i[:32] for i in lake["ids"]), *lake["emails"])]


def test_a_run_completes_every_request_on_delta_tables(erased_lake):
    report = erased_lake["report"]
    assert sorted(r.request_id for r in report.completed) == sorted([*erased_lake["submitted"], erased_lake["access"]])
    assert not report.failed
    for table in LAYOUTS[erased_lake["layout"]]:
        verification = report.tables[table]["verification"]
        assert verification["passed"] and verification["details"]["metadata_files"] > 0
    events = report.tables["demo.events"]
    assert events["erase"]["strategy"] == "merge_broadcast"
    # a deletion-vector table purged in the same run: the MERGE rewrote the files, REORG had nothing left
    assert events["erase"]["write_mode"] == "copy-on-write" and events["erase"]["data_files_rewritten"] > 0
    assert events["erase"]["delete_files_added"] == 0 and events["purge"]["data_files_rewritten"] == 0


def test_an_access_package_holds_the_delta_rows_delta_rs_reads(erased_lake):
    settings, report = erased_lake["settings"], erased_lake["report"]
    assert erased_lake["access"] in {r.request_id for r in report.completed}
    package = json.loads((Path(settings.export.directory) / report.run_id / f"{erased_lake['access']}.json")
                         .read_text(encoding="utf-8"))
    assert erased_lake["kept_events"]
    assert sorted(row["event_id"] for row in package["tables"]["demo.events"]) == erased_lake["kept_events"]


def test_no_row_version_file_or_log_byte_holds_an_erased_person(erased_lake):
    erased = {*erased_lake["ids"], *erased_lake["emails"]}
    for name, path in erased_lake["locations"].items():
        assert [f for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts], name  # data was read
        assert list(Path(path, "_delta_log").iterdir()), name
        assert delta_traces(path, erased, _needles(erased_lake)) == [], name
    assert erased_lake["kept"] in values_of(delta_rows(erased_lake["locations"]["demo.events"]))


def test_describe_history_names_nobody_and_the_proof_holds_later(spark, erased_lake):
    settings = erased_lake["settings"]
    for name in erased_lake["locations"]:
        history = spark.sql(f"DESCRIBE HISTORY {settings.table(name)}").collect()
        text = " ".join(str(r.asDict()) for r in history)
        assert not [i for i in (*erased_lake["ids"], *erased_lake["emails"]) if i in text], name
    assert verify_completed(spark, settings) == {rid: [] for rid in erased_lake["submitted"]}
