"""Helpers the tests share: tiny lakehouses (settings, config files, extra subjects), snapshot ids,
ledger reads and `dsr run` in its own process. Fixtures live in conftest.py."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType

from lakehouse_dsr import synth
from lakehouse_dsr.config import Settings, settings_from_dict
from lakehouse_dsr.datamap import KeyGroup, demo_datamap
from lakehouse_dsr.lake import indriver
from lakehouse_dsr.lake.spark import INTERPRETED, attach
from lakehouse_dsr.stages import matching

SEED = 7
HOSTILE = ["x' OR '1'='1", "%", "' ; DROP TABLE demo.events; --", "Jos\u00e9 \u4e2d\u6587 \U0001f600", "k" * 10_000,
           "_", "a\\'b"]
NEAR_MISS = ["x", "%%", "Jos\u00e9", "k" * 9_999, "ab"]  # similar to hostile ids; must survive
_names = itertools.count()
USER_KEY = [KeyGroup("user_id", "user_id")]  # the demo tables' one key column
GENERATED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}
CODEGEN_MODES = {"generated": GENERATED, "interpreted": INTERPRETED}  # a large run's, a small lake's


@contextmanager
def conf_kept(spark: SparkSession, keys: Iterable[str]) -> Iterator[None]:
    """The session's values of `keys` (set or unset) back as they are now when the block ends."""
    before = {key: spark.conf.get(key, None) for key in keys}
    try:
        yield
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)


@contextmanager
def codegen(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """The session's code generation set to `conf` (GENERATED or INTERPRETED) meanwhile."""
    with conf_kept(spark, conf):
        for key, value in conf.items():
            spark.conf.set(key, value)
        yield


def event_log_conf(folder: Path) -> dict[str, str]:
    """Spark settings that write event logs to `folder` as plain text (Spark 4 compresses them)."""
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(folder), "spark.eventLog.compress": "false"}


def event_logs(folder: Path) -> list[str]:
    """The text of every Spark event log under `folder`: a file per application on Spark 3.5, a folder
    of rolled files on Spark 4."""
    return [p.read_text(errors="replace") for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith((".", "appstatus"))]  # not a rolled log's checksums and marker


def make_settings(root: Path, **overrides) -> Settings:
    raw = {
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}},
        "catalog": {"name": f"cat{next(_names)}", "properties": {"type": "hadoop", "warehouse": str(root / "wh")}},
        "secret_key_file": str(root / "dsr-secret.key"),
        # the demo's bronze tables only: the silver and gold layers cost every run; test_propagate adds them
        "datamap": datamap_dict(demo_datamap(derived=False)),  # no vault copy either
        **overrides,
    }
    return settings_from_dict(raw, base=root)


def write_config(settings: Settings, path: Path, **overrides) -> Path:
    """`settings` (with top-level `overrides`) as a dsr.yaml at `path`, for the CLI."""
    raw = settings.model_dump(mode="json", exclude_none=True)
    raw.update(overrides)
    path.write_text(yaml.safe_dump(raw))
    return path


def snapshot_ids(spark: SparkSession, settings: Settings, tables: list[str]) -> dict[str, list[int]]:
    """Every snapshot id (a Delta table's: every version delta-rs sees) of each table that exists:
    unchanged ids prove nothing was written."""
    out = {}
    delta = settings.delta_tables()
    for table in tables:
        if table in delta:
            out[table] = sorted(h["version"] for h in DeltaTable(delta[table]).history())
            continue
        try:
            spark.catalog.refreshTable(settings.table(table))  # the ledger is written by pyiceberg, not this session
            rows = spark.sql(f"SELECT snapshot_id FROM {settings.table(table)}.snapshots").collect()
            out[table] = sorted(r.snapshot_id for r in rows)
        except Exception:
            out[table] = None
    return out


def ledger_table(spark: SparkSession, settings: Settings, table: str):
    """A ledger table as committed now: the control plane writes it through pyiceberg, so Spark's
    cached copy is refreshed first."""
    spark.catalog.refreshTable(settings.table(table))
    return spark.table(settings.table(table))


