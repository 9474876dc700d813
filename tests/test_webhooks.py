"""Hand-offs with other privacy tools (issue 29, item 5): signed webhooks on status changes, delivered
over real HTTP to a receiver in this process (http.server) that checks nothing itself: the test
recomputes every signature; a receiver that fails, one that hangs and a port that refuses; and the
operators' batch endpoint, idempotent per external id. No Spark: outcomes are recorded with
`Ledger.finish`, as a run records them; the application runs in this process (OpenAPI-checked)."""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from helpers import make_settings, write_config
from intake_server import OPERATOR_TOKEN, Mailbox, free_port, intake_config, served
from lakehouse_dsr.cli import app
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.evidence.certificate import build_certificate, certificate_digest
from lakehouse_dsr.ledger.ledger import Ledger, Outcome
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.service.app import create_app
from lakehouse_dsr.service.intake import Filing, Intake
from lakehouse_dsr.service.queue import IntakeQueue
from lakehouse_dsr.service.webhooks import POLL_SECONDS, collect, deliver, delivery_log
from openapi_check import CheckedClient, OpenAPI

ROOT = Path(__file__).parent.parent
SECRET = "whsec-0123456789abcdef"
SUBJECTS = ("alice@example.com", "bob@example.com", "carol@example.com")
BATCH = "/api/v1/operator/requests/batch"


class Receiver:
    """An HTTP server recording every POST; `/fail-once` answers 500 the first time, `/hang` never in time."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        self.calls: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.calls[self.path] = receiver.calls.get(self.path, 0) + 1
                if self.path == "/hang":
                    time.sleep(1.5)
                failing = self.path == "/fail-once" and receiver.calls[self.path] == 1
                if not failing and self.path != "/hang":
                    receiver.got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(500 if failing else 204)
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str = "/ok") -> list[dict]:
        return [json.loads(body) for p, _, body in self.got if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    found = Receiver()
    yield found
    found.close()


def _hook(name: str, url: str, **extra) -> dict:
    return {"name": name, "url": url, "secret": SECRET, "backoff_seconds": 0, **extra}


def _verified(headers: dict[str, str], body: bytes) -> bool:
    """The receiver's side of the scheme, written from the documentation: t=<unix>,v1=<hex>."""
    parts = dict(p.split("=", 1) for p in headers["x-dsr-signature"].split(","))
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - int(parts["t"])) < 60


def _validator(stem: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / f"{stem}.schema.json").read_text()))


def _log(settings) -> list[dict]:
    with sqlite3.connect(settings.intake_queue_file()) as c:
        c.row_factory = sqlite3.Row
        return [dict(r) for r in c.execute("SELECT * FROM webhook_log ORDER BY id")]


def test_status_changes_are_signed_delivered_and_logged_without_identifiers(tmp_path, receiver):
    settings = make_settings(tmp_path, webhooks=[
        _hook("portal", f"{receiver.url}/ok"),
        _hook("flaky", f"{receiver.url}/fail-once", events=["completed"]),
        _hook("slow", f"{receiver.url}/hang", events=["completed"], timeout_seconds=0.3, max_attempts=2),
        _hook("gone", f"http://127.0.0.1:{free_port()}/", events=["completed"], max_attempts=1)])
    queue, ledger = IntakeQueue(settings.intake_queue_file()), Ledger(settings)
    try:
        assert collect(queue, ledger, settings) == 0  # the first call sets the watermark
        ids = ledger.submit([RequestInput(s, "erase") for s in SUBJECTS]).created
        ledger.finish([Outcome(ids[0], "completed", evidence={"tables": {}}),
                       Outcome(ids[1], "held", "a legal hold: litigation"),
                       Outcome(ids[2], "failed", "demo.events: the catalog did not answer")], "run-1")
        ledger.finish([Outcome(ids[1], "held", "a legal hold: litigation")], "run-2")  # no change: not sent again
        assert collect(queue, ledger, settings) == 6  # received x3, held, completed, failed (held once)
        assert collect(queue, ledger, settings) == 0  # read again (the lookback), counted once

        started = time.monotonic()
        first = deliver(queue, settings)
        assert time.monotonic() - started < 5  # the hanging endpoint held up no other one
        assert (first.delivered, first.failed) == (6, 3)  # portal's 6; fail-once, hang and gone failed once each
        second = deliver(queue, settings)  # backoff 0: due again
        assert (second.delivered, second.failed, second.given_up) == (1, 1, 1)  # fail-once now 200; hang gives up
        assert deliver(queue, settings).attempted == 0  # nothing due: delivered or given up
    finally:
        queue.close()

    events = receiver.bodies()
    assert sorted(e["event"] for e in events) == ["completed", "failed", "held", "received", "received", "received"]
    check = _validator("webhook-event")
    for path, headers, body in receiver.got:
        assert _verified(headers, body), path
        check.validate(json.loads(body))
        assert headers["x-dsr-event-id"] == json.loads(body)["id"]
        assert not any(s.encode() in body for s in SUBJECTS)
    by_event = {e["event"]: e for e in events}
    assert by_event["held"]["request"] == {"request_id": ids[1], "type": "erase", "regulation": "gdpr",
                                           "status": "held", "reason": "a legal hold: litigation",
                                           "external_reference": None}
    # the certificate named is the one an operator downloads later: another copy, the same digest
    completed = by_event["completed"]["certificate"]
    later = build_certificate(ledger, ids[0])
    assert completed["id"] == ids[0] and completed["digest"] == certificate_digest(later)
    assert receiver.bodies("/fail-once") == [by_event["completed"]]  # the retry sent the same event

    log = _log(settings)
    assert not any(s in json.dumps(log) for s in SUBJECTS) and not any("127.0.0.1" in json.dumps(r) for r in log)
    outcomes = {(r["endpoint"], r["attempt"]): (r["http_status"], r["error"]) for r in log}
    assert outcomes[("flaky", 1)] == (500, "HTTP 500") and outcomes[("flaky", 2)] == (204, None)
    assert outcomes[("slow", 1)] == outcomes[("slow", 2)] == (None, "ReadTimeout")
    assert outcomes[("gone", 1)] == (None, "ConnectError")
    with sqlite3.connect(settings.intake_queue_file()) as c:
        states = dict(c.execute("SELECT endpoint, state FROM webhook_deliveries WHERE endpoint != 'portal'"))
    assert states == {"flaky": "delivered", "slow": "given_up", "gone": "given_up"}


