"""Shared fixtures: one SparkSession for the whole suite; each lakehouse gets its own catalog + warehouse.
Helpers that tests import are in helpers.py."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from helpers import CODEGEN_MODES, SEED, codegen, conf_kept, delta_settings, make_disk_lakehouse, make_settings
from lakehouse_dsr import synth
from lakehouse_dsr.config import Settings
from lakehouse_dsr.lake.spark import INTERPRETED, attach, build_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory) -> SparkSession:
    # Tiny data: queries interpreted, as on a small lake's run (about a quarter less time in a Delta
    # test); the tests whose subject is code generation run in both modes (`mode`).
    session = build_session(make_settings(tmp_path_factory.mktemp("session")), quick_jit=True, interpreted=True)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _suite_codegen(request):
    """Each test that uses Spark leaves the suite's code generation as it found it: an in-process CLI
    command builds its session on the suite's (lake/spark.py's `build_session` sets the codegen confs
    by the lake's size), and tests that follow would run in that mode."""
    if "spark" not in request.fixturenames:  # tests without Spark start no JVM for this
        yield
        return
    with conf_kept(request.getfixturevalue("spark"), INTERPRETED):
        yield


@pytest.fixture(params=list(CODEGEN_MODES))
def mode(spark, request):
    """The session's code generation as a large run (Spark's default) or a small lake's run has it:
    the test runs once in each."""
    with codegen(spark, CODEGEN_MODES[request.param]):
        yield request.param


@pytest.fixture
def new_lakehouse(spark, tmp_path_factory):
    """Factory: a fresh catalog with the tiny demo tables (users, events, newsletter, orders);
    `delta`: these of them written and mapped as Delta tables (helpers.delta_settings)."""

    def make(users: int = 40, events: int = 600, delta: list[str] | None = None, **overrides) -> Settings:
        root = tmp_path_factory.mktemp("lh")
        settings = delta_settings(root, delta, **overrides) if delta else make_settings(root, **overrides)
        attach(spark, settings)
        synth.generate(spark, settings, users=users, events=events, seed=SEED, batches=2)
        return settings

    return make


@pytest.fixture
def disk_lakehouse(spark, tmp_path):
    """A tiny lakehouse that other processes (dsr run, writers) share: returns (settings, dsr.yaml path).

    Orphans are removed at once (a killed run leaves some; the tests say when another writer runs).
    """
    return make_disk_lakehouse(spark, tmp_path)
