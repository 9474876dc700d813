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
