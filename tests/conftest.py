"""Shared fixtures: one SparkSession for the whole suite; each lakehouse gets its own catalog + warehouse."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakehouse_dsr import synth
from lakehouse_dsr.config import Settings, settings_from_dict
from lakehouse_dsr.spark import attach, build_session

SEED = 7
_names = itertools.count()


def make_settings(root: Path, **overrides) -> Settings:
    raw = {
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}},
        "catalog": {"name": f"cat{next(_names)}", "properties": {"type": "hadoop", "warehouse": str(root / "wh")}},
        "secret_key_file": str(root / "dsr-secret.key"),
        **overrides,
    }
    return settings_from_dict(raw, base=root)


@pytest.fixture(scope="session")
def spark(tmp_path_factory) -> SparkSession:
    session = build_session(make_settings(tmp_path_factory.mktemp("session")))
    yield session
    session.stop()


@pytest.fixture
def new_lakehouse(spark, tmp_path_factory):
    """Factory: a fresh catalog with the tiny demo tables (users, events, newsletter, orders)."""

    def make(users: int = 40, events: int = 600, **overrides) -> Settings:
        settings = make_settings(tmp_path_factory.mktemp("lh"), **overrides)
        attach(spark, settings)
        synth.generate(spark, settings, users=users, events=events, seed=SEED, batches=2)
        return settings

    return make


def snapshot_ids(spark: SparkSession, settings: Settings, tables: list[str]) -> dict[str, list[int]]:
    """Every snapshot id of each table that exists: unchanged ids prove nothing was written."""
    out = {}
    for table in tables:
        try:
            rows = spark.sql(f"SELECT snapshot_id FROM {settings.table(table)}.snapshots").collect()
            out[table] = sorted(r.snapshot_id for r in rows)
        except Exception:
            out[table] = None
    return out
