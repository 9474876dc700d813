"""Delta Lake tables in the stages around the cycle: a batched purge, a concurrent writer, people
written back, refusals, format detection, data skipping on a clustered table, a numeric key, and a
Parquet folder adopted in place; checked by delta-rs (`deltalake`), pyarrow and byte scans. The
cycle itself, on an all-Delta and a mixed lake, is test_delta.py."""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from helpers import (
    DELTA_LAYOUTS,
    SEED,
    delta_rows,
    delta_settings,
    delta_traces,
    live_rows,
    make_settings,
    subscribed,
    values_of,
)
from lakehouse_dsr import synth
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.lake import layout, plainfiles, skipping
from lakehouse_dsr.lake.bridge import compiled
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

USERS = 30
LAYOUTS = {layout: tables for layout, tables in DELTA_LAYOUTS.items() if tables}


@pytest.fixture(scope="module")
def delta_lake(spark, tmp_path_factory):
    """A lake whose events and newsletter are Delta tables, for the tests that change it."""
    root = tmp_path_factory.mktemp("delta-lake")
    settings = delta_settings(root, LAYOUTS["mixed"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED + 1, batches=1)
    return settings


@pytest.mark.slow  # this file runs on one worker: make test stays under 10 minutes
def test_a_batched_erasure_leaves_no_identifier_in_delta_history_and_purges_later(spark, tmp_path):
    settings = delta_settings(tmp_path, LAYOUTS["mixed"], purge={"policy": "batched"})
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED + 2, batches=1)
    ids, _ = subscribed(settings, spark)
    ledger = Ledger(settings)
    submitted = ledger.submit([RequestInput(s, "erase", "gdpr") for s in ids]).created
    first = run(spark, settings)
    assert {s.request_id: s.status for s in ledger.statuses()} == {rid: "erased" for rid in submitted}
    events = settings.delta_tables()["demo.events"]
    history = spark.sql(f"DESCRIBE HISTORY {settings.table('demo.events')}").collect()
    assert [r.operation for r in history][0] == "MERGE"  # the erase commit, not purged yet
    assert not [i for i in ids if i in " ".join(str(r.asDict()) for r in history)]
    assert not set(ids) & values_of(delta_rows(events))
    later = date.fromisoformat(max(s.purge_by for s in ledger.statuses()))
    report = run(spark, settings, today=later)
    assert sorted(r.request_id for r in report.completed) == sorted(submitted)
    # the rows left the data files: rewritten by the MERGE, or masked by it and rewritten by the purge
    rewritten = first.tables["demo.events"]["erase"]["data_files_rewritten"]
    assert rewritten + report.tables["demo.events"]["purge"]["data_files_rewritten"] > 0
    log = [f for f in Path(events, "_delta_log").iterdir() if f.is_file()]
    assert not [f.name for f in log for i in ids if i[:32].encode() in f.read_bytes()]


def test_a_concurrent_append_during_the_erasure_is_kept(spark, delta_lake, monkeypatch):
    from lakehouse_dsr import faults

    settings = delta_lake
    events = settings.delta_tables()["demo.events"]
    late = "late-writer-0001"
    appended: list[int] = []
    armed = faults.failpoint

    def append_meanwhile(name: str) -> None:  # another writer commits between the erase and the purge
        if name == "after_erase" and not appended:
            row = spark.sql(f"SELECT * FROM {settings.table('demo.events')} LIMIT 1").selectExpr(
                "uuid() event_id", f"'{late}' user_id", *[f"`{c}`" for c in
                                                          spark.table(settings.table("demo.events")).columns[2:]])
            row.write.format("delta").mode("append").save(events)
            appended.append(1)
        armed(name)

    monkeypatch.setattr(faults, "failpoint", append_meanwhile)
    erased = synth.user_id(SEED + 1, 2)
    Ledger(settings).submit([RequestInput(erased, "erase", "gdpr")])
    report = run(spark, settings)
    assert appended and not report.failed and len(report.completed) == 1
    users = values_of(delta_rows(events).select(["user_id"]))
    assert late in users and erased not in users


