"""Opt-out of sale/sharing: a share (`shares:` in the data map) is created and refreshed by `dsr run`
and never holds an opted-out or erased subject, in its live data, any retained snapshot or any file on
storage; opt-ins come back at the next refresh; consent is kept by keyed hash across key rotation.

One tiny lake goes through a sequence of runs (created, opt-out, incremental refresh after a key
rotation, opt-in); each test asserts on what one step left behind, read with plain Spark and Iceberg
metadata tables, not with the engine's own verification.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from pyspark.sql import functions as F
from typer.testing import CliRunner

from helpers import (
    DELTA_LAYOUTS,
    SEED,
    datamap_dict,
    delta_settings,
    make_settings,
    rows_of,
    snapshot_ids,
    write_config,
)
from lakehouse_dsr import synth
from lakehouse_dsr.cli import app
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.exceptions import ConfigError, DataMapError, RequestInputError
from lakehouse_dsr.keys import KEY_ENV, rotate_key
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput, add_business_days, due_date, read_requests_csv
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import share
from lakehouse_dsr.stages.verify import verify_completed

SHARE = "partner.events"
SQL = "SELECT user_id, event_type, event_timestamp FROM demo.events"
SPEC = {"from": "demo.events", "key": "user_id", "sql": SQL}


def with_shares(shares: dict) -> dict:
    return {**datamap_dict(demo_datamap(derived=False)), "shares": shares}


def subject_rows(df, subjects: list[str]) -> int:
    """Rows of `df` naming any of `subjects` (ids as data, never in SQL text)."""
    return df.where(F.col("user_id").isin(*subjects)).count()


def share_is_its_sql(spark, settings, without: list[str]) -> None:
    """The share holds exactly its SQL over the current source, minus the subjects `without`."""
    held = spark.table(settings.table(SHARE))
    expected = spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*without)) \
        .select("user_id", "event_type", "event_timestamp")
    rows = rows_of(held)
    assert rows and rows == rows_of(expected)


def anywhere(spark, settings, subjects: list[str]) -> dict[str, int]:
    """Rows of `subjects` in the share's live data, in each retained snapshot (time travel) and in every
    Parquet file under its location (orphans included)."""
    lake = Lake.of(spark, settings)
    snapshots = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {settings.table(SHARE)}.snapshots")
                 .collect()]
    location = lake.table(SHARE).location()
    stored = spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.parquet") \
        .schema("user_id string").parquet(location)
    return {"live": subject_rows(spark.table(settings.table(SHARE)), subjects),
            "history": sum(subject_rows(lake.table(SHARE).read_at(s), subjects) for s in snapshots),
            "storage": subject_rows(stored, subjects)}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """The sequence of runs; each step's report and observations, for the tests below."""
    root = tmp_path_factory.mktemp("share")
    settings = make_settings(root, purge={"orphan_min_age_minutes": 0}, datamap=with_shares({SHARE: SPEC}))
    attach(spark, settings)
    synth.generate(spark, settings, users=30, events=300, seed=SEED, batches=2)
    events = settings.table("demo.events")
    a, b = synth.user_id(SEED, 1), synth.user_id(SEED, 2)
    out: dict = {"settings": settings, "a": a, "b": b, "a_rows": subject_rows(spark.table(events), [a])}

    out["created"] = run(spark, settings)  # no request: the share is created all the same
    out["created_rows"] = spark.table(settings.table(SHARE)).count()

    ledger = Ledger(settings)
    opt_out = ledger.submit([RequestInput(a, "opt_out", "ccpa"), RequestInput("nobody-at-all", "opt_out", "gdpr")])
    out["opt_out_ids"] = opt_out.created
    out["opted_out"] = run(spark, settings)
    out["evidence"] = ledger.evidence(opt_out.created)
    out["after_opt_out"] = anywhere(spark, settings, [a])
    share_is_its_sql(spark, settings, without=[a])
    out["files_before"] = {r.file_path for r in spark.sql(f"SELECT file_path FROM {settings.table(SHARE)}.files")
                           .collect()}

    with pytest.MonkeyPatch.context() as env:  # consent hashed under the old key must keep matching
        env.delenv(KEY_ENV, raising=False)
        out["rotation"] = rotate_key(settings.key_file())
        late = spark.createDataFrame([(f"late-{i}", s) for i, s in enumerate([a, a, b])],
                                     "event_id string, user_id string")
        late.selectExpr("event_id", "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp",
                        "null page_url", "null product_id", "'late' event_details").writeTo(events).append()
        Lake.of(spark, settings).table("demo.events").rewrite_sorted("user_id", 1 << 27)  # a `replace`: same rows
        out["refreshed"] = run(spark, settings)
        out["refresh_commit"] = Lake.of(spark, settings).table(SHARE).current_snapshot().summary
        out["files_after"] = {r.file_path for r in spark.sql(f"SELECT file_path FROM {settings.table(SHARE)}.files")
                              .collect()}
        out["after_refresh"] = anywhere(spark, settings, [a])
        share_is_its_sql(spark, settings, without=[a])

        opt_in = ledger.submit([RequestInput(a, "opt_in", "ccpa")])
        out["opt_in_ids"] = opt_in.created
        out["opted_in"] = run(spark, settings)
        out["opt_in_evidence"] = ledger.evidence(opt_in.created)
        share_is_its_sql(spark, settings, without=[])
    return out


