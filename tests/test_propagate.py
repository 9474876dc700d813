"""Propagation: a person erased from bronze leaves the silver and gold tables built from it in the same run.

The demo's layers (silver user_daily keyed by user_id, user_history as SCD type 2; gold
daily_by_type recomputed by groups, top_visitors recomputed whole) plus a gold table read from a
silver one (level 2). After `run`, each derived table must equal its recomputation from scratch on
the post-erase sources, row for row; no erased id may be left in any live row, snapshot or file.
"""

from __future__ import annotations

import signal

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from helpers import SEED, datamap_dict, delta_traces, dsr_run, make_disk_lakehouse, make_settings, rows_of, snapshot_ids
from lakehouse_dsr import synth
from lakehouse_dsr.datamap import KeyGroup, demo_datamap, lineage
from lakehouse_dsr.datamap.model import DEMO_DERIVED, DataMap, DerivedMapping
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import propagate
from lakehouse_dsr.stages.verify import stored_hashes, verify_table

TYPE_TOTALS = {"from": ["demo_silver.user_daily"], "group_by": ["event_type"],
               "sql": "SELECT event_type, sum(events) AS events, count(DISTINCT user_id) AS users "
                      "FROM demo_silver.user_daily WHERE events > 0 GROUP BY event_type"}
SILVER_GOLD = ["demo_silver.user_daily", "demo_silver.user_history", "demo_gold.daily_by_type",
               "demo_gold.top_visitors", "demo_gold.type_totals"]


def layered_datamap(table_format: str = "iceberg", **extra) -> dict:
    """The demo's layers plus type_totals (a gold table read from a silver one), every table in `table_format`."""
    raw = datamap_dict(demo_datamap(vault=False, table_format=table_format))
    in_delta = {"format": "delta"} if table_format == "delta" else {}
    raw["derived"]["demo_gold.type_totals"] = {**TYPE_TOTALS, **in_delta}
    raw["derived"].update(extra)
    return raw


def recompute(spark, settings, table: str):
    """A derived table as it must be: built from scratch on the current sources."""
    if table == "demo_silver.user_daily":
        return synth.user_daily_df(spark.table(settings.table("demo.events")))
    if table == "demo_silver.user_history":
        return synth.user_history_df(spark.table(settings.table("demo.users")), SEED)
    mapping = settings.datamap.derived[table]
    query = lineage.parse(spark, table, mapping, {*settings.datamap.tables, *settings.datamap.derived},
                          settings.catalog.name)
    return lineage.bound(spark, query, lambda t: spark.table(settings.table(t)))


def assert_equal_to_recomputation(spark, settings, table: str) -> None:
    held = spark.table(settings.table(table))
    rows = rows_of(held)
    assert rows and rows == rows_of(recompute(spark, settings, table).select(*held.columns)), table


def create_type_totals(spark, settings) -> None:
    query = lineage.parse(spark, "demo_gold.type_totals", DerivedMapping.model_validate(TYPE_TOTALS),
                          {"demo_silver.user_daily"}, settings.catalog.name)
    synth.create_table(spark, settings, "demo_gold.type_totals",
                       lineage.bound(spark, query, lambda t: spark.table(settings.table(t))), synth.PLAIN_PROPS,
                       settings.delta_tables().get("demo_gold.type_totals"))


@pytest.fixture
def layered(spark, new_lakehouse, request):
    """A layered lake, in Iceberg unless parametrized (indirect) with "delta"."""
    settings = new_lakehouse(datamap=layered_datamap(getattr(request, "param", "iceberg")))
    create_type_totals(spark, settings)
    return settings


@pytest.fixture(scope="module")
def shared(spark, tmp_path_factory):
    """A layered lake for tests that change no data (each failing run, or analysis only)."""
    settings = make_settings(tmp_path_factory.mktemp("lh"), datamap=layered_datamap())
    attach(spark, settings)
    synth.generate(spark, settings, users=40, events=600, seed=SEED, batches=2)
    create_type_totals(spark, settings)
    return settings


def top_visitors(spark, settings, n: int) -> list[str]:
    counts = spark.table(settings.table("demo.events")).groupBy("user_id").count()
    return [r.user_id for r in counts.orderBy(F.desc("count"), "user_id").limit(n).collect()]


