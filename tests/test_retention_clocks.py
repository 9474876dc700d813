"""Retention (issue 28): a clock of the subject (N days after a date in another mapped table, joined
through the subject key), and the conformance report's bytes past a rule and oldest retained
snapshot still holding rows past it. Checked with independent readers: pyiceberg for live data,
snapshots and file sizes, pyarrow for every Parquet file on storage."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable

from helpers import delta_rows, delta_traces, dsr_in_process, make_settings, snapshot_ids, write_config
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.exceptions import ConfigError, DataMapError
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.holds import add_hold, release_hold
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.runner.retention import expire, status

TODAY = date(2025, 6, 30)
MIDNIGHT = datetime(TODAY.year, TODAY.month, TODAY.day, tzinfo=UTC)
CLICKS, ACCOUNTS = "web.clicks", "crm.accounts"
CLOSED = {"table": ACCOUNTS, "column": "account_closed_at"}
# u0 closed 60 days ago: past 30 days; u1 closed 10 days ago; u2 open (NULL); u3 has one closed and
# one open account (no clock: kept); u4 closed 40 days ago, twice (the latest counts: past); u5, u6
# have no account row (no clock: kept)
ACCOUNT_ROWS = [("u0", 60), ("u1", 10), ("u2", None), ("u3", 100), ("u3", None), ("u4", 90), ("u4", 40)]
GONE = {"u0", "u4"}


def _datamap(rules: list[dict], accounts: dict | None = None, table_format: str = "iceberg") -> dict:
    return {"subject": "user_id",
            "tables": {ACCOUNTS: {"format": table_format, **(accounts or {"key": "user_id"})},
                       CLICKS: {"key": "user_id", "retention": "30 days after the account is closed",
                                "expire": rules, "format": table_format}}}


RULES = [{"after": "30 days", "clock": CLOSED, "delete": True},
         {"after": "45 days", "clock": "event_timestamp", "redact": ["ip"]}]


@pytest.fixture
def lake(spark, tmp_path, request):
    """web.clicks (two rows a day for 60 days, users u0..u6; Iceberg: one file per day, partitioned by
    day) and crm.accounts (ACCOUNT_ROWS), both in the format a test's `lake` parameter names (Iceberg
    when it names none)."""
    table_format = getattr(request, "param", "iceberg")
    settings = make_settings(tmp_path, datamap=_datamap(RULES, table_format=table_format),
                             delta={"warehouse": str(tmp_path / "delta")}, purge={"orphan_min_age_minutes": 0})
    attach(spark, settings)
    rows = [(f"u{d % 7}", f"10.0.0.{d}", MIDNIGHT - timedelta(days=d, hours=h), d * 10 + h)
            for d in range(60) for h in (3, 15)]
    clicks = spark.createDataFrame(rows, "user_id string, ip string, event_timestamp timestamp, amount bigint")
    accounts = spark.createDataFrame([(u, MIDNIGHT - timedelta(days=d) if d is not None else None)
                                      for u, d in ACCOUNT_ROWS], "user_id string, account_closed_at timestamp")
    if table_format == "delta":
        located = settings.delta_tables()
        clicks.write.format("delta").save(located[CLICKS])
        accounts.write.format("delta").save(located[ACCOUNTS])
        return settings
    spark.sql(f"CREATE TABLE {settings.table(CLICKS)} (user_id string, ip string, event_timestamp timestamp, "
              "amount bigint) USING iceberg PARTITIONED BY (days(event_timestamp))")
    clicks.writeTo(settings.table(CLICKS)).append()
    accounts.writeTo(settings.table(ACCOUNTS)).create()
    return settings


def _live(spark, settings, table: str) -> pa.Table:
    """The table's live rows, read without Spark: pyiceberg, or delta-rs."""
    located = settings.delta_tables().get(table)
    return delta_rows(located) if located else _static(spark, settings, table).scan().to_arrow()


def _location(spark, settings, table: str) -> Path:
    located = settings.delta_tables().get(table)
    return Path(located or _static(spark, settings, table).metadata.location.removeprefix("file:"))


def _static(spark, settings, table: str = CLICKS) -> StaticTable:
    lake = Lake.of(spark, settings)
    return StaticTable.from_metadata(
        lake.table(table).java().operations().current().metadataFileLocation())


