"""Retention and branches/tags (issue 28 item 5): a ref is touched only if its snapshot pins a row
past a rule, and then as `purge.pinned_refs` says, as erasure settles refs pinning erased rows.

The lake (web.clicks, rules: redact ip and user_agent after 30 days, delete after 45): a tag `release`
made when the table held only fresh rows (pins nothing past a rule), then rows 60 days old (past the
delete) and 35 days old (past the redaction) and a tag `audit` (pins them), then a branch `staging`
with more such rows and fresh ones. Checked with pyiceberg (each ref's rows) and pyarrow (every data
file of every retained snapshot, and every Parquet file under the table's location, read raw).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable
from typer.testing import CliRunner

from helpers import make_settings, snapshot_ids, write_config
from lakehouse_dsr.cli import app
from lakehouse_dsr.evidence.html import run_report_page
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.holds import add_hold, release_hold
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.runner.orchestrator import run
from lakehouse_dsr.runner.retention import expire

TODAY = date(2025, 6, 30)
TABLE = "web.clicks"
RULES = [{"after": "30 days", "clock": "event_timestamp", "redact": ["ip", "user_agent"]},
         {"after": "45 days", "clock": "event_timestamp", "delete": True}]
SCHEMA = "user_id string, ip string, user_agent string, event_timestamp timestamp, amount bigint"
NOW = datetime(TODAY.year, TODAY.month, TODAY.day, tzinfo=UTC)
DELETE_CUTOFF, REDACT_CUTOFF = NOW - timedelta(days=45), NOW - timedelta(days=30)


def _rows(prefix: str, days: list[int], first: int) -> list[tuple]:
    return [(f"{prefix}{i}", f"10.0.0.{first + i}", "agent", NOW - timedelta(days=d, hours=1), first + i)
            for i, d in enumerate(days)]


def _lake(spark, tmp_path, policy: str, merge_on_read: bool = False):
    """The lake above; returns (settings, ref -> snapshot id, each ref's rows before the pass)."""
    settings = make_settings(tmp_path, purge={"pinned_refs": policy}, datamap={
        "subject": "user_id", "tables": {TABLE: {"key": "user_id", "retention": "45 days", "expire": RULES}}})
    attach(spark, settings)
    name = settings.table(TABLE)
    modes = ("'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
             "'write.merge.mode'='merge-on-read'") if merge_on_read else "'write.delete.mode'='copy-on-write'"
    spark.sql(f"CREATE TABLE {name} ({SCHEMA}) USING iceberg TBLPROPERTIES ({modes})")
    spark.createDataFrame(_rows("fresh", [1, 2, 5, 10], 0), SCHEMA).writeTo(name).append()
    spark.sql(f"ALTER TABLE {name} CREATE TAG `release`")
    spark.createDataFrame(_rows("old", [60, 61, 62, 35, 36], 10), SCHEMA).writeTo(name).append()
    spark.sql(f"ALTER TABLE {name} CREATE TAG audit")
    spark.sql(f"ALTER TABLE {name} CREATE BRANCH staging")
    spark.createDataFrame(_rows("staged", [50, 52, 40, 3, 4], 20), SCHEMA).writeTo(f"{name}.branch_staging").append()
    static = _static(spark, settings)
    before = _refs(static)
    return settings, before, {ref: _at(static, sid) for ref, sid in before.items()}


def _static(spark, settings) -> StaticTable:
    lake = Lake.of(spark, settings)
    return StaticTable.from_metadata(
        lake.table(TABLE).java().operations().current().metadataFileLocation())


def _refs(static: StaticTable) -> dict[str, int]:
    return {name: ref.snapshot_id for name, ref in static.metadata.refs.items()}


def _at(static: StaticTable, snapshot_id: int) -> list[dict]:
    return sorted(static.scan(snapshot_id=snapshot_id).to_arrow().to_pylist(), key=lambda r: r["amount"])


def _as_the_rules_leave(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["event_timestamp"] < DELETE_CUTOFF:
            continue
        out.append({**r, "ip": None, "user_agent": None} if r["event_timestamp"] < REDACT_CUTOFF else r)
    return out


def _assert_nothing_past_anywhere(static: StaticTable) -> None:
    """Every data file of every retained snapshot, then every Parquet file under the location, raw."""
    paths = set()
    for snapshot in static.metadata.snapshots:
        for entry in static.inspect.entries(snapshot_id=snapshot.snapshot_id).to_pylist():
            if entry["data_file"]["content"] == 0 and entry["status"] != 2:
                paths.add(Path(entry["data_file"]["file_path"].removeprefix("file:")))
    location = Path(static.metadata.location.removeprefix("file:"))
    stored = set(location.rglob("*.parquet"))
    assert paths and paths <= stored
    for path in stored:
        rows = pq.read_table(path, columns=["ip", "user_agent", "event_timestamp"])
        assert pc.sum(pc.less(rows["event_timestamp"], DELETE_CUTOFF)).as_py() in (None, 0), path
        old = rows.filter(pc.less(rows["event_timestamp"], REDACT_CUTOFF))
        assert old["ip"].null_count == old.num_rows and old["user_agent"].null_count == old.num_rows, path


# main's expiry on a merge-on-read table writes delete files (the purge rewrites main's); a branch's and a
# tag's cleaning is copy-on-write whatever the table's mode (refs.rewrite_on_branch)
@pytest.mark.parametrize(("policy", "merge_on_read"), [("drop", False), ("rewrite", True)])
def test_only_refs_pinning_rows_past_a_rule_are_cleaned(spark, tmp_path, policy, merge_on_read):
    settings, before, rows = _lake(spark, tmp_path, policy, merge_on_read)
    assert sum(r["event_timestamp"] < DELETE_CUTOFF for r in rows["audit"]) == 3
    assert sum(r["event_timestamp"] < DELETE_CUTOFF for r in rows["staging"]) == 5

    # a hold on someone whose rows past a rule only the branch holds keeps the table whole
    ledger = Ledger(settings)
    hold = add_hold(ledger, "a claim about staged0", "test", subject="staged0")
    held = expire(spark, settings, today=TODAY)
    assert not held.tables and "a claim about staged0" in held.skipped[TABLE]
    release_hold(ledger, hold.hold_id, "test")
    assert _refs(_static(spark, settings)) == before

    dry = expire(spark, settings, dry_run=True, today=TODAY).tables[TABLE]
    assert {k: (r.rows_past, r.outcome) for k, r in dry.refs.items()} == {
        "tag release": (0, "clean"), "tag audit": (5, "dropped" if policy == "drop" else "rewritten"),
        "branch staging": (8, "rewritten")}
    assert _refs(_static(spark, settings)) == before  # the dry run changed nothing

    done = expire(spark, settings, today=TODAY)
    table = done.tables[TABLE]
    assert done.passed and table.passed and table.history == 0 and table.storage == 0 and not table.blocked
    assert bool(sum(r.delete_files_added for r in table.rules)) == merge_on_read
    report = json.loads(done.model_dump_json())["tables"][TABLE]["refs"]  # what `dsr expire --json` prints
    assert report["tag release"] == {"rows_past": 0, "outcome": "clean", "snapshot_id": before["release"],
                                     "rows_left": None}
    assert report["branch staging"]["outcome"] == "rewritten" and report["branch staging"]["rows_left"] == 0
    static = _static(spark, settings)
    after = _refs(static)
    assert after["release"] == before["release"] and _at(static, after["release"]) == rows["release"]  # untouched
    if policy == "drop":
        assert "audit" not in after and report["tag audit"]["outcome"] == "dropped"
        assert table.purge is not None and table.purge["refs_dropped"] == ["tag audit"]
    else:
        assert report["tag audit"] == {"rows_past": 5, "outcome": "rewritten", "snapshot_id": after["audit"],
                                       "rows_left": 0}
        assert after["audit"] != before["audit"]
        assert _at(static, after["audit"]) == _as_the_rules_leave(rows["audit"])  # a cleaned copy, names kept
    # the branch expired in place: the same rules committed on it, its fresh rows and everyone else's kept
    assert after["staging"] != before["staging"]
    assert _at(static, after["staging"]) == _as_the_rules_leave(rows["staging"])
    assert _at(static, after["main"]) == _as_the_rules_leave(rows["main"])
    _assert_nothing_past_anywhere(static)

    again = expire(spark, settings, today=TODAY)  # nothing past anywhere now: nothing committed
    assert again.passed and {r.outcome for r in again.tables[TABLE].refs.values()} == {"clean"}
    assert _refs(_static(spark, settings)) == after


def test_block_expires_nothing_and_names_the_refs(spark, tmp_path):
    """Under `pinned_refs: block` (the default), refs pinning rows past a rule keep the table from
    expiring: nothing is committed, the report names them, the pass fails (`dsr expire` exits 1, a
    run needs attention), as an erase request stays open under block."""
    settings, before, _ = _lake(spark, tmp_path, "block")
    snapshots = snapshot_ids(spark, settings, [TABLE])

    done = expire(spark, settings, today=TODAY)
    table = done.tables[TABLE]
    assert not done.passed and not table.passed and table.purge is None
    assert table.blocked is not None and "tag audit (5 row(s))" in table.blocked \
        and "branch staging (8 row(s))" in table.blocked and "release" not in table.blocked
    assert {k: (r.rows_past, r.outcome) for k, r in table.refs.items()} == {
        "tag release": (0, "clean"), "tag audit": (5, "blocked"), "branch staging": (8, "blocked")}
    assert [r.rows_past for r in table.rules] == [r.rows_left for r in table.rules] == [3, 5]  # delete, redact
    assert snapshot_ids(spark, settings, [TABLE]) == snapshots and _refs(_static(spark, settings)) == before

    report = run(spark, settings, today=TODAY)
    assert report.needs_attention and report.retention is not None and report.retention.tables[TABLE].blocked
    assert "tag audit (5 row(s))" in run_report_page(report.as_dict())
    config = write_config(settings, tmp_path / "dsr.yaml")
    result = CliRunner().invoke(app, ["-c", str(config), "expire", "--json"], catch_exceptions=False)
    assert result.exit_code == 1
    assert json.loads(result.output)["tables"][TABLE]["refs"]["tag audit"]["outcome"] == "blocked"
    assert snapshot_ids(spark, settings, [TABLE]) == snapshots and _refs(_static(spark, settings)) == before


def test_a_clock_of_the_subject_is_read_against_each_refs_rows(spark, tmp_path):
    """A rule on a clock of the subject (`clock: {table, column}`): u0's account closed 60 days ago, so
    their rows are past `redact ip after 30 days`; u1's closed 10 days ago, u2's is open. A tag made
    before u0's rows is left alone; the tag and the branch holding them keep their rows, u0's ip NULL."""
    accounts = "crm.accounts"
    rules = [{"after": "30 days", "clock": {"table": accounts, "column": "closed_at"}, "redact": ["ip"]}]
    settings = make_settings(tmp_path, purge={"pinned_refs": "rewrite"}, datamap={
        "subject": "user_id", "tables": {accounts: {"key": "user_id"}, TABLE: {"key": "user_id", "expire": rules}}})
    attach(spark, settings)
    name = settings.table(TABLE)
    spark.createDataFrame([("u0", NOW - timedelta(days=60)), ("u1", NOW - timedelta(days=10)), ("u2", None)],
                          "user_id string, closed_at timestamp").writeTo(settings.table(accounts)).create()
    spark.sql(f"CREATE TABLE {name} ({SCHEMA}) USING iceberg")
    clicks = [(u, f"10.0.0.{i}", "agent", NOW - timedelta(days=1), i) for i, u in enumerate(["u1", "u2", "u1"])]
    spark.createDataFrame(clicks, SCHEMA).writeTo(name).append()
    spark.sql(f"ALTER TABLE {name} CREATE TAG `release`")
    spark.createDataFrame([("u0", "10.0.1.1", "agent", NOW - timedelta(days=2), 10)], SCHEMA).writeTo(name).append()
    spark.sql(f"ALTER TABLE {name} CREATE TAG audit")
    spark.sql(f"ALTER TABLE {name} CREATE BRANCH staging")
    spark.createDataFrame([("u0", "10.0.2.1", "agent", NOW, 20), ("u2", "10.0.2.2", "agent", NOW, 21)], SCHEMA) \
        .writeTo(f"{name}.branch_staging").append()
    static = _static(spark, settings)
    before = _refs(static)
    rows = {ref: _at(static, sid) for ref, sid in before.items()}

    done = expire(spark, settings, today=TODAY)
    table = done.tables[TABLE]
    assert done.passed and table.history == 0 and table.storage == 0
    assert {k: (r.rows_past, r.outcome, r.rows_left) for k, r in table.refs.items()} == {
        "tag release": (0, "clean", None), "tag audit": (1, "rewritten", 0), "branch staging": (2, "rewritten", 0)}
    static = _static(spark, settings)
    after = _refs(static)
    assert after["release"] == before["release"]
    for ref in ("main", "audit", "staging"):
        assert _at(static, after[ref]) == [{**r, "ip": None} if r["user_id"] == "u0" else r for r in rows[ref]], ref
    location = Path(static.metadata.location.removeprefix("file:"))
    for path in location.rglob("*.parquet"):  # every file on storage, raw: u0's ip nowhere
        stored = pq.read_table(path, columns=["user_id", "ip"]).filter(pc.equal(pc.field("user_id"), "u0"))
        assert stored["ip"].null_count == stored.num_rows, path
