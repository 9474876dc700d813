"""Data skipping: on a clustered table, plan, erase, collateral check, verification and export read
the files that can hold the requested keys and no other; a table no file of which can hold them
costs no Spark job; a concurrent change to another person's row in a touched file is still caught.

Rows read come from Spark's own counters (lake/metrics.py); which files hold whom is worked out
independently, with pyiceberg and pyarrow over the table's files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType

from helpers import SEED, event_log_conf, event_logs, make_disk_lakehouse, make_settings
from lakehouse_dsr import synth
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.lake import indriver, layout, skipping
from lakehouse_dsr.lake.bridge import bridge
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.metrics import StageMeter
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.runner.erasure import ErasureBatch
from lakehouse_dsr.stages import access, collateral, erase, matching, purge, verify
from lakehouse_dsr.stages.access import export
from test_reliability import wrap_apply

EVENTS = "demo.events"
ERASED, ASKED, BYSTANDER = synth.user_id(SEED, 3), synth.user_id(SEED, 11), synth.user_id(SEED, 4)
ABSENT = "zzzz-no-such-user"  # sorts after every id: outside every file's key bounds


def files_holding(settings, subjects: list[str]) -> dict[str, int]:
    """{data file: its rows} of the live files holding any of `subjects`, read with pyiceberg and pyarrow."""
    table = open_catalog(settings).load_table(EVENTS)
    out = {}
    for f in table.inspect.files().to_pylist():
        ids = pq.read_table(f["file_path"].removeprefix("file:"), columns=["user_id"]).column("user_id")
        if pc.any(pc.is_in(ids, value_set=pa.array(subjects))).as_py():
            out[f["file_path"]] = f["record_count"]
    return out


def live_files(settings) -> set[str]:
    """The events table's live data files (not delete files), read with pyiceberg."""
    return {f["file_path"] for f in open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()
            if f["content"] == 0}


def clustered_lake(spark, tmp_path, in_driver_max_bytes: int = 0):
    """The tiny demo lake with only the events table mapped, clustered by user_id into many small
    files; read by Spark, as a large table is, unless `in_driver_max_bytes` lets the driver read it."""
    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0},
                             erase={"in_driver_max_bytes": in_driver_max_bytes},
                             datamap={"subject": "user_id", "identifiers": {}, "tables": {EVENTS: {"key": "user_id"}}})
    attach(spark, settings)
    synth.generate(spark, settings, users=60, events=3000, seed=SEED, batches=1)
    layout.optimize(Lake.of(spark, settings).table(EVENTS), settings.datamap, target_file_size_bytes=4 * 1024)
    assert len(live_files(settings)) >= 10
    return settings


@pytest.fixture
def clustered(spark, tmp_path):
    return clustered_lake(spark, tmp_path)


def table_keys(spark, settings, subjects: list[str]) -> matching.TableKeys:
    keys = spark.createDataFrame([(f"r{i}", "user_id", s) for i, s in enumerate(subjects)],
                                 "request_id string, key_type string, key_value string")
    types = check_against_catalog(spark, settings.datamap, settings.table)
    return matching.key_sets(settings.datamap, keys, types, [EVENTS])[EVENTS]


def test_the_plan_reads_only_the_files_that_can_hold_the_keys(spark, clustered):
    holding = files_holding(clustered, [ERASED])
    total = spark.table(clustered.table(EVENTS)).count()
    keys = table_keys(spark, clustered, [ERASED])
    meter = StageMeter(spark)
    mark = meter.mark()
    plan = erase.plan(Lake.of(spark, clustered), clustered.datamap, clustered.erase, EVENTS, keys)
    cost = meter.since(mark)
    expected = spark.table(clustered.table(EVENTS)).where(F.col("user_id") == ERASED).count()
    assert plan.rows_matched == expected > 0
    assert plan.rows_before == total
    assert plan.skipping["pruned"] and plan.skipping["files"] == len(holding) < plan.skipping["total_files"]
    assert set(plan.matched_files) == set(holding)
    assert plan.rows_scanned == sum(holding.values()) < total / 5
    # Spark's count: those files' rows, plus the broadcast key row read back from its checkpoint
    assert plan.rows_scanned <= cost.rows_read <= plan.rows_scanned + keys.size


def test_the_driver_reads_only_the_files_that_can_hold_the_keys(spark, tmp_path):
    settings = clustered_lake(spark, tmp_path, in_driver_max_bytes=8 << 20)
    holding = files_holding(settings, [ERASED])
    keys = table_keys(spark, settings, [ERASED])
    meter = StageMeter(spark)
    mark = meter.mark()
    plan = erase.plan(Lake.of(spark, settings), settings.datamap, settings.erase, EVENTS, keys)
    cost = meter.since(mark)
    assert cost.stages == 0 and cost.driver_files == len(holding) < plan.skipping["total_files"]
    assert set(plan.matched_files) == set(holding) and plan.rows_scanned == sum(holding.values()) == cost.rows_read