def _with(settings, tmp_path, datamap: dict):
    return settings.model_copy(update={"datamap": settings_from_dict(
        {**settings.model_dump(mode="json", exclude_none=True), "datamap": datamap}, base=tmp_path).datamap})


@pytest.mark.parametrize("lake", ["iceberg", "delta"], indirect=True)
def test_a_clock_of_the_subject_expires_rows_of_people_whose_account_closed_long_enough_ago(spark, lake):
    """On Delta, whose DELETE and UPDATE refuse a subquery, the rule's statement is a MERGE."""
    settings = lake
    before = _live(spark, settings, CLICKS)
    expected = {u: before.filter(pc.equal(before["user_id"], u)).num_rows for u in GONE}

    ledger = Ledger(settings)
    held = add_hold(ledger, "claim by u4", "test", subject="u4")
    kept = expire(spark, settings, today=TODAY)
    assert list(kept.skipped) == [CLICKS] and "claim by u4" in kept.skipped[CLICKS]  # found by keyed hash
    release_hold(ledger, held.hold_id, "test")

    dry = expire(spark, settings, dry_run=True, today=TODAY)
    subject_rule, row_rule = dry.tables[CLICKS].rules
    assert subject_rule.rule == "delete after 30 days by the subject's crm.accounts.account_closed_at"
    assert subject_rule.cutoff == "2025-05-31" and subject_rule.rows_past == sum(expected.values())

    done = expire(spark, settings, today=TODAY)
    assert done.passed and not done.skipped
    assert [r.rows_left for r in done.tables[CLICKS].rules] == [0, 0]
    after = _live(spark, settings, CLICKS)
    assert not set(after["user_id"].to_pylist()) & GONE
    # everyone else's rows kept, whole (the row rule redacted only old IPs)
    others = before.filter(pc.invert(pc.is_in(before["user_id"], pc.cast(list(GONE), "string")))).sort_by("amount")
    assert after.sort_by("amount").select(["user_id", "amount"]) == others.select(["user_id", "amount"])
    location = _location(spark, settings, CLICKS)
    for path in location.rglob("*.parquet"):  # every data file on storage, referenced or not
        if "_delta_log" not in path.parts:
            assert not set(pq.read_table(path, columns=["user_id"]).column("user_id").to_pylist()) & GONE, path
    if CLICKS in settings.delta_tables():  # nor any version or byte of the log (the stats hold short keys whole)
        assert not delta_traces(str(location), GONE, [f'"{u}"'.encode() for u in GONE])
    assert _live(spark, settings, ACCOUNTS).num_rows == len(ACCOUNT_ROWS)  # the clock's table

    report = status(spark, settings, today=TODAY).tables[CLICKS]
    assert [r.rows_past for r in report.rules] == [0, 0]
    assert [r.oldest_snapshot_holding for r in report.rules] == [None, None]
    assert [r.bytes_past_estimate for r in report.rules] == [0, 0]
    # the oldest subject clock of a live row: u1's closing, 10 days ago; their rows pass in 20 days
    assert report.rules[0].oldest == "2025-06-20 00:00:00" and report.rules[0].next_crossing == "2025-07-21"


def test_a_bad_clock_of_the_subject_is_refused_naming_the_field_and_changes_nothing(spark, lake, tmp_path,
                                                                                   monkeypatch, capsys):
    settings = lake
    before = snapshot_ids(spark, settings, [CLICKS, ACCOUNTS])
    for rules, accounts, said in [
        ([{"after": "30 days", "clock": {"table": ACCOUNTS, "column": "user_id"}, "delete": True}], None,
         "table web.clicks, expire rule 1 (delete after 30 days by the subject's crm.accounts.user_id): "
         "clock.column 'user_id' of crm.accounts has type string, not a date or timestamp"),
        ([{"after": "30 days", "clock": {"table": ACCOUNTS, "column": "closed_on"}, "delete": True}], None,
         "clock.column: crm.accounts has no column 'closed_on'"),
    ]:
        with pytest.raises(DataMapError, match=said.replace("(", r"\(").replace(")", r"\)")):
            expire(spark, _with(settings, tmp_path, _datamap(rules, accounts)), today=TODAY)
    for rules, accounts, said in [
        ([{"after": "30 days", "clock": {"table": "crm.nothing", "column": "closed"}, "delete": True}], None,
         "table web.clicks, expire rule 1: clock.table crm.nothing is not a keyed table of the data map"),
        ([{"after": "30 days", "clock": CLOSED, "delete": True}], {"key": "email", "identifier": "email"},
         "clock.table crm.accounts is keyed by 'email' (email); web.clicks is not keyed by the same subject"),
        ([{"after": "30 days", "clock": {"table": CLICKS, "column": "event_timestamp"}, "delete": True}], None,
         "clock.table web.clicks is the rule's own table"),
        ([{"after": "30 days", "clock": {"table": ACCOUNTS}, "delete": True}], None, "column"),
    ]:
        datamap = _datamap(rules, accounts)
        if accounts:
            datamap["identifiers"] = {"email": {"table": CLICKS, "subject_column": "user_id", "column": "ip"}}
        with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
            make_settings(tmp_path / "bad", datamap=datamap)
    config = write_config(settings, tmp_path / "bad.yaml", datamap=_datamap(
        [{"after": "30 days", "clock": {"table": ACCOUNTS, "column": "user_id"}, "delete": True}]))
    code, out = dsr_in_process(monkeypatch, capsys, "--config", str(config), "expire")
    assert code == 2 and "clock.column 'user_id' of crm.accounts has type string" in out
    assert snapshot_ids(spark, settings, [CLICKS, ACCOUNTS]) == before


