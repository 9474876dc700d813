"""Purge edge cases: refs pinning erased rows, orphan files on storage, verification keeping requests open."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from helpers import SEED, ledger_table
from lakehouse_dsr import synth
from lakehouse_dsr.config import PurgeSettings
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.metrics import StageMeter
from lakehouse_dsr.lake.table import ExpireResult, parquet_files_under, same_file
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import erase, purge


def _submit(spark, settings, *indexes) -> list[str]:
    inputs = [RequestInput(synth.user_id(SEED, i), "erase") for i in indexes]
    return Ledger(settings).submit(inputs).created


@pytest.mark.slow  # 15 s; test_refs.py covers each pinned_refs policy on tiny tables
def test_tag_pinning_erased_rows_blocks_until_dropped(spark, new_lakehouse):
    settings = new_lakehouse()
    spark.sql(f"ALTER TABLE {settings.table('demo.events')} CREATE TAG audit_2024")
    (request_id,) = _submit(spark, settings, 0)

    report = run(spark, settings)
    (result,) = report.requests
    assert result.status == "failed"
    assert "tag audit_2024 pins snapshot" in result.reason and "purge.pinned_refs: drop" in result.reason
    assert report.tables["demo.events"]["purge"]["refs_kept"] == ["tag audit_2024"]
    events = report.tables["demo.events"]["verification"]
    assert events["live"] == 0  # invisible, but not yet gone
    assert events["history"] > 0 and events["storage"] >= events["history"]  # the tag's files still hold it
    assert events["refs"]["tag audit_2024"] > 0
    status = Ledger(settings).request(request_id)
    assert status.status == "failed" and "audit_2024" in status.status_reason
    still_open = ledger_table(spark, settings, "dsr.requests").where("subject_id IS NOT NULL").count()
    assert still_open == 1  # an open request keeps what it needs to be retried

    dropping = settings.model_copy(update={"purge": PurgeSettings(pinned_refs="drop")})
    report = run(spark, dropping)
    assert [(r.request_id, r.status) for r in report.requests] == [(request_id, "completed")]
    assert report.tables["demo.events"]["purge"]["refs_dropped"] == ["tag audit_2024"]
    assert spark.sql(f"SELECT * FROM {settings.table('demo.events')}.refs WHERE name = 'audit_2024'").count() == 0


def test_orphan_files_are_removed_only_past_the_safety_window(spark, new_lakehouse):
    settings = new_lakehouse()
    events_dir = Path(spark.sql(f"DESCRIBE TABLE EXTENDED {settings.table('demo.events')}")
                      .where("col_name = 'Location'").first().data_type.removeprefix("file:")) / "data"
    # A file a crashed writer left behind: same rows as a live file, referenced by no snapshot.
    source = next(events_dir.rglob("*.parquet"))
    orphan = events_dir / "00000-0-crashed-writer-00001.parquet"
    shutil.copy(source, orphan)
    (request_id,) = _submit(spark, settings, 0)

    report = run(spark, settings)
    assert orphan.exists()  # too young: a writer could still be committing it
    assert report.requests[0].status == "failed"
    assert "files on storage (incl. unreferenced/orphan files)" in report.requests[0].reason
    assert report.tables["demo.events"]["verification"]["history"] == 0

    two_hours_ago = time.time() - 7200
    os.utime(orphan, (two_hours_ago, two_hours_ago))
    report = run(spark, settings)
    assert not orphan.exists()
    assert [(r.request_id, r.status) for r in report.requests] == [(request_id, "completed")]
    assert report.tables["demo.events"]["verification"]["storage"] == 0


def test_copy_on_write_and_merge_on_read_tables_agree(spark, new_lakehouse):
    """Same data, same request: both write modes end with the same rows and verified purges."""
    settings = new_lakehouse()
    spark.sql(f"ALTER TABLE {settings.table('demo.orders')} SET TBLPROPERTIES ('write.merge.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {settings.table('demo.users')} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'format-version'='3')")
    spark.sql(f"ALTER TABLE {settings.table('demo.events')} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write')")
    _submit(spark, settings, 0, 1, 2)
    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"] * 3
    # merge-on-read orders, purged in this run: the files holding the people are rewritten at once
    assert report.tables["demo.orders"]["erase"]["strategy"] == "rewrite_files"
    users = report.tables["demo.users"]
    # format v3 (row lineage) keeps Spark's statements; MERGE would ignore its delete mode
    assert users["erase"]["strategy"] == "delete_where_exists"
    assert users["erase"]["write_mode"] == "merge-on-read" and users["erase"]["delete_files_added"] == 1
    assert users["purge"]["data_files_rewritten"] >= 1  # deletion vectors purged
    assert report.tables["demo.events"]["erase"]["data_files_rewritten"] >= 1  # copy-on-write rewrote
    ids = {synth.user_id(SEED, i) for i in range(3)}
    for table in ("demo.users", "demo.events", "demo.orders"):
        assert not {r.user_id for r in spark.table(settings.table(table)).collect()} & ids
    assert spark.table(settings.table("demo.orders")).where("user_id IS NULL AND customer_name IS NULL").count() >= 1


def test_strategy_rule():
    cow = dict.fromkeys(("delete", "update", "merge"), "copy-on-write")
    mor_delete = {**cow, "delete": "merge-on-read"}
    assert erase.choose_strategy("delete", 100, 1_000_000, cow) == "merge_broadcast"
    assert erase.choose_strategy("redact", 100, 1_000_000, mor_delete) == "merge_broadcast"
    assert erase.choose_strategy("delete", 100, 1_000_000, mor_delete) == "delete_where_exists"
    assert erase.choose_strategy("delete", 2_000_000, 1_000_000, cow) == "delete_where_exists"
    assert erase.choose_strategy("redact", 2_000_000, 1_000_000, cow) == "update_where_exists"
    assert erase.choose_strategy("delete", 100, 1_000_000, mor_delete, rewrite=True) == "rewrite_files"
    assert erase.choose_strategy("redact", 100, 1_000_000, cow, simple=False, rewrite=True) == "rewrite_files"
    # its join broadcasts the key set: beyond the limit, the statements that need not
    assert erase.choose_strategy("delete", 2_000_000, 1_000_000, cow, rewrite=True) == "delete_where_exists"
    # the plan's scan found the positions: whatever the key set's size or shape, no statement
    assert erase.choose_strategy("delete", 2_000_000, 1_000_000, mor_delete, positions=True) == "delete_positions"
    assert erase.choose_strategy("delete", 100, 1_000_000, mor_delete, simple=False, positions=True) \
        == "delete_positions"
    assert erase.choose_strategy("delete", 100, 1_000_000, mor_delete, rewrite=True, positions=True) == "rewrite_files"


def test_large_key_sets_use_shuffle_statements(spark, new_lakehouse):
    settings = new_lakehouse(erase={"broadcast_max_keys": 0})
    _submit(spark, settings, 0, 1)
    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"] * 2
    strategies = {name: t["erase"]["strategy"] for name, t in report.tables.items()}
    assert strategies == {"demo.users": "delete_where_exists", "demo.events": "delete_where_exists",
                          "demo.newsletter": "delete_where_exists", "demo.orders": "update_where_exists"}
    ids = {synth.user_id(SEED, i) for i in range(2)}
    assert not {r.user_id for r in spark.table(settings.table("demo.events")).collect()} & ids


def test_a_catalog_named_like_the_namespace_is_purged_in_its_own_tables(spark, new_lakehouse):
    """Catalog `demo`, tables `demo.*`: a procedure given `demo.events` alone would look for `events`
    in catalog demo's default namespace."""
    settings = new_lakehouse(catalog={"name": "demo", "properties": {"type": "hadoop", "warehouse": "wh"}})
    _submit(spark, settings, 0)
    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"]
    assert report.tables["demo.events"]["verification"]["passed"]
    # delete files for the purge's procedures (the run rewrote the files holding the subject at once)
    spark.sql(f"DELETE FROM {settings.table('demo.events')} WHERE event_type = 'click'")
    purged = purge.purge_table(Lake.of(spark, settings), settings.datamap, settings.purge, "demo.events")
    assert purged.data_files_rewritten >= 1 and purged.delete_files_removed >= 1 and not purged.error