def test_a_table_no_file_can_match_costs_no_spark_job(spark, clustered, tmp_path):
    keys = table_keys(spark, clustered, [ABSENT])
    meter = StageMeter(spark)
    mark = meter.mark()
    plan = erase.plan(Lake.of(spark, clustered), clustered.datamap, clustered.erase, EVENTS, keys)
    result = erase.apply(Lake.of(spark, clustered), clustered.datamap, clustered.erase, plan, keys)
    assert meter.since(mark).stages == 0
    assert plan.rows_matched == 0 and plan.skipping["files"] == 0 and result.snapshot_id is None
    hashes = spark.createDataFrame([("r0", "user_id", "0" * 64, None)],
                                   "request_id string, key_type string, key_hash string, key_id string")
    key = verify.keys_for(clustered.key_file(), hashes, Ledger(clustered).key)  # once per run, for every table
    mark = meter.mark()
    proof = verify.verify_table(Lake.of(spark, clustered), clustered.key_file(), EVENTS,
                                clustered.datamap.mapping(EVENTS).groups,
                                check_against_catalog(spark, clustered.datamap, clustered.table)[EVENTS],
                                hashes, key, physical=False, prune=keys)
    assert meter.since(mark).stages == 0 and proof.live == 0 and proof.passed
    # An access request for nobody: the export's scan of the table is skipped, one empty package is written.
    requests = spark.createDataFrame([("r0", ABSENT, "gdpr")],
                                     "request_id string, subject_id string, regulation string")
    mark = meter.mark()
    result = export(Lake.of(spark, clustered), clustered.datamap, requests, tmp_path / "out")
    # what Spark counts as read is the batch's own few rows, none of the table's 3,000
    assert meter.since(mark).rows_read < 10 and len(result.packages) == 1
    skipping.release()


def test_key_sets_of_identifiers_kept_in_the_driver_cost_no_spark_job_and_equal_sparks_grouping(spark, tmp_path):
    rows = [("r1", "user_id", "u1"), ("r2", "user_id", "u1"), ("r2", "user_id", "u2"), ("r3", "email", "x@y"),
            ("r4", "user_id", "7"), ("r5", "user_id", None)]
    batch = spark.createDataFrame(rows, "request_id string, key_type string, key_value string")  # an RDD
    kept = indriver.kept(batch)
    meter = StageMeter(spark)
    mark = meter.mark()
    held = {t: matching.key_set(kept, "user_id", t) for t in (StringType(), LongType())}
    assert meter.since(mark).stages == 0
    in_spark = {t: matching.key_set(batch, "user_id", t) for t in (StringType(), LongType())}
    assert meter.since(mark).stages > 0  # the same key sets grouped by Spark jobs

    def content(key_set):
        return {(r.key_value, tuple(sorted(r.request_ids))) for r in key_set.requesters.collect()}
    for key_type in held:
        assert content(held[key_type]) == content(in_spark[key_type])
        assert held[key_type].size == in_spark[key_type].size == len(content(held[key_type]))
        assert list(held[key_type].values.java_list) == list(in_spark[key_type].values.java_list)
    assert content(held[StringType()]) == {("u1", ("r1", "r2")), ("u2", ("r2",)), ("7", ("r4",))}
    assert content(held[LongType()]) == {(7, ("r4",))}  # a text id is no bigint: it cannot match

    # The ledger's hashes, held in the driver too: their key ids are read without a job.
    stored = indriver.local_rows(spark, [("r1", "user_id", "0" * 64, "k1"), ("r2", "user_id", "1" * 64, None)],
                                 "request_id string, key_type string, key_hash string, key_id string")
    mark = meter.mark()
    resolved = verify.keys_for(tmp_path / "dsr-secret.key", stored, b"k" * 32)
    assert meter.since(mark).stages == 0
    assert resolved.lost == {"r1": "k1"}  # made by a key no keyring holds


@pytest.mark.slow  # a whole run over a clustered table: make test-slow
def test_a_run_reads_the_files_holding_the_requested_people_and_leaves_the_others_untouched(spark, clustered):
    holding = files_holding(clustered, [ERASED, ASKED])
    erased_holding = set(files_holding(clustered, [ERASED]))
    before = live_files(clustered)
    total = spark.table(clustered.table(EVENTS)).count()
    bystanders = spark.table(clustered.table(EVENTS)).where(~F.col("user_id").isin(ERASED)).count()
    Ledger(clustered).submit([RequestInput(ERASED, "erase"), RequestInput(ASKED, "access")])
    report = run(spark, clustered)
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "rewrite_files" and events["erase"]["collateral"]["ok"]
    assert events["erase"]["skipping"]["files"] < events["erase"]["skipping"]["total_files"]
    # Plan, commit, collateral check, verification and export: each reads some of the files holding
    # the two people (the commit and the check read the erased person's files again, the check also
    # the new ones), never the rest.
    read = sum(report.cost[stage]["rows_read"] for stage in ("export", "erase", "verify"))
    assert 0 < read <= 5 * sum(holding.values()) < total
    # The erase stage reads the erased person's files three times at most: the plan, the rewrite (which
    # fingerprints the old rows on the way) and the check of the new files; a check that read the
    # old files again would make it four.
    assert report.cost["erase"]["rows_read"] <= 3 * sum(rows for f, rows in holding.items() if f in erased_holding)
    replaced = before - live_files(clustered)
    assert replaced == erased_holding  # only the files holding the erased person were rewritten
    assert spark.table(clustered.table(EVENTS)).where(F.col("user_id") == ERASED).count() == 0
    assert spark.table(clustered.table(EVENTS)).count() == bystanders


