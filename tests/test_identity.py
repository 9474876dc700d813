"""Resolving a batch to its identifiers (stages/identity.py): each (request, identifier, value) once,
kept in the driver's JVM; a data map without linked identifiers costs no Spark job.

The expected identifiers are read with pyiceberg, not with the engine's own readers."""

from __future__ import annotations

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.datamap import DataMap
from lakehouse_dsr.lake import indriver
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.metrics import StageMeter
from lakehouse_dsr.stages import identity

SCHEMA = "request_id string, subject_id string, regulation string"


def test_each_identifier_once_even_where_the_link_table_names_it_twice(spark, new_lakehouse):
    settings = new_lakehouse()
    users = settings.table(f"{settings.demo_namespace}.users")
    subject = synth.user_id(SEED, 3)
    spark.sql(f"INSERT INTO {users} SELECT * FROM {users} WHERE user_id = '{subject}'")  # test data, not a run
    email = open_catalog(settings).load_table(f"{settings.demo_namespace}.users").scan(
        row_filter=f"user_id == '{subject}'", selected_fields=("email",)).to_arrow().column("email").to_pylist()
    assert len(email) == 2 and email[0] == email[1]
    batch = indriver.local_rows(spark, [("r1", subject, "gdpr"), ("r2", "nobody", "ccpa")], SCHEMA)

    keys = identity.resolve(Lake.of(spark, settings), settings.datamap, batch)

    assert indriver.is_local(keys)
    assert sorted(tuple(r) for r in keys.collect()) == [
        ("r1", "email", email[0]), ("r1", "user_id", subject), ("r2", "user_id", "nobody")]


def test_without_linked_identifiers_the_batch_resolves_in_the_driver(spark, new_lakehouse):
    settings = new_lakehouse()
    datamap = DataMap.model_validate({"subject": "user_id", "identifiers": {},
                                      "tables": {f"{settings.demo_namespace}.events": {"key": "user_id"}}})
    batch = indriver.local_rows(spark, [("r1", "u1", "gdpr"), ("r2", "u2", "gdpr")], SCHEMA)
    meter = StageMeter(spark)
    mark = meter.mark()

    keys = identity.resolve(Lake.of(spark, settings), datamap, batch)

    assert sorted(tuple(r) for r in keys.collect()) == [("r1", "user_id", "u1"), ("r2", "user_id", "u2")]
    assert meter.since(mark).stages == 0
