"""Several `dsr serve` instances on one PostgreSQL queue (issue 29, item 4): two servers on different ports
share a real PostgreSQL (`intake.queue_url`) while clients file to both; `kill -9` of either instance (its
server and its ingester) under load loses no acknowledged request and adds none twice, one ingester holds
the lease at a time, and the rate limit counts an address's requests to either instance. A queue that
cannot be reached is named in the log and by `/readyz`, and filings are refused (503), never lost.

Run: `.venv/bin/python -m pytest -q -m integration tests/integration/test_instances.py`."""

from __future__ import annotations

import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from helpers import make_settings
from intake_server import intake_config
from lakehouse_dsr.evidence.handoff import BatchItem, RequestBatch
from lakehouse_dsr.ledger.records import expire_records
from lakehouse_dsr.ledger.requests import utc_now
from lakehouse_dsr.service.intake import Filing, Intake, IntakeError
from lakehouse_dsr.service.queue import PostgresQueue
from lakehouse_dsr.service.webhooks import collect, deliver, delivery_log
from test_webhooks import Receiver

from .reader import HadoopTables
from .servers import Postgres, free_port, postgres
from .test_serve_stop import Load, Server

TAKEN = re.compile(r"intake ingest: lease taken at (\S+)")
RELEASED = re.compile(r"intake ingest: \d+ request\(s\) moved into the ledger; lease released at (\S+)")


@pytest.fixture(scope="module")
def pg():
    with postgres() as server:
        yield server


def _database(pg: Postgres, name: str) -> str:
    """A fresh database on the test server: the queue's URL (with the password: the logs must not show it)."""
    admin = f"postgresql://{pg.user}:{pg.password}@127.0.0.1:{pg.port}/{pg.database}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}".encode())
    return f"postgresql://{pg.user}:{pg.password}@127.0.0.1:{pg.port}/{name}"


def _ledger_ids(root: Path) -> Counter[str]:
    """The ledger's request ids as pyiceberg reads the table's files (no lakehouse_dsr code)."""
    table = HadoopTables(root / "wh").load_table("dsr.requests")
    return Counter(table.scan(selected_fields=("request_id",)).to_arrow().column("request_id").to_pylist())


def _rounds(servers: list[Server], killed: dict[str, datetime]) -> list[tuple[datetime, datetime, str]]:
    """When each instance's ingester held the ingest lease, from its log: (taken, released, log); a round
    its kill cut short ends at the kill."""
    found = []
    for server in servers:
        taken: datetime | None = None
        for line in server.output().splitlines():
            if match := TAKEN.search(line):
                assert taken is None, line
                taken = datetime.fromisoformat(match[1])
            elif match := RELEASED.search(line):
                assert taken is not None, line
                found.append((taken, datetime.fromisoformat(match[1]), server.log.name))
                taken = None
        if taken is not None:
            found.append((taken, killed[server.log.name], server.log.name))
    return sorted(found)


def _queue_rows(url: str, sql: str) -> int:
    with psycopg.connect(url) as connection:
        row = connection.execute(sql.encode()).fetchone()
        assert row is not None
        return int(row[0])