def one_file_lake(spark, tmp_path):
    """The events table alone, in one data file holding everyone (unclustered: every erasure
    rewrites it), read and rewritten by Spark as a large table is."""
    settings = make_settings(tmp_path, erase={"in_driver_max_bytes": 0},
                             datamap={"subject": "user_id", "identifiers": {}, "tables": {EVENTS: {"key": "user_id"}}})
    attach(spark, settings)
    synth.generate(spark, settings, users=40, events=800, seed=SEED, batches=1)
    assert len(live_files(settings)) == 1
    return settings


@pytest.mark.parametrize("rewrite_forgets", [False, True])
def test_verification_skips_the_files_the_content_check_read_clean_and_reads_the_others(
        spark, tmp_path, monkeypatch, rewrite_forgets):
    """The content check reads the erase commit's new files whole, marking rows by the batch's keys:
    where it found none of them, the live verification does not read those files again. A rewrite
    that left the requested rows in (simulated) passes the fingerprint of the others, but its file
    is not clean: verification reads it and fails the request."""
    settings = one_file_lake(spark, tmp_path)
    rows = spark.table(settings.table(EVENTS)).count()
    if rewrite_forgets:
        monkeypatch.setattr(collateral, "erased_rows", lambda content, keys, action: content)
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    report = run(spark, settings)
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "rewrite_files" and events["erase"]["collateral"]["ok"]
    left = pq.read_table([p.removeprefix("file:") for p in live_files(settings)][0], columns=["user_id"])
    if rewrite_forgets:
        assert pc.sum(pc.equal(left.column("user_id"), ERASED)).as_py() > 0
        assert events["erase"]["collateral"]["clean_files"] == 0
        assert events["verification"]["live"] > 0 and {r.status for r in report.requests} == {"failed"}
        assert report.cost["verify"]["rows_read"] >= rows  # the new file, read again by the verification
    else:
        assert pc.sum(pc.equal(left.column("user_id"), ERASED)).as_py() == 0
        assert events["erase"]["collateral"]["clean_files"] == 1
        assert events["verification"]["passed"] and {r.status for r in report.requests} == {"completed"}
        assert report.cost["verify"]["rows_read"] < 10  # the stored hashes only: no row of the table


@pytest.mark.parametrize("rolled_back", [False, True])
def test_merge_on_read_files_the_check_read_clean_are_not_read_again_while_history_runs_through_it(
        spark, tmp_path, monkeypatch, rolled_back):
    """Batched purge on a merge-on-read table: the erase commit attaches deletes to the file; the
    content check reads it with them (key columns) and finds no requested row, so the live check
    does not read it again. A rollback past the erase commit between the check and the verification
    brings the person back in the same file: the proof no longer applies, the verification reads
    the file, finds them and fails the request."""
    settings = one_file_lake(spark, tmp_path).replace(purge={"policy": "batched"})
    spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    rows = spark.table(settings.table(EVENTS)).count()
    (file,) = live_files(settings)
    before = Lake.of(spark, settings).table(EVENTS).current_snapshot().snapshot_id
    real_hashes, reads = verify.stored_hashes, []
    monkeypatch.setattr(verify, "stored_hashes", lambda *args: reads.append(1) or real_hashes(*args))
    if rolled_back:  # after the erase and its late-rows rounds, before the purge and the verification
        real_hold, calls = ErasureBatch._hold_damaged, []

        def roll_back_then_hold(batch, erasures):
            calls.append(1)
            spark.sql(f"CALL `{settings.catalog.name}`.system.rollback_to_snapshot("
                      f"'{Lake.of(spark, settings).table(EVENTS).procedure_name}', {before})")
            return real_hold(batch, erasures)

        monkeypatch.setattr(ErasureBatch, "_hold_damaged", roll_back_then_hold)
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    report = run(spark, settings)
    events = report.tables[EVENTS]
    erased_at = events["erase"]["snapshot_id"]
    assert events["erase"]["delete_files_added"] == 1 and events["erase"]["data_files_rewritten"] == 0
    assert live_files(settings) == {file} and events["erase"]["collateral"]["clean_files"] == 1
    assert len(reads) == 1  # the batch's stored hashes, read by the erasure, serve its proof
    if rolled_back:
        assert len(calls) == 1 and not Lake.of(spark, settings).table(EVENTS).descends_from(erased_at)
        assert spark.table(settings.table(EVENTS)).where(F.col("user_id") == ERASED).count() > 0
        assert events["verification"]["live"] > 0 and {r.status for r in report.requests} == {"failed"}
        assert report.cost["verify"]["rows_read"] >= rows  # the file, read again by the verification
    else:
        assert Lake.of(spark, settings).table(EVENTS).descends_from(erased_at)
        assert events["verification"]["passed"] and events["verification"]["live"] == 0
        assert report.cost["verify"]["rows_read"] < 10  # the stored hashes only: the file was not read again
        spark.sql(f"CALL `{settings.catalog.name}`.system.rollback_to_snapshot("
                  f"'{Lake.of(spark, settings).table(EVENTS).procedure_name}', {before})")
        assert not Lake.of(spark, settings).table(EVENTS).descends_from(erased_at)
        assert spark.table(settings.table(EVENTS)).where(F.col("user_id") == ERASED).count() > 0