@pytest.mark.slow  # this file runs on one worker: make test stays under 10 minutes
def test_erased_people_appended_again_are_erased_by_the_next_run(spark, delta_lake):
    settings = delta_lake
    events = settings.delta_tables()["demo.events"]
    back = synth.user_id(SEED + 1, 4)
    ledger = Ledger(settings)
    ledger.submit([RequestInput(back, "erase", "gdpr")])
    run(spark, settings)
    replay = spark.table(settings.table("demo.events")).limit(2).selectExpr(
        "event_id", f"'{back}' user_id", *[f"`{c}`" for c in spark.table(settings.table("demo.events")).columns[2:]])
    replay.write.format("delta").mode("append").save(events)  # a backfill brings the person back
    assert back in values_of(delta_rows(events).select(["user_id"]))
    report = run(spark, settings)
    assert "demo.events" in report.resurrections
    assert back not in values_of(delta_rows(events).select(["user_id"]))


def _set_by_hand(location: str, properties: dict[str, str]) -> None:
    """A commit that adds `properties` to the table's metadata, written into its log as another writer
    (with the jars the property needs, which this session lacks) would have."""
    log = sorted(Path(location, "_delta_log").glob("*.json"))
    metadata = next(json.loads(line)["metaData"] for f in log for line in f.read_text().splitlines()
                    if "metaData" in json.loads(line))
    metadata["configuration"] = {**metadata.get("configuration", {}), **properties}
    version = int(log[-1].stem) + 1
    Path(location, "_delta_log", f"{version:020d}.json").write_text(json.dumps({"metaData": metadata}) + "\n")


@pytest.mark.parametrize(("properties", "said"), [
    ({"delta.appendOnly": "true"}, "delta.appendOnly is true, so Delta refuses every delete and update"),
    # UniForm: the Iceberg metadata its commits write needs Delta's Iceberg jar, and keeps column bounds
    ({"delta.universalFormat.enabledFormats": "iceberg"}, "delta.universalFormat.enabledFormats is iceberg")])
def test_a_delta_table_feature_the_engine_cannot_erase_through_is_refused_by_name_before_anything_changes(
        spark, tmp_path, properties, said):
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=5, events=20, seed=SEED, batches=1)
    events = settings.delta_tables()["demo.events"]
    _set_by_hand(events, properties)
    versions = len(DeltaTable(events).history())
    Ledger(settings).submit([RequestInput(synth.user_id(SEED, 1), "erase", "gdpr")])
    with pytest.raises(DataMapError, match=re.escape(f"table demo.events: {said}")):
        run(spark, settings)
    assert len(DeltaTable(events).history()) == versions
    assert [s.status for s in Ledger(settings).statuses()] == ["received"]


