"""Streaming ingest: a person erased while a query runs never lands again; restarts neither lose nor duplicate.

Real streaming queries (file source, Iceberg sink, checkpoints); the target is read back with pyiceberg.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from helpers import write_config
from lakehouse_dsr import erased, suppress_stream
from lakehouse_dsr.exceptions import DataMapError, DsrError
from lakehouse_dsr.ingest.stream import ingest, suppressed_counts
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

GONE, STAYS = "stream-subject-gone", "stream-subject-stays"


def drop_file(folder: Path, name: str, people: dict[str, int]) -> None:
    """A JSON-lines file of login events: `n` for each person."""
    lines = [json.dumps({"event_id": f"{name}-{p}-{i}", "user_id": p, "event_type": "login",
                         "event_timestamp": "2024-06-01T10:00:00Z", "event_details": "Logged in"})
             for p, n in people.items() for i in range(n)]
    (folder / f"{name}.json").write_text("\n".join(lines) + "\n")


def landed(settings) -> dict[str, int]:
    """Rows per streamed person in demo.events, read by pyiceberg (not the Spark session that wrote)."""
    table = open_catalog(settings).load_table(("demo", "events")).scan(selected_fields=("user_id",)).to_arrow()
    return {p: pc.sum(pc.equal(table["user_id"], p)).as_py() or 0 for p in (GONE, STAYS)}


def erase(spark, settings, subject: str) -> None:
    Ledger(settings).submit([RequestInput(subject, "erase")])
    assert {r.status for r in run(spark, settings).requests} == {"completed"}


def test_a_running_query_drops_a_person_erased_meanwhile(spark, new_lakehouse, tmp_path):
    settings = new_lakehouse()
    source = tmp_path / "landing"
    source.mkdir()
    schema = spark.table(settings.table("demo.events")).schema
    stream = spark.readStream.schema(schema).json(str(source))
    query = (suppress_stream(stream, settings, "user_id").writeStream.format("iceberg")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="500 milliseconds")
             .toTable(settings.table("demo.events")))
    try:
        drop_file(source, "a", {GONE: 3, STAYS: 2})
        query.processAllAvailable()
        assert landed(settings) == {GONE: 3, STAYS: 2}  # not erased yet

        erase(spark, settings, GONE)  # while the query runs: no restart
        assert landed(settings) == {GONE: 0, STAYS: 2}
        drop_file(source, "b", {GONE: 4, STAYS: 1})
        query.processAllAvailable()
        assert landed(settings) == {GONE: 0, STAYS: 3}
        counts = [suppressed_counts(p) for p in query.recentProgress if p["numInputRows"]]
        assert counts[-1] == (5, 1)  # 5 rows in, 1 kept: 4 of the erased person dropped
        assert GONE not in json.dumps(query.recentProgress, default=str)  # counts only
    finally:
        query.stop()


def test_a_restart_resumes_from_the_checkpoint_exactly_once(spark, new_lakehouse, tmp_path):
    settings = new_lakehouse()
    source, checkpoint = tmp_path / "landing", str(tmp_path / "ckpt")
    source.mkdir()
    drop_file(source, "a", {GONE: 2, STAYS: 2})
    first = ingest(spark, settings, str(source), "json", "demo.events", checkpoint, once=True)
    assert (first.rows_in, first.rows_suppressed, first.rows_written) == (4, 0, 4)
    erase(spark, settings, GONE)

    drop_file(source, "b", {GONE: 3, STAYS: 5})
    second = ingest(spark, settings, str(source), "json", "demo.events", checkpoint, once=True)  # a new query
    assert (second.rows_in, second.rows_suppressed, second.rows_written) == (8, 3, 5)
    assert landed(settings) == {GONE: 0, STAYS: 7}  # the restart read only the new file: nothing lost or twice
    again = ingest(spark, settings, str(source), "json", "demo.events", checkpoint, once=True)
    assert again.rows_in == 0 and landed(settings) == {GONE: 0, STAYS: 7}


@pytest.mark.slow
def test_dsr_ingest_command(spark, new_lakehouse, tmp_path):
    settings = new_lakehouse()
    source = tmp_path / "landing"
    source.mkdir()
    erase(spark, settings, GONE)
    drop_file(source, "a", {GONE: 3, STAYS: 5})
    config = write_config(settings, tmp_path / "dsr.yaml")
    dsr = str(Path(sys.executable).parent / "dsr")
    command = [dsr, "-c", str(config), "ingest", "--source", str(source), "--table", "demo.events",
               "--checkpoint", str(tmp_path / "ckpt"), "--once"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 batch(es): 8 rows read, 3 dropped (erased subjects), 5 appended to demo.events" in out.stdout
    assert GONE not in out.stdout + out.stderr
    assert landed(settings) == {GONE: 0, STAYS: 5}
    missing = subprocess.run([*command[:5], str(tmp_path / "nowhere"), *command[6:]], capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_bad_ingest_input_is_a_clear_error(spark, new_lakehouse, tmp_path):
    settings = new_lakehouse()
    with pytest.raises(DsrError, match="source folder .*nowhere does not exist"):
        ingest(spark, settings, str(tmp_path / "nowhere"), "json", "demo.events", str(tmp_path / "c"), once=True)
    (tmp_path / "in").mkdir()
    with pytest.raises(DsrError, match="unknown format 'xml'"):
        ingest(spark, settings, str(tmp_path / "in"), "xml", "demo.events", str(tmp_path / "c"), once=True)
    stream = spark.readStream.schema("event_id string, who string").json(str(tmp_path / "in"))
    with pytest.raises(DataMapError, match="the stream has no key column 'user_id'.*has no column 'user_id'"):
        suppress_stream(stream, settings, "user_id")
    with pytest.raises(DataMapError, match="unknown identifier 'phone'"):
        suppress_stream(stream, settings, "who", "phone")
    assert not (tmp_path / "c").exists()  # nothing started


def test_erased_flags_rows_of_erased_people(spark, new_lakehouse):
    settings = new_lakehouse()
    events = spark.table(settings.table("demo.events"))
    subject = events.select("user_id").orderBy("user_id").first().user_id
    erase(spark, settings, subject)
    incoming = spark.createDataFrame([(subject, 1), ("someone-else", 2), (None, 3)], "user_id string, n int")
    flagged = incoming.withColumn("gone", erased(incoming, settings, "user_id"))
    assert {r.n: r.gone for r in flagged.collect()} == {1: True, 2: False, 3: False}
    assert incoming.where(~erased(incoming, settings, "user_id")).count() == 2
    assert subject not in flagged._jdf.queryExecution().toString()  # never as a literal in the plan
    with pytest.raises(DataMapError, match="no column 'mail'"):
        erased(incoming, settings, "mail")