def test_a_concurrent_change_to_another_persons_row_in_a_touched_file_is_caught(spark, new_lakehouse, monkeypatch):
    settings = new_lakehouse()
    events = spark.table(settings.table(EVENTS))
    assert events.where(F.col("user_id") == BYSTANDER).count() > 0
    Ledger(settings).submit([RequestInput(ERASED, "erase")])

    def during(spark, settings, keys):  # another writer changes a bystander's rows between plan and commit
        spark.sql(f"UPDATE {settings.table(EVENTS)} SET event_details = 'changed' WHERE user_id = '{BYSTANDER}'")

    wrap_apply(monkeypatch, settings, EVENTS, during)
    report = run(spark, settings)
    assert EVENTS in report.collateral_failures
    assert "cannot prove" in report.collateral_failures[EVENTS]
    assert report.tables[EVENTS]["purge"] == {} and {r.status for r in report.requests} == {"failed"}
    # nothing purged: the pre-erase snapshot stays for a rollback, and the other writer's change is kept
    before = report.tables[EVENTS]["erase"]["snapshot_before"]
    assert Lake.of(spark, settings).table(EVENTS).read_at(before).where(F.col("user_id") == ERASED).count() > 0
    assert {r.event_details for r in spark.table(settings.table(EVENTS)).where(F.col("user_id") == BYSTANDER)
            .select("event_details").distinct().collect()} == {"changed"}


@pytest.mark.parametrize("case", ["clean", "damaged", "older_deletes"])
def test_merge_on_read_deletion_writes_the_plans_positions_and_the_check_reads_once(spark, tmp_path, monkeypatch,
                                                                                   case):
    """Batched purge on a format-v2 merge-on-read table: the plan's scan records the requested rows'
    positions, and the erase commit is a position delete file written at those positions (no
    MERGE, no second scan). The check's "before" side is the file's rows from its manifest less the
    requested rows the plan counted, so the erase stage reads the key column twice: the plan and the
    check's "after". A delete file that also deletes a bystander's rows is still caught. A file that
    had deletes already (an earlier batch's) has no row count in metadata: the check reads its
    "before" side, and passes; the deletes of both batches apply."""
    settings = one_file_lake(spark, tmp_path).replace(purge={"policy": "batched"})
    spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    (file,) = live_files(settings)
    rows = pq.read_metadata(file.removeprefix("file:")).num_rows
    ids = pq.read_table(file.removeprefix("file:"), columns=["user_id"]).column("user_id")
    erased_rows, bystander_rows = (pc.sum(pc.equal(ids, who)).as_py() for who in (ERASED, BYSTANDER))
    assert erased_rows > 0 and bystander_rows > 0
    ledger = Ledger(settings)
    if case == "older_deletes":  # an earlier batch erased the bystander: the file has a delete file
        ledger.submit([RequestInput(BYSTANDER, "erase")])
        assert {r.status for r in run(spark, settings).requests} == {"erased"}
        rows -= bystander_rows
    if case == "damaged":  # a bug that also deletes a bystander's rows, in the delete file only
        bystander_at = pc.indices_nonzero(pc.equal(ids, BYSTANDER)).to_pylist()
        real = indriver.position_deletes
        monkeypatch.setattr(indriver, "position_deletes", lambda spark, candidates, positions: real(
            spark, candidates, {f: sorted(at + bystander_at) for f, at in positions.items()}))
    ledger.submit([RequestInput(ERASED, "erase")])
    report = run(spark, settings)
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "delete_positions" and events["erase"]["write_mode"] == "merge-on-read"
    assert events["erase"]["delete_files_added"] == 1 and events["erase"]["data_files_rewritten"] == 0
    # the plan, and the check's "after" (its deletes applied); "before" only where older deletes hide the count
    after = rows - erased_rows - (bystander_rows if case == "damaged" else 0)
    assert report.cost["erase"]["rows_read"] == rows + after + (rows if case == "older_deletes" else 0)
    # what an independent reader finds: the file less the rows at the delete files' positions
    live = open_catalog(settings).load_table(EVENTS).scan(selected_fields=("user_id",)).to_arrow().column("user_id")
    assert len(live) == after and ERASED not in live.to_pylist()
    assert (pc.sum(pc.equal(live, BYSTANDER)).as_py() or 0) == (bystander_rows if case == "clean" else 0)
    if case == "damaged":
        assert f"{bystander_rows} rows not requested were deleted" in report.collateral_failures[EVENTS]
        assert {r.status for r in report.requests} == {"failed"}
    else:
        assert events["erase"]["collateral"]["ok"] and EVENTS not in report.collateral_failures
        assert {r.status for r in report.requests} == {"erased"}


