"""Collateral check, commit-conflict retries and late rows, in one process with real tables.

Faults are injected by wrapping `erase.apply`: the wrapper runs what a concurrent writer or a
faulty statement would commit, around the real erase.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import SEED, make_settings, snapshot_ids
from lakehouse_dsr import synth
from lakehouse_dsr.exceptions import CommitConflictError, ConfigError, LedgerError
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.table import CommitRetries, with_conflict_retries
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import erase
from lakehouse_dsr.stages.matching import KeySet
from lakehouse_dsr.stages.verify import verify_completed

ERASED = [synth.user_id(SEED, 1), synth.user_id(SEED, 2)]
BYSTANDER = synth.user_id(SEED, 9)


def events_of(spark, settings, ids) -> int:
    return spark.table(settings.table("demo.events")).where(F.col("user_id").isin(*ids)).count()


def append_events(spark, settings, user_ids: list[str], tag: str) -> None:
    spark.createDataFrame([(u,) for u in user_ids], "user_id string").selectExpr(
        "uuid() event_id", "user_id", "'late' event_type", "timestamp'2024-07-01' event_timestamp",
        "cast(null as string) page_url", "cast(null as string) product_id", f"'{tag}' event_details",
    ).writeTo(settings.table("demo.events")).append()


def wrap_apply(monkeypatch, settings, table: str, before=None, after=None) -> None:
    """Run `before(spark, settings, keys)` / `after(spark, settings)` around the real erase of `table`
    (first call only); TableKeys that `before` returns replace the batch's in the statement."""
    real, calls = erase.apply, []

    def apply(lake, datamap, erasing, table_plan, keys, **options):  # options (the check's keys) pass unchanged
        first = table_plan.table == table and not calls
        if first:
            calls.append(1)
            keys = (before(lake.spark, settings, keys) if before else None) or keys
        result = real(lake, datamap, erasing, table_plan, keys, **options)
        if first and after:
            after(lake.spark, settings)
        return result

    monkeypatch.setattr(erase, "apply", apply)


def roll_back(spark, settings, table: str, snapshot_id: int) -> None:
    """`table` back to a version, as an operator would: Iceberg's rollback procedure, Delta's RESTORE."""
    if table in settings.delta_tables():
        spark.sql(f"RESTORE TABLE {settings.table(table)} TO VERSION AS OF {snapshot_id}")
    else:
        spark.sql(f"CALL {settings.catalog.name}.system.rollback_to_snapshot("
                  f"'{Lake.of(spark, settings).table(table).procedure_name}', {snapshot_id})")


@pytest.mark.parametrize(("mode", "in_driver_max_bytes", "table_format"), [
    # the tiny tables rewritten and checked in the driver (make test-slow: 12 s)
    pytest.param("content", 8 << 20, "iceberg", marks=pytest.mark.slow),
    ("content", 0, "iceberg"),  # Spark's rewrite and check, as for large tables
    # the MERGE's files, from its commit in the log (three runs, demo.events in Delta: make test-slow)
    pytest.param("content", 0, "delta", marks=pytest.mark.slow),
    pytest.param("count", 8 << 20, "iceberg", marks=pytest.mark.slow)])
def test_collateral_damage_stops_the_run_before_the_purge_and_holds_the_table(spark, new_lakehouse, monkeypatch,
                                                                              mode, in_driver_max_bytes, table_format):
    settings = new_lakehouse(delta=["demo.events"] if table_format == "delta" else None,
                             erase={"collateral_check": mode, "in_driver_max_bytes": in_driver_max_bytes})
    ledger = Ledger(settings)
    ledger.submit([RequestInput(s, "erase") for s in ERASED])
    bystander_rows = events_of(spark, settings, [BYSTANDER])
    assert bystander_rows > 0

    def before(spark, settings, keys):  # a bug that also matches a bystander, in the statement only
        extra = spark.createDataFrame([(BYSTANDER, ["bug"])], "key_value string, request_ids array<string>")
        return keys.replace(0, KeySet(keys.sets[0].requesters.unionByName(extra), keys.sets[0].size + 1))

    wrap_apply(monkeypatch, settings, "demo.events", before)
    report = run(spark, settings)

    assert "demo.events" in report.collateral_failures and report.needs_attention
    assert report.tables["demo.events"]["purge"] == {}  # stopped before the purge
    detail = report.tables["demo.events"]["erase"]["collateral"]["detail"]
    assert ("rows after the erase commit" in detail) == (mode == "count"), detail  # the content check found it
    assert {r.status for r in report.requests} == {"failed"}
    assert all("collateral check failed in demo.events" in r.reason for r in report.requests)
    assert set(ledger.journal.holds()) == {"demo.events"}
    # The pre-erase snapshot is still there: a rollback restores the bystander.
    held_at = ledger.journal.holds()["demo.events"].snapshot_id
    assert Lake.of(spark, settings).table("demo.events").read_at(held_at) \
        .where(F.col("user_id") == BYSTANDER).count() == bystander_rows

    # While held, a run erases and purges nothing and says why.
    monkeypatch.undo()
    before_ids = snapshot_ids(spark, settings, list(settings.datamap.tables))
    held = run(spark, settings)
    assert set(held.held) == {"demo.events"} and held.needs_attention and not held.tables
    assert snapshot_ids(spark, settings, list(settings.datamap.tables)) == before_ids

    with pytest.raises(LedgerError, match="reason"):
        ledger.journal.release("demo.events", " ")
    roll_back(spark, settings, "demo.events", held_at)
    ledger.journal.release("demo.events", "rolled back to the pre-erase snapshot")
    assert not ledger.journal.holds()
    with pytest.raises(LedgerError, match="not on hold"):
        ledger.journal.release("demo.events", "again")

    done = run(spark, settings)
    assert {r.status for r in done.requests} == {"completed"}, [r.reason for r in done.requests]
    assert events_of(spark, settings, [BYSTANDER]) == bystander_rows
    assert events_of(spark, settings, ERASED) == 0