def test_two_instances_share_the_queue_through_kill_9_of_either(tmp_path, pg):
    url = _database(pg, "kills")
    config = intake_config(tmp_path, queue_url=url, rate_limit_per_minute=0)
    first, second = Server(config), Server(config)
    servers, loads = [first, second], []
    try:
        first.ready()
        second.ready()
        loads = [Load(first.url, clients=3), Load(second.url, clients=3)]
        time.sleep(3)
        # kill -9 of the first instance, its ingester included, while both take filings
        killed = {first.log.name: datetime.now(UTC)}
        first.kill_all()
        assert second.ready(timeout=10)["queue"]
        time.sleep(2)
        third = Server(config)  # the first comes back (a supervisor's restart), on a port of its own
        servers.append(third)
        third.ready()
        loads.append(Load(third.url, clients=3))
        time.sleep(2)
        # then kill -9 of the second instance
        killed[second.log.name] = datetime.now(UTC)
        second.kill_all()
        assert third.ready(timeout=10)["queue"]
        time.sleep(2)
        for load in loads:
            load.stop()
        # what waits in the queue is moved by the instance left, at its own ticks (nobody forces it)
        deadline = time.monotonic() + 60
        while _queue_rows(url, "SELECT count(*) FROM intake WHERE ingested_at IS NULL"):
            assert time.monotonic() < deadline, third.output()
            time.sleep(0.5)
    finally:
        for load in loads:
            load.stop()
        for server in servers:
            server.kill_all()
    acknowledged = [i for load in loads for i in load.acknowledged]
    per_instance = [len(load.acknowledged) for load in loads]
    assert min(per_instance) > 20, per_instance
    assert len(set(acknowledged)) == len(acknowledged)

    # Every acknowledged request is in the ledger exactly once (a filing cut off by a kill may be there
    # without its 202 having arrived: it was committed; once too).
    ledger = _ledger_ids(tmp_path)
    assert set(acknowledged) <= set(ledger), len(set(acknowledged) - set(ledger))
    assert max(ledger.values()) == 1, [i for i, n in ledger.items() if n > 1][:5]
    assert _queue_rows(url, "SELECT count(*) FROM intake") == len(ledger)
    assert _queue_rows(url, "SELECT count(*) FROM intake WHERE subject_id IS NOT NULL") == 0  # nothing kept

    # One ingester at a time: the rounds every instance logged never overlap; more than one instance ingested.
    rounds = _rounds(servers, killed)
    assert len({log for *_, log in rounds}) >= 2, rounds
    for (_, end, log), (start, _, later) in zip(rounds, rounds[1:], strict=False):
        assert end <= start, (log, end, later, start)
    for server in servers:
        assert "Traceback" not in server.output(), server.output()
        assert pg.password not in server.output()


def test_the_rate_limit_is_shared_by_the_instances(tmp_path, pg):
    config = intake_config(tmp_path, queue_url=_database(pg, "limits"), rate_limit_per_minute=6)
    first, second = Server(config), Server(config)
    try:
        first.ready()
        second.ready()  # /readyz has no rate limit
        with httpx.Client(base_url=first.url, timeout=10) as a, httpx.Client(base_url=second.url, timeout=10) as b:
            statuses = [a.post("/api/v1/requests", json={"type": "erase", "subject_id": f"limit-{i}"}).status_code
                        for i in range(4)]
            statuses += [b.post("/api/v1/requests", json={"type": "erase", "subject_id": f"limit-b{i}"}).status_code
                         for i in range(2)]
            assert statuses == [202] * 6
            # the address's 7th request this minute, to either instance: refused
            for client in (b, a):
                refused = client.post("/api/v1/requests", json={"type": "erase", "subject_id": "limit-over"})
                assert refused.status_code == 429, refused.text
                assert int(refused.headers["retry-after"]) >= 1
            # /metrics (no rate limit): the totals are the shared queue's, the refusals each instance's own
            for client in (a, b):
                text = client.get("/metrics").text
                assert 'dsr_intake_requests_acknowledged_total{type="erase"} 6.0' in text, text
                assert 'dsr_intake_requests_refused_total{reason="rate_limited"} 1.0' in text, text
    finally:
        first.kill_all()
        second.kill_all()


