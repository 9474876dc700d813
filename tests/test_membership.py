"""Key membership inside Spark's generated code (lake/membership.py, Membership.java): the same answer
as an IN list for string, bigint and int keys (NULL for a NULL key), in generated and interpreted
sessions; the requests naming a key as a join with the batch's keys finds them; no value in any
plan string; a row counter counts each request's rows once, as Python counts them; and the
rewrite, the collateral check, the plan and the export use them instead of a join wherever the
batch's values are held in the driver (array keys keep their join)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, IntegerType, LongType, StringType

from helpers import GENERATED, codegen, table_keys
from lakehouse_dsr.datamap import KeyGroup
from lakehouse_dsr.lake import frames, indriver
from lakehouse_dsr.lake.membership import (
    membership,
    positions,
    requesters,
    row_counter,
    row_counter_on,
    supported,
)
from lakehouse_dsr.stages import collateral, matching

SECRET = "ann@example.com"


def _values(spark, values: list):
    return spark._jvm.java.util.ArrayList(values)


@pytest.mark.parametrize(("sql_type", "key_type", "rows", "wanted"), [
    ("string", StringType(), [SECRET, "b", "c", None], [SECRET, "b", "z"]),
    ("bigint", LongType(), [3, 2**40, -7, 5, None], [3, 2**40, 9]),
    ("int", IntegerType(), [3, -7, 5, None], [3, -7, 9])])
def test_membership_answers_as_an_in_list_does(spark, mode, sql_type, key_type, rows, wanted):
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(rows)], f"i int, k {sql_type}")
    tested = frame.select(membership(spark, _values(spark, wanted), F.col("k"), key_type).alias("member"),
                          F.col("k").isin(wanted).alias("expected")).orderBy("i").collect()
    assert [r.member for r in tested] == [r.expected for r in tested]
    assert [r.member for r in tested] == [v in wanted if v is not None else None for v in rows]  # NULL for NULL


@pytest.mark.parametrize(("sql_type", "key_type", "values", "probes"), [
    ("string", StringType(),
     [f"user-{i:05d}" for i in range(0, 6000, 3)] + ["", "é漢字", "x" * 100, "12345678", "1234567"],
     [f"user-{i:05d}" for i in range(6000)] + ["", "é漢字", "x" * 100, "x" * 99, "12345678", "1234567", "123456789"]),
    ("bigint", LongType(), [*range(-3000, 3000, 7), 2**63 - 1, -2**63, 0, 2**40],
     [*range(-3100, 3100), 2**63 - 1, -2**63, 2**40, 2**40 + 1]),
    ("int", IntegerType(), [*range(-3000, 3000, 7), 2**31 - 1, -2**31], [*range(-3100, 3100), 2**31 - 1, -2**31])])
def test_membership_over_thousands_of_values_answers_as_a_set_does(spark, sql_type, key_type, values, probes):
    """Thousands of values fill the lookup table's slots enough for probes to step past occupied ones;
    strings of every length around the 8 bytes read at a time, and the extreme numbers."""
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(probes)], f"i int, k {sql_type}")
    tested = frame.select("i", membership(spark, _values(spark, values), F.col("k"), key_type).alias("member"))
    held = set(values)
    assert [r.member for r in tested.orderBy("i").collect()] == [v in held for v in probes]


def test_no_value_reaches_a_plan_string_and_the_test_is_generated_code(spark):
    frame = spark.createDataFrame([(SECRET,), ("b",)], "k string")
    tested = frame.where(membership(spark, _values(spark, [SECRET]), F.col("k"), StringType()))
    with codegen(spark, GENERATED):
        plans = {mode: spark._jvm.PythonSQLUtils.explainString(tested._jdf.queryExecution(), mode)
                 for mode in ("extended", "codegen", "formatted")}
        assert tested.count() == 1
    assert all(SECRET not in plan and "membership" in plan for plan in plans.values())
    assert "java.util.function.Predicate" in plans["codegen"]


def test_an_unsupported_key_type_is_refused_before_anything_runs(spark):
    assert supported(spark, StringType()) and supported(spark, LongType()) and not supported(spark, DateType())
    with pytest.raises(ValueError, match="no membership test for keys of type date"):
        membership(spark, _values(spark, []), F.col("k"), DateType())


def test_the_rewrite_and_the_check_test_membership_where_the_values_are_held(spark, mode):
    rows = spark.createDataFrame([("u1", "a@x", "n1"), ("u2", "b@x", "n2"), ("u3", None, "n3"), (None, "a@x", "n4")],
                                 "user_id string, email string, note string")
    groups = [KeyGroup("user_id", "user_id", redact=("note",)), KeyGroup("email", "email", redact=("email",))]
    keys = table_keys(spark, groups, [("r1", "user_id", "u1"), ("r2", "email", "a@x")])
    assert all(s.values is not None for s in keys.sets)  # held in the driver: membership applies

    marked = matching.mark(rows, keys, requests=False)
    plan = marked._jdf.queryExecution().executedPlan().toString()
    assert "membership" in plan and "Join" not in plan
    hits = {r.note: (r.dsr_ids_0, r.dsr_ids_1) for r in marked.collect()}
    assert hits == {"n1": (True, True), "n2": (None, None), "n3": (None, None), "n4": (None, True)}
    # the same rows as the mark that finds the requests leaves, deleted or redacted
    joined = matching.mark(rows, keys)
    assert "requesters" in joined._jdf.queryExecution().executedPlan().toString()
    assert sorted(map(tuple, collateral.erased_rows(rows, keys, "delete").collect()), key=str) == \
        [("u2", "b@x", "n2"), ("u3", None, "n3")]
    assert sorted(map(tuple, collateral.erased_rows(rows, keys, "redact").collect()), key=str) == \
        sorted([("u1", None, None), ("u2", "b@x", "n2"), ("u3", None, "n3"), (None, None, "n4")], key=str)
    assert sorted(map(tuple, joined.where(matching.any_hit(keys)).select("note").collect())) == [("n1",), ("n4",)]


@pytest.mark.parametrize("in_python", [False, True], ids=["joined", "by-position"])
def test_keys_not_held_in_the_driver_are_joined_or_tested_by_their_positions(spark, in_python):
    """A batch beyond the driver's lookups is joined, or, where the driver's Python holds it as Arrow
    (a million subjects), tested against its values' positions, one broadcast table for the run."""
    rows = spark.createDataFrame([("u1",), ("u2",), (None,)], "user_id string")
    groups = [KeyGroup("user_id", "user_id")]
    keys = table_keys(spark, groups, [("r1", "user_id", "u1")])
    held = pa.table({"key_value": ["u1"], "request_ids": [["r1"]]}) if in_python else None
    unheld = keys.replace(0, matching.KeySet(frames.arrow_frame(spark, held) if held else keys.sets[0].requesters,
                                             1, None, held=held))
    marked = matching.mark(rows, unheld, requests=False)
    plan = marked._jdf.queryExecution().executedPlan().toString()
    assert ("Join" in plan, "membership" in plan) == (not in_python, in_python)
    assert [r.user_id for r in marked.where(matching.any_hit(unheld)).collect()] == ["u1"]


