"""A batch larger than `erase.in_driver_max_requests` stays in Spark (lake/frames.py): the batch and
the ledger's hashes travel as Arrow batches, identifiers are resolved by a shuffle join and kept on
the executors, key sets are grouped by Spark. The threshold is lowered so that a few requests take
the path a million do; the run must erase, export and prove exactly as on the driver's path. Checked
with pyiceberg and delta-rs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from helpers import SEED, live_rows, make_settings, values_of
from lakehouse_dsr import synth
from lakehouse_dsr.lake import frames, indriver
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import identity

USERS = 12


def email(i: int) -> str:
    return f"person{i}@example.com"


@pytest.mark.parametrize("table_format", [  # a run on Delta costs 30-40 s here: make test stays under 10 min
    "iceberg", pytest.param("delta", marks=pytest.mark.slow)])
def test_a_batch_beyond_the_drivers_size_is_erased_and_proven_in_spark(spark, tmp_path, table_format):
    settings = make_settings(
        tmp_path, delta={"warehouse": str(tmp_path / "delta")}, purge={"orphan_min_age_minutes": 0},
        erase={"in_driver_max_requests": 2},
        datamap={"subject": "user_id",
                 "identifiers": {"email": {"table": "app.users", "subject_column": "user_id", "column": "email"}},
                 "tables": {"app.users": {"key": "user_id", "format": table_format},
                            "app.mail": {"key": "address", "identifier": "email", "format": table_format}}})
    attach(spark, settings)
    lake = Lake.of(spark, settings)
    lake.create_table("app.users", spark.createDataFrame(
        [(f"u{i}", email(i), i) for i in range(USERS)], "user_id string, email string, n int").coalesce(1), {})
    lake.create_table("app.mail", spark.createDataFrame(
        [(email(i % USERS), f"subject {i}") for i in range(3 * USERS)], "address string, title string"
    ).coalesce(2), {})
    ledger = Ledger(settings)
    erased = ledger.submit([RequestInput(f"u{i}", "erase") for i in range(4)]).created
    (access,) = ledger.submit([RequestInput("u5", "access")]).created

    report = run(spark, settings)

    assert sorted(r.request_id for r in report.completed) == sorted([*erased, access]), report.failed
    for table in ("app.users", "app.mail"):
        assert report.tables[table]["verification"]["passed"], table
        assert report.tables[table]["erase"]["collateral"]["ok"], table
    gone = {f"u{i}" for i in range(4)} | {email(i) for i in range(4)}
    assert not gone & (values_of(live_rows(settings, "app.users")) | values_of(live_rows(settings, "app.mail")))
    assert live_rows(settings, "app.users").num_rows == USERS - 4
    assert live_rows(settings, "app.mail").num_rows == 3 * (USERS - 4)
    assert {h["request_id"] for h in ledger.key_hashes(erased)} == set(erased)  # recorded through Arrow


def test_a_batch_in_spark_resolves_to_the_same_identifiers_as_in_the_driver(spark, new_lakehouse):
    settings = new_lakehouse()
    subject = synth.user_id(SEED, 3)
    (mail,) = open_catalog(settings).load_table(f"{settings.demo_namespace}.users").scan(
        row_filter=f"user_id == '{subject}'", selected_fields=("email",)).to_arrow().column("email").to_pylist()
    rows = pa.table({"request_id": ["r1", "r2", "r3"], "subject_id": [subject, "nobody", subject],
                     "regulation": ["gdpr", "ccpa", "gdpr"]})
    resolved = {}
    for in_driver_max in (10, 0):
        batch = frames.rows_frame(spark, rows, in_driver_max)
        assert indriver.is_local(batch) == (in_driver_max > 0)
        keys = identity.resolve(Lake.of(spark, settings), settings.datamap, batch)
        assert indriver.is_local(keys) == (in_driver_max > 0)
        resolved[in_driver_max] = sorted(tuple(r) for r in keys.collect())
    assert resolved[0] == resolved[10] == [("r1", "email", mail), ("r1", "user_id", subject),
                                           ("r2", "user_id", "nobody"), ("r3", "email", mail),
                                           ("r3", "user_id", subject)]


def test_a_batch_in_spark_groups_its_subjects_key_set_in_arrow_as_spark_would(spark, new_lakehouse, monkeypatch):
    """Beyond the driver's size, the subjects' key set is grouped in Arrow from the rows the run holds
    (at a million requests Spark's grouping and checkpoint took 3-6 s): the same values, each with
    the same requests, as Spark's grouping of the resolved keys; a linked identifier's key set is
    still Spark's. Beyond skipping.MAX_VALUES (as at a million) it costs no Spark job at all."""
    from pyspark.sql.types import StringType

    from lakehouse_dsr.lake import skipping
    from lakehouse_dsr.stages import matching

    settings = new_lakehouse()
    datamap = settings.datamap
    subject = synth.user_id(SEED, 3)
    rows = pa.table({"request_id": ["r1", "r2", "r3", "r4"], "subject_id": [subject, "nobody", subject, "x"],
                     "regulation": ["gdpr", "ccpa", "gdpr", "gdpr"]})
    keys = identity.resolve(Lake.of(spark, settings), datamap, frames.rows_frame(spark, rows, 0))
    tables = list(datamap.keyed)
    key_types = {t: {g.column: StringType() for g in datamap.mapping(t).groups} for t in tables}

    def grouped(key_set: matching.KeySet) -> dict[str, list[str]]:
        return {r.key_value: sorted(r.request_ids) for r in key_set.requesters.collect()}

    by_arrow = matching.key_sets(datamap, keys, key_types, tables, rows)
    by_spark = matching.key_sets(datamap, keys, key_types, tables)
    own = [t for t in tables if datamap.mapping(t).groups[0].identifier == datamap.subject]
    linked = [t for t in tables if t not in own]
    assert own and linked
    arrow_set, spark_set = by_arrow[own[0]].sets[0], by_spark[own[0]].sets[0]
    assert grouped(arrow_set) == grouped(spark_set) == {subject: ["r1", "r3"], "nobody": ["r2"], "x": ["r4"]}
    assert arrow_set.size == spark_set.size == 3
    assert sorted(arrow_set.values.java_list) == sorted(spark_set.values.java_list) == sorted([subject, "nobody", "x"])
    assert all(grouped(by_arrow[t].sets[0]) == grouped(by_spark[t].sets[0]) for t in linked)

    monkeypatch.setattr(skipping, "MAX_VALUES", 0)  # a million values: none fetched into the driver
    tracker, subjects = spark.sparkContext.statusTracker(), rows.rename_columns(["request_id", "key_value", "r"])
    jobs = []
    for held in (subjects, None):
        before = len(tracker.getJobIdsForGroup())
        matching.key_set(keys, datamap.subject, StringType(), held)
        jobs.append(len(tracker.getJobIdsForGroup()) - before)
    assert jobs[0] == 0 < jobs[1]
    beyond = matching.key_set(keys, datamap.subject, StringType(), subjects)  # pruned by range: its bounds
    assert [tuple(r) for r in beyond.span.collect()] == [(min(subject, "nobody", "x"), "x")]
    assert indriver.is_local(beyond.span)  # read into the JVM without a Spark job
    routed = matching.key_sets(datamap, keys, key_types, tables, rows)  # the subject's sets take the Arrow rows
    assert all((routed[t].sets[0].bounds is not None) == (t in own) for t in tables)


def test_a_batch_is_taken_from_the_ledgers_read_without_a_dict_per_request():
    """The open requests stay as the ledger read them (RequestRows over Arrow): the batch is their
    columns sorted by request id, lengths, iteration and membership make no dict, and a request
    looked up is the read's row."""
    from lakehouse_dsr.runner.context import batch_rows
    from lakehouse_dsr.runner.work import RequestRows

    read = pa.table({"request_id": ["r3", "r1", "r2", "r9"], "request_type": ["erase"] * 4,
                     "subject_id": ["c", "a", "b", "z"], "regulation": ["gdpr", "ccpa", "gdpr", "gdpr"]})
    requests = RequestRows.of(RequestRows(read.slice(0, 2)), RequestRows(read.slice(2)))
    assert batch_rows(requests).equals(pa.table({"request_id": ["r1", "r2", "r3", "r9"],
                                                 "subject_id": ["a", "b", "c", "z"],
                                                 "regulation": ["ccpa", "gdpr", "gdpr", "gdpr"]}))
    assert (len(requests), list(requests), "r2" in requests, "r5" in requests) == (4, ["r3", "r1", "r2", "r9"],
                                                                                  True, False)
    assert "_rows" not in vars(requests)  # no dict made so far
    assert requests["r1"] == {"request_id": "r1", "request_type": "erase", "subject_id": "a", "regulation": "ccpa"}
    assert dict(requests) == {r["request_id"]: r for r in read.to_pylist()}