def test_a_queue_that_cannot_be_reached_is_named_and_nothing_is_acknowledged(tmp_path, pg):
    closed = free_port()  # nothing listens there
    url = f"postgresql://{pg.user}:{pg.password}@127.0.0.1:{closed}/nowhere"
    server = Server(intake_config(tmp_path, queue_url=url))
    try:
        deadline = time.monotonic() + 60
        while True:  # /healthz answers: the process is up, though the queue is not
            assert server.proc.poll() is None, server.output()
            try:
                answer = httpx.get(f"{server.url}/readyz", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, server.output()
                time.sleep(0.2)
        assert answer.status_code == 503 and "queue" in answer.json()["failing"], answer.text
        assert answer.json()["ledger"] is True
        filed = httpx.post(f"{server.url}/api/v1/requests", json={"type": "erase", "subject_id": "lost?"}, timeout=20)
        assert filed.status_code == 503 and "intake queue" in filed.json()["detail"], filed.text
        assert str(closed) not in filed.text  # the answer is public: the queue's address is in the log only
        output = server.output()
        assert f"postgresql://{pg.user}:***@127.0.0.1:{closed}/nowhere" in output, output
        assert pg.password not in output and "Traceback" not in output, output
    finally:
        server.kill_all()


def test_every_queue_table_works_on_postgresql(tmp_path, pg):
    """In this process, two intakes (as two instances) on one PostgreSQL queue: filings and their
    Idempotency-Keys, hand-offs and their external ids, the ingest, the webhooks' outbox, deliveries and
    log, and the expiry of unverified requests (ledger/records.py)."""
    receiver = Receiver()
    url = _database(pg, "tables")
    settings = make_settings(tmp_path, intake={"queue_url": url}, webhooks=[
        {"name": "portal", "url": f"{receiver.url}/ok", "secret": "whsec-0123456789abcdef", "backoff_seconds": 0}])
    one, two = Intake(settings), Intake(settings)
    try:
        assert isinstance(one.queue, PostgresQueue)
        # the same key on both instances at once: one request, every answer the first
        with ThreadPoolExecutor(8) as pool:
            acks = list(pool.map(lambda i: (one, two)[i % 2].file(Filing("erase", "pg-subject-1"), "key-1").result(),
                                 range(16)))
        assert len({a.request_id for a in acks}) == 1 and sum(not a.replayed for a in acks) == 1
        with pytest.raises(IntakeError, match="different request"):
            two.file(Filing("access", "pg-subject-1"), "key-1").result()
        batch = RequestBatch(source="fides", requests=[BatchItem(external_id="f-1", type="erase",
                                                                 subject_id="pg-subject-2")])
        first = one.file_batch(batch).result()
        assert first.created == 1 and two.file_batch(batch).result().existing == 1
        handed = first.requests[0].request_id
        assert two.external_references([handed])[handed].id == "f-1"

        collect(one.queue, one.ledger, settings)  # the watermark: from now on
        assert two.ingest() == 2 and one.ingest() == 0
        assert {r["request_id"] for r in one.ledger.requests()} == {acks[0].request_id, handed}
        assert collect(two.queue, two.ledger, settings) == 2  # received, twice
        assert collect(one.queue, one.ledger, settings) == 0  # the other instance's outbox is this one's
        assert deliver(one.queue, settings).delivered == 2 and deliver(two.queue, settings).attempted == 0
        assert {b["request"]["request_id"] for b in receiver.bodies()} == {acks[0].request_id, handed}
        assert [e["event"] for e in delivery_log(two.queue)] == ["received", "received"]
        assert two.status(handed, two.status_token(handed)).status == "received"

        # an identity never verified, past records.keep_unverified_days: dropped by the records' expiry
        old = (utc_now() - timedelta(days=60)).isoformat()
        with psycopg.connect(url) as connection:
            connection.execute(b"INSERT INTO intake (request_id, fingerprint, request_type, regulation, subject_id,"
                               b" email, received_at, state) VALUES ('req-old', 'f', 'erase', 'gdpr', 'pg-stale',"
                               b" 'x@example.org', %s, 'identity_unverified')", (old,))
        assert expire_records(settings, dry_run=True).intake_dropped == 1
        assert expire_records(settings).intake_dropped == 1
        assert _queue_rows(url, "SELECT count(*) FROM intake WHERE request_id = 'req-old'") == 0
        assert _queue_rows(url, "SELECT count(*) FROM intake WHERE subject_id IS NOT NULL") == 0
    finally:
        one.queue.close()
        two.queue.close()
        receiver.close()