def test_concurrent_appends_during_the_erase_are_kept_and_late_rows_erased(spark, new_lakehouse, monkeypatch):
    settings = new_lakehouse()
    Ledger(settings).submit([RequestInput(s, "erase") for s in ERASED])
    others = spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*ERASED)).count()

    def during(spark, settings, keys):  # lands between the plan's snapshot and the erase commit
        append_events(spark, settings, [BYSTANDER] * 5 + [ERASED[0]], "during")

    def after(spark, settings):  # lands after the erase commit: a later round must catch it
        append_events(spark, settings, [BYSTANDER] * 3 + [ERASED[1]] * 2, "after")

    wrap_apply(monkeypatch, settings, "demo.events", during, after)
    report = run(spark, settings)

    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    events = report.tables["demo.events"]["erase"]
    assert events["collateral"]["ok"] and events["rounds"] == 2
    assert events_of(spark, settings, ERASED) == 0
    assert spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*ERASED)).count() == others + 8
    assert all(not reasons for reasons in verify_completed(spark, settings).values())


def test_redacting_table_with_a_concurrent_append_of_a_requested_subject(spark, new_lakehouse, monkeypatch):
    """The erase may or may not see rows appended while it runs; either way the check must hold."""
    settings = new_lakehouse()
    Ledger(settings).submit([RequestInput(ERASED[0], "erase")])

    def during(spark, settings, keys):
        spark.createDataFrame([(ERASED[0],), (BYSTANDER,)], "user_id string").selectExpr(
            "uuid() order_id", "user_id", "cast(1.00 as decimal(10,2)) amount", "'N' customer_name",
            "'S' shipping_address", "timestamp'2024-06-01' ordered_at").writeTo(settings.table("demo.orders")).append()

    wrap_apply(monkeypatch, settings, "demo.orders", during)
    report = run(spark, settings)
    assert report.tables["demo.orders"]["erase"]["collateral"]["ok"]
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]


def test_commit_conflicts_are_retried_with_backoff_and_then_fail_clearly(tmp_path):
    settings = make_settings(tmp_path, erase={"commit_retries": 2, "retry_backoff_seconds": 0.01})
    conflict = "org.apache.iceberg.exceptions.ValidationException: Found conflicting files that can contain records"
    attempts = []

    def flaky(fail_times):
        def statement():
            attempts.append(1)
            if len(attempts) <= fail_times:
                raise RuntimeError(conflict)
        return statement

    retries = CommitRetries.of(settings.erase)  # the retries a Lake of these settings uses; no session needed
    assert retries == CommitRetries(2, 0.01)
    assert with_conflict_retries(retries, "an erase", flaky(2))[1] == 3
    attempts.clear()
    with pytest.raises(CommitConflictError, match="conflicted with concurrent writers 3 times"):
        with_conflict_retries(retries, "an erase", flaky(5))
    attempts.clear()

    def broken():
        attempts.append(1)
        raise RuntimeError("AnalysisException: something else")

    with pytest.raises(RuntimeError, match="something else"):
        with_conflict_retries(retries, "an erase", broken)
    assert len(attempts) == 1  # other errors are not retried


def test_a_misspelt_failpoint_fails_before_anything_changes(spark, new_lakehouse, monkeypatch):
    settings = new_lakehouse()
    Ledger(settings).submit([RequestInput(ERASED[0], "erase")])
    tables = [*settings.datamap.tables, "dsr.requests", "dsr.audit"]
    before = snapshot_ids(spark, settings, tables)
    monkeypatch.setenv("DSR_FAIL_AT", "after_erse")
    with pytest.raises(ConfigError, match="not a failpoint.*after_erase"):
        run(spark, settings)
    assert snapshot_ids(spark, settings, tables) == before


def test_the_keyed_hashes_are_stored_before_the_first_commit_and_a_failure_to_store_them_erases_nothing(
        spark, new_lakehouse, monkeypatch):
    """The batch's keyed hashes are stored on a thread while the erasure plans: every commit finds
    them in the ledger; when storing them fails, the run fails and no mapped table changed."""
    settings = new_lakehouse()
    ledger = Ledger(settings)
    ids = ledger.submit([RequestInput(u, "erase") for u in ERASED]).created
    stored_at_commit: list[int] = []
    real_apply = erase.apply

    def apply(lake, datamap, erasing, table_plan, keys, **options):
        stored_at_commit.append(len(Ledger(settings).key_hashes(ids)))
        return real_apply(lake, datamap, erasing, table_plan, keys, **options)

    monkeypatch.setattr(erase, "apply", apply)
    tables = list(settings.datamap.tables)
    before = snapshot_ids(spark, settings, tables)
    record_keys = Ledger.record_keys
    monkeypatch.setattr(Ledger, "record_keys", lambda self, hashed: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        run(spark, settings)
    assert snapshot_ids(spark, settings, tables) == before and not stored_at_commit
    monkeypatch.setattr(Ledger, "record_keys", record_keys)
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}
    assert stored_at_commit and min(stored_at_commit) >= len(ERASED)  # a subject id and its linked keys
    assert events_of(spark, settings, ERASED) == 0