def test_a_share_is_created_by_a_run_without_requests(spark, lake):
    report = lake["created"]
    assert report.shares[SHARE]["mode"] == "created" and report.shares[SHARE]["error"] is None
    assert report.shares[SHARE]["rows_added"] == lake["created_rows"] > 0
    assert "shares" in report.seconds and report.requests == []
    props = Lake.of(spark, lake["settings"]).table(SHARE).properties()
    assert props[share.SOURCE_SNAPSHOT] != "none" and props["write.delete.mode"] == "copy-on-write"


def test_opt_out_leaves_live_data_history_and_storage(lake):
    a_rows, report = lake["a_rows"], lake["opted_out"]
    assert a_rows > 0 and lake["after_opt_out"] == {"live": 0, "history": 0, "storage": 0}
    assert {r.status for r in report.requests} == {"completed"} and len(report.requests) == 2
    known, unknown = lake["opt_out_ids"]
    evidence = lake["evidence"][known]["tables"][SHARE]
    assert evidence["action"] == "exclude" and evidence["rows"] == a_rows and evidence["purged"]
    assert evidence["checks"] == {"live": True, "history": True, "storage": True}
    assert evidence["verification"]["passed"] and evidence["snapshots_expired"] >= 1
    assert lake["evidence"][unknown]["tables"][SHARE]["rows"] == 0 and lake["evidence"][unknown]["rows"] == 0
    s = report.shares[SHARE]
    assert s["rows_removed"] == a_rows and s["verification"]["passed"] and s["purge"]["snapshots_expired"] >= 1


def test_refresh_is_incremental_and_keeps_opted_out_subjects_out_across_a_key_rotation(lake):
    s = lake["refreshed"].shares[SHARE]
    assert lake["rotation"].old_id != lake["rotation"].new_id
    assert s["mode"] == "incremental" and s["reason"] is None and s["rows_added"] == 1  # b's late row, not a's two
    commit = lake["refresh_commit"]
    assert commit["added-records"] == "1" and "deleted-data-files" not in commit and commit["added-data-files"] == "1"
    assert lake["files_before"] < lake["files_after"]  # every earlier file kept: nothing rewritten
    # the late rows were read from the appended files alone, once, though a rewrite moved them meanwhile
    assert lake["after_refresh"] == {"live": 0, "history": 0, "storage": 0}


def test_opt_in_puts_the_subject_back_whole_at_the_next_refresh(lake):
    (opt_in,) = lake["opt_in_ids"]
    report = lake["opted_in"]
    assert [(r.request_id, r.status) for r in report.requests] == [(opt_in, "completed")]
    entry = lake["opt_in_evidence"][opt_in]["tables"][SHARE]
    assert entry["action"] == "include" and entry["rows"] == lake["a_rows"] + 2  # with the two late rows
    assert report.shares[SHARE]["mode"] == "incremental" and report.shares[SHARE]["rows_added"] == entry["rows"]


def test_a_share_the_catalog_contradicts_fails_the_run_before_anything_changes(spark, lake):
    settings = lake["settings"]
    before = snapshot_ids(spark, settings, [SHARE, "demo.events", "dsr.consent", "dsr.requests"])
    props = Lake.of(spark, settings).table(SHARE).properties()
    cases = [({**SPEC, "key": "email"}, "key 'email' is not a column of the sql's result (has: user_id, event_type"),
             ({**SPEC, "sql": "SELECT user_id FROM demo.users"}, "reads demo.users, which its 'from' does not name"),
             ({**SPEC, "sql": "SELECT user_id, nope FROM demo.events"}, "shares partner.events: "),
             ({**SPEC, "sql": "SELECT user_id FROM demo.events; DROP TABLE demo.events"}, "the sql does not parse")]
    for spec, message in cases:
        bad = settings.model_copy(update={"datamap": settings_from_dict({"datamap": with_shares({SHARE: spec})}
                                                                        ).datamap})
        with pytest.raises(DataMapError, match="does not match the catalog") as info:
            run(spark, bad)
        assert message in str(info.value)
    assert snapshot_ids(spark, settings, [SHARE, "demo.events", "dsr.consent", "dsr.requests"]) == before
    assert Lake.of(spark, settings).table(SHARE).properties() == props


@pytest.mark.parametrize(("shares", "message"), [
    ({"partner": SPEC}, "shares: 'partner' must be written namespace.table"),
    ({SHARE: {**SPEC, "from": "demo.nowhere"}}, "reads demo.nowhere ('from'), which is not a table of the data map"),
    ({SHARE: {**SPEC, "sql": "DELETE FROM demo.events"}}, "'sql' must be one SELECT statement"),
    ({SHARE: {**SPEC, "sql": "  INSERT INTO partner.events SELECT * FROM demo.events"}}, "must be one SELECT"),
    ({SHARE: {**SPEC, "key": "user id"}}, "'key' 'user id' must name a column"),
    ({SHARE: {"source": "demo.events", "key": "user_id", "sql": SQL}}, "datamap.shares.partner.events.from"),
    ({"demo.events": SPEC}, "demo.events is also listed under tables/derived/files"),
])
def test_bad_share_declarations_are_config_errors(shares, message):
    with pytest.raises(ConfigError) as info:
        settings_from_dict({"datamap": with_shares(shares)})
    assert message in str(info.value)


