"""`dsr ingest --source kafka://HOST:PORT/TOPIC`: a topic streamed into an Iceberg or a Delta table,
exactly once through the query's checkpoint (a kill -9 mid-stream included), never admitting a person
who asked to be erased. A real broker (lake/broker.py); the table read back by pyiceberg / delta-rs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import live_rows, write_config
from lakehouse_dsr.exceptions import DsrError
from lakehouse_dsr.ingest.stream import ingest
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

from .kafka_tools import create_topic, produce

GONE, LATE, STAYS = "kafka-subject-gone", "kafka-subject-late", "kafka-subject-stays"


def events(tag: str, people: dict[str, int]) -> list[tuple[str | None, dict]]:
    return [(person, {"event_id": f"{tag}-{person}-{i}", "user_id": person, "event_type": "login",
                      "event_timestamp": "2024-06-01T10:00:00Z", "event_details": "Logged in"})
            for person, n in people.items() for i in range(n)]


def landed(settings) -> Counter:
    """event_id -> how many rows hold it, for the streamed people, read without Spark."""
    rows = live_rows(settings, "demo.events").select(["event_id", "user_id"]).to_pylist()
    return Counter(r["event_id"] for r in rows if r["user_id"] in (GONE, LATE, STAYS))


def mid_batch(checkpoint: Path) -> bool:
    """Whether the query's checkpoint has planned a micro-batch (its offsets written) that it has not
    committed, after committing at least one: a kill now lands inside that batch."""
    batches = lambda log: {int(p.name) for p in (checkpoint / log).glob("[0-9]*")}  # noqa: E731
    planned, committed = batches("offsets"), batches("commits")
    return bool(committed) and bool(planned - committed)


def erase(spark, settings, subject: str) -> None:
    Ledger(settings).submit([RequestInput(subject, "erase")])
    assert {r.status for r in run(spark, settings).requests} == {"completed"}


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_topic_is_ingested_without_erased_people(spark, new_lakehouse, kafka_broker, tmp_path, fmt):
    settings = new_lakehouse(delta=["demo.events"] if fmt == "delta" else None)
    bootstrap, checkpoint = kafka_broker.bootstrap, str(tmp_path / "ckpt")
    source = f"kafka://{bootstrap}/events-{fmt}"
    create_topic(bootstrap, f"events-{fmt}", partitions=2)
    erase(spark, settings, GONE)
    produce(bootstrap, f"events-{fmt}", [*events("a", {GONE: 3, LATE: 2, STAYS: 4}), ("x", None)])  # and a tombstone
    first = ingest(spark, settings, source, "json", "demo.events", checkpoint, once=True)
    assert (first.rows_in, first.rows_suppressed, first.rows_written) == (9, 3, 6)
    assert landed(settings) == Counter({f"a-{LATE}-{i}": 1 for i in range(2)} | {f"a-{STAYS}-{i}": 1 for i in range(4)})

    erase(spark, settings, LATE)  # erased between two micro-batches: the next one drops them
    produce(bootstrap, f"events-{fmt}", events("b", {LATE: 2, STAYS: 1}))
    second = ingest(spark, settings, source, "json", "demo.events", checkpoint, once=True)
    assert (second.rows_in, second.rows_suppressed) == (3, 2)  # only the new records: resumed from the checkpoint
    assert set(landed(settings)) == {*(f"a-{STAYS}-{i}" for i in range(4)), f"b-{STAYS}-0"}


def test_bad_kafka_sources_are_clear_errors(spark, new_lakehouse, kafka_broker, tmp_path):
    settings = new_lakehouse()
    with pytest.raises(DsrError, match="is not a Kafka source: write kafka://HOST:PORT/TOPIC"):
        ingest(spark, settings, "kafka://127.0.0.1:1", "json", "demo.events", str(tmp_path / "c"), once=True)
    with pytest.raises(DsrError, match=r"unknown format 'csv' \(expected json\)"):
        ingest(spark, settings, f"kafka://{kafka_broker.bootstrap}/t", "csv", "demo.events", str(tmp_path / "c"),
               once=True)
    create_topic(kafka_broker.bootstrap, "garbled")
    produce(kafka_broker.bootstrap, "garbled", [("k", {"user_id": STAYS, "event_id": "ok"})])
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    producer.produce("garbled", key=b"k", value=b"{not json")
    producer.flush(30)
    before = live_rows(settings, "demo.events").num_rows
    with pytest.raises(DsrError, match="the streaming query failed"):
        ingest(spark, settings, f"kafka://{kafka_broker.bootstrap}/garbled", "json", "demo.events",
               str(tmp_path / "c"), once=True)
    assert live_rows(settings, "demo.events").num_rows == before  # nothing appended from the failed batch


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_kill_9_mid_stream_loses_nothing_and_doubles_nothing(spark, new_lakehouse, kafka_broker, tmp_path, fmt):
    settings = new_lakehouse(delta=["demo.events"] if fmt == "delta" else None)
    bootstrap, topic = kafka_broker.bootstrap, f"stream-{fmt}"
    create_topic(bootstrap, topic, partitions=2)
    erase(spark, settings, GONE)
    produce(bootstrap, topic, events("k", {GONE: 300, STAYS: 3000}))
    config = write_config(settings, tmp_path / "dsr.yaml")
    command = [str(Path(sys.executable).parent / "dsr"), "-c", str(config), "ingest", "--source",
               f"kafka://{bootstrap}/{topic}", "--table", "demo.events", "--checkpoint", str(tmp_path / "ckpt"),
               "--option", "maxOffsetsPerTrigger=300"]  # about 11 micro-batches: the kill lands among them
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not mid_batch(tmp_path / "ckpt"):  # a micro-batch after the first planned, not yet committed
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0].decode()[-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert sum(landed(settings).values()) < 3000  # killed before the end
    done = subprocess.run([*command, "--once"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = landed(settings)
    assert rows == Counter({f"k-{STAYS}-{i}": 1 for i in range(3000)})  # every record once, the erased person never
    assert GONE not in done.stdout + done.stderr and GONE not in json.dumps(sorted(rows))