@pytest.mark.slow
def test_merge_on_read_deletion_on_a_partitioned_table(spark, tmp_path):
    """On a table partitioned by bucket(4, user_id), each position delete file is written into its
    data file's partition and scoped to it; an independent reader applies them: the requested rows
    are gone, every other row is there."""
    settings = one_file_lake(spark, tmp_path).replace(purge={"policy": "batched"})
    table = settings.table(EVENTS)
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {table} ADD PARTITION FIELD bucket(4, user_id)")
    spark.sql(f"CALL {settings.catalog.name}.system.rewrite_data_files(table => '{table}', "
              "options => map('rewrite-all', 'true'))")
    before = open_catalog(settings).load_table(EVENTS).scan().to_arrow()
    assert len(open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()) > 1
    Ledger(settings).submit([RequestInput(ERASED, "erase"), RequestInput(BYSTANDER, "erase")])
    report = run(spark, settings)
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "delete_positions" and events["erase"]["collateral"]["ok"]
    assert {r.status for r in report.requests} == {"erased"}
    files = open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()
    data = {f["file_path"]: f["partition"] for f in files if f["content"] == 0}
    deletes = [f for f in files if f["content"] == 1]
    assert deletes and events["erase"]["delete_files_added"] == len(deletes)
    for d in deletes:  # scoped to one data file, in its partition
        targets = set(pq.read_table(d["file_path"].removeprefix("file:"), columns=["file_path"])
                      .column("file_path").to_pylist())
        assert len(targets) == 1 and data[targets.pop()] == d["partition"]
    after = open_catalog(settings).load_table(EVENTS).scan().to_arrow()
    kept = before.filter(pc.invert(pc.is_in(before.column("user_id"), value_set=pa.array([ERASED, BYSTANDER]))))
    assert sorted(after.column("event_id").to_pylist()) == sorted(kept.column("event_id").to_pylist())


@pytest.mark.slow
def test_merge_on_read_deletion_beyond_max_delete_positions_runs_spark_statement(spark, tmp_path):
    """More requested rows than `erase.max_delete_positions`: the plan hands no positions to the
    driver, and Spark's MERGE writes the delete file, reading the key column once more."""
    settings = one_file_lake(spark, tmp_path)
    (file,) = live_files(settings)
    ids = pq.read_table(file.removeprefix("file:"), columns=["user_id"]).column("user_id")
    rows, erased_rows = len(ids), pc.sum(pc.equal(ids, ERASED)).as_py()
    settings = settings.replace(purge={"policy": "batched"}, erase={"in_driver_max_bytes": 0,
                                                                    "max_delete_positions": erased_rows - 1})
    spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'write.merge.mode'='merge-on-read')")
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    report = run(spark, settings)
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "merge_broadcast" and events["erase"]["delete_files_added"] == 1
    assert report.cost["erase"]["rows_read"] == 2 * rows + rows - erased_rows  # plan, MERGE, the check's "after"
    assert {r.status for r in report.requests} == {"erased"}
    live = open_catalog(settings).load_table(EVENTS).scan(selected_fields=("user_id",)).to_arrow().column("user_id")
    assert len(live) == rows - erased_rows and ERASED not in live.to_pylist()


@pytest.mark.slow
def test_merge_on_read_deletion_after_another_writers_commit_runs_spark_statement(spark, tmp_path, monkeypatch):
    """Rows of the requested subject appended between the plan and the erase commit: the positions
    the plan found no longer cover them, so the commit is Spark's statement, which finds them too."""
    settings = one_file_lake(spark, tmp_path).replace(purge={"policy": "batched"})
    spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    late = spark.table(settings.table(EVENTS)).where(F.col("user_id") == ERASED).limit(3).localCheckpoint()

    def append(spark, settings):
        late.writeTo(settings.table(EVENTS)).append()

    written = []
    real = indriver.position_deletes
    monkeypatch.setattr(indriver, "position_deletes", lambda *a: written.append(1) or real(*a))
    wrap_apply(monkeypatch, settings, EVENTS, before=lambda spark, settings, keys: append(spark, settings))
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    report = run(spark, settings)
    assert report.tables[EVENTS]["erase"]["strategy"] == "delete_positions" and not written
    live = open_catalog(settings).load_table(EVENTS).scan(selected_fields=("user_id",)).to_arrow().column("user_id")
    assert ERASED not in live.to_pylist()
    assert {r.status for r in report.requests} == {"erased"}