def add_lone_refunder(spark, settings) -> str:
    """A person whose events alone form a group of daily_by_type ('refund'); the layers are rebuilt."""
    spark.createDataFrame([(f"refund-{i}", LONE, "refund") for i in range(3)],
                          "event_id string, user_id string, event_type string").selectExpr(
        "event_id", "user_id", "event_type", "timestamp'2024-11-01 10:00:00' event_timestamp",
        "cast(null as string) page_url", "cast(null as string) product_id", "'Refund' event_details",
    ).writeTo(settings.table("demo.events")).append()
    for table in ["demo_silver.user_daily", "demo_gold.daily_by_type", "demo_gold.top_visitors",
                  "demo_gold.type_totals"]:
        recompute(spark, settings, table).writeTo(settings.table(table)).overwrite(F.lit(True))
    return LONE


LONE = "lone-refunder"


# Nine Delta tables' erase, refresh, purge and proof on two cores: make test-slow (3 minutes)
@pytest.mark.parametrize("layered", ["iceberg", pytest.param("delta", marks=pytest.mark.slow)], indirect=True)
def test_one_run_erases_bronze_silver_and_gold(spark, layered):
    settings = layered
    add_lone_refunder(spark, settings)
    for table in SILVER_GOLD:  # the layers start equal to their definitions
        assert_equal_to_recomputation(spark, settings, table)
    erased = [*top_visitors(spark, settings, 2), LONE]  # in top_visitors, in many groups; alone in one
    assert spark.table(settings.table("demo_gold.top_visitors")).where(F.col("user_id").isin(*erased)).count() == 2
    ledger = Ledger(settings)
    ledger.submit([RequestInput(s, "erase") for s in erased])

    report = run(spark, settings)

    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    for table in SILVER_GOLD:
        assert_equal_to_recomputation(spark, settings, table)
    daily = report.tables["demo_gold.daily_by_type"]["erase"]
    assert daily["strategy"] == "subtract_groups" and daily["rows_matched"] > 0  # counts only: subtracted
    daily_rows = spark.table(settings.table("demo_gold.daily_by_type"))
    assert daily_rows.where(F.col("event_type") == "refund").count() == 0  # an emptied group disappears
    top = report.tables["demo_gold.top_visitors"]["erase"]
    assert top["strategy"] == "full_refresh" and top["reason"] == "refresh: full"
    assert report.tables["demo_silver.user_history"]["erase"]["rows_matched"] >= 2  # every version went
    totals = report.tables["demo_gold.type_totals"]["erase"]  # a sum: recomputed, groups only
    assert totals["strategy"] == "affected_groups" and totals["rows_matched"] > 0
    for table in SILVER_GOLD:
        assert report.tables[table]["verification"]["passed"], table
    assert report.seconds["propagate"] > 0

    # No erased id left in silver or gold: live rows, every retained snapshot, every stored file.
    hashes = stored_hashes(spark, ledger, [r.request_id for r in report.requests], 100)
    for table in ["demo_silver.user_daily", "demo_silver.user_history", "demo_gold.top_visitors"]:
        found = verify_table(Lake.of(spark, settings), settings.key_file(), table, [KeyGroup("user_id", "user_id")],
                             {"user_id": StringType()}, hashes, ledger.keyring)
        assert found.live == found.history == found.storage == 0, table
    for table in ["demo_gold.daily_by_type", "demo_gold.type_totals"]:  # old figures gone from history too
        assert len(snapshot_ids(spark, settings, [table])[table]) == 1, table
    # Read without Spark: no Delta table's rows, versions, files or log bytes hold an erased id.
    for table, path in settings.delta_tables().items():
        assert delta_traces(path, set(erased), [e.encode() for e in erased]) == [], table