def test_a_column_mapped_delta_table_is_erased_and_proven_by_its_files_own_column_names(spark, tmp_path):
    """Column mapping: the key column renamed after the files were written, so Parquet and the log's
    statistics still call it `user_id` while the table (and the data map) say `member_id`. The raw
    reads of the proof and the statistics of the plan go by the physical name."""
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED, batches=2)
    spark.sql(f"ALTER TABLE {settings.table('demo.events')} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
    spark.sql(f"ALTER TABLE {settings.table('demo.events')} RENAME COLUMN user_id TO member_id")
    raw = settings.model_dump(mode="json", exclude_none=True)
    raw["datamap"]["tables"]["demo.events"]["key"] = "member_id"
    settings = settings_from_dict(raw, base=tmp_path)
    events = settings.delta_tables()["demo.events"]
    assert "member_id" not in pq.read_schema(next(Path(events).glob("*.parquet"))).names  # the files' own name
    erased, kept = synth.user_id(SEED, 3), synth.user_id(SEED, 4)
    Ledger(settings).submit([RequestInput(erased, "erase", "gdpr")])

    report = run(spark, settings)

    assert len(report.completed) == 1 and not report.failed
    verification = report.tables["demo.events"]["verification"]
    assert verification["passed"] and verification["live"] == verification["history"] == 0
    assert delta_traces(events, {erased}, [erased.encode()]) == []
    handle = Lake.of(spark, settings).table("demo.events")
    stored = handle.read_raw(handle.data_files_on_storage(), StructType([StructField("member_id", StringType())]))
    found = {r.member_id for r in stored.distinct().collect()}
    assert kept in found and erased not in found  # read by the physical name: the values are there


def test_the_log_cleanup_drops_delta_s_cached_log_of_its_own_table_only(spark, tmp_path):
    """After the expiry deleted the log files before its checkpoint, Delta's cached log of that table
    (which names them) is replaced, and the table reads whole; another table's cached log is kept."""
    settings = delta_settings(tmp_path, LAYOUTS["mixed"])
    attach(spark, settings)
    synth.generate(spark, settings, users=5, events=20, seed=SEED, batches=2)
    lake = Lake.of(spark, settings)
    events, newsletter = lake.table("demo.events"), lake.table("demo.newsletter")
    rows = spark.table(settings.table("demo.events")).count()
    cached_events, cached_newsletter = events._log(), newsletter._log()
    assert events.expire_snapshots_before_current().snapshots_expired > 0
    assert not events._log().equals(cached_events) and newsletter._log().equals(cached_newsletter)
    assert spark.table(settings.table("demo.events")).count() == rows == delta_rows(events.location()).num_rows


@pytest.mark.slow  # this file runs on one worker: make test stays under 10 minutes
def test_a_v2_checkpoint_table_keeps_no_sidecar_of_an_older_checkpoint(spark, tmp_path):
    """v2 checkpoints keep their file lists, statistics included, in `_delta_log/_sidecars/`: after the
    purge only the new checkpoint's sidecars are left, and the table reads whole with delta-rs."""
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED, batches=1)
    name, events = settings.table("demo.events"), settings.delta_tables()["demo.events"]
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2', "
              "'delta.checkpointInterval' = '2')")
    for _ in range(2):  # commits enough for Delta's own checkpoint
        spark.table(name).limit(3).write.format("delta").mode("append").save(events)
    sidecars = Path(events, "_delta_log", "_sidecars")
    older = set(sidecars.iterdir())
    assert older  # Delta's own v2 checkpoint wrote its file list there
    erased = synth.user_id(SEED, 2)
    Ledger(settings).submit([RequestInput(erased, "erase", "gdpr")])

    report = run(spark, settings)

    assert len(report.completed) == 1 and report.tables["demo.events"]["verification"]["passed"]
    left = set(sidecars.iterdir())
    assert left and not older & left
    assert delta_traces(events, {erased}, [erased.encode()]) == []
    assert delta_rows(events).num_rows == spark.table(name).count()


def test_a_delta_table_in_the_data_map_is_found_without_its_format(spark, tmp_path):
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=5, events=20, seed=SEED, batches=1)
    raw = settings.model_dump(mode="json", exclude_none=True)
    raw["datamap"]["tables"]["demo.events"].pop("format")
    found = settings_from_dict(raw, base=tmp_path)
    assert found.delta_tables() == {"demo.events": str(tmp_path / "delta" / "demo" / "events")}
    assert type(Lake.of(spark, found).table("demo.events")).__name__ == "DeltaTable"
    assert type(Lake.of(spark, found).table("demo.users")).__name__ == "IcebergTable"


def test_a_clustered_delta_table_is_planned_from_its_file_statistics(spark, tmp_path):
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=400, seed=SEED, batches=1)
    events = settings.delta_tables()["demo.events"]
    spark.read.format("delta").load(events).repartition(6).write.format("delta").mode("overwrite").save(events)
    optimized = layout.optimize(Lake.of(spark, settings).table("demo.events"), settings.datamap,
                                target_file_size_bytes=4096)
    assert optimized.files_after > 1 and optimized.bytes_rewritten > 0
    erased = synth.user_id(SEED, 7)
    Ledger(settings).submit([RequestInput(erased, "erase", "gdpr")])
    report = run(spark, settings)
    plan = report.tables["demo.events"]["erase"]
    assert plan["skipping"]["pruned"] and plan["skipping"]["files"] < plan["skipping"]["total_files"]
    assert plan["rows_matched"] > 0 and len(report.completed) == 1
    assert erased not in values_of(delta_rows(events).select(["user_id"]))