def add_subjects(spark, settings, ids: list[str], tag: str) -> None:
    """Give each id a user (email <tag><i>@example.net), 3 events, an order and a newsletter row."""
    rows = [(sid, f"{tag}{i}@example.net") for i, sid in enumerate(ids)]
    people = spark.createDataFrame(rows, "user_id string, email string")
    delta = settings.delta_tables()

    def append(df, table: str) -> None:
        if table in delta:
            df.write.format("delta").mode("append").save(delta[table])
        else:
            df.writeTo(settings.table(table)).append()
    append(people.selectExpr("user_id", "timestamp'2024-01-01' created_at", "'Hostile Name' name", "email"),
           "demo.users")
    append(people.crossJoin(spark.range(3)).selectExpr(
        "uuid() event_id", "user_id", "'login' event_type", "timestamp'2024-05-01' event_timestamp",
        "cast(null as string) page_url", "cast(null as string) product_id", "'Logged in' event_details"),
        "demo.events")
    append(people.selectExpr("uuid() order_id", "user_id", "cast(9.99 as decimal(10,2)) amount",
                             "'Hostile Name' customer_name", "'1 Main Street' shipping_address",
                             "timestamp'2024-06-01' ordered_at"), "demo.orders")
    append(people.selectExpr("email", "timestamp'2024-02-01' subscribed_at", "'weekly' list_name", "'account' source"),
           "demo.newsletter")


# The demo tables each layout keeps in Delta (the rest stay Iceberg tables of the catalog).
DELTA_LAYOUTS = {"iceberg": [], "delta": ["demo.users", "demo.events", "demo.newsletter", "demo.orders"],
                 "mixed": ["demo.events", "demo.newsletter"]}


def delta_settings(root: Path, delta_tables: list[str], **overrides) -> Settings:
    """`make_settings` whose data map keeps `delta_tables` in Delta (`format: delta`, under root/delta),
    without retention rules (not on Delta yet), orphans removed at once (`purge` overrides merge in)."""
    raw = datamap_dict(demo_datamap(derived=False))
    for name, mapping in raw["tables"].items():
        mapping.pop("expire", None)
        if name in delta_tables:
            mapping["format"] = "delta"
    purge = {"orphan_min_age_minutes": 0, **overrides.pop("purge", {})}
    return make_settings(root, datamap=raw, delta={"warehouse": str(root / "delta")}, purge=purge, **overrides)


def datamap_dict(datamap) -> dict:
    return datamap.model_dump(mode="json", by_alias=True, exclude_none=True)


def make_disk_lakehouse(spark, tmp_path: Path, derived: bool = False) -> tuple[Settings, Path]:
    """`disk_lakehouse`; `derived`: with the demo's silver and gold layers in the data map and the lake."""
    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0},
                             **({"datamap": datamap_dict(demo_datamap(vault=False))} if derived else {}))
    # other processes commit: never serve a cached table state
    props = {**settings.catalog.properties, "cache-enabled": "false"}
    settings = settings.replace(catalog={"properties": props})
    attach(spark, settings)
    synth.generate(spark, settings, users=40, events=600, seed=SEED, batches=2)
    config = {
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}},
        "catalog": {"name": settings.catalog.name, "properties": dict(props)},
        "secret_key_file": str(settings.key_file()),
        "purge": {"orphan_min_age_minutes": 0},
        "export": {"directory": str(settings.export.directory)},
        "datamap": datamap_dict(settings.datamap),
    }
    path = tmp_path / "dsr.yaml"
    path.write_text(yaml.safe_dump(config))
    return settings, path


def dsr_run(config: Path, fail_at: str | None = None, kill_after: float | None = None) -> int:
    """`dsr run` in its own process; killed with SIGKILL after `kill_after` seconds if still running."""
    env = {k: v for k, v in os.environ.items() if k != "DSR_FAIL_AT"}
    if fail_at:
        env["DSR_FAIL_AT"] = fail_at
    dsr = str(Path(sys.executable).parent / "dsr")
    proc = subprocess.Popen([dsr, "-c", str(config), "run"], env=env, cwd=config.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"dsr run exited {proc.returncode}:\n{out.decode(errors='replace')[-3000:]}")
    return proc.returncode