def test_manifest_rewrite_and_expiry_leave_only_the_current_snapshots_files(spark, new_lakehouse):
    """The manifest rewrite drops the entries of removed files; the expiry, in the driver (Iceberg's
    core API, no Spark stage), leaves storage holding the current snapshot's files and no more,
    counts the data and delete files it removed, and the data stays."""
    settings = new_lakehouse()
    table = "demo.events"
    name = settings.table(table)
    spark.sql(f"DELETE FROM {name} WHERE event_type = 'click'")  # merge-on-read: adds delete files
    Lake.of(spark, settings).table(table).rewrite_files_with_deletes(128 * 1024 * 1024)
    rows = spark.table(name).count()
    removed = f"SELECT * FROM {name}.entries WHERE status = 2"  # DELETED entries keep removed files' bounds
    assert spark.sql(removed).count() > 0
    assert Lake.of(spark, settings).table(table).rewrite_manifests() > 0
    assert spark.sql(removed).count() == 0 and spark.table(name).count() == rows
    location = Lake.of(spark, settings).table(table).location()
    before = set(map(same_file, parquet_files_under(spark, location)))
    current = {same_file(r.file_path) for r in spark.sql(f"SELECT file_path FROM {name}.files").collect()}
    snapshots = spark.sql(f"SELECT * FROM {name}.snapshots").count()
    assert snapshots >= 3 and before > current

    meter = StageMeter(spark)
    mark = meter.mark()
    expired = Lake.of(spark, settings).table(table).expire_snapshots_before_current()
    assert meter.since(mark).stages == 0

    after = set(map(same_file, parquet_files_under(spark, location)))
    assert after == current
    assert expired.files_deleted == len(before - after)
    assert expired.snapshots_expired == snapshots - 1
    assert spark.sql(f"SELECT * FROM {name}.snapshots").count() == 1
    assert spark.table(name).count() == rows
    assert Lake.of(spark, settings).table(table).expire_snapshots_before_current() == ExpireResult(0, 0)