def test_a_numeric_key_leaves_no_byte_in_the_log(spark, tmp_path):
    """A key held as a number (a BIGINT account reached through a linked identifier), sitting whole
    in the log's statistics as the smallest value of its file: gone from every byte after the run."""
    raw = {"subject": "user_id",
           "identifiers": {"account_no": {"table": "crm.accounts", "subject_column": "user_id",
                                          "column": "account_no"}},
           "tables": {"crm.accounts": {"key": "user_id", "format": "delta"},
                      "fin.payments": {"key": "account_no", "identifier": "account_no", "format": "delta"}}}
    settings = make_settings(tmp_path, datamap=raw, delta={"warehouse": str(tmp_path / "delta")},
                             purge={"orphan_min_age_minutes": 0})
    attach(spark, settings)
    paths = settings.delta_tables()
    accounts = spark.range(20).selectExpr("concat('user-', cast(id as string)) user_id",
                                          "900000000 + id * 7919 account_no")
    accounts.coalesce(1).write.format("delta").save(paths["crm.accounts"])
    accounts.crossJoin(spark.range(3).withColumnRenamed("id", "n")).selectExpr(
        "account_no", "cast(n * 10 as double) amount").coalesce(1).write.format("delta").save(paths["fin.payments"])
    needle = b"900000000"  # user-0's account: the smallest in the payments file's statistics
    assert needle in b"".join(f.read_bytes() for f in Path(paths["fin.payments"], "_delta_log").glob("*.json"))
    Ledger(settings).submit([RequestInput("user-0", "erase", "gdpr")])
    report = run(spark, settings)
    assert len(report.completed) == 1 and report.tables["fin.payments"]["erase"]["rows_matched"] == 3
    for path in paths.values():
        assert not [f for f in Path(path).rglob("*") if f.is_file() and needle in f.read_bytes()], path
    assert 900000000 not in delta_rows(paths["fin.payments"]).column("account_no").to_pylist()


def test_a_parquet_folder_adopted_as_delta_is_erased_in_place(spark, tmp_path):
    folder = tmp_path / "legacy"
    folder.mkdir()
    for part in range(2):  # seed 002's first step: Parquet files converted to Delta where they are
        rows = {"customer": [f"c{part}-{i}" for i in range(5)], "spend": [float(i) for i in range(5)]}
        pq.write_table(pa.table(rows), folder / f"part-{part}.parquet")
    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0}, datamap={
        "subject": "customer", "tables": {"legacy.spend": {"key": "customer", "format": "delta", "path": str(folder)}}})
    attach(spark, settings)
    adopted = plainfiles.adopt(Lake.of(spark, settings), str(folder), "legacy.spend", "delta")
    assert (adopted.files, adopted.rows, adopted.copied) == (2, 10, False)
    with pytest.raises(DataMapError, match="Delta table already"):
        plainfiles.adopt(Lake.of(spark, settings), str(folder), "legacy.spend", "delta")
    Ledger(settings).submit([RequestInput("c1-3", "erase", "gdpr")])
    report = run(spark, settings)
    assert len(report.completed) == 1
    assert sorted(values_of(delta_rows(str(folder)).select(["customer"]))) == sorted(
        f"c{p}-{i}" for p in range(2) for i in range(5) if (p, i) != (1, 3))
    assert not [f for f in folder.rglob("*") if f.is_file() and b"c1-3" in f.read_bytes()]


