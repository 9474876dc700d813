"""Seed 004's pipeline, end to end, on Delta and on Iceberg: bronze streamed from a Kafka topic, silver
kept from bronze's change feed with deletes applied (SCD type 1), an SCD type 2 history that only marks
a deleted row expired, and gold, the users above the 90th percentile of visits.

The company owns the pipeline (the engine does not run it): here a thread applying bronze's changes
(`read_changes`: Delta's change data feed, or Iceberg snapshots compared) while `dsr run` erases
bronze. The run waits for the pipeline to carry the deletes to silver and proves it there, erases the
SCD type 2 history itself, recomputes gold, and purges history and change-feed files. Read back by
pyiceberg / delta-rs.
"""

from __future__ import annotations

import json
import threading

import pytest

from helpers import delta_traces, live_rows, make_settings, values_of
from lakehouse_dsr.ingest.stream import ingest
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.lake.table import CHANGE_TYPE
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

from .kafka_tools import create_topic, produce

BRONZE, SILVER, HISTORY, GOLD = "demo.user_bronze", "demo_silver.users", "demo_silver.user_history", "demo_gold.top"
COLUMNS = {BRONZE: "user_id string, visits int", SILVER: "user_id string, visits int",
           HISTORY: "user_id string, visits int, is_current boolean"}
GOLD_SQL = (f"SELECT user_id, visits FROM {SILVER} WHERE visits > "
            f"(SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY visits) FROM {SILVER})")


def pipeline_datamap(fmt: str) -> dict:
    where = {"format": fmt}
    return {"subject": "user_id", "tables": {BRONZE: {"key": "user_id", **where}},
            "derived": {SILVER: {"from": [BRONZE], "key": "user_id", "propagation": "pipeline", "wait_seconds": 120,
                                 **where},
                        HISTORY: {"from": [BRONZE], "key": "user_id", "kind": "scd2", **where},
                        GOLD: {"from": [SILVER], "sql": GOLD_SQL, "refresh": "full", **where}}}


class Pipeline:
    """The company's pipeline, step by step: silver and the history take bronze's changes since the
    version they last applied (MERGE on the key: deletes applied as deletes in silver, as `is_current =
    false` in the history); gold is refreshed from silver."""

    def __init__(self, spark, settings):
        self.spark, self.settings, self.lake = spark, settings, Lake.of(spark, settings)
        self.applied: int | None = None
        self.errors: list[str] = []
        self._stop = threading.Event()

    def step(self) -> None:
        bronze = self.lake.table(BRONZE)
        until = bronze.current_snapshot_id()
        if until is None or until == self.applied:
            return
        changes = bronze.read_changes(self.applied, until).where(
            f"{CHANGE_TYPE} IN ('insert', 'delete', 'update_postimage')").localCheckpoint()
        self.applied = until
        if changes.isEmpty():  # a compaction or a purge of bronze: nothing to apply, no commit
            return
        changes.createOrReplaceTempView("bronze_changes")
        table = self.settings.table
        # the history first, silver last: silver clean means this step is done
        self.spark.sql(f"""MERGE INTO {table(HISTORY)} t USING bronze_changes s
            ON t.user_id = s.user_id AND t.is_current
            WHEN MATCHED AND s.{CHANGE_TYPE} = 'delete' THEN UPDATE SET is_current = false
            WHEN NOT MATCHED AND s.{CHANGE_TYPE} <> 'delete' THEN
              INSERT (user_id, visits, is_current) VALUES (s.user_id, s.visits, true)""")
        self.spark.sql(f"""MERGE INTO {table(SILVER)} t USING bronze_changes s ON t.user_id = s.user_id
            WHEN MATCHED AND s.{CHANGE_TYPE} = 'delete' THEN DELETE
            WHEN MATCHED THEN UPDATE SET visits = s.visits
            WHEN NOT MATCHED AND s.{CHANGE_TYPE} <> 'delete' THEN
              INSERT (user_id, visits) VALUES (s.user_id, s.visits)""")

    def refresh_gold(self) -> None:
        self.spark.sql(GOLD_SQL.replace(SILVER, self.settings.table(SILVER))).createOrReplaceTempView("gold_now")
        self.spark.sql(f"INSERT OVERWRITE {self.settings.table(GOLD)} SELECT * FROM gold_now")

    def run_beside(self) -> threading.Thread:
        """The pipeline running continuously (every half second), as a streaming job would, until stopped.
        A step that fails (the run purging what it reads) is noted and tried again."""
        def loop() -> None:
            while not self._stop.wait(0.5):
                try:
                    self.step()
                except Exception as exc:  # noqa: BLE001  (a pipeline keeps going; the test reads the notes)
                    self.errors.append(str(exc).splitlines()[0])
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def stop(self, thread: threading.Thread) -> None:
        self._stop.set()
        thread.join(60)


