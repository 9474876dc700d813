"""The core acceptance: one `dsr run` over all four demo tables, checked by independent readers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable

from helpers import HOSTILE, NEAR_MISS, SEED, add_subjects, ledger_table, make_settings, snapshot_ids
from lakehouse_dsr import synth
from lakehouse_dsr.evidence.html import run_report_page
from lakehouse_dsr.lake import batching, iceberg
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.verify import verify_completed

TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders"]
USERS = 40


def _rows(spark, settings, table):
    return Counter(tuple(r) for r in spark.table(settings.table(table)).collect())


@pytest.fixture(scope="module")
def cycle(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("cycle")
    settings = make_settings(root)
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=800, seed=SEED, batches=2)
    add_subjects(spark, settings, HOSTILE, "hostile")
    add_subjects(spark, settings, NEAR_MISS, "near")
    erased_ids = [synth.user_id(SEED, i) for i in range(6)] + HOSTILE
    unknown = synth.user_id(SEED, USERS + 1)  # in no table at all
    users_before = spark.table(settings.table("demo.users")).collect()
    emails = [u.email for u in users_before if u.user_id in set(erased_ids)]
    before = {t: _rows(spark, settings, t) for t in TABLES}
    ledger = Ledger(settings)
    submitted = ledger.submit([RequestInput(s, "erase", "ccpa" if i % 2 else "gdpr")
                               for i, s in enumerate(erased_ids + [unknown])])
    released: list = []

    def release(session) -> None:  # what the run has done when it hands its session back
        released.append((session, {r.request_id: r.status for r in ledger.statuses()}, len(iceberg._staged),
                         snapshot_ids(spark, settings, TABLES)))

    report = run(spark, settings, release=release)
    report_file = root / "report.json"
    report.write(report_file)
    return {"settings": settings, "root": root, "ids": erased_ids, "emails": emails, "before": before,
            "report": report, "report_file": report_file, "submitted": submitted.created, "ledger": ledger,
            "released": released, "snapshots_after": snapshot_ids(spark, settings, TABLES)}


def _erased(cycle) -> set[str]:
    return set(cycle["ids"]) | set(cycle["emails"])


def test_all_requests_completed(cycle):
    report = cycle["report"]
    assert sorted(r.request_id for r in report.completed) == sorted(cycle["submitted"])
    assert not report.failed
    statuses = {s.request_id: s for s in cycle["ledger"].statuses()}
    assert {statuses[r].status for r in cycle["submitted"]} == {"completed"}
    assert len(cycle["emails"]) == len(cycle["ids"])  # every erased subject had an email to follow


def test_the_session_is_handed_back_once_after_the_spark_work_and_before_the_outcomes(spark, cycle):
    # the Spark work is over (its staged scan tasks dropped), nothing recorded yet: a process that
    # started its JVM lets it exit while the run records the outcomes (cli's `_done_with_spark`)
    # (the tables as the run leaves them: erased, purged and verified)
    assert cycle["released"] == [(spark, {rid: "in_progress" for rid in cycle["submitted"]}, 0,
                                  cycle["snapshots_after"])]


def test_report_counts(cycle):
    tables = cycle["report"].tables
    assert tables["demo.events"]["erase"]["rows_matched"] == sum(
        n for row, n in cycle["before"]["demo.events"].items() if row[1] in set(cycle["ids"]))
    assert tables["demo.users"]["erase"]["rows_changed"] == len(cycle["ids"])
    # The purge follows in this run: each table's files holding requested people are rewritten at once,
    # merge-on-read events included (delete files would be rewritten by the purge minutes later).
    assert {t["erase"]["strategy"] for t in tables.values()} == {"rewrite_files"}
    assert tables["demo.events"]["erase"]["write_mode"] == "copy-on-write"
    assert tables["demo.events"]["erase"]["data_files_rewritten"] >= 1
    assert tables["demo.events"]["erase"]["delete_files_added"] == 0
    # After the purge history and storage hold exactly the live files: one scan proves all three.
    assert all(t["verification"]["one_scan"] for t in tables.values())
    for name, t in tables.items():
        assert t["verification"]["passed"], name
        assert t["purge"]["snapshots_expired"] >= 1, name
    assert cycle["report"].ledger_purge["passed"] and cycle["report"].ledger_purge["plaintext_found"] == 0


def test_report_costs_each_stage_in_spark_io(cycle):
    cost = cycle["report"].cost
    assert set(cost) == set(cycle["report"].seconds) == {"resolve", "erase", "purge", "verify", "ledger"}
    assert sum(t["erase"]["bytes_rewritten"] for t in cycle["report"].tables.values()) > 0
    assert cost["erase"]["bytes_written"] > 0 and cost["erase"]["rows_written"] > 0  # the rewritten files
    assert cost["verify"]["bytes_read"] > 0 and cost["erase"]["bytes_read"] > 0
    # the purge is metadata work (expiry, orphans, manifests): no data file is read or written
    assert cost["purge"]["rows_written"] == 0
    # every other stage read data: in Spark jobs, or (small files) in the driver, counted as driver_files
    assert all((c["stages"] > 0 or c["driver_files"] > 0) and not c["truncated"]
               for stage, c in cost.items() if stage not in ("ledger", "purge")), cost
    assert cost["ledger"]["stages"] == 0  # the ledger is read and written through pyiceberg, not Spark jobs


def test_current_snapshot_holds_no_erased_subject(spark, cycle):
    settings, erased = cycle["settings"], _erased(cycle)
    for table, column in (("demo.users", "user_id"), ("demo.users", "email"), ("demo.events", "user_id"),
                          ("demo.orders", "user_id"), ("demo.newsletter", "email")):
        values = {r[0] for r in spark.table(settings.table(table)).select(column).collect()}
        assert not values & erased, (table, column)


def test_other_subjects_rows_unchanged(spark, cycle):
    settings, ids, emails = cycle["settings"], set(cycle["ids"]), set(cycle["emails"])
    key_index = {"demo.users": 0, "demo.events": 1}
    for table, index in key_index.items():
        expected = Counter({row: n for row, n in cycle["before"][table].items() if row[index] not in ids})
        assert _rows(spark, settings, table) == expected, table
    expected = Counter({row: n for row, n in cycle["before"]["demo.newsletter"].items() if row[0] not in emails})
    assert _rows(spark, settings, "demo.newsletter") == expected
    survivors = {r.user_id for r in spark.table(settings.table("demo.users")).collect()}
    assert set(NEAR_MISS) <= survivors


def test_orders_are_redacted_not_deleted(spark, cycle):
    settings, ids = cycle["settings"], set(cycle["ids"])
    before = cycle["before"]["demo.orders"]
    after = _rows(spark, settings, "demo.orders")
    assert sum(after.values()) == sum(before.values())
    kept = Counter({row: n for row, n in before.items() if row[1] not in ids})
    redacted = Counter({(row[0], None, row[2], None, None, row[5]): n for row, n in before.items() if row[1] in ids})
    assert redacted and after == kept + redacted


def _all_parquet_values(root: Path) -> set:
    values = set()
    for file in root.rglob("*.parquet"):
        table = pq.read_table(file)
        for column in table.itercolumns():
            values.update(v for v in column.to_pylist() if isinstance(v, str))
    return values


def test_no_parquet_file_on_storage_holds_erased_identifiers(cycle):
    values = _all_parquet_values(cycle["root"])  # data, delete and ledger files alike
    assert values, "found no parquet values at all"
    assert not values & _erased(cycle)
    assert set(NEAR_MISS) <= values


def test_no_file_of_any_kind_holds_an_erased_identifier(cycle):
    """Manifests, manifest lists and metadata JSON included: column bounds there are 16-character prefixes."""
    survivors = [v.encode() for v in NEAR_MISS]
    needles = [n for n in (v.encode()[:16] for v in _erased(cycle) if len(v) >= 8)
               if not any(s.startswith(n) for s in survivors)]
    for file in cycle["root"].rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            leaked = [n[:12] for n in needles if n in data]
            assert not leaked, f"{file} holds an erased identifier"


def _static_table(cycle, table: str) -> StaticTable:
    meta = cycle["root"] / "wh" / Path(*table.split(".")) / "metadata"
    version = (meta / "version-hint.text").read_text().strip()
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def test_no_manifest_keeps_bounds_of_erased_values(cycle):
    """Manifests are compressed Avro, so read them (pyiceberg) rather than grep them."""
    prefixes = {v.encode()[:16] for v in _erased(cycle)} - {v.encode()[:16] for v in NEAR_MISS}
    for table in TABLES + ["dsr.requests"]:
        static = _static_table(cycle, table)
        for snapshot in static.metadata.snapshots:
            for entry in static.inspect.entries(snapshot_id=snapshot.snapshot_id).to_pylist():
                f = entry["data_file"]
                bounds = [*(f["lower_bounds"] or []), *(f["upper_bounds"] or [])]
                values = {b[1] if isinstance(b, tuple) else b["value"] for b in bounds}
                assert not values & prefixes, (table, entry["status"], f["file_path"])


def test_pyiceberg_reader_agrees(cycle):
    erased = _erased(cycle)
    for table in TABLES:
        arrow = _static_table(cycle, table).scan().to_arrow()
        assert arrow.num_rows > 0
        values = {v for column in arrow.itercolumns() for v in column.to_pylist() if isinstance(v, str)}
        assert not values & erased, table


def test_ledger_keeps_only_hashes_and_evidence(spark, cycle):
    settings = cycle["settings"]
    rows = ledger_table(spark, settings, "dsr.requests").collect()
    assert all(r.subject_id is None and len(r.subject_hash) == 64 for r in rows)
    evidence = cycle["ledger"].evidence(cycle["submitted"])
    assert set(evidence) == set(cycle["submitted"])
    first = evidence[cycle["submitted"][0]]
    assert first["run_id"] == cycle["report"].run_id and set(first["tables"]) == set(TABLES)
    for table in first["tables"].values():
        assert table["checks"] == {"live": True, "history": True, "storage": True, "collateral": True}
        assert table["snapshots_expired"] >= 1 and table["purged"]
    assert first["tables"]["demo.events"]["bytes_rewritten"] > 0
    assert first["tables"]["demo.events"]["rows"] == sum(
        n for row, n in cycle["before"]["demo.events"].items() if row[1] == cycle["ids"][0])


def test_report_file_holds_no_identifier(cycle):
    text = cycle["report_file"].read_text()
    assert cycle["report_file"].stat().st_mode & 0o077 == 0
    assert not [v for v in _erased(cycle) if len(v) >= 4 and (v in text or json.dumps(v)[1:-1] in text)]


def test_second_run_changes_nothing(spark, cycle):
    settings = cycle["settings"]
    before = snapshot_ids(spark, settings, TABLES + cycle["ledger"].tables())
    report = run(spark, settings)
    assert report.requests == []
    assert snapshot_ids(spark, settings, TABLES + cycle["ledger"].tables()) == before


def test_reverification_detects_data_that_came_back(spark, cycle):
    settings = cycle["settings"]
    results = verify_completed(spark, settings)
    assert set(results) == set(cycle["submitted"]) and not any(results.values())
    victim = cycle["ids"][0]
    before = Lake.of(spark, settings).table("demo.events").current_snapshot().snapshot_id
    spark.createDataFrame([("late-1", victim)], "event_id string, user_id string").selectExpr(
        "event_id", "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp", "null page_url",
        "null product_id", "'late backfill' event_details").writeTo(settings.table("demo.events")).append()
    appended = Lake.of(spark, settings).table("demo.events").current_snapshot().snapshot_id
    try:
        results = verify_completed(spark, settings)
        failing = {rid: reasons for rid, reasons in results.items() if reasons}
        assert len(failing) == 1
        (reasons,) = failing.values()
        assert any("demo.events: 1 rows in the current snapshot" in r for r in reasons)
    finally:  # the module's other tests read this lake: the row, its snapshot and its file go again
        table = Lake.of(spark, settings).table("demo.events").procedure_name
        spark.sql(f"CALL `{settings.catalog.name}`.system.rollback_to_snapshot('{table}', {before})")
        spark.sql(f"CALL `{settings.catalog.name}`.system.expire_snapshots(table => '{table}', "
                  f"snapshot_ids => array({appended}))")
    assert not any(verify_completed(spark, settings).values())


def test_an_erased_person_appended_again_is_erased_again_by_the_next_run(spark, cycle, monkeypatch):
    """Issue 28: a replay brings an erased person's rows back; the next run, with no request open, reads
    only the appended files, erases them again and purges them (tests/test_resurrection.py: more).
    Every table in a Spark job of its own (lake/batching.py), as each ten of a wide lake's are: what
    one table's job finds joins the erasure with the other's."""
    monkeypatch.setattr(batching, "UNION_WIDTH", 1)
    settings, victim = cycle["settings"], cycle["ids"][0]
    spark.createDataFrame([("replay-1", victim), ("replay-2", victim)], "event_id string, user_id string").coalesce(
        1).selectExpr("event_id", "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp",
                      "null page_url", "null product_id", "'replayed' event_details").writeTo(
        settings.table("demo.events")).append()
    spark.createDataFrame([(victim,)], "user_id string").selectExpr(
        "user_id", "timestamp'2024-07-01' created_at", "'Replayed Name' name", "'replayed@example.invalid' email"
    ).writeTo(settings.table("demo.users")).append()
    lake = Lake.of(spark, settings)
    appended = lake.table("demo.events").current_snapshot().snapshot_id
    restored = lake.table("demo.users").current_snapshot().snapshot_id
    report = run(spark, settings)
    assert report.resurrections == {
        "demo.events": {"rows": 2, "requests": 1, "files": 1, "files_read": 1, "whole_table": False,
                        "commits": [{"snapshot_id": appended, "operation": "append"}]},
        "demo.users": {"rows": 1, "requests": 1, "files": 1, "files_read": 1, "whole_table": False,
                       "commits": [{"snapshot_id": restored, "operation": "append"}]}}
    assert report.requests == []  # the completed request keeps its record; the run report has the evidence
    for table in ("demo.events", "demo.users"):
        rows = StaticTable.from_metadata(Lake.of(spark, settings).table(table).java().operations().current()
                                         .metadataFileLocation()).scan(selected_fields=("user_id",)).to_arrow()
        assert victim not in rows["user_id"].to_pylist()
        assert report.tables[table]["verification"]["passed"]
    page = run_report_page(report.as_dict())  # the run page shows it, by counts and commits
    assert "People erased before who came back" in page and f"append {appended}" in page and victim not in page


@pytest.mark.parametrize("in_driver_max_bytes", [8 * 2**20, 0])
def test_small_new_files_holding_nobody_erased_are_checked_in_the_driver(spark, cycle, in_driver_max_bytes):
    """A table that moved is checked for erased people in its new files; small ones are read in the
    driver's JVM (lake/indriver.py: the same keyed hashes), with no Spark stage, unless the driver may
    not read them (max 0 bytes): then Spark does, and finds the same nobody. (Where the driver finds
    someone, Spark reads the table again: the test above.)"""
    settings = cycle["settings"].replace(erase={"in_driver_max_bytes": in_driver_max_bytes})
    kept = synth.user_id(SEED, USERS - 1)  # never erased
    assert kept not in cycle["ids"]
    spark.createDataFrame([(f"later-{in_driver_max_bytes}", kept)], "event_id string, user_id string").selectExpr(
        "event_id", "user_id", "'login' event_type", "timestamp'2024-07-02' event_timestamp", "null page_url",
        "null product_id", "'later' event_details").writeTo(settings.table("demo.events")).append()
    before = snapshot_ids(spark, settings, TABLES)
    report = run(spark, settings)  # no open request: the moved table alone makes the run due
    assert report.resurrections == {} and report.requests == []
    cost = report.cost["resurrection"]  # the driver's reads are counted as driver_files
    assert cost["rows_read"] == 1  # the new file's one row, by the driver or by Spark
    if in_driver_max_bytes:
        assert cost["stages"] == 0 and cost["tasks"] == 0 and cost["driver_files"] == 1
    else:
        assert cost["stages"] > 0 and cost["driver_files"] == 0
    assert snapshot_ids(spark, settings, TABLES) == before  # nothing erased, nothing rewritten
    assert run(spark, settings).resurrections == {}  # the checkpoint moved past the new file
