"""A Spark Connect session is recognised at once: every data-plane entry refuses it (SparkConnectError,
exit code 2) before anything changes, while the control plane works without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_config
from lakehouse_dsr import Ledger, RequestInput
from lakehouse_dsr.lake.catalog import open_catalog

# A session of a real Connect client, in a process of its own (this one already runs a classic
# SparkContext, which a local Connect server would reuse). PySpark 4 ships the Connect server and
# starts it for `local[1]`; PySpark 3.5 does not ship it, so there the client is made for a port where
# nothing listens (its builder would wait for the server): the refusal must come before the client
# first calls its server.
_CONNECTED = """
import json, sys
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSession
from lakehouse_dsr import Lake, attach, load_settings, run
from lakehouse_dsr.exceptions import DsrError

if pyspark.__version__.startswith("4."):
    spark = SparkSession.builder.remote("local[1]").getOrCreate()
else:
    spark = ConnectSession(connection="sc://127.0.0.1:9")
settings = load_settings(sys.argv[1])
answers = {"session": type(spark).__module__}
for name, call in {"run": lambda: run(spark, settings), "attach": lambda: attach(spark, settings),
                   "Lake.of": lambda: Lake.of(spark, settings)}.items():
    try:
        call()
        answers[name] = None
    except DsrError as exc:
        answers[name] = [type(exc).__name__, str(exc)]
print(json.dumps(answers))
"""


def _state(settings) -> tuple:
    """The ledger's requests and every demo table's rows, read without Spark."""
    catalog = open_catalog(settings)
    tables = {t: catalog.load_table(t).scan().to_arrow().num_rows for t in ("demo.users", "demo.events")}
    return sorted(Ledger(settings).requests(), key=lambda r: r["request_id"]), tables


@pytest.fixture
def lake(new_lakehouse, tmp_path):
    settings = new_lakehouse(users=5, events=20)
    Ledger(settings).submit([RequestInput("u-does-not-matter", "erase")])
    return settings, write_config(settings, tmp_path / "dsr.yaml"), _state(settings)


def test_a_connect_session_is_refused_by_every_data_plane_entry_before_anything_changes(lake):
    settings, config, before = lake
    done = subprocess.run([sys.executable, "-c", _CONNECTED, str(config)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["session"].startswith("pyspark.sql.connect")
    for entry in ("run", "attach", "Lake.of"):
        kind, message = answers[entry]
        assert kind == "SparkConnectError" and "Spark Connect" in message and "classic session" in message, entry
    assert _state(settings) == before


def test_the_command_line_refuses_spark_connect_with_exit_2_and_keeps_the_control_plane(lake):
    settings, config, before = lake
    env = {**os.environ, "SPARK_REMOTE": "sc://127.0.0.1:9"}
    dsr = [str(Path(sys.executable).parent / "dsr"), "-c", str(config)]
    refused = subprocess.run([*dsr, "run"], capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Spark Connect" in refused.stdout + refused.stderr
    assert _state(settings) == before
    status = subprocess.run([*dsr, "status"], capture_output=True, text=True, env=env, timeout=300)
    assert status.returncode == 0 and before[0][0]["request_id"] in status.stdout