def test_a_subset_of_a_delta_tables_files_is_read_without_opening_the_others(spark, tmp_path):
    settings = delta_settings(tmp_path, ["demo.events"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=200, seed=SEED, batches=2)
    handle = Lake.of(spark, settings).table("demo.events")
    files = sorted(re.sub("^file:/+", "/", path) for path, _, _ in handle.live_files())
    assert len(files) >= 2
    rows = handle.read_files(handle.current_snapshot().snapshot_id, {files[0]})
    selected = rows.select(F.input_file_name().alias("file"), "event_id")
    read = selected.collect()
    assert {re.sub("^file:/+", "/", r.file) for r in read} == {files[0]}
    assert sorted(r.event_id for r in read) == sorted(pq.read_table(files[0], columns=["event_id"])["event_id"]
                                                      .to_pylist())
    scan = selected._jdf.queryExecution().executedPlan().collectLeaves().head()
    assert scan.metrics().apply("numFiles").value() == 1  # not every file of the version, filtered


@pytest.mark.slow  # this file runs on one worker: make test stays under 10 minutes
def test_a_commits_files_deletion_vectors_and_rows_are_read_as_its_json_says(spark, tmp_path):
    """commit_files and added_versions against the log's JSON commits parsed here and the files'
    rows counted by pyarrow: a deletion-vector delete, then a copy-on-write one."""
    settings = make_settings(tmp_path, delta={"warehouse": str(tmp_path / "delta")},
                             datamap={"subject": "user_id", "tables": {"app.t": {"key": "user_id", "format": "delta"}}})
    attach(spark, settings)
    lake = Lake.of(spark, settings)
    people = spark.createDataFrame([(f"u{i}", i) for i in range(40)], "user_id string, n int").repartition(2)
    lake.create_table("app.t", people, {"delta.enableDeletionVectors": "true"})
    handle = lake.table("app.t")
    log = Path(re.sub("^file:/*", "/", handle.location())) / "_delta_log"

    def actions(version):
        lines = (log / f"{version:020d}.json").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def local(paths):
        return {re.sub("^file:/+", "/", p) for p in paths}

    spark.sql(f"DELETE FROM {handle.quoted} WHERE n = 3")
    masked = handle.commit_files(1)
    vectors = {a["add"]["path"] for a in actions(1) if "add" in a and a["add"].get("deletionVector")}
    assert len(vectors) == 1 and {p.rsplit("/", 1)[-1] for p in masked.deleted_from} == vectors
    assert masked.removed == masked.added == frozenset() and masked.added_rows == 0

    spark.sql(f"ALTER TABLE {handle.quoted} SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')")
    spark.sql(f"REORG TABLE {handle.quoted} APPLY (PURGE)")
    rewrite = handle.current_snapshot().snapshot_id
    changed = handle.commit_files(rewrite)
    said = actions(rewrite)
    assert {p.rsplit("/", 1)[-1] for p in changed.removed} == {a["remove"]["path"] for a in said if "remove" in a}
    assert {p.rsplit("/", 1)[-1] for p in changed.added} == {a["add"]["path"] for a in said if "add" in a} != set()
    assert not changed.deleted_from
    rows = {name: sum(pq.read_metadata(p).num_rows for p in local(paths))
            for name, paths in (('added', changed.added), ('removed', changed.removed))}
    assert changed.added_rows == rows['added'] == rows['removed'] - 1  # the masked row left with the purge
    live = [path for path, _, _ in handle.live_files()]
    first = {a["add"]["path"] for a in actions(0) if "add" in a}
    assert handle.added_versions(live) == [0 if p.rsplit("/", 1)[-1] in first else rewrite for p in live]


@pytest.mark.parametrize("writer", ["append", pytest.param("delete", marks=pytest.mark.slow)])  # two runs
def test_another_writer_during_the_engines_own_delta_rewrite(spark, tmp_path, monkeypatch, writer):
    """A Delta table without a change data feed is erased by the engine's own rewrite, committed
    through Delta's transaction. Another writer's commit between its write and its commit makes it
    retry from the new version (open-source Delta fails any non-append commit on an unpartitioned
    table after an append, as it fails its own DELETE): an append is kept and the request completes;
    a commit that removed rows leaves the proof to the next run."""
    from lakehouse_dsr.lake import delta

    settings = delta_settings(tmp_path, ["demo.newsletter"])
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=100, seed=SEED + 3, batches=1)
    path = settings.delta_tables()["demo.newsletter"]
    ids, emails = subscribed(settings, spark)
    bystander = sorted(values_of(delta_rows(path).select(["email"])) - set(emails))[0]
    newcomer = "newcomer@example.org"
    done: list[str] = []
    metrics = delta._metrics

    def meanwhile(*args):  # the rows are written, the commit not yet made
        if not done:
            if writer == "append":
                row = {**delta_rows(path).slice(0, 1).to_pylist()[0], "email": newcomer}  # a blind append
                schema = spark.read.format("delta").load(path).schema
                spark.createDataFrame([row], schema).write.format("delta").mode("append").save(path)
            else:
                spark.sql(f"DELETE FROM delta.`{path}` WHERE email = '{bystander}'")
            done.append(writer)
        return metrics(*args)

    from lakehouse_dsr import faults

    histories: list = []
    armed = faults.failpoint

    def history_after_erase(name: str) -> None:  # the erase commit's own entry, before the purge cleans the log
        if name == "after_erase":
            histories.append(spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where("operation = 'DELETE'").collect())
        armed(name)

    monkeypatch.setattr(delta, "_metrics", meanwhile)
    monkeypatch.setattr(faults, "failpoint", history_after_erase)
    ledger = Ledger(settings)
    submitted = ledger.submit([RequestInput(ids[0], "erase", "gdpr")]).created
    report = run(spark, settings)
    erased = report.tables["demo.newsletter"]["erase"]
    assert done and erased["strategy"] == "rewrite_files" and erased["attempts"] == 2
    left = values_of(delta_rows(path).select(["email"]))
    assert emails[0] not in left and (newcomer in left if writer == "append" else bystander not in left)
    ours = [h for h in histories[0] if h.operationParameters["predicate"] == "[]"]
    assert len(ours) == 1 and int(ours[0].operationMetrics["numDeletedRows"]) == 1
    if writer == "delete":  # a commit that removed rows lies between the plan and the erase: not proven yet
        assert not report.completed and not erased["collateral"]["conclusive"]
        monkeypatch.undo()
        report = run(spark, settings)
    assert [r.request_id for r in report.completed] == submitted
    assert delta_traces(path, {emails[0]}, [emails[0].encode()]) == []