def create_tables(spark, settings, fmt: str) -> None:
    for name, columns in [*COLUMNS.items(), (GOLD, "user_id string, visits int")]:
        if fmt == "delta":
            spark.sql(f"CREATE TABLE {settings.table(name)} ({columns}) USING delta "
                      "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        else:
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.namespace(name.split('.')[0])}")
            spark.sql(f"CREATE TABLE {settings.table(name)} ({columns}) USING iceberg")


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_seed_004_pipeline_is_erased_end_to_end(spark, kafka_broker, tmp_path, fmt):
    settings = make_settings(tmp_path, datamap=pipeline_datamap(fmt), delta={"warehouse": str(tmp_path / "delta")},
                             purge={"orphan_min_age_minutes": 0})
    attach(spark, settings)
    create_tables(spark, settings, fmt)
    people = {f"seed4-user-{i:02d}": 5 + i for i in range(20)}  # visits: the last two are above the 90th percentile
    gone, stays = "seed4-user-19", "seed4-user-03"
    topic = f"users-{fmt}"
    create_topic(kafka_broker.bootstrap, topic)
    produce(kafka_broker.bootstrap, topic, [(p, {"user_id": p, "visits": v}) for p, v in people.items()])
    assert ingest(spark, settings, f"kafka://{kafka_broker.bootstrap}/{topic}", "json", BRONZE,
                  str(tmp_path / "bronze-checkpoint"), once=True).rows_written == 20
    pipeline = Pipeline(spark, settings)
    pipeline.step()
    pipeline.refresh_gold()
    assert {r["user_id"] for r in live_rows(settings, GOLD).to_pylist()} == {"seed4-user-18", gone}
    assert gone in values_of(live_rows(settings, SILVER)) and gone in values_of(live_rows(settings, HISTORY))

    Ledger(settings).submit([RequestInput(gone, "erase")])
    thread = pipeline.run_beside()
    try:
        report = run(spark, settings)
    finally:
        pipeline.stop(thread)

    [outcome] = report.requests
    assert outcome.status == "completed", outcome.reason
    silver = report.tables[SILVER]["erase"]
    assert silver["reason"].startswith("carried by the pipeline: clean") and silver["rows_matched"] == 0
    assert report.tables[HISTORY]["erase"]["rows_matched"] == 1  # SCD2 only marked it expired: erased by the run
    assert report.tables[BRONZE]["erase"]["rows_matched"] == 1
    assert {SILVER, GOLD} <= set(report.clean_after_seconds)
    assert report.clean_after_seconds[SILVER] <= report.clean_after_seconds[GOLD]  # gold from the clean silver
    for table in (BRONZE, SILVER, HISTORY, GOLD):
        assert gone not in values_of(live_rows(settings, table)), table
    assert stays in values_of(live_rows(settings, SILVER))
    # gold recomputed by its own query: the top 10% now without the erased person
    assert {r["user_id"] for r in live_rows(settings, GOLD).to_pylist()} == {"seed4-user-17", "seed4-user-18"}
    if fmt == "delta":  # history, the change data feed's files and the log: nothing of the person left
        for table in (BRONZE, SILVER, HISTORY, GOLD):
            assert delta_traces(settings.delta_tables()[table], {gone}, [gone.encode()]) == [], table
    assert gone not in json.dumps(report.as_dict())


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_pipeline_that_does_not_carry_the_erasure_is_erased_by_the_run(spark, tmp_path, fmt):
    datamap = pipeline_datamap(fmt)
    datamap["derived"][SILVER]["wait_seconds"] = 2
    settings = make_settings(tmp_path, datamap=datamap, delta={"warehouse": str(tmp_path / "delta")},
                             purge={"orphan_min_age_minutes": 0})
    attach(spark, settings)
    create_tables(spark, settings, fmt)
    spark.createDataFrame([("seed4-a", 3), ("seed4-b", 4)], COLUMNS[BRONZE]).writeTo(settings.table(BRONZE)).append()
    Pipeline(spark, settings).step()  # then the pipeline stops: it never sees the erasure
    Ledger(settings).submit([RequestInput("seed4-a", "erase")])
    report = run(spark, settings)
    [outcome] = report.requests
    assert outcome.status == "completed", outcome.reason
    silver = report.tables[SILVER]["erase"]
    assert silver["reason"] == "the pipeline had not carried the erasure after 2 s: erased by the engine"
    assert silver["rows_matched"] == 1 and report.clean_after_seconds[SILVER] >= 2
    assert values_of(live_rows(settings, SILVER)) & {"seed4-a", "seed4-b"} == {"seed4-b"}