def test_an_aggregate_behind_its_source_is_recomputed_where_it_was_erased(spark, layered):
    """daily_by_type misses a row appended to events since it was built, in a group the erased person
    fed: subtracting alone would leave it short, so verification finds it and the groups are recomputed."""
    settings = layered
    [subject] = top_visitors(spark, settings, 1)
    first = spark.table(settings.table("demo.events")).where(F.col("user_id") == subject).orderBy("event_id").limit(1)
    first.select(F.lit("late-event").alias("event_id"), F.lit("late-arrival").alias("user_id"), "event_type",
                 "event_timestamp", "page_url", "product_id", "event_details"
                 ).writeTo(settings.table("demo.events")).append()
    for table in ["demo_silver.user_daily", "demo_gold.top_visitors", "demo_gold.type_totals"]:
        recompute(spark, settings, table).writeTo(settings.table(table)).overwrite(F.lit(True))
    Ledger(settings).submit([RequestInput(subject, "erase")])

    report = run(spark, settings)

    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    daily = report.tables["demo_gold.daily_by_type"]
    assert daily["erase"]["strategy"] == "affected_groups"
    assert daily["erase"]["reason"] == "subtracted, then recomputed: the table was behind its sources"
    assert daily["verification"]["passed"]
    for table in SILVER_GOLD:
        assert_equal_to_recomputation(spark, settings, table)


def test_verification_counts_every_row_an_aggregate_differs_by(spark):
    """Rows missing, extra or duplicated, nulls equal to nulls, columns matched by name."""
    held = spark.createDataFrame([("a", 1), ("a", 1), ("b", None), ("c", 3)], "g string, n int")
    assert propagate._rows_differing(held, held.select("n", "g")) == 0
    fresh = spark.createDataFrame([("a", 1), ("b", None), ("d", 4), ("d", 4)], "g string, n int")
    assert propagate._rows_differing(held, fresh) == 4  # the second a, c; both d rows


def test_an_unrelated_erasure_leaves_aggregates_alone(spark, layered):
    settings = layered
    before = snapshot_ids(spark, settings, SILVER_GOLD)
    Ledger(settings).submit([RequestInput("nobody-has-this-id", "erase")])
    report = run(spark, settings)
    assert {r.status for r in report.requests} == {"completed"}
    assert snapshot_ids(spark, settings, SILVER_GOLD) == before  # nothing fed: nothing rewritten


@pytest.mark.parametrize("change, message", [
    ({"demo_gold.bad": {"from": ["demo.events"], "sql": "SELEC nothing", "refresh": "full"}}, "does not parse"),
    ({"demo_gold.daily_by_type": {**DEMO_DERIVED["demo_gold.daily_by_type"],
                                  "sql": "SELECT event_type, to_date(event_timestamp) AS day, count(*) AS events, "
                                         "count(*) AS users FROM demo.orders GROUP BY 1, 2"}},
     "which its 'from' does not name"),
    ({"demo_gold.daily_by_type": {**DEMO_DERIVED["demo_gold.daily_by_type"],
                                  "sql": "SELECT * FROM other.secret_table", "refresh": "full", "group_by": []}},
     "does not list"),
    ({"demo_gold.daily_by_type": {**DEMO_DERIVED["demo_gold.daily_by_type"], "group_by": ["event_type", "hour"]}},
     "group_by hour not among"),
])
def test_bad_lineage_is_one_clear_error_and_changes_nothing(spark, shared, change, message):
    settings = shared.model_copy(update={"datamap": DataMap.model_validate(layered_datamap(**change))})
    Ledger(settings).submit([RequestInput(top_visitors(spark, settings, 1)[0], "erase")])
    tables = ["demo.events", "demo.users", *SILVER_GOLD]
    before = snapshot_ids(spark, settings, tables)
    with pytest.raises(DataMapError, match=message):
        run(spark, settings)
    assert snapshot_ids(spark, settings, tables) == before


def test_a_cycle_in_from_is_refused():
    raw = layered_datamap()
    raw["derived"]["demo_silver.user_daily"]["from"] = ["demo.events", "demo_gold.type_totals"]
    with pytest.raises(ValueError, match="a cycle in 'from' among demo_gold.type_totals, demo_silver.user_daily"):
        DataMap.model_validate(raw)