def test_a_delta_table_the_metastore_does_not_have_is_refused_by_name_before_anything_changes(spark, tmp_path):
    settings = make_settings(tmp_path, delta={"catalog": "spark_catalog"},
                             datamap={"subject": "user_id", "tables": {"ghost.events": {"key": "user_id",
                                                                                       "format": "delta"}}})
    assert settings.delta_named() == ["ghost.events"] and not settings.delta_tables()
    ledger = Ledger(settings)
    ledger.submit([RequestInput("someone", "erase", "gdpr")])
    with pytest.raises(DataMapError, match=re.escape("table ghost.events: no table `spark_catalog`.`ghost`.`events` "
                                                     "in the metastore")):
        run(spark, settings)
    assert [s.status for s in ledger.statuses()] == ["received"]


@pytest.mark.slow  # make test reached 9:30 on a clean clone
@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_table_with_a_timestamp_ntz_column_is_erased_exported_and_proven(spark, tmp_path, table_format):
    """TIMESTAMP_NTZ (Delta's `timestampNtz` table feature, Iceberg's timestamp without zone): the
    rewrite, the fingerprints, the proof's raw reads and the package keep the wall-clock values."""
    settings = make_settings(tmp_path, delta={"warehouse": str(tmp_path / "delta")},
                             purge={"orphan_min_age_minutes": 0},
                             datamap={"subject": "user_id", "tables": {"app.sessions": {"key": "user_id",
                                                                                       "format": table_format}}})
    attach(spark, settings)
    rows = [(f"u{i % 4}", datetime(2025, 1, 1 + i, 8, 30), i) for i in range(12)]
    Lake.of(spark, settings).create_table(
        "app.sessions", spark.createDataFrame(rows, "user_id string, started timestamp_ntz, n int").coalesce(1), {})
    ledger = Ledger(settings)
    erased, (access,) = ledger.submit([RequestInput("u0", "erase")]).created, \
        ledger.submit([RequestInput("u1", "access")]).created
    report = run(spark, settings)
    assert sorted(r.request_id for r in report.completed) == sorted([*erased, access]), report.failed
    assert report.tables["app.sessions"]["verification"]["passed"]
    assert report.tables["app.sessions"]["erase"]["collateral"]["ok"]
    left = live_rows(settings, "app.sessions").sort_by("n")
    assert left.column("user_id").to_pylist() == [u for u, _, _ in rows if u != "u0"]
    assert left.column("started").to_pylist() == [t for u, t, _ in rows if u != "u0"]  # naive, unshifted
    package = json.loads((Path(settings.export.directory) / report.run_id / f"{access}.json").read_text())
    assert sorted(r["started"] for r in package["tables"]["app.sessions"]) == \
        [t.isoformat(timespec="milliseconds") for u, t, _ in rows if u == "u1"]  # no zone added


