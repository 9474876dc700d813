"""The full cycle on each shared-catalog set-up, configured only through the examples/ files and the
environment: generate, submit erase + access requests, run, verify; then an independent reader
(pyiceberg through the same catalog, pyarrow over the storage, DuckDB on the metadata) checks that
the erased subjects are gone from live data, every remaining snapshot and every file in storage."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
from pyarrow import fs
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog

import lakehouse_dsr
from lakehouse_dsr.lake.jars import resolve

from .conftest import STAGES, TIMES
from .reader import HadoopTables, Reader, duckdb_count
from .servers import Postgres, SeaweedFS, postgres, seaweedfs, spark_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent
SEED, USERS, EVENTS = 7, 40, 600
DATA_TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders"]


def _command(args: list[str], env: dict[str, str], cwd: Path, outputs: list[str]) -> None:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    outputs.append(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{' '.join(args[:3])} ... exited {proc.returncode}:\n{outputs[-1][-4000:]}"


def full_cycle(name: str, workdir: Path, example: str, env: dict[str, str], reader: Reader,
               run: list[str] | None = None) -> dict:
    """Run the cycle with `examples/<example>` copied unchanged; return the run report.

    `run` replaces `dsr run` (spark-submit); times per step go to the session summary.
    """
    shutil.copy(EXAMPLES / example, workdir / "dsr.yaml")
    env = {**os.environ, **env, "DSR_ORPHAN_MIN_AGE_MINUTES": "0",  # nothing else writes: purge orphans now
           "DSR_SECRET_KEY_FILE": str(workdir / "dsr-secret.key"), "DSR_EXPORT_DIR": str(workdir / "exports")}
    env.pop("DSR_SECRET_KEY", None)
    dsr = [str(BIN / "dsr"), "-c", "dsr.yaml"]
    outputs: list[str] = []
    times: dict[str, float] = {}

    def step(label: str, args: list[str]) -> None:
        start = time.monotonic()
        _command(args, env, workdir, outputs)
        times[label] = time.monotonic() - start

    step("generate", [*dsr, "generate", "--users", str(USERS), "--events", str(EVENTS), "--seed", str(SEED),
                      "--batches", "2"])
    # Erase two newsletter subscribers (found by email in a table without user_id) and one other user.
    users = dict(zip(*reader.table("demo.users").select(["user_id", "email"]).to_pydict().values(), strict=True))
    subscribed = set(reader.table("demo.newsletter").column("email").to_pylist())
    ids = sorted(users)
    erased = [u for u in ids if users[u] in subscribed][:2] + [u for u in ids if users[u] not in subscribed][:1]
    accessed = [u for u in ids if u not in erased][:2]
    emails = {users[u] for u in erased}
    needles = set(erased) | emails
    before = {t: reader.count(t) for t in DATA_TABLES}
    erased_events = reader.count("demo.events", "user_id", set(erased))
    accessed_events = {s: reader.count("demo.events", "user_id", {s}) for s in accessed}
    assert erased_events > 0 and reader.count("demo.newsletter", "email", emails) == 2
    # Positive controls: the history and storage scans below find the erased values before the run.
    assert reader.found_in_history("demo.events", needles) and reader.found_in_storage("demo.newsletter", needles)
    (workdir / "requests.csv").write_text(
        "subject_id,type\n" + "".join(f"{s},erase\n" for s in erased) + "".join(f"{s},access\n" for s in accessed))

    step("submit", [*dsr, "submit", "--file", "requests.csv"])
    assert reader.found_in_storage("dsr.requests", needles)  # the ledger holds plaintext until completion
    step("run", (run or [*dsr, "run"]) + ["--report", str(workdir / "report.json")])
    step("verify", [*dsr, "verify"])
    times["total"] = sum(times.values())
    TIMES[name] = times

    report = json.loads((workdir / "report.json").read_text())
    STAGES[name] = report["seconds"]
    assert report["summary"]["completed"] == len(erased) + len(accessed), report["requests"]
    assert f"{len(erased)} of {len(erased)} completed request(s) verified erased" in outputs[-1]

    # Independent reader, through the same catalog: live data.
    assert reader.count("demo.users", "user_id", set(erased)) == 0
    assert reader.count("demo.events", "user_id", set(erased)) == 0
    assert reader.count("demo.newsletter", "email", emails) == 0
    assert reader.count("demo.orders", "user_id", set(erased)) == 0
    assert reader.count("demo.events") == before["demo.events"] - erased_events
    assert reader.count("demo.orders") == before["demo.orders"]  # redacted, kept
    for subject, n in accessed_events.items():
        assert reader.count("demo.events", "user_id", {subject}) == n  # access requests change nothing
    # History and storage: no remaining snapshot and no file (referenced or orphaned) holds an erased value,
    # in the data tables or the ledger's own tables.
    ledger_tables = [f"dsr.{t[-1]}" for t in reader.catalog.list_tables("dsr")]
    for table in DATA_TABLES:
        assert reader.found_in_history(table, needles) == [], table
    for table in DATA_TABLES + ledger_tables:
        assert reader.found_in_storage(table, needles) == [], table
        assert reader.parquet_files(table) or table.startswith("dsr."), table  # the listing itself works
    # A third reader: DuckDB on the current metadata file agrees.
    events = reader.catalog.load_table("demo.events")
    if events.metadata_location.startswith("file:"):
        assert duckdb_count(events.metadata_location, "user_id", set(erased)) == (reader.count("demo.events"), 0)

    # One package per access request, with the subject's rows as the reader counts them.
    manifests = list((workdir / "exports").glob("run-*/manifest.json"))
    assert len(manifests) == 1
    packages = [json.loads((manifests[0].parent / r["file"]).read_text())
                for r in json.loads(manifests[0].read_text())["requests"]]
    assert {p["subject"]["user_id"][0]: len(p["tables"]["demo.events"]) for p in packages} == accessed_events
    # Nothing the commands printed (progress, reports, Spark's own logs) names an erased subject.
    assert not any(needle in out for out in outputs for needle in needles)
    return report


@pytest.fixture(scope="module")
def jars_dir() -> str:
    return str(resolve(s3a=True)[0].parent)


def _rest_env(server: SeaweedFS, jars: str) -> dict[str, str]:
    return {"DSR_JARS": jars, "DSR_REST_URI": server.catalog_uri, "DSR_S3_ENDPOINT": server.s3_endpoint,
            "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}


def _rest_reader(server: SeaweedFS) -> Reader:
    catalog = RestCatalog(
        "independent", uri=server.catalog_uri, warehouse=server.bucket,
        credential=f"{server.access_key}:{server.secret_key}",
        **{"oauth2-server-uri": f"{server.catalog_uri}/v1/oauth/tokens", "s3.endpoint": server.s3_endpoint,
           "s3.access-key-id": server.access_key, "s3.secret-access-key": server.secret_key,
           "s3.region": "us-east-1"},
    )
    storage = fs.S3FileSystem(access_key=server.access_key, secret_key=server.secret_key,
                              endpoint_override=server.s3_endpoint, scheme="http", region="us-east-1")
    return Reader(catalog, storage)


def _pg_env(server: Postgres, workdir: Path) -> dict[str, str]:
    return {"DSR_PG_URI": server.jdbc_uri, "DSR_PG_USER": server.user, "DSR_PG_PASSWORD": server.password,
            "DSR_WAREHOUSE": str(workdir / "warehouse")}


def _pg_reader(server: Postgres) -> Reader:
    # The catalog name is part of every row of Iceberg's JDBC tables: read as "lakehouse", like dsr.yaml.
    return Reader(SqlCatalog("lakehouse", uri=server.sqlalchemy_uri), fs.LocalFileSystem())


def assert_stopped(*ports: int) -> None:
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_rest_catalog_on_s3(tmp_path, jars_dir):
    with seaweedfs(tmp_path) as server:
        full_cycle("rest + s3, local[2]", tmp_path, "rest-s3.yaml",
                   {**_rest_env(server, jars_dir), "DSR_SPARK_MASTER": "local[2]"}, _rest_reader(server))
    assert_stopped(server.s3_port, server.iceberg_port)


def test_jdbc_catalog_on_postgres(tmp_path):
    with postgres() as server:
        full_cycle("jdbc postgres, local[2]", tmp_path, "jdbc-postgres.yaml",
                   {**_pg_env(server, tmp_path), "DSR_SPARK_MASTER": "local[2]"}, _pg_reader(server))
    assert_stopped(server.port)


def test_jdbc_catalog_on_sqlite(tmp_path):
    db = tmp_path / "catalog.db"
    reader = Reader(SqlCatalog("lakehouse", uri=f"sqlite:///{db}"), fs.LocalFileSystem())
    full_cycle("jdbc sqlite, local[2]", tmp_path, "jdbc-sqlite.yaml",
               {"DSR_SQLITE_FILE": str(db), "DSR_WAREHOUSE": str(tmp_path / "warehouse"),
                "DSR_SPARK_MASTER": "local[2]"}, reader)


def test_embedded_lakehouse_for_comparison(tmp_path):
    """The default (hadoop catalog, local warehouse) through the same cycle: the baseline for the timings."""
    reader = Reader(HadoopTables(tmp_path / "lakehouse"), fs.LocalFileSystem())
    full_cycle("embedded (hadoop), local[2]", tmp_path, "dsr.yaml", {"DSR_SPARK_MASTER": "local[2]"}, reader)


def _python_without_lakehouse_dsr(root: Path) -> Path:
    """An interpreter with our dependencies but not our package: executors get the code only from the driver."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "pyarrow").is_dir())
    (site / "deps.pth").write_text(deps + "\n")  # .pth files inside `deps` (our editable install) are not read
    python = root / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import pyarrow, pydantic, yaml, lakehouse_dsr"], capture_output=True)
    assert b"No module named 'lakehouse_dsr'" in probe.stderr
    return python