def test_requested_rows_are_tested_before_their_requests_are_looked_up(spark):
    rows = spark.createDataFrame([("u1", ["a@x"]), ("u2", ["b@x"]), ("u3", ["a@x", "c@x"]), (None, None)],
                                 "user_id string, emails array<string>")
    scalar = table_keys(spark, [KeyGroup("user_id", "user_id")], [("r1", "user_id", "u1"), ("r2", "user_id", "u3")])
    found = matching.requested_rows(rows, scalar)
    plan = found._jdf.queryExecution().executedPlan().toString()
    # the membership filter sits below the lookup of the requests: only the requested rows are looked up
    assert "Join" not in plan and plan.index("requesters") < plan.index("membership")
    assert sorted((r.user_id, r.dsr_ids_0) for r in found.collect()) == [("u1", ["r1"]), ("u3", ["r2"])]
    # an array key has no membership test: the join alone, with the same rows as mark and any_hit
    arrays = table_keys(spark, [KeyGroup("emails[]", "email")], [("r3", "email", "a@x")])
    joined = matching.requested_rows(rows, arrays)
    assert "membership" not in joined._jdf.queryExecution().executedPlan().toString()
    assert sorted(r.user_id for r in joined.collect()) == ["u1", "u3"]
    assert sorted(r.user_id for r in matching.mark(rows, arrays).where(matching.any_hit(arrays)).collect()) == \
        ["u1", "u3"]


@pytest.mark.parametrize(("sql_type", "key_type", "rows", "requested"), [
    ("string", StringType(), [SECRET, "b", "c", None], [("r1", SECRET), ("r2", SECRET), ("r3", "b"), ("r4", "z")]),
    ("bigint", LongType(), [3, 2**40, -7, None], [("r1", 3), ("r2", 2**40), ("r0", 2**40), ("r3", 9)]),
    ("int", IntegerType(), [3, -7, 5, None], [("r2", 3), ("r1", 3), ("r3", -7)])])
