"""The lake handle from a notebook: a Lake opened on the user's own SparkSession reads a table's
snapshot, refs and history as an independent reader (pyiceberg, on the same catalog) sees them."""

from __future__ import annotations

import lakehouse_dsr as dsr
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.table import CommitRetries, Ref

EVENTS = "demo.events"


def test_a_notebook_reads_snapshots_and_refs_through_its_own_lake(spark, new_lakehouse):
    settings = new_lakehouse(users=4, events=10)  # attached to the session: the catalog is registered
    events = settings.table(EVENTS)
    spark.sql(f"ALTER TABLE {events} CREATE TAG audit")
    spark.sql(f"ALTER TABLE {events} CREATE BRANCH staging")
    spark.sql(f"DELETE FROM {events} WHERE event_type = 'page_view'")  # main moves on; the tag and branch stay

    lake = dsr.Lake(spark, settings.catalog.name)  # as a notebook opens it: the session and the catalog's name
    table = lake.table(EVENTS)
    assert isinstance(table, dsr.IcebergTable) and table.identifier == f"{settings.catalog.name}.{EVENTS}"
    assert lake.retries == CommitRetries()  # the erase section's defaults
    assert dsr.Lake.of(spark, settings) == dsr.Lake(spark, settings.catalog, CommitRetries.of(settings.erase))

    expected = open_catalog(settings).load_table(EVENTS)  # pyiceberg: no JVM, the same catalog
    current, independent = table.current_snapshot(), expected.current_snapshot()
    assert current is not None and independent is not None
    assert (current.snapshot_id, current.committed_ms, current.parent_id) == \
        (independent.snapshot_id, independent.timestamp_ms, independent.parent_snapshot_id)
    assert current.summary["total-records"] == independent.summary["total-records"]
    assert current.operation == independent.summary.operation.value
    assert table.refs() == sorted(
        (Ref(name, ref.snapshot_ref_type.value.upper(), ref.snapshot_id)
         for name, ref in expected.metadata.refs.items() if name != "main"), key=lambda r: r.name)
    assert {r.name: r.kind for r in table.refs()} == {"audit": "TAG", "staging": "BRANCH"}
    assert sorted(s.snapshot_id for s in table.history()) == sorted(s.snapshot_id for s in expected.snapshots())
    tagged = table.refs()[0].snapshot_id
    assert table.read_at(tagged).count() == expected.scan(snapshot_id=tagged).to_arrow().num_rows
    assert table.read_at(None).count() == expected.scan().to_arrow().num_rows
    assert table.descends_from(tagged) and table.properties() == dict(expected.properties)
