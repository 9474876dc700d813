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
HOSTILE = ["x' OR '1'='1", "%", "' ; DROP TABLE demo.events; --", "Jos\u00e9 \u4e2d\u6587 \U0001f600", "k" * 10_000,
           "_", "a\\'b"]
NEAR_MISS = ["x", "%%", "Jos\u00e9", "k" * 9_999, "ab"]  # similar to hostile ids; must survive
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


def add_subjects(spark, settings, ids: list[str], tag: str) -> None:
    """Give each id a user (email <tag><i>@example.net), 3 events, an order and a newsletter row."""
    rows = [(sid, f"{tag}{i}@example.net") for i, sid in enumerate(ids)]
    people = spark.createDataFrame(rows, "user_id string, email string")
    people.selectExpr("user_id", "timestamp'2024-01-01' created_at", "'Hostile Name' name", "email") \
        .writeTo(settings.table("demo.users")).append()
    people.crossJoin(spark.range(3)).selectExpr(
        "uuid() event_id", "user_id", "'login' event_type", "timestamp'2024-05-01' event_timestamp",
        "cast(null as string) page_url", "cast(null as string) product_id", "'Logged in' event_details",
    ).writeTo(settings.table("demo.events")).append()
    people.selectExpr("uuid() order_id", "user_id", "cast(9.99 as decimal(10,2)) amount",
                      "'Hostile Name' customer_name",
                      "'1 Main Street' shipping_address", "timestamp'2024-06-01' ordered_at") \
        .writeTo(settings.table("demo.orders")).append()
    people.selectExpr("email", "timestamp'2024-02-01' subscribed_at", "'weekly' list_name", "'account' source") \
        .writeTo(settings.table("demo.newsletter")).append()
