"""Branches and tags under `purge.pinned_refs`: only refs holding an erased person's rows are touched.

The lake: a tag `release_2024` made before the person arrived (pins none of their rows), a tag
`audit_q3` made after (pins them), and a write-audit-publish branch `staging` holding staged rows
of that person and of three others. Checked with pyiceberg and pyarrow over the table's own files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable

from helpers import SEED, add_subjects, datamap_dict, make_settings
from lakehouse_dsr import synth
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import purge, refs

ERASED = "5e1f0c4a-0d3b-4c6e-9a57-refs00000001"
OTHERS = [synth.user_id(SEED, i) for i in (1, 2, 3)]


def _history_lake(spark, new_lakehouse, policy: str):
    """The lake above and the erase request of ERASED; returns (settings, ref -> snapshot id before the run)."""
    settings = new_lakehouse(purge={"pinned_refs": policy})
    events = settings.table("demo.events")
    spark.sql(f"ALTER TABLE {events} CREATE TAG release_2024")
    add_subjects(spark, settings, [ERASED], "gone")
    spark.sql(f"ALTER TABLE {events} CREATE TAG audit_q3")
    spark.sql(f"ALTER TABLE {events} CREATE BRANCH staging")
    staged = spark.createDataFrame([(u,) for u in [ERASED, *OTHERS, ERASED]], "user_id string")
    staged.selectExpr("uuid() event_id", "user_id", "'staged' event_type", "timestamp'2024-09-01' event_timestamp",
                      "cast(null as string) page_url", "cast(null as string) product_id",
                      "'Staged' event_details").writeTo(f"{events}.branch_staging").append()
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    return settings, _refs(_static(settings))


def _static(settings) -> StaticTable:
    meta = settings.catalog.local_warehouse() / "demo" / "events" / "metadata"
    version = (meta / "version-hint.text").read_text().strip()
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def _refs(static: StaticTable) -> dict[str, int]:
    return {name: ref.snapshot_id for name, ref in static.metadata.refs.items() if name != "main"}


def _users_at(static: StaticTable, snapshot_id: int) -> list[tuple[str, str]]:
    rows = static.scan(snapshot_id=snapshot_id, selected_fields=("user_id", "event_type")).to_arrow().to_pylist()
    return [(r["user_id"], r["event_type"]) for r in rows]


def _assert_no_file_holds_erased(static: StaticTable) -> None:
    """Every data file any retained snapshot references, read raw (no delete applied)."""
    for snapshot in static.metadata.snapshots:
        for entry in static.inspect.entries(snapshot_id=snapshot.snapshot_id).to_pylist():
            path = entry["data_file"]["file_path"]
            if entry["data_file"]["content"] == 0 and entry["status"] != 2:  # a data file the snapshot holds
                assert ERASED not in pq.read_table(Path(path.removeprefix("file:")), columns=["user_id"]) \
                    .column("user_id").to_pylist(), (snapshot.snapshot_id, path)


def _assert_staging_erased_in_place(static: StaticTable, before: dict[str, int]) -> None:
    after = _refs(static)
    assert after["staging"] != before["staging"]
    rows = _users_at(static, after["staging"])
    assert ERASED not in {u for u, _ in rows}
    assert sorted(u for u, t in rows if t == "staged") == sorted(OTHERS)  # everyone else's staged rows kept


# About 11-20 s each on 2 cores: make test-slow (make test stays under its 10 minutes).
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["drop", "rewrite"])
def test_only_refs_pinning_erased_rows_are_touched(spark, new_lakehouse, policy):
    settings, before = _history_lake(spark, new_lakehouse, policy)
    release_rows = _users_at(_static(settings), before["release_2024"])
    audit_rows = _users_at(_static(settings), before["audit_q3"])
    assert sum(u == ERASED for u, _ in audit_rows) == 3 and ERASED not in {u for u, _ in release_rows}

    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"], report.requests[0].reason
    purge = report.tables["demo.events"]["purge"]
    assert purge["refs_clean"] == ["tag release_2024"] and purge["refs_kept"] == []
    static = _static(settings)
    after = _refs(static)
    assert after["release_2024"] == before["release_2024"]  # untouched
    if policy == "drop":
        assert purge["refs_dropped"] == ["tag audit_q3"] and purge["refs_rewritten"] == ["branch staging"]
        assert "audit_q3" not in after
    else:
        assert purge["refs_dropped"] == [] and sorted(purge["refs_rewritten"]) == ["branch staging", "tag audit_q3"]
        assert after["audit_q3"] != before["audit_q3"]
        assert sorted(_users_at(static, after["audit_q3"])) == sorted(r for r in audit_rows if r[0] != ERASED)
    _assert_staging_erased_in_place(static, before)
    _assert_no_file_holds_erased(static)
    assert report.tables["demo.events"]["verification"]["refs"] == {label: 0 for label in purge["refs_clean"]
                                                                    + purge["refs_rewritten"]}


def test_a_temporary_branch_left_by_an_interrupted_rewrite_is_removed(spark, new_lakehouse):
    """A purge killed between a tag's rewrite commit and the tag's move leaves `dsr-rewrite-<tag>`: the
    next purge removes it. Without hashes to tell a ref clean (a share's purge), every ref is kept."""
    settings = new_lakehouse(purge={"pinned_refs": "rewrite"})
    events = settings.table("demo.events")
    spark.sql(f"ALTER TABLE {events} CREATE TAG audit_q3")
    spark.sql(f"ALTER TABLE {events} CREATE BRANCH `{refs.TEMPORARY}audit_q3`")
    add_subjects(spark, settings, [ERASED], "gone")

    result = purge.purge_table(Lake.of(spark, settings), settings.datamap, settings.purge, "demo.events")
    assert result.refs_kept == ["tag audit_q3"] and not result.refs_rewritten and not result.refs_dropped
    assert sorted(_refs(_static(settings))) == ["audit_q3"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["drop", "rewrite"])
def test_refs_across_a_history_of_renames_partition_changes_and_old_deletes(spark, new_lakehouse, policy):
    """Issue 28's history case: old position deletes (merge-on-read), partition evolution (bucket of the
    key), a tag before the person arrived, the key column renamed (`user_id` -> `uid`, the data map names
    the new one; old files keep the old name, Iceberg reads them by field id), a tag pinning the person
    and a WAP branch with their and others' staged rows. After one run no file of any retained snapshot
    holds them, read raw by every column; the clean tag and the others' staged rows stay."""
    datamap = datamap_dict(demo_datamap(derived=False))
    datamap["tables"]["demo.events"] = {**datamap["tables"]["demo.events"], "key": "uid"}
    settings = new_lakehouse(purge={"pinned_refs": policy}, datamap=datamap)
    events = settings.table("demo.events")
    spark.sql(f"ALTER TABLE {events} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    spark.sql(f"DELETE FROM {events} WHERE event_type = 'logout'")  # old position deletes
    spark.sql(f"ALTER TABLE {events} ADD PARTITION FIELD bucket(4, user_id)")
    spark.sql(f"ALTER TABLE {events} CREATE TAG release_2024")
    add_subjects(spark, settings, [ERASED], "gone")  # written under the new partition spec
    spark.sql(f"ALTER TABLE {events} RENAME COLUMN user_id TO uid")
    spark.sql(f"ALTER TABLE {events} CREATE TAG audit_q3")
    spark.sql(f"ALTER TABLE {events} CREATE BRANCH staging")
    staged = spark.createDataFrame([(u,) for u in [ERASED, *OTHERS]], "uid string")
    staged.selectExpr("uuid() event_id", "uid", "'staged' event_type", "timestamp'2024-09-01' event_timestamp",
                      "cast(null as string) page_url", "cast(null as string) product_id",
                      "'Staged' event_details").writeTo(f"{events}.branch_staging").append()
    Ledger(settings).submit([RequestInput(ERASED, "erase")])
    before = _refs(_static(settings))

    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"], report.requests[0].reason
    static = _static(settings)
    after = _refs(static)
    assert after["release_2024"] == before["release_2024"]  # pinned nobody erased: untouched
    assert ("audit_q3" in after) == (policy == "rewrite")
    staging = static.scan(snapshot_id=after["staging"], selected_fields=("uid", "event_type")).to_arrow().to_pylist()
    assert sorted(r["uid"] for r in staging if r["event_type"] == "staged") == sorted(OTHERS)
    for snapshot in static.metadata.snapshots:  # every data file of every retained snapshot, every column
        for entry in static.inspect.entries(snapshot_id=snapshot.snapshot_id).to_pylist():
            if entry["data_file"]["content"] == 0 and entry["status"] != 2:
                table = pq.read_table(Path(entry["data_file"]["file_path"].removeprefix("file:")))
                assert all(ERASED not in table.column(c).to_pylist() for c in table.column_names
                           if table.schema.field(c).type == "string"), entry["data_file"]["file_path"]


ERASED_NO = 1_000_042  # an INT key value in the old files, a BIGINT one in the new


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["drop", "rewrite"])
def test_refs_across_a_key_renamed_and_promoted_from_int_to_bigint(spark, tmp_path, policy):
    """Issue 28's history case with a numeric key: written as INT `user_no` (old position deletes,
    then partition evolution by bucket of the key and a tag pinning nobody erased), then renamed `uid`
    and promoted to BIGINT (Iceberg reads the old INT files as BIGINT, by field id), more rows with
    keys past the INT range, a tag pinning the erased person and a WAP branch with their and others'
    staged rows. After one run no data file of any retained snapshot holds them, read raw with
    pyarrow (old files: INT `user_no`, new: BIGINT `uid`); the clean tag and others' staged rows stay."""
    settings = make_settings(tmp_path, purge={"pinned_refs": policy},
                             datamap={"subject": "user_id", "tables": {"hist.points": {"key": "uid"}}})
    attach(spark, settings)
    name = settings.table("hist.points")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.hist")
    spark.sql(f"CREATE TABLE {name} (user_no int, points int, note string) USING iceberg TBLPROPERTIES "
              "('format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
              "'write.merge.mode'='merge-on-read')")
    spark.sql(f"INSERT INTO {name} SELECT CAST(id % 20 AS INT), CAST(id AS INT), 'old' FROM range(60)")
    spark.sql(f"DELETE FROM {name} WHERE points % 7 = 0")  # old position deletes
    spark.sql(f"ALTER TABLE {name} ADD PARTITION FIELD bucket(4, user_no)")
    spark.sql(f"ALTER TABLE {name} CREATE TAG release_2024")
    spark.sql(f"INSERT INTO {name} VALUES ({ERASED_NO}, 1, 'int'), ({ERASED_NO}, 2, 'int'), (3, 3, 'int')")
    spark.sql(f"ALTER TABLE {name} RENAME COLUMN user_no TO uid")
    spark.sql(f"ALTER TABLE {name} ALTER COLUMN uid TYPE BIGINT")
    spark.sql(f"INSERT INTO {name} VALUES ({ERASED_NO}, 4, 'bigint'), (5000000001, 5, 'bigint'), "
              "(5000000002, 6, 'bigint')")
    spark.sql(f"ALTER TABLE {name} CREATE TAG audit_q3")
    spark.sql(f"ALTER TABLE {name} CREATE BRANCH staging")
    spark.sql(f"INSERT INTO {name}.branch_staging VALUES ({ERASED_NO}, 7, 'staged'), (5000000003, 8, 'staged'), "
              "(4, 9, 'staged')")
    static = _points(settings)
    before = _refs(static)
    assert ERASED_NO not in _column(static, before["release_2024"], "uid")
    assert _column(static, before["audit_q3"], "uid").count(ERASED_NO) == 3
    Ledger(settings).submit([RequestInput(str(ERASED_NO), "erase")])

    report = run(spark, settings)
    assert [r.status for r in report.requests] == ["completed"], report.requests[0].reason
    static = _points(settings)
    after = _refs(static)
    assert after["release_2024"] == before["release_2024"]  # pinned nobody erased: untouched
    assert ("audit_q3" in after) == (policy == "rewrite")
    if policy == "rewrite":
        assert _column(static, after["audit_q3"], "uid").count(ERASED_NO) == 0
    staged = static.scan(snapshot_id=after["staging"]).to_arrow().to_pylist()
    assert sorted(r["uid"] for r in staged if r["note"] == "staged") == [4, 5000000003]  # others' staged rows
    assert sorted(r["uid"] for r in static.scan().to_arrow().to_pylist() if r["note"] == "bigint") == \
        [5000000001, 5000000002]
    kinds = set()
    for snapshot in static.metadata.snapshots:  # every data file of every retained snapshot, raw
        for entry in static.inspect.entries(snapshot_id=snapshot.snapshot_id).to_pylist():
            if entry["data_file"]["content"] == 0 and entry["status"] != 2:
                table = pq.read_table(Path(entry["data_file"]["file_path"].removeprefix("file:")))
                keys = [c for c in table.column_names if c in ("user_no", "uid")]
                assert keys and all(ERASED_NO not in table.column(c).to_pylist() for c in keys), \
                    entry["data_file"]["file_path"]
                kinds |= {(c, str(table.schema.field(c).type)) for c in keys}
    assert kinds == {("user_no", "int32"), ("uid", "int64")}  # old INT files and new BIGINT ones were read


def _points(settings) -> StaticTable:
    meta = settings.catalog.local_warehouse() / "hist" / "points" / "metadata"
    version = (meta / "version-hint.text").read_text().strip()
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def _column(static: StaticTable, snapshot_id: int, column: str) -> list:
    """The key column at a snapshot, read with that snapshot's schema (`user_no` before the rename)."""
    rows = static.scan(snapshot_id=snapshot_id).to_arrow()
    return rows.column(column if column in rows.column_names else "user_no").to_pylist()
