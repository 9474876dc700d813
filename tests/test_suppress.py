"""Suppression: rows of erased people are dropped from incoming data, everyone else's pass."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from helpers import HOSTILE, SEED, add_subjects
from lakehouse_dsr import suppress, synth
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run


@pytest.fixture(scope="module")
def erased(spark, tmp_path_factory):
    from helpers import make_settings
    from lakehouse_dsr.lake.spark import attach

    settings = make_settings(tmp_path_factory.mktemp("suppress"))
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=1)
    add_subjects(spark, settings, HOSTILE[:3], "hostile")
    emails = {r.user_id: r.email for r in spark.table(settings.table("demo.users")).collect()}
    gone = [synth.user_id(SEED, 0), HOSTILE[0], HOSTILE[2]]
    Ledger(settings).submit([RequestInput(s, "erase") for s in gone]
                                   + [RequestInput(synth.user_id(SEED, 1), "access")])
    assert {r.status for r in run(spark, settings).requests} == {"completed"}
    return settings, gone, emails


def test_late_rows_of_erased_subjects_are_dropped(spark, erased):
    settings, gone, emails = erased
    kept = [synth.user_id(SEED, 1), synth.user_id(SEED, 2), HOSTILE[1], "x"]  # access request: not suppressed
    late = spark.createDataFrame([(u, n) for n, u in enumerate(gone + kept + [None])], "user_id string, n int")
    result = suppress(late, "user_id", settings=settings)
    assert sorted(r.user_id or "" for r in result.collect()) == sorted(kept + [""])  # NULL keys pass
    assert result.columns == late.columns


def test_other_identifiers_and_column_names(spark, erased):
    settings, gone, emails = erased
    signups = spark.createDataFrame([(emails[gone[0]], 1), (emails[synth.user_id(SEED, 3)], 2)], "mail string, n int")
    assert [r.n for r in suppress(signups, "mail", "email", settings=settings).collect()] == [2]
    # A user id in an email column is not an email: nothing is suppressed by the wrong identifier.
    mixed = spark.createDataFrame([(gone[0],)], "mail string")
    assert suppress(mixed, "mail", "email", settings=settings).count() == 1


def test_numeric_keys_are_compared_as_text(spark, erased):
    settings, _, _ = erased
    Ledger(settings).submit([RequestInput("4711", "erase")])
    run(spark, settings)
    ids = spark.range(4700, 4720).select(F.col("id").alias("user_id"))
    assert 4711 not in {r.user_id for r in suppress(ids, "user_id", settings=settings).collect()}
    assert suppress(ids, "user_id", settings=settings).count() == 19


def test_bad_arguments_are_refused(spark, erased):
    settings, _, _ = erased
    df = spark.createDataFrame([("a",)], "user_id string")
    with pytest.raises(DataMapError, match="unknown identifier 'phone'"):
        suppress(df, "user_id", "phone", settings=settings)
    with pytest.raises(DataMapError, match="no column 'uid'"):
        suppress(df, "uid", settings=settings)