@pytest.mark.parametrize(("received", "due"), [
    (date(2025, 1, 31), date(2025, 2, 21)),  # a Friday: Monday is the first business day
    (date(2025, 2, 1), date(2025, 2, 21)),  # Saturday and Sunday count nothing
    (date(2025, 2, 2), date(2025, 2, 21)),
    (date(2025, 2, 3), date(2025, 2, 24)),  # a Monday: three weeks to the next Monday
    (date(2024, 12, 24), date(2025, 1, 14)),  # across the year's end (holidays are not known: counted)
])
def test_ccpa_opt_out_is_due_in_15_business_days(received, due):
    assert add_business_days(received, 15) == due
    assert due_date(received, "ccpa", request_type="opt_out") == due == due_date(received, "ccpa", False, "opt_in")
    assert due_date(received, "ccpa", request_type="erase") == date.fromordinal(received.toordinal() + 45)
    assert due_date(date(2025, 1, 31), "gdpr", request_type="opt_out") == date(2025, 2, 28)  # objection: a month
    assert due_date(date(2025, 1, 31), "gdpr", True, "opt_out") == date(2025, 4, 30)
    with pytest.raises(RequestInputError, match="CCPA allows no extension for opt_out"):
        due_date(received, "ccpa", True, "opt_out")


def test_opt_in_is_accepted_by_dsr_submit_and_csv_and_dated(lake, tmp_path):
    settings = lake["settings"]
    config = write_config(settings, tmp_path / "dsr.yaml")
    (tmp_path / "in.csv").write_text("subject_id,type,regulation,received_at\ncsv-person,opt_in,ccpa,2025-01-31\n")
    assert [(r.request_type, r.regulation) for r in read_requests_csv(tmp_path / "in.csv")] == [("opt_in", "ccpa")]
    result = CliRunner().invoke(app, ["-c", str(config), "submit", "--subject", "cli-person", "--type", "opt_in",
                                      "--regulation", "ccpa", "--received", "2025-01-31"])
    assert result.exit_code == 0, result.output
    (created,) = [line.split()[1] for line in result.output.splitlines() if line.startswith("submitted req-")]
    status = Ledger(settings).request(created)
    assert (status.request_type, status.due_date, status.status_reason) == ("opt_in", "2025-02-21", None)
    with pytest.raises(RequestInputError, match="CCPA allows no extension"):
        Ledger(settings).extend(created, "busy")
    assert RequestInput("x", "opt_in", "gdpr", datetime(2025, 1, 31, tzinfo=UTC)).validated().request_type == "opt_in"


@pytest.mark.slow
@pytest.mark.parametrize("source_format", ["iceberg", "delta"])
def test_erasure_removes_the_subject_from_shares_and_dsr_verify_checks_them(spark, tmp_path, source_format):
    """The share's source an Iceberg or a Delta table (with deletion vectors and a change data feed)."""
    raw = delta_settings(tmp_path, DELTA_LAYOUTS[source_format]).model_dump(mode="json", exclude_none=True)
    raw["datamap"]["shares"] = {SHARE: SPEC}
    settings = settings_from_dict(raw, base=tmp_path)
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=2)
    gone = synth.user_id(SEED, 3)
    first = run(spark, settings).shares[SHARE]
    assert first["mode"] == "created", first["error"]
    assert anywhere(spark, settings, [gone])["live"] > 0
    (erase_id,) = Ledger(settings).submit([RequestInput(gone, "erase")]).created
    report = run(spark, settings)
    assert [(r.request_id, r.status) for r in report.requests] == [(erase_id, "completed")]
    assert anywhere(spark, settings, [gone]) == {"live": 0, "history": 0, "storage": 0}
    entry = Ledger(settings).evidence([erase_id])[erase_id]["tables"][SHARE]
    assert entry["action"] == "delete" and entry["rows"] > 0 and entry["verification"]["passed"]
    # the source was erased and purged: its refreshed-from snapshot expired, so the share was recomputed
    assert report.shares[SHARE]["mode"] == "full" and "no longer in its history" in report.shares[SHARE]["reason"]
    assert verify_completed(spark, settings) == {erase_id: []}
    planted = spark.createDataFrame([(gone,)], "user_id string").selectExpr(
        "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp")
    planted.writeTo(settings.table(SHARE)).append()
    assert verify_completed(spark, settings)[erase_id][0] == "partner.events: 1 rows in the current snapshot"
    # the share changed behind the engine's back: the next refresh recomputes it whole, without the subject
    refreshed = run(spark, settings).shares[SHARE]
    assert refreshed["mode"] == "full" and "changed after its last refresh" in refreshed["reason"]
    assert anywhere(spark, settings, [gone])["live"] == 0