@pytest.mark.slow
def test_a_restore_behind_the_engines_back_is_caught_and_the_person_erased_again(spark, tmp_path):
    """Under the batched purge the erase commit's old files stay until the purge, so a RESTORE to the
    version before it brings the erased person back into live data. The purge run's proof finds them
    and fails the request, naming where (no certificate for an erasure that did not hold); the next
    run erases them again, and the purge after it completes the request with nothing left anywhere.
    (Once purged, no version holding the person is left to restore.)"""
    settings = delta_settings(tmp_path, ["demo.events"], purge={"policy": "batched"})
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED + 3, batches=1)
    events = settings.delta_tables()["demo.events"]
    gone = synth.user_id(SEED + 3, 4)
    ledger = Ledger(settings)
    (request,) = ledger.submit([RequestInput(gone, "erase", "gdpr")]).created
    before = run(spark, settings).tables["demo.events"]["erase"]["snapshot_before"]
    assert gone not in values_of(delta_rows(events).select(["user_id"]))
    spark.sql(f"RESTORE TABLE {settings.table('demo.events')} TO VERSION AS OF {before}")
    assert gone in values_of(delta_rows(events).select(["user_id"]))  # back, behind the engine's back

    purge_day = date.fromisoformat(max(s.purge_by for s in ledger.statuses()))
    caught = run(spark, settings, today=purge_day)
    (outcome,) = caught.requests
    assert outcome.status == "failed" and "demo.events: 3 rows in the current snapshot" in outcome.reason
    assert not caught.completed
    again = run(spark, settings, today=purge_day)
    assert [r.status for r in again.requests] == ["erased"]
    assert gone not in values_of(delta_rows(events).select(["user_id"]))
    done = run(spark, settings, today=date.fromisoformat(max(s.purge_by for s in ledger.statuses())))
    assert [r.request_id for r in done.completed] == [request]
    assert delta_traces(events, {gone}, [gone.encode(), gone[:32].encode()]) == []


@pytest.mark.slow
@pytest.mark.parametrize(("key_type", "files", "probes"), [
    # strings past Delta's 32-character statistics (cut minimum, raised maximum), and characters whose
    # UTF-16 order differs from UTF-8's (a supplementary character sorts after U+E000 only in UTF-8)
    ("string", [["a" * 40 + "1", "a" * 40 + "9"], ["\ue000x", "\ue000y"], ["\U0001f600a", "\U0001f600b"], ["m", "n"]],
     ["a" * 40 + "5", "a" * 31, "\ue000z", "\U0001f600a", "\U0001f600c", "mm", "zz"]),
    ("bigint", [[1, 5], [10, 20], [900000000000, 900000000009]], [3, 6, 15, 900000000005, -1]),
])
def test_pruning_by_the_logs_statistics_value_by_value_and_by_range(spark, tmp_path, key_type, files, probes):
    """DeltaStats.java flags the same files, probe by probe, whether it holds the batch's values (one
    by one) or only their range (a set too large for the driver: its minimum and maximum, found by
    Spark in the same UTF-8 order as the statistics); and a value inside a file's bounds flags it."""
    settings = make_settings(tmp_path)
    attach(spark, settings)
    location = str(tmp_path / "keys")
    for rows in files:  # one file each
        spark.createDataFrame([(v,) for v in rows], f"k {key_type}").coalesce(1).write.format("delta") \
            .mode("append").save(location)
    handle = Lake(spark, settings.catalog, delta={"t.keys": location}).table("t.keys")
    version = handle.current_snapshot().snapshot_id
    counts = []
    for probe in probes:
        grouped = spark.createDataFrame([(probe, ["r"])], f"key_value {key_type}, request_ids array<string>")
        held = skipping.key_values(grouped, grouped.schema["key_value"].dataType)
        assert held is not None
        in_driver = handle.files_for_keys(version, [("k", _span(grouped), held)])
        by_range = handle.files_for_keys(version, [("k", _span(grouped), None)])
        assert sorted(in_driver) == sorted(by_range), probe  # one value: its range is itself
        counts.append(sum(1 for f in in_driver if f[3]))
        assert counts[-1] >= sum(1 for rows in files if _utf8(min(rows, key=_utf8)) <= _utf8(probe)
                                 <= _utf8(max(rows, key=_utf8))), probe  # never pruned where it may be
    assert 0 in counts and max(counts) > 0  # some probe pruned every file, some kept one
    # Several values at once: beyond what the driver holds, a file is kept where its bounds overlap the
    # values' range, never fewer than the driver's value-by-value answer
    pair = sorted(probes[:2], key=_utf8)
    grouped = spark.createDataFrame([(v, ["r"]) for v in pair], f"key_value {key_type}, request_ids array<string>")
    held = skipping.key_values(grouped, grouped.schema["key_value"].dataType)
    exact = {f[0] for f in handle.files_for_keys(version, [("k", _span(grouped), held)]) if f[3]}
    ranged = {f[0] for f in handle.files_for_keys(version, [("k", _span(grouped), None)]) if f[3]}
    overlapping = sum(1 for rows in files if _utf8(min(rows, key=_utf8)) <= _utf8(pair[1])
                      and _utf8(pair[0]) <= _utf8(max(rows, key=_utf8)))
    assert exact <= ranged and len(ranged) >= overlapping