def test_the_report_gives_bytes_past_and_the_oldest_snapshot_still_holding_them(spark, lake, tmp_path,
                                                                               monkeypatch, capsys):
    """Bytes past a row-clock rule on a table partitioned by the clock: whole files, exactly their
    sizes (pyiceberg's file list). The oldest snapshot holding rows past: the first append, as long
    as any retained snapshot references its files or their rows; none after a run's purge."""
    settings = lake
    first = _static(spark, settings).metadata.current_snapshot_id
    name = settings.table(CLICKS)
    # a second commit: rows past the redact rule deleted by a delete file (merge-on-read), still in the files
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    spark.sql(f"DELETE FROM {name} WHERE amount = 593")  # day 59, 15:00: a row past both rules
    spark.sql(f"INSERT INTO {name} VALUES ('u1', '10.9.9.9', timestamp'2025-06-29 12:00:00', 1)")
    static = _static(spark, settings)
    files = static.inspect.data_files().to_pylist()

    def bound(f: dict, which: str) -> datetime:
        found = f["readable_metrics"]["event_timestamp"][which]
        return found if found.tzinfo else found.replace(tzinfo=UTC)

    cutoff = MIDNIGHT - timedelta(days=45)
    wholly = sum(f["file_size_in_bytes"] for f in files if bound(f, "upper_bound") < cutoff)
    day59 = next(f["file_size_in_bytes"] for f in files
                 if bound(f, "lower_bound").date() == (MIDNIGHT - timedelta(days=60)).date())

    report = status(spark, settings, today=TODAY).model_dump(mode="json")  # the JSON of dsr retention --json
    subject_rule, row_rule = report["tables"][CLICKS]["rules"]
    assert row_rule["rows_past"] == 29  # 15 days x 2 rows, one deleted
    # every file past the cutoff is wholly past (one per day): exactly their bytes; the day-59 file
    # counts for the one live row of its two (its record count still includes the deleted row)
    assert row_rule["bytes_past_estimate"] == wholly - day59 + (day59 + 1) // 2
    assert row_rule["oldest_snapshot_holding"]["snapshot_id"] == first
    assert row_rule["oldest_snapshot_holding"]["refs"] == []  # not the current one
    assert subject_rule["rows_past"] > 0 and subject_rule["oldest_snapshot_holding"]["snapshot_id"] == first
    assert 0 < subject_rule["bytes_past_estimate"] < sum(f["file_size_in_bytes"] for f in files)

    config = str(write_config(settings, tmp_path / "c.yaml"))  # the text report (today's date: all past)
    code, out = dsr_in_process(monkeypatch, capsys, "--config", config, "retention")
    assert code == 0 and "bytes" in out and "oldest" in out  # (the table wraps to the terminal)

    assert expire(spark, settings, today=TODAY).passed
    after = status(spark, settings, today=TODAY).tables[CLICKS]
    assert [(r.rows_past, r.bytes_past_estimate, r.oldest_snapshot_holding) for r in after.rules] == \
        [(0, 0, None), (0, 0, None)]
    assert len(_static(spark, settings).metadata.snapshots) == after.snapshots == 1