def test_requesters_answer_as_a_join_with_the_batchs_keys_does(spark, mode, sql_type, key_type, rows, requested):
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(rows)], f"i int, k {sql_type}")
    keys = indriver.local_rows(spark, [(r, "id", v) for r, v in requested],
                               f"request_id string, key_type string, key_value {sql_type}")
    key_set = matching.key_set(keys, "id", key_type)
    assert key_set.values is not None  # held in the driver
    looked_up = frame.select("i", requesters(spark, key_set.values.lookup, F.col("k"), key_type).alias("ids"))
    plan = looked_up._jdf.queryExecution().executedPlan().toString()
    assert "requesters" in plan and "Join" not in plan and SECRET not in plan
    joined = frame.join(key_set.requesters, frame.k == key_set.requesters.key_value, "left")
    assert {r.i: r.ids for r in looked_up.collect()} == {r.i: r.request_ids for r in joined.collect()}
    expected = {v: sorted(r for r, w in requested if w == v) or None for v in rows}
    assert [r.ids for r in looked_up.orderBy("i").collect()] == [expected[v] if v is not None else None for v in rows]


def test_a_key_column_of_a_narrower_type_is_looked_up_at_the_keys_type(spark):
    frame = spark.createDataFrame([(3,), (4,)], "k int")
    keys = indriver.local_rows(spark, [("r1", "id", 3)], "request_id string, key_type string, key_value bigint")
    key_set = matching.key_set(keys, "id", LongType())
    found = frame.select(requesters(spark, key_set.values.lookup, F.col("k"), LongType()).alias("ids")).collect()
    assert [r.ids for r in found] == [["r1"], None]


@pytest.mark.parametrize("by", ["lookup", "position"])
@pytest.mark.parametrize(("sql_type", "key_type", "rows", "requested"), [
    ("string", StringType(), [SECRET, "b", "c", None, "b", SECRET, SECRET],
     [("r1", SECRET), ("r2", SECRET), ("r3", "b"), ("r4", "z"), ("r1", "c")]),
    ("bigint", LongType(), [3, 2**40, -7, None, 0, 3], [("r1", 3), ("r2", 2**40), ("r0", 2**40), ("r3", 9)])])
def test_a_row_counter_counts_each_requests_rows_once_as_the_rows_are_written(spark, mode, sql_type, key_type, rows,
                                                                              requested, by):
    """Over several tasks, each finished once: a row two requests name counts once in the total and for
    each of them, a request naming two values counts the rows of both; a NULL key or a value nobody
    asked for counts for no one; no value in the plan. `by`: the values held in the driver's JVM with
    their requests (a lookup), or the values only, counted by their position in the batch's Arrow rows
    (a batch too large for a lookup)."""
    frame = spark.createDataFrame([(v,) for v in rows * 50], f"k {sql_type}").repartition(4)
    keys = indriver.local_rows(spark, [(r, "id", v) for r, v in requested],
                               f"request_id string, key_type string, key_value {sql_type}")
    if by == "lookup":
        counter = row_counter(spark, matching.key_set(keys, "id", key_type).values.lookup, key_type)
    else:
        held = pa.Table.from_pylist([{"key_value": v, "request_ids": sorted(r for r, w in requested if w == v)}
                                     for v in dict.fromkeys(v for _, v in requested)])
        table = positions(spark, frames.arrow_frame(spark, held).select("key_value"), key_type)
        counter = row_counter_on(spark, table, held, key_type)
    counted = frame.where(counter.counting(F.col("k")))
    assert SECRET not in counted._jdf.queryExecution().executedPlan().toString()
    counted.write.format("noop").mode("overwrite").save()
    named = {v: [r for r, w in requested if w == v] for v in rows}
    per_request: dict[str, int] = {}
    for v in rows * 50:
        for r in named[v] if v is not None else []:
            per_request[r] = per_request.get(r, 0) + 1
    assert counter.counted() == (sum(1 for v in rows * 50 if v is not None and named[v]), per_request)
    assert counted.count() == len(rows) * 50  # it keeps every row (a second action counts again: not read)


def test_a_row_counter_counts_rows_spark_filters_in_the_driver(spark):
    """A filter over rows held in the driver is evaluated by Spark's optimizer there, outside any task:
    the counts still arrive, once."""
    rows = [("a",), ("b",), ("a",), (None,)]
    frame = indriver.local_rows(spark, rows, "k string")
    keys = indriver.local_rows(spark, [("r1", "id", "a")], "request_id string, key_type string, key_value string")
    key_set = matching.key_set(keys, "id", StringType())
    counter = row_counter(spark, key_set.values.lookup, StringType())
    assert len(frame.where(counter.counting(F.col("k"))).collect()) == 4
    assert counter.counted() == (2, {"r1": 2})