@pytest.mark.slow
def test_no_identifier_in_plans_or_the_event_log_of_a_real_run(spark, tmp_path):
    """A whole `dsr run` with Spark's event log on: every query plan Spark records (physical plan
    descriptions, plan trees of each SQL execution and its adaptive updates, job and stage
    descriptions) and the process's output hold no identifier of the batch, though data skipping
    turned the identifiers into predicates. Spark rewrites and checks the tables (as large ones),
    so the export's scan carries the content check's sums too."""
    settings, config = make_disk_lakehouse(spark, tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["spark"]["conf"].update(event_log_conf(tmp_path / "events"))
    raw["erase"] = {"in_driver_max_bytes": 0}
    (tmp_path / "events").mkdir()
    config.write_text(yaml.safe_dump(raw))
    erased, asked = [synth.user_id(SEED, 1), synth.user_id(SEED, 2)], synth.user_id(SEED, 5)
    emails = [r.email for r in spark.table(settings.table("demo.users")).where(F.col("user_id").isin(*erased))
              .select("email").collect()]
    assert len(emails) == 2
    Ledger(settings).submit([*(RequestInput(s, "erase") for s in erased), RequestInput(asked, "access")])
    out = dsr_output(config, "run")
    logs = event_logs(tmp_path / "events")
    assert logs and all("SparkListenerSQLExecutionStart" in log for log in logs)
    assert any("BatchScan" in log and "demo.events" in log for log in logs)  # the skipping reads are in the plans
    assert any("lakehouse_dsr.HashSum" in log for log in logs)  # and the summed scans
    for value in [*erased, asked, *emails]:
        assert value not in out
        assert not any(value in log for log in logs), "an identifier is in the event log"


def dsr_output(config, *args: str) -> str:
    dsr = str(Path(sys.executable).parent / "dsr")
    done = subprocess.run([dsr, "-c", str(config), *args], cwd=config.parent, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


@pytest.mark.parametrize("case", ["shared", "damaged", pytest.param("asked_and_erased", marks=pytest.mark.slow)])
def test_the_export_reads_the_rewritten_files_once_with_the_content_check(spark, tmp_path, monkeypatch, case):
    """With access and erase requests in one run, the export runs after the first erase commits: the
    content check's "after" side is observed on the export's scan of the commit's new files, so the
    table is read twice (the plan's keys, the rewrite) plus once by the export, not once more by the
    check. The package is the one an export run first writes; a rewrite that changes a bystander's
    row is still caught. A person who asks for a copy and erasure together gets the copy: the table
    is then read as before the erase commit, and the check reads the new file itself."""
    settings = one_file_lake(spark, tmp_path)
    (file,) = live_files(settings)
    before = pq.read_table(file.removeprefix("file:"))
    rows = before.num_rows
    asked = ERASED if case == "asked_and_erased" else ASKED
    wanted = before.filter(pc.equal(before.column("user_id"), asked))
    erased_rows = pc.sum(pc.equal(before.column("user_id"), ERASED)).as_py()
    assert wanted.num_rows > 0 and erased_rows > 0
    if case == "damaged":  # the rewrite also changes a bystander's rows
        real = collateral.erased_rows
        monkeypatch.setattr(collateral, "erased_rows", lambda content, keys, action: real(content, keys, action)
                            .withColumn("event_details", F.when(F.col("user_id") == BYSTANDER, F.lit("changed"))
                                        .otherwise(F.col("event_details"))))
    Ledger(settings).submit([RequestInput(ERASED, "erase"), RequestInput(asked, "access")])
    report = run(spark, settings)

    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "rewrite_files" and events["erase"]["data_files_rewritten"] == 1
    package = json.loads(next((tmp_path / "exports").rglob("req-*.json")).read_text())
    assert sorted(r["event_id"] for r in package["tables"][EVENTS]) == sorted(wanted.column("event_id").to_pylist())
    status = {r.request_id: r.status for r in report.requests}
    exported = report.export["packages"] == 1 and sorted(status.values()).count("completed")
    if case == "damaged":
        assert report.collateral_failures[EVENTS].startswith("rows not requested changed")
        assert events["purge"] == {} and exported == 1  # the erasure failed, the copy was delivered
        assert report.cost["erase"]["rows_read"] == 2 * rows  # the plan's keys, the rewrite: the export read the rest
        assert report.cost["export"]["rows_read"] == rows - erased_rows  # the new file
        return
    assert events["erase"]["collateral"]["ok"] and set(status.values()) == {"completed"}
    assert events["verification"]["passed"] and report.cost["verify"]["rows_read"] < 10  # checked clean: not read
    if case == "shared":
        assert report.cost["erase"]["rows_read"] == 2 * rows
        assert report.cost["export"]["rows_read"] == rows - erased_rows
    else:  # the old file for the copy, and the check reads the new one itself
        assert report.cost["export"]["rows_read"] == rows
        assert report.cost["erase"]["rows_read"] == 2 * rows + rows - erased_rows


def test_the_erasure_concludes_and_purges_while_the_shared_export_writes_its_packages(spark, tmp_path,
                                                                                      monkeypatch):
    """The shared export goes on grouping and writing its packages on a thread of its own once its scan
    (which carried the content check's "after" side) has completed: the check's verdict and the purge
    come meanwhile. The export here waits, before it checks its packages, for the erasure to have
    concluded: a run that waited for the whole export first would leave it waiting a minute, and the
    export would fail."""
    settings = one_file_lake(spark, tmp_path)
    concluded, purged = threading.Event(), threading.Event()
    conclude, purge_table, checked = collateral.conclude_many, purge.purge_table, access.checked_packages

    def purge_and_tell(*args, **kwargs):
        done = purge_table(*args, **kwargs)
        purged.set()
        return done

    monkeypatch.setattr(collateral, "conclude_many", lambda *a, **k: (concluded.set(), conclude(*a, **k))[1])
    monkeypatch.setattr(purge, "purge_table", purge_and_tell)

    def checked_after_the_purge(result):
        assert concluded.wait(60) and purged.wait(60), "the erasure waited for the export's packages"
        return checked(result)

    monkeypatch.setattr(access, "checked_packages", checked_after_the_purge)
    Ledger(settings).submit([RequestInput(ERASED, "erase"), RequestInput(ASKED, "access")])
    report = run(spark, settings.replace(purge={"policy": "immediate"}))
    events = report.tables[EVENTS]
    assert {r.status for r in report.requests} == {"completed"} and report.export["packages"] == 1
    assert events["erase"]["collateral"]["ok"] and events["purge"]["snapshots_expired"] > 0
    assert report.cost["export"]["rows_read"] == events["erase"]["rows_after"]  # the shared scan: the new file
    assert report.cost["erase"]["rows_read"] == 2 * events["erase"]["rows_before"]  # the plan's keys, the rewrite


@pytest.mark.parametrize(("sizes", "parallelism", "split", "loads"), [
    ([12] * 40, 2, 128, [120] * 4),  # Iceberg packs 11, 11, 11 and 7 files: one core idles at the end
    ([12] * 40, 2, 100, [72, 72, 84, 84, 84, 84]),  # 5 splits' worth, rounded up to 6 groups
    ([30, 10, 10, 10, 10, 10, 10, 10], 2, 50, [50, 50]),
    # many cores: 64 groups would make a rewrite write 64 files of 7.5 where 4 of 120 do
    ([12] * 40, 64, 128, [120] * 4),
])
def test_files_are_packed_into_groups_of_even_size(sizes, parallelism, split, loads):
    groups = skipping.balanced_groups(sizes, parallelism, split)
    assert groups is not None
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))  # each file once
    assert sorted(sum(sizes[i] for i in g) for g in groups) == loads


