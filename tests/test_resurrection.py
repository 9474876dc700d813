"""Nothing erased comes back: a run finds people erased earlier in rows added since the last check,
erases them again (reading only the added files), and re-checks a table whose history was rolled back.
(test_cycle has the fast case on its shared lake; these build a lake of their own: make test-slow.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pyiceberg.table import StaticTable

from helpers import SEED, make_settings, snapshot_ids
from lakehouse_dsr import synth
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.lake.table import Snapshot
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.records import expire_records
from lakehouse_dsr.ledger.requests import RequestInput, utc_now
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import resurrection

pytestmark = pytest.mark.slow

TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders"]


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """A tiny lake where two people were erased (completed) by a first run."""
    settings = make_settings(tmp_path_factory.mktemp("resurrection"))
    attach(spark, settings)
    synth.generate(spark, settings, users=30, events=300, seed=SEED, batches=2)
    erased = [synth.user_id(SEED, 1), synth.user_id(SEED, 2)]
    Ledger(settings).submit([RequestInput(s, "erase") for s in erased])
    first = run(spark, settings)
    assert len(first.completed) == 2 and first.resurrections == {}
    return {"settings": settings, "erased": erased, "kept": synth.user_id(SEED, 3)}


def _append_events(spark, settings, users: list[str], tag: str) -> int:
    lake = Lake.of(spark, settings)
    rows = [(f"{tag}-{i}", u) for i, u in enumerate(users)]
    spark.createDataFrame(rows, "event_id string, user_id string").selectExpr(
        "event_id", "user_id", "'login' event_type", "timestamp'2024-07-01' event_timestamp", "null page_url",
        "null product_id", "'replayed' event_details").writeTo(settings.table("demo.events")).append()
    return lake.table("demo.events").current_snapshot().snapshot_id


def _snapshot(spark, settings, snapshot_id: int) -> Snapshot:
    lake = Lake.of(spark, settings)
    return next(s for s in lake.table("demo.events").history() if s.snapshot_id == snapshot_id)


def _user_ids_on_storage(spark, settings, table: str) -> list[str]:
    """Every user_id in the table's current files, read by pyiceberg (an independent reader)."""
    lake = Lake.of(spark, settings)
    metadata = lake.table(table).java().operations().current().metadataFileLocation()
    return StaticTable.from_metadata(metadata).scan(selected_fields=("user_id",)).to_arrow()["user_id"].to_pylist()


def test_a_run_with_nothing_new_starts_no_check(spark, lake):
    settings = lake["settings"]
    before = snapshot_ids(spark, settings, TABLES)
    report = run(spark, settings)
    assert report.requests == [] and report.resurrections == {}
    assert set(report.seconds) <= {"ledger"}  # no table moved since its checkpoint: the run started no Spark stage
    assert snapshot_ids(spark, settings, TABLES) == before


def test_an_erased_person_appended_again_is_erased_again_reading_only_the_new_file(spark, lake):
    settings = lake["settings"]
    victim, kept = lake["erased"][0], lake["kept"]
    kept_rows = _user_ids_on_storage(spark, settings, "demo.events").count(kept)
    appended = _append_events(spark, settings, [victim, victim, kept], "replay")
    assert _user_ids_on_storage(spark, settings, "demo.events").count(victim) == 2
    added = int(_snapshot(spark, settings, appended).summary["added-data-files"])

    report = run(spark, settings)  # no open request: the moved table alone makes the run due

    back = report.resurrections["demo.events"]
    assert back["requests"] == 1 and back["rows"] == 2 and 1 <= back["files"] <= added
    assert back["files_read"] == added and not back["whole_table"]  # the appended files only
    assert back["commits"] == [{"snapshot_id": appended, "operation": "append"}]
    assert set(report.resurrections) == {"demo.events"}
    ids = _user_ids_on_storage(spark, settings, "demo.events")
    assert victim not in ids and ids.count(kept) == kept_rows + 1  # the other person's replayed row stays
    assert report.tables["demo.events"]["verification"]["passed"]
    assert report.tables["demo.events"]["verification"]["physical"]  # purged: history no longer holds it
    # The next run has nothing to do: the checkpoint moved past the commits it checked and made.
    before = snapshot_ids(spark, settings, TABLES)
    assert run(spark, settings).resurrections == {}
    assert snapshot_ids(spark, settings, TABLES) == before


def test_a_rolled_back_table_is_checked_whole(spark, lake):
    settings = lake["settings"]
    table = Lake.of(spark, settings).table("demo.newsletter").procedure_name
    start = Lake.of(spark, settings).table("demo.newsletter").current_snapshot().snapshot_id
    spark.createDataFrame([("someone.new@example.org",)], "email string").selectExpr(
        "email", "timestamp'2024-07-01' subscribed_at", "'weekly' list_name", "'import' source"
    ).writeTo(settings.table("demo.newsletter")).append()
    run(spark, settings)  # checks the appended row (nobody erased in it) and moves the checkpoint past it
    spark.sql(f"CALL `{settings.catalog.name}`.system.rollback_to_snapshot('{table}', {start})")
    checked = resurrection.checkpoints(Ledger(settings).journal.steps())["demo.newsletter"]
    scope = resurrection.scope(Lake.of(spark, settings), settings.datamap, "demo.newsletter", checked)
    assert scope.whole and scope.files == Lake.of(spark, settings).table("demo.newsletter").summary_count(
                                                                 "total-data-files")
    report = run(spark, settings)
    assert report.resurrections == {}  # read whole, nobody erased found


def test_a_person_whose_erase_record_expired_is_still_kept_out(spark, lake):
    """Issue 28 item 4 keeps an expired erasure's keyed hashes (ledger erased_keys): the check still knows them."""
    settings = lake["settings"]
    expire_records(settings, now=utc_now() + timedelta(days=800))
    assert Ledger(settings).completed_ids("erase") == []  # the request records are gone
    victim = lake["erased"][1]
    _append_events(spark, settings, [victim], "late")
    report = run(spark, settings)
    assert report.resurrections["demo.events"]["requests"] == 1
    assert victim not in _user_ids_on_storage(spark, settings, "demo.events")