def test_the_batch_endpoint_files_once_per_external_id_and_refuses_bad_batches(tmp_path, receiver):
    settings = make_settings(tmp_path, intake={"rate_limit_per_minute": 0}, webhooks=[_hook("portal", receiver.url)])
    intake = Intake(settings)
    guard = create_app(settings, intake, OPERATOR_TOKEN)
    openapi = OpenAPI(guard.app.openapi())
    operator = CheckedClient(guard, openapi, {"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    anonymous = CheckedClient(guard, openapi)
    batch = {"source": "fides", "requests": [
        {"external_id": "pri_001", "type": "erase", "subject_id": SUBJECTS[0]},
        {"external_id": "pri_002", "type": "access", "subject_id": SUBJECTS[1], "regulation": "ccpa",
         "received_at": "2026-01-05T09:30:00+01:00"}]}
    try:
        refused = anonymous.post(BATCH, json=batch)
        assert refused.status_code == 401 and SUBJECTS[0] not in refused.text

        collect(intake.queue, intake.ledger, settings)  # the watermark: from now on
        first = operator.post(BATCH, json=batch)
        assert first.status_code == 202, first.text
        answer = first.json()
        assert (answer["created"], answer["existing"], answer["conflicts"]) == (2, 0, 0)
        assert answer["requests"][1]["due_date"] == "2026-02-19"  # CCPA's 45 days from the tool's receipt
        _validator("request-batch-result").validate(answer)
        ids = [r["request_id"] for r in answer["requests"]]

        again = operator.post(BATCH, json={"source": "fides", "requests": [
            batch["requests"][0], {**batch["requests"][1], "type": "erase"},
            {"external_id": "pri_003", "type": "opt_out", "subject_id": SUBJECTS[2], "regulation": "ccpa"}]}).json()
        assert [(r["result"], r["request_id"]) for r in again["requests"][:2]] == [("existing", ids[0]),
                                                                                  ("conflict", ids[1])]
        assert again["requests"][2]["result"] == "created"
        assert operator.post(BATCH, json={**batch, "source": "transcend"}).json()["created"] == 2  # another tool

        filed = len(intake.waiting())
        duplicate = operator.post(BATCH, json={"source": "fides", "requests": [
            {"external_id": "pri_9", "type": "erase", "subject_id": SUBJECTS[0]},
            {"external_id": "pri_9", "type": "access", "subject_id": SUBJECTS[1]}]})
        assert duplicate.status_code == 409 and duplicate.json()["field"] == "requests.1.external_id"
        malformed = [({"source": "fides", "requests": []}, "requests"),
                     ({"source": "Fides!", "requests": batch["requests"]}, "source"),
                     ({"source": "fides", "requests": [{"type": "erase", "subject_id": SUBJECTS[0]}]},
                      "requests.0.external_id"),
                     ({"source": "fides", "requests": [{**batch["requests"][0], "type": "forget"}]},
                      "requests.0.type"),
                     ({"source": "fides", "requests": [{**batch["requests"][0], "external_id": "pri_4",
                                                         "received_at": "2999-01-01T00:00:00Z"}]},
                      "requests.0.received_at"),
                     ({"source": "fides", "requests": [{**batch["requests"][0], "external_id": "pri_5",
                                                         "subject_id": "   "}]}, "requests.0.subject_id")]
        for body, field in malformed:
            bad = operator.post(BATCH, json=body)
            assert bad.status_code == 422, (field, bad.text)
            fields = [e["field"] for e in bad.json().get("errors", [])] or [bad.json()["field"]]
            assert field in fields, (field, bad.text)
            assert not any(s in bad.text for s in SUBJECTS)
        assert len(intake.waiting()) == filed  # nothing filed by a refused batch

        # the tool's id is kept: in the operator's list, the person's status and the webhook payload
        listed = operator.get("/api/v1/operator/requests").json()["requests"]
        assert {r["request_id"]: r["external_reference"] for r in listed}[ids[0]] == {"source": "fides",
                                                                                     "id": "pri_001"}
        status = anonymous.get(f"/api/v1/requests/{ids[0]}", headers={"X-Status-Token": intake.status_token(ids[0])})
        assert status.json()["external_reference"] == {"source": "fides", "id": "pri_001"}
        audit = [json.loads(r["detail"]) | {"request_id": r["request_id"]}
                 for r in intake.ledger.store.rows("audit") if r["event"] == "operator"]
        assert {"operator": "default", "action": "file from fides", "request_id": ids[0]} in audit

        intake.ingest()
        collect(intake.queue, intake.ledger, settings)
        assert deliver(intake.queue, settings).delivered == 5  # every request filed: received
        received = {e["request"]["request_id"]: e for e in receiver.bodies("/")}
        assert received[ids[0]]["event"] == "received"
        assert received[ids[0]]["request"]["external_reference"] == {"source": "fides", "id": "pri_001"}
    finally:
        operator.close()
        anonymous.close()
        intake.close()


def test_a_verified_identity_is_an_event_from_the_intake_queue(tmp_path, receiver):
    mailbox = Mailbox().start()
    settings = make_settings(tmp_path, webhooks=[_hook("portal", receiver.url, events=["verified"])], intake={
        "verification": "email_code", "smtp": {"host": "127.0.0.1", "port": mailbox.port}})
    intake = Intake(settings)
    try:
        ack = intake.file(Filing("erase", SUBJECTS[0], email="alice@example.com")).result()
        intake.send_due_codes()
        intake.verify(ack.request_id, mailbox.code_for(ack.request_id))
        assert deliver(intake.queue, settings).delivered == 1
        assert json.loads(json.dumps(delivery_log(intake.queue)))[0]["event"] == "verified"
    finally:
        intake.close()
        mailbox.stop()
    (event,) = receiver.bodies("/")
    assert event["event"] == "verified" and event["request"]["status"] == "received"
    assert SUBJECTS[0] not in json.dumps(event)


def test_dsr_webhooks_deliver_and_log_without_the_service(tmp_path, receiver):
    config = write_config(make_settings(tmp_path), tmp_path / "dsr.yaml", webhooks=[_hook("portal", receiver.url)])
    cli = CliRunner()
    assert json.loads(cli.invoke(app, ["-c", str(config), "webhooks", "deliver"]).stdout)["collected"] == 0
    Ledger(load_settings(config)).submit([RequestInput(SUBJECTS[0], "access")])
    done = cli.invoke(app, ["-c", str(config), "webhooks", "deliver"])
    assert done.exit_code == 0 and json.loads(done.stdout) == {"collected": 1, "attempted": 1, "delivered": 1,
                                                               "failed": 0, "given_up": 0}
    (logged,) = json.loads(cli.invoke(app, ["-c", str(config), "webhooks", "log"]).stdout)
    assert (logged["endpoint"], logged["event"], logged["http_status"]) == ("portal", "received", 204)
    assert [e["event"] for e in receiver.bodies("/")] == ["received"]


@pytest.mark.slow
def test_dsr_serve_delivers_from_its_ingester_process(tmp_path, receiver):
    config = intake_config(tmp_path)
    config.write_text(config.read_text() + yaml.safe_dump({"webhooks": [_hook("portal", receiver.url)]}))
    with served(config) as server, server.client() as client:
        time.sleep(POLL_SECONDS + 1)  # the first round sets the watermark: events from then on
        ack = client.post("/api/v1/requests", json={"type": "erase", "subject_id": SUBJECTS[0]}).json()
        deadline = time.monotonic() + 3 * POLL_SECONDS
        while not receiver.got and time.monotonic() < deadline:
            time.sleep(0.2)
    (event,) = receiver.bodies("/")
    assert (event["event"], event["request"]["request_id"]) == ("received", ack["request_id"])
    assert _verified(receiver.got[0][1], receiver.got[0][2])