@pytest.mark.parametrize(("sizes", "why"), [
    ([10, 20, 30], "they fill one split"),
    ([200, 10, 10], "a file larger than a split: Iceberg splits it by row groups"),
    ([100, 100, 100], "no more files than groups"),
])
def test_files_iceberg_packs_as_well_are_left_to_it(sizes, why):
    assert skipping.balanced_groups(sizes, 2, 128) is None, why


def every_file_a_candidate(spark, tmp_path) -> tuple[list[dict], skipping.Candidates]:
    """An unclustered events table of 6 files (pyiceberg's file entries) and its candidates for
    every user: no file can be skipped."""
    settings = make_settings(tmp_path, datamap={"subject": "user_id", "identifiers": {},
                                                "tables": {EVENTS: {"key": "user_id"}}})
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=400, seed=SEED, batches=6)
    files = open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()
    everyone = sorted({u for f in files for u in pq.read_table(f["file_path"].removeprefix("file:"),
                                                                columns=["user_id"]).column("user_id").to_pylist()})
    return files, table_keys(spark, settings, everyone).current_candidates(Lake.of(spark, settings).table(EVENTS))


def test_groups_iceberg_cannot_pack_from_one_scan_are_read_as_a_union_of_scans(spark, tmp_path, monkeypatch):
    """Where Iceberg's packing, with the heaviest group's weight as split, does not reproduce the groups
    (here: one file, then all the others, whose first file would join the first group), each group is
    a scan of its own, every file read once."""
    files, candidates = every_file_a_candidate(spark, tmp_path)
    assert candidates.files == len(files) >= 3
    lone = [[0], list(range(1, len(files)))]
    assert bridge(spark).splitForGroups(candidates._tasks, json.dumps(lone)) == 0
    monkeypatch.setattr(skipping, "balanced_groups", lambda *_: lone)
    rows = skipping.read(candidates)
    assert rows.rdd.getNumPartitions() == 2
    assert str(rows._jdf.queryExecution().executedPlan()).count("BatchScan") == 2
    first = {f["file_path"]: f["record_count"] for f in files}[candidates.paths()[0]]
    assert sorted(rows.rdd.glom().map(len).collect()) == sorted([first, sum(f["record_count"] for f in files) - first])


