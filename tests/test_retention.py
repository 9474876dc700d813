"""Retention as code (issue 28 item 1): the data map's `expire:` rules, enforced with erasure's purge
and proof, checked with independent readers (pyiceberg for live data and snapshots, pyarrow for every
Parquet file on storage)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyiceberg.table import StaticTable
from pyspark.sql import functions as F

from helpers import delta_rows, make_settings, snapshot_ids, write_config
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.evidence.html import run_report_page
from lakehouse_dsr.exceptions import ConfigError, DataMapError
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.holds import add_hold, release_hold
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.runner.orchestrator import run
from lakehouse_dsr.runner.retention import expire, status

TODAY = date(2025, 6, 30)
TABLE = "web.clicks"
RULES = [{"after": "30 days", "clock": "event_timestamp", "redact": ["ip", "user_agent"]},
         {"after": "45 days", "clock": "event_timestamp", "delete": True}]


def _datamap(rules: list[dict]) -> dict:
    return {"subject": "user_id",
            "tables": {TABLE: {"key": "user_id", "retention": "45 days (IP address: 30 days)", "expire": rules}}}


@pytest.fixture
def clicks(spark, tmp_path, request):
    """web.clicks partitioned by day (Iceberg: days(event_timestamp); Delta, when parametrized (indirect)
    with "delta": a date column written beside it): two rows a day for 60 days before TODAY, one file
    per day."""
    table_format = getattr(request, "param", "iceberg")
    datamap = _datamap(RULES)
    datamap["tables"][TABLE]["format"] = table_format
    settings = make_settings(tmp_path, datamap=datamap)
    attach(spark, settings)
    name = settings.table(TABLE)
    columns = "user_id string, ip string, user_agent string, event_timestamp timestamp, amount bigint"
    start = datetime(TODAY.year, TODAY.month, TODAY.day, tzinfo=UTC)
    rows = spark.createDataFrame([(f"u{d % 7}", f"10.0.0.{d}", "agent", start - timedelta(days=d, hours=h), d * 10 + h)
                                  for d in range(60) for h in (3, 15)], columns).coalesce(1)
    if table_format == "iceberg":
        spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg PARTITIONED BY (days(event_timestamp))")
        rows.writeTo(name).append()
    else:
        rows.withColumn("event_day", F.to_date("event_timestamp")).write.format("delta").partitionBy(
            "event_day").save(settings.delta_tables()[TABLE])
    return settings


def _read(spark, settings) -> tuple[pa.Table, int, Path]:
    """The table's live rows, how many versions it retains and its location, read without Spark
    (pyiceberg from the current metadata file, or delta-rs)."""
    delta = settings.delta_tables().get(TABLE)
    if delta is not None:
        return delta_rows(delta), len(DeltaTable(delta).history()), Path(delta)
    metadata = Lake.of(spark, settings).table(TABLE).java().operations().current().metadataFileLocation()
    static = StaticTable.from_metadata(metadata)
    location = Path(static.metadata.location.removeprefix("file:"))
    return static.scan().to_arrow(), len(static.metadata.snapshots), location


def _cutoff(days: int) -> datetime:
    return datetime(TODAY.year, TODAY.month, TODAY.day, tzinfo=UTC) - timedelta(days=days)


@pytest.mark.parametrize("clicks", ["iceberg", "delta"], indirect=True)
def test_expire_deletes_and_redacts_through_history_and_storage(spark, clicks):
    settings = clicks
    before, _, _ = _read(spark, settings)
    kept = before.filter(pc.greater_equal(before["event_timestamp"], _cutoff(45)))
    untouched = before.filter(pc.greater_equal(before["event_timestamp"], _cutoff(30)))

    past = status(spark, settings, today=TODAY).tables[TABLE].rules  # bytes by each row's file, joined with sizes
    assert [r.rows_past for r in past] == [30, 60] and all(r.bytes_past_estimate > 0 for r in past)
    dry = expire(spark, settings, dry_run=True, today=TODAY)
    # 15 days x 2 rows past 45 days; 30 days x 2 past 30 (a dry run deletes nothing before it counts)
    assert [r.rows_past for r in dry.tables[TABLE].rules] == [30, 60]
    assert snapshot_ids(spark, settings, [TABLE])[TABLE] == [s.snapshot_id for s in
                                                              Lake.of(spark, settings).table(TABLE).history()]
    assert len(Lake.of(spark, settings).table(TABLE).history()) == 1  # the dry run committed nothing

    done = expire(spark, settings, today=TODAY)
    delete, redact = done.tables[TABLE].rules
    assert delete.rule == "delete after 45 days by event_timestamp" and delete.cutoff == "2025-05-16"
    # whole day partitions: dropped from metadata, no data file rewritten
    assert delete.metadata_only and delete.data_files_deleted == 15 and delete.data_files_added == 0
    assert redact.rows_past == 30 and redact.rows_left == 0 and delete.rows_left == 0
    assert done.passed and done.tables[TABLE].history == 0 and done.tables[TABLE].storage == 0

    after, versions, location = _read(spark, settings)
    after = after.sort_by("amount")
    assert versions == 1  # history holds only the clean snapshot
    assert after.num_rows == kept.num_rows and pc.sum(after["amount"]) == pc.sum(kept["amount"])
    assert after.select(["user_id", "event_timestamp", "amount"]) == kept.sort_by("amount").select(
        ["user_id", "event_timestamp", "amount"])  # redaction kept the rest of the row
    recent = after.filter(pc.greater_equal(after["event_timestamp"], _cutoff(30)))
    assert recent == untouched.sort_by("amount")  # rows inside every rule: untouched
    older = after.filter(pc.less(after["event_timestamp"], _cutoff(30)))
    assert older.num_rows == 30 and older["ip"].null_count == 30 and older["user_agent"].null_count == 30
    for path in [p for p in location.rglob("*.parquet") if "_delta_log" not in p.parts]:  # every data file stored
        stored = pq.read_table(path, columns=["ip", "event_timestamp"])
        # Spark writes Delta's timestamps as INT96 (UTC instants without a zone): read as UTC
        clock = pc.cast(stored["event_timestamp"], pa.timestamp("us", tz="UTC"))
        assert pc.sum(pc.less(clock, _cutoff(45))).as_py() in (None, 0), path
        old = stored.filter(pc.less(clock, _cutoff(30)))
        assert old["ip"].null_count == old.num_rows, path

    again = expire(spark, settings, today=TODAY)  # nothing past any more: no commit
    assert [r.rows_past for r in again.tables[TABLE].rules] == [0, 0] and again.passed
    report = status(spark, settings, today=TODAY).tables[TABLE]
    assert [r.rows_past for r in report.rules] == [0, 0] and report.snapshots == 1
    assert report.rules[0].oldest == "2025-05-16 09:00:00"  # 44 days and 15 hours before
    assert report.rules[0].next_crossing == "2025-07-01"  # the day the 2025-05-16 rows pass 45 days


def test_bad_clock_or_period_is_refused_and_changes_nothing(spark, clicks, tmp_path):
    settings = clicks
    before = snapshot_ids(spark, settings, [TABLE])
    for rules, said in [
        ([{"after": "30 days", "clock": "amount", "delete": True}],
         "table web.clicks, expire rule 1 (delete after 30 days by amount): clock column 'amount' has type bigint"),
        ([{"after": "30 days", "clock": "seen_at", "delete": True}],
         "table web.clicks, expire rule 1 (delete after 30 days by seen_at): clock has no column 'seen_at'"),
        ([{"after": "30 days", "clock": "event_timestamp", "redact": ["referrer"]}],
         "redact has no column 'referrer'"),
    ]:
        bad = settings.model_copy(update={"datamap": settings_from_dict(
            {**settings.model_dump(mode="json", exclude_none=True), "datamap": _datamap(rules)},
            base=tmp_path).datamap})
        with pytest.raises(DataMapError, match=r"(?s)" + said.replace("(", r"\(").replace(")", r"\)")):
            expire(spark, bad, today=TODAY)
    with pytest.raises(DataMapError, match="--table: web.nothing has no 'expire' rules"):
        expire(spark, settings, tables=["web.nothing"], today=TODAY)
    with pytest.raises(ConfigError, match=r"(?s)tables.*web\.clicks.*expire.*'a fortnight' is not a period"):
        make_settings(tmp_path / "p", datamap=_datamap([{"after": "a fortnight", "clock": "event_timestamp",
                                                         "delete": True}]))
    assert snapshot_ids(spark, settings, [TABLE]) == before


@pytest.mark.slow
def test_dsr_run_enforces_the_rules_skips_held_tables_and_the_cli_refuses_a_bad_clock(spark, clicks, tmp_path):
    settings = clicks
    report = run(spark, settings, today=TODAY)
    section = report.document().retention  # checked against the published model
    assert section is not None and section.passed and not section.skipped
    assert [r.rows_left for r in section.tables[TABLE].rules] == [0, 0]
    assert "retention" in report.seconds and not report.needs_attention
    page = run_report_page(report.as_dict())
    assert "<h2>Retention</h2>" in page and "delete after 45 days by event_timestamp" in page

    add_hold(Ledger(settings), "audit of the click logs", "test", table=TABLE)
    before = snapshot_ids(spark, settings, [TABLE])
    held = run(spark, settings, today=TODAY + timedelta(days=10)).retention
    assert held is not None and TABLE in held.skipped and "audit of the click logs" in held.skipped[TABLE]
    assert snapshot_ids(spark, settings, [TABLE]) == before  # ten more days past a rule, kept by the hold

    config = write_config(settings, tmp_path / "bad.yaml", datamap=_datamap(
        [{"after": "30 days", "clock": "user_agent", "delete": True}]))
    done = subprocess.run([sys.executable, "-m", "lakehouse_dsr", "--config", str(config), "expire"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "expire rule 1 (delete after 30 days by user_agent): clock column 'user_agent' has type string" \
        in done.stderr + done.stdout
    assert snapshot_ids(spark, settings, [TABLE]) == before


@pytest.mark.parametrize("clicks", ["iceberg", "delta"], indirect=True)
def test_a_held_subject_keeps_the_table_from_expiring_while_the_hold_lasts(spark, clicks):
    """Issue 28: retention skips held subjects. Their rows past a rule are found by keyed hash (the hold
    stores no plaintext); the table is then skipped whole and reported, nothing committed. A hold on
    someone the table's rows past the rules do not name changes nothing."""
    settings = clicks
    ledger = Ledger(settings)
    absent = add_hold(ledger, "a claim against someone else", "test", subject="nobody-here")
    before = snapshot_ids(spark, settings, [TABLE])
    held = add_hold(ledger, "litigation about u3's clicks", "test", subject="u3")
    kept = expire(spark, settings, today=TODAY)
    assert list(kept.skipped) == [TABLE] and "litigation about u3's clicks" in kept.skipped[TABLE]
    assert absent.why not in kept.skipped[TABLE] and not kept.tables
    assert snapshot_ids(spark, settings, [TABLE]) == before
    release_hold(ledger, held.hold_id, "test")
    done = expire(spark, settings, today=TODAY)
    assert not done.skipped and done.passed and done.tables[TABLE].rules[0].rows_past > 0