def _apps_registered(cluster_log: Path) -> int:
    return cluster_log.read_text(errors="replace").count("Registering app ")


def test_standalone_cluster_on_rest_s3(tmp_path, jars_dir):
    (tmp_path / "cluster").mkdir()
    executor_python = _python_without_lakehouse_dsr(tmp_path / "executor-venv")
    with seaweedfs(tmp_path) as server, spark_cluster(tmp_path / "cluster", workers=2) as cluster:
        env = {**_rest_env(server, jars_dir), "DSR_SPARK_MASTER": cluster.master_url,
               "PYSPARK_PYTHON": str(executor_python)}
        full_cycle("rest + s3, standalone cluster", tmp_path, "rest-s3.yaml", env, _rest_reader(server))
        # generate, run, verify: each an application on the cluster, with executors on both workers; submit
        # writes the ledger through pyiceberg and starts no Spark.
        assert _apps_registered(tmp_path / "cluster" / "master.log") == 3
        for worker in ("worker0.log", "worker1.log"):
            assert "Asked to launch executor" in (tmp_path / "cluster" / worker).read_text(errors="replace")
    assert_stopped(server.s3_port, server.iceberg_port, cluster.port)


def test_spark_submit_on_cluster_with_postgres(tmp_path):
    """The way a scheduler runs it: spark-submit of the library's entry point; the launcher's master wins."""
    (tmp_path / "cluster").mkdir()
    with postgres() as server, spark_cluster(tmp_path / "cluster", workers=2) as cluster:
        # No DSR_SPARK_MASTER: dsr.yaml says local[*]. spark-submit starts the driver with PYSPARK_PYTHON.
        env = {**_pg_env(server, tmp_path), "PYSPARK_PYTHON": sys.executable}
        jars = subprocess.run([str(BIN / "dsr"), "-c", str(EXAMPLES / "jdbc-postgres.yaml"), "jars"],
                              env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.strip()
        submit = str(Path(pyspark.__file__).parent / "bin" / "spark-submit")
        entry = str(Path(lakehouse_dsr.__file__).parent / "__main__.py")
        run = [submit, "--master", cluster.master_url, "--jars", jars, entry, "-c", "dsr.yaml", "run"]
        full_cycle("jdbc postgres, spark-submit", tmp_path, "jdbc-postgres.yaml", env, _pg_reader(server), run=run)
        assert _apps_registered(tmp_path / "cluster" / "master.log") == 1  # only the spark-submit step
    assert_stopped(server.port, cluster.port)