def test_the_one_scan_keeps_each_group_closed_once_the_next_one_opens(spark, tmp_path, monkeypatch):
    """Groups [largest], [second, third], [smallest], where the smallest file would still fit beside
    the largest: Iceberg's packing looking back at open groups (its default) would put it there; the
    one scan packs with a lookback of 1, as `splitForGroups` checked, so each task is one group."""
    _, candidates = every_file_a_candidate(spark, tmp_path)
    by_size = sorted(zip(candidates._sizes, candidates.paths(), strict=True), reverse=True)
    (largest, first), (second, second_path), (third, third_path), (smallest, last) = (
        by_size[0], by_size[1], by_size[2], by_size[-1])
    assert largest + smallest <= second + third  # the smallest fits beside the largest within the split
    four = candidates.subset(spark, {first, second_path, third_path, last})
    index = {p: i for i, p in enumerate(four.paths())}
    groups = [[index[first]], [index[second_path], index[third_path]], [index[last]]]
    assert bridge(spark).splitForGroups(four._tasks, json.dumps(groups)) == second + third
    monkeypatch.setattr(skipping, "balanced_groups", lambda *_: groups)
    rows = skipping.read(four)
    assert str(rows._jdf.queryExecution().executedPlan()).count("BatchScan") == 1
    tasks = rows.select(F.input_file_name(), "user_id").rdd.glom().map(lambda part: sorted({r[0] for r in part}))
    assert sorted(tasks.collect()) == sorted([[first], sorted([second_path, third_path]), [last]])


def test_files_filling_several_splits_are_read_and_rewritten_in_even_tasks(spark, tmp_path):
    """An unclustered table whose files fill several splits (`read.split.target-size`, small here):
    the plan reads them in a multiple of the cores' count of tasks with each file once, positions
    included, and a run erases through that read exactly what an independent reader expects."""
    settings = make_settings(tmp_path, erase={"in_driver_max_bytes": 0},
                             datamap={"subject": "user_id", "identifiers": {}, "tables": {EVENTS: {"key": "user_id"}}})
    attach(spark, settings)
    synth.generate(spark, settings, users=40, events=1200, seed=SEED, batches=12)
    files = open_catalog(settings).load_table(EVENTS).inspect.files().to_pylist()
    assert len(files) >= 12
    split = sum(f["file_size_in_bytes"] for f in files) // 3  # 3 splits' worth: 4 groups on 2 cores
    spark.sql(f"ALTER TABLE {settings.table(EVENTS)} SET TBLPROPERTIES ('read.split.target-size'='{split}')")
    everyone = sorted({u for f in files for u in pq.read_table(f["file_path"].removeprefix("file:"),
                                                                columns=["user_id"]).column("user_id").to_pylist()})
    keys = table_keys(spark, settings, everyone)  # no row group can be skipped
    candidates = keys.current_candidates(Lake.of(spark, settings).table(EVENTS))
    rows = skipping.read(candidates, position=True)
    assert rows.rdd.getNumPartitions() == 4
    # One scan packed by Iceberg into the groups, not a union of a scan per group (each broadcasts the table)
    assert str(rows._jdf.queryExecution().executedPlan()).count("BatchScan") == 1
    paths = candidates.paths()
    groups = skipping.balanced_groups(candidates._sizes, spark.sparkContext.defaultParallelism, split)
    tasks = rows.select(F.input_file_name(), "user_id").rdd.glom().map(  # (a read of no column fails in Iceberg)
        lambda part: sorted({r[0] for r in part})).collect()
    assert sorted(tasks) == sorted(sorted(paths[i] for i in g) for g in groups)  # each task one balanced group
    per_task = rows.rdd.glom().map(len).collect()
    assert max(per_task) - min(per_task) <= max(f["record_count"] for f in files)
    # Each file's rows once, at their positions: compared with pyarrow's reading of every file.
    seen = {(r.file, r.pos, r.event_id) for r in rows.select(F.input_file_name().alias("file"), F.col(
        skipping.POSITION).alias("pos"), "event_id", "user_id").collect()}
    expected = {(f["file_path"], i, e) for f in files
                for i, e in enumerate(pq.read_table(f["file_path"].removeprefix("file:"), columns=["event_id"])
                                      .column("event_id").to_pylist())}
    assert seen == expected
    bystanders = sum(pc.sum(pc.not_equal(pq.read_table(f["file_path"].removeprefix("file:"), columns=["user_id"])
                                         .column("user_id"), ERASED)).as_py() for f in files)
    Ledger(settings).submit([RequestInput(ERASED, "erase"), RequestInput(ASKED, "access")])
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    events = report.tables[EVENTS]
    assert events["erase"]["strategy"] == "rewrite_files" and events["erase"]["collateral"]["ok"]
    after = open_catalog(settings).load_table(EVENTS).scan().to_arrow()
    assert after.num_rows == bystanders and ERASED not in set(after.column("user_id").to_pylist())