def test_access_packages_tell_the_enforced_rules_beside_the_stated_retention(tmp_path):
    """An access package's manifest says, per table, what the person is told (`retention:`) and what is
    enforced (`expire:`), in words (no Spark: the manifest is built from the data map)."""
    settings = make_settings(tmp_path, datamap=_datamap(RULES))
    told = settings.datamap.table_mapping(TABLE).disclosure()
    assert told["retention"] == "45 days (IP address: 30 days)"
    assert told["retention_enforced"] == ["redact ip, user_agent after 30 days by event_timestamp",
                                          "delete after 45 days by event_timestamp"]
    assert "retention_enforced" not in make_settings(tmp_path).datamap.table_mapping("demo.events").disclosure()


def test_the_retention_report_names_derived_tables_that_keep_rows_longer_than_their_sources(tmp_path):
    """Issue 28: a keyed derived table is held to the strictest delete rule of its sources through
    lineage (a source's own sources count); the data map says which keeps rows longer (no Spark)."""
    tables = {"raw.events": {"key": "user_id", "expire": [{"after": "25 months", "clock": "ts", "delete": True}]},
              "raw.users": {"key": "user_id"}}
    derived = {"silver.daily": {"from": ["raw.events"], "key": "user_id"},
               "gold.per_user": {"from": ["silver.daily"], "key": "user_id",
                                 "expire": [{"after": "3 years", "clock": "day", "delete": True}]},
               "silver.kept": {"from": ["raw.events"], "key": "user_id",
                               "expire": [{"after": "24 months", "clock": "day", "delete": True}]},
               "silver.accounts": {"from": ["raw.users"], "key": "user_id"}}
    datamap = make_settings(tmp_path, datamap={"subject": "user_id", "tables": tables, "derived": derived}).datamap
    longer = datamap.kept_longer_than_sources()
    assert sorted(longer) == ["gold.per_user", "silver.daily"]  # through silver.daily, gold inherits raw's limit
    assert "raw.events: delete after 25 months by ts" in longer["gold.per_user"]