@pytest.mark.parametrize("sql, group_by, why", [
    ("SELECT event_type, count(*) AS n FROM demo.events WHERE page_url IS NOT NULL GROUP BY event_type "
     "HAVING count(*) > 1 ORDER BY n", ["event_type"], None),
    ("SELECT e.event_type, count(*) AS n FROM demo.events e JOIN demo.users u ON e.user_id = u.user_id "
     "GROUP BY e.event_type", ["event_type"], "a Join node"),
    ("SELECT event_type, count(*) AS n FROM demo.events GROUP BY event_type "
     "HAVING count(*) > (SELECT count(*) FROM demo.users)", ["event_type"], "a subquery"),
    ("SELECT event_type, n, rank() OVER (ORDER BY n) AS r FROM (SELECT event_type, count(*) AS n FROM demo.events "
     "GROUP BY event_type)", ["event_type"], "a Window node"),
    ("SELECT event_type, count(*) AS n FROM demo.events GROUP BY event_type", ["n"],
     "group_by column n is not a GROUP BY expression"),
    ("SELECT event_type, count(*) AS n FROM demo.events GROUP BY event_type LIMIT 3", ["event_type"], "Limit"),
    ("SELECT event_type, count(*) AS n FROM demo.events WHERE rand() < 0.5 GROUP BY event_type", ["event_type"],
     "non-deterministic"),
])
def test_which_shapes_are_recomputed_by_group(spark, shared, sql, group_by, why):
    settings = shared
    mapping = DerivedMapping.model_validate({"from": ["demo.events", "demo.users"], "sql": sql, "group_by": group_by})
    query = lineage.parse(spark, "x.y", mapping, {"demo.events", "demo.users"}, settings.catalog.name)
    shape = lineage.shape(lineage.bound(spark, query, lambda t: spark.table(settings.table(t))), group_by)
    assert shape.incremental == (why is None)
    assert why is None or why in shape.reason


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", ["before_propagate", "during_propagate"])
def test_a_run_killed_while_propagating_is_finished_by_the_next(spark, tmp_path, failpoint):
    settings, config = make_disk_lakehouse(spark, tmp_path, derived=True)
    ledger = Ledger(settings)
    ledger.submit([RequestInput(s, "erase") for s in top_visitors(spark, settings, 2)])

    assert dsr_run(config, failpoint) == -signal.SIGKILL
    assert {r.status for r in ledger.statuses()} == {"in_progress"}
    assert dsr_run(config) == 0

    assert {r.status for r in ledger.statuses()} == {"completed"}
    for table in SILVER_GOLD[:4]:
        spark.catalog.refreshTable(settings.table(table))
        assert_equal_to_recomputation(spark, settings, table)
    # The source's erased rows were gone when the second run came: it recomputed the aggregate whole.
    evidence = ledger.evidence([r.request_id for r in ledger.statuses()])
    assert {e["tables"]["demo_gold.daily_by_type"]["strategy"] for e in evidence.values()} == {"full_refresh"}


@pytest.mark.parametrize("sql, erased_key, expected", [
    (DEMO_DERIVED["demo_gold.daily_by_type"]["sql"], "user_id", ("events", ("events", "users"))),
    (DEMO_DERIVED["demo_gold.daily_by_type"]["sql"], None, None),  # COUNT(DISTINCT) exact only for the erased key
    ("SELECT event_type, count(*) AS n, count(page_url) AS pages FROM demo.events GROUP BY event_type",
     None, ("n", ("n", "pages"))),
    ("SELECT event_type, count(*) AS n FROM demo.events GROUP BY event_type HAVING count(*) > 2", None, None),
    ("SELECT event_type, count(*) * 2 AS n FROM demo.events GROUP BY event_type", None, None),
    ("SELECT event_type, count(page_url) AS n FROM demo.events GROUP BY event_type", None, None),  # no COUNT(*)
    ("SELECT event_type, count(*) AS n, sum(length(page_url)) AS s FROM demo.events GROUP BY event_type",
     None, None),
])
def test_which_aggregates_are_updated_by_subtraction(spark, shared, sql, erased_key, expected):
    settings = shared
    mapping = DerivedMapping.model_validate({"from": ["demo.events"], "sql": sql,
                                             "group_by": ["event_type", "day"] if "day" in sql else ["event_type"]})
    query = lineage.parse(spark, "x.y", mapping, {"demo.events"}, settings.catalog.name)
    found = lineage.subtraction(lineage.bound(spark, query, lambda t: spark.table(settings.table(t))),
                                mapping.group_by, erased_key)
    assert (found and (found.rows, found.columns)) == expected