def _span(grouped):
    """The values' range as data skipping reads it (matching.KeySet.span): one row, `min` and `max`."""
    return grouped.agg(F.min("key_value").alias("min"), F.max("key_value").alias("max"))


def _utf8(value):
    """Spark's order: strings by their UTF-8 bytes."""
    return value.encode() if isinstance(value, str) else value


def _add_text(action) -> str:
    """An AddFile as JSON, an empty `tags` map left out: Delta 4.4 reads `{}` from a checkpoint where
    a commit's JSON has none (the same file either way)."""
    found = json.loads(str(action.json()))
    if found["add"].get("tags") == {}:
        del found["add"]["tags"]
    return json.dumps(found, sort_keys=True)


@pytest.mark.slow  # every Delta test reads files through the replay; this compares it with Delta's at each version
@pytest.mark.parametrize("properties", [
    pytest.param({"delta.enableDeletionVectors": "true", "delta.checkpointPolicy": "v2",
                  "delta.checkpointInterval": "3"}, id="vectors-v2-checkpoint"),
    pytest.param({"delta.checkpointInterval": "2", "delta.enableChangeDataFeed": "true",
                  "delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"},
                 id="mapped-zorder-classic-checkpoint"),
])
def test_a_versions_files_replayed_in_the_driver_are_deltas_own(spark, tmp_path, properties):
    """The live files `_adds` replays in the driver's JVM from a checkpoint and the commits since
    are Delta's own replay's (allFiles: the same actions, statistics and deletion vectors included),
    and the files delta-rs reads, with the row counts the files hold less those masked; at each
    version, as deletes, appends, a compaction and checkpoints go by. A space in the path checks
    canonical paths."""
    location = str(tmp_path / "a table")
    people = spark.range(30).selectExpr("cast(id as string) user_id", "id", "id % 3 as part").repartition(3)
    people.write.format("delta").partitionBy("part").save(location)
    for key, value in properties.items():
        spark.sql(f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('{key}' = '{value}')")
    handle = Lake(spark, make_settings(tmp_path).catalog, delta={"t.people": location}).table("t.people")
    for i in range(3):
        spark.sql(f"DELETE FROM delta.`{location}` WHERE id = {i * 4}")
        spark.range(2).selectExpr(f"cast(id + 100 * {i} as string) user_id", "id", "id % 3 as part") \
            .write.format("delta").mode("append").save(location)
        if i == 1:
            spark.sql(f"OPTIMIZE delta.`{location}` ZORDER BY (user_id)")
        snapshot = handle._snapshot()
        adds, listed = handle._adds(snapshot)
        theirs = snapshot.allFiles().collectAsList()
        conf = spark._jsc.hadoopConfiguration()
        replayed = compiled(spark, "DeltaLogText").liveFiles(handle._log(), snapshot, 1 << 30, conf)
        assert replayed is not None  # replayed here, not Delta's list handed back by the fallback
        assert sorted(map(_add_text, adds)) == sorted(map(_add_text, replayed)) == sorted(map(_add_text, theirs)) != []
        assert compiled(spark, "DeltaLogText").liveFiles(handle._log(), snapshot, 0, conf) is None  # past the limit
        assert sorted(re.sub("^file:/+", "/", p) for p, _, _, _ in listed) == sorted(
            re.sub("^file:/+", "/", unquote(p)) for p in DeltaTable(location).file_uris())  # delta-rs: URIs
        assert sum(rows for _, _, rows, _ in listed) == delta_rows(location).num_rows == handle.live_rows(
            snapshot.version()) > 0
    log = Path(location) / "_delta_log"
    assert list(log.glob("*.checkpoint*")), "the replay started from a checkpoint"