def dsr_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The `dsr` console script run in this process (no new JVM): (exit code, stdout + stderr)."""
    import pytest

    from lakehouse_dsr.cli import entry

    monkeypatch.setattr(sys, "argv", ["dsr", *args])
    with pytest.raises(SystemExit) as done:
        entry()
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out + out.err


def subscribed(settings, spark) -> tuple[list[str], list[str]]:
    """Three users, the first two with a newsletter row, and their emails."""
    users = {r.user_id: r.email for r in spark.table(settings.table("demo.users")).collect()}
    listed = {r.email for r in spark.table(settings.table("demo.newsletter")).collect()}
    subscribed = [u for u in sorted(users) if users[u] in listed][:2]
    ids = subscribed + [next(u for u in sorted(users) if users[u] not in listed)]
    return ids, [users[u] for u in ids]


def rows_of(df) -> Counter:
    """A tiny DataFrame's rows as a multiset, in one job: two of them are equal row for row (duplicates
    counted) when their multisets are, which costs two small collects where exceptAll both ways and
    counts cost four shuffling jobs."""
    return Counter(tuple(row) for row in df.collect())


def delta_rows(path: str, version: int | None = None) -> pa.Table:
    """Every row delta-rs reads at a version (deletion vectors applied), independently of Spark; its
    string and binary views as plain strings and binaries (which every pyarrow kernel takes)."""
    rows = pa.table(QueryBuilder().register("t", DeltaTable(path, version=version)).execute("select * from t"))
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return rows.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in rows.schema]))


def live_rows(settings: Settings, table: str) -> pa.Table:
    """A mapped table's live rows read without Spark: delta-rs for a Delta table by path, pyiceberg
    for an Iceberg table of the catalog."""
    located = settings.delta_tables().get(table)
    if located is not None:
        return delta_rows(located)
    from lakehouse_dsr.lake.catalog import open_catalog

    return open_catalog(settings).load_table(table).scan().to_arrow()


def values_of(table: pa.Table) -> set[str]:
    """Every non-null value of every column, as text."""
    return {str(v) for column in table.columns for v in column.to_pylist() if v is not None}


def delta_traces(path: str, erased: set[str], needles: list[bytes]) -> list[str]:
    """Where a Delta table still holds one of `erased` (values) or `needles` (bytes), read without
    Spark: live rows and every version delta-rs can still load, every Parquet file on storage, every
    byte of `_delta_log`, any change-data-feed file. Empty: nowhere."""
    found = [f"live rows: {sorted(values_of(delta_rows(path)) & erased)}"] if values_of(delta_rows(path)) & erased \
        else []
    for version in [entry["version"] for entry in DeltaTable(path).history()]:
        try:
            rows = delta_rows(path, version)
        except Exception:  # its log is gone: unreachable
            continue
        found += [f"version {version}"] if values_of(rows) & erased else []
    files = [f for f in Path(path).rglob("*") if f.is_file() and not f.name.startswith(".")]
    found += [f"data file {f.name}" for f in files if f.suffix == ".parquet" and "_delta_log" not in f.parts
              and values_of(pq.read_table(f)) & erased]
    found += [f"log file {f.name}" for f in files if "_delta_log" in f.parts
              and any(n in f.read_bytes() for n in needles)]
    return found + [f"change data {f.name}" for f in files if "_change_data" in f.parts]


def table_keys(spark: SparkSession, groups: list[KeyGroup], requested: list[tuple[str, str, str]]
               ) -> matching.TableKeys:
    """A batch's matching.TableKeys for string key `groups`, from (request id, identifier, value) rows
    held in the driver (as a run holds a small batch's)."""
    keys = indriver.local_rows(spark, requested, "request_id string, key_type string, key_value string")
    sets = {g.identifier: matching.key_set(keys, g.identifier, StringType()) for g in groups}
    return matching.TableKeys(tuple(groups), tuple(sets[g.identifier] for g in groups))
