"""The intake service's typed API (issue 29, item 6): every endpoint declares what it answers, so the
OpenAPI document describes every answer, and real answers (successes and refusals) validate against
it with an independent validator (jsonschema). The application runs in this process (no server,
no Spark); the certificate, run and table answers of a real run are checked in test_certificate.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import get_args

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, PlainTextResponse
from fastapi.routing import APIRoute
from jsonschema import Draft202012Validator
from starlette.routing import Mount

from helpers import make_settings
from intake_server import OPERATOR_TOKEN, Mailbox
from lakehouse_dsr.evidence.certificate import ALGORITHM, FORMAT, Certificate, CertificateSignature
from lakehouse_dsr.ledger.ledger import OPEN_STATUSES
from lakehouse_dsr.service import models
from lakehouse_dsr.service.app import create_app
from lakehouse_dsr.service.guard import Guard
from lakehouse_dsr.service.intake import Intake
from openapi_check import CheckedClient, OpenAPI

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The application on a fresh ledger, codes mailed to a real SMTP server; not started (no ingester
    process): the tests ingest through the operator endpoint and send codes with the intake."""
    mailbox = Mailbox().start()
    settings = make_settings(tmp_path_factory.mktemp("openapi"), intake={
        "verification": "email_code", "max_code_attempts": 3, "rate_limit_per_minute": 0,
        "smtp": {"host": "127.0.0.1", "port": mailbox.port}})
    intake = Intake(settings)
    guard = create_app(settings, intake, OPERATOR_TOKEN)
    try:
        yield SimpleNamespace(settings=settings, intake=intake, guard=guard, app=guard.app, mailbox=mailbox)
    finally:
        intake.close()
        mailbox.stop()


def _described(openapi: OpenAPI, schema: dict) -> bool:
    """A schema that says what the answer holds: an object with named properties and no open-ended
    extras (FastAPI gives `{}` for an endpoint without a model, a bare object for `-> dict`)."""
    schema = openapi.resolve(schema)
    if "anyOf" in schema:
        return all(_described(openapi, member) for member in schema["anyOf"])
    return (schema.get("type") == "object" and bool(schema.get("properties"))
            and schema.get("additionalProperties") is not True)


def undescribed(app: FastAPI) -> list[str]:
    """Every route of `app` whose answers the OpenAPI document does not describe (empty: all are)."""
    app.openapi_schema = None  # built again from the routes as they are now
    openapi = OpenAPI(app.openapi())
    problems = []
    for route in app.routes:
        if isinstance(route, Mount) and route.path == "/static":
            continue
        if not isinstance(route, APIRoute):
            if getattr(route, "path", None) != app.openapi_url:
                problems.append(f"{route}: neither an API route nor the OpenAPI document")
            continue
        if not route.include_in_schema:
            if route.response_class is not HTMLResponse:
                problems.append(f"{route.path}: left out of the OpenAPI document, yet not an HTML page")
            continue
        for method in sorted(route.methods):
            responses = openapi.spec["paths"][route.path_format][method.lower()]["responses"]
            success = str(route.status_code or 200)
            if route.response_class is PlainTextResponse:  # /metrics: Prometheus' text format, declared as such
                if "text/plain" not in responses.get(success, {}).get("content", {}):
                    problems.append(f"{method} {route.path}: no text/plain answer declared for {success}")
                continue
            if "application/json" not in responses.get(success, {}).get("content", {}):
                problems.append(f"{method} {route.path}: no JSON answer declared for {success}")
                continue
            for status, response in responses.items():
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                if schema is not None and not _described(openapi, schema):
                    problems.append(f"{method} {route.path} {status}: the schema does not describe the answer")
    return problems


def test_every_endpoint_declares_its_answers(service):
    assert undescribed(service.app) == []
    spec = service.app.openapi()
    operations = {(path, method) for path, methods in spec["paths"].items() for method in methods}
    # refusals are documented as the service sends them, not as FastAPI's default 422 would be
    assert not {"HTTPValidationError", "ValidationError"} & set(spec["components"]["schemas"])
    for path, method in operations:
        responses = spec["paths"][path][method]["responses"]
        if path.startswith("/api/"):
            assert {"422", "429", "500"} <= set(responses), (method, path)
        if "/operator/" in path:
            assert "401" in responses, (method, path)
    certificate = spec["paths"]["/api/v1/operator/requests/{request_id}/certificate"]["get"]["responses"]["200"]
    assert certificate["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Certificate"}
    assert "text/html" in certificate["content"]


def test_an_endpoint_without_a_model_fails_the_check(service):
    app = create_app(service.settings, service.intake, OPERATOR_TOKEN).app

    def untyped():
        return {"moved": 1}

    def loosely_typed() -> dict:
        return {"moved": 1}

    app.add_api_route("/api/v1/untyped", untyped, methods=["GET"])
    app.add_api_route("/api/v1/loose", loosely_typed, methods=["POST"])
    app.add_api_route("/hidden", loosely_typed, methods=["GET"], include_in_schema=False)
    found = undescribed(app)
    assert len(found) == 3, found
    assert any("GET /api/v1/untyped 200" in p for p in found) and any("POST /api/v1/loose 200" in p for p in found)
    assert any("/hidden: left out" in p for p in found)


def test_the_models_name_what_the_engine_knows():
    assert set(get_args(models.RequestState)) == {*OPEN_STATUSES, "in_progress", "completed", "identity_unverified",
                                                  "locked"}
    assert get_args(Certificate.model_fields["format"].annotation) == (FORMAT,)
    assert get_args(CertificateSignature.model_fields["algorithm"].annotation) == (ALGORITHM,)
    schema = Certificate.model_json_schema()  # what `dsr schema` publishes
    Draft202012Validator.check_schema(schema)
    assert set(schema["required"]) == {"format", "issued_at", "request", "runs", "tables", "totals", "signature"}
    assert "package" in schema["properties"] and schema["additionalProperties"] is False


def test_real_answers_validate_against_the_openapi_document(service):
    openapi = OpenAPI(service.app.openapi())
    person, operator = CheckedClient(service.guard, openapi), CheckedClient(service.guard, openapi, OPERATOR)
    intake, mailbox = service.intake, service.mailbox

    def filed(subject: str, kind: str = "erase", **headers) -> dict:
        body = {"type": kind, "subject_id": subject, "email": f"{subject}@example.com"}
        answer = person.post("/api/v1/requests", json=body, headers=headers)
        assert answer.status_code == 202
        return answer.json()

    def code_of(request_id: str) -> str:
        intake.send_due_codes()  # the mail thread does this in a started service
        return mailbox.code_for(request_id)

    # filing: acknowledged (with and without the GPC opt-out beside it), replayed, refused
    ack = filed("ann")
    assert ack["status"] == "identity_unverified" and "gpc_opt_out_request_id" not in ack
    gpc = filed("ben", "access", **{"Sec-GPC": "1", "Idempotency-Key": "k-1"})
    assert gpc["gpc_opt_out_request_id"].startswith("req-")
    assert filed("ben", "access", **{"Sec-GPC": "1", "Idempotency-Key": "k-1"})["replayed"] is True
    opt_out = person.post("/api/v1/requests", json={"type": "opt_out", "subject_id": "cy", "regulation": "ccpa"})
    assert opt_out.json()["status"] == "received"
    assert person.post("/api/v1/requests", json={"type": "opt_out", "subject_id": "dee"},  # the key, another filing
                       headers={"Idempotency-Key": "k-1"}).status_code == 409
    refused = [person.post("/api/v1/requests", content=body, headers={"Content-Type": "application/json"})
               for body in (b'{"type": "erase"', b"[1]", b'{"type": "forget", "subject_id": "s"}',
                            b'{"type": "erase", "x": 1}', b'{"type": "erase", "subject_id": " ", "email": "e@x.org"}',
                            b'{"type": "erase", "subject_id": "s"}')]
    assert {answer.status_code for answer in refused} == {422}
    assert {"errors", "field"} <= {key for answer in refused for key in answer.json()}  # both shapes of a 422
    assert person.post("/api/v1/requests", content=b"x" * 20_000, headers={"Content-Type": "application/json"}
                       ).status_code == 413

    # following and verifying
    url, token = f"/api/v1/requests/{ack['request_id']}", {"X-Status-Token": ack["status_token"]}
    assert person.get(url, headers=token).json()["status"] == "identity_unverified"
    assert person.get(url, headers={"X-Status-Token": "wrong"}).status_code == 403
    assert person.get("/api/v1/requests/req-nope", params={"status_token": "x"}).status_code == 404
    assert person.post(f"{url}/verify", json={"code": "123456"}).status_code == 409  # no code sent yet
    code = code_of(ack["request_id"])
    assert person.post(f"{url}/verify", json={"code": "000000" if code != "000000" else "111111"}).status_code == 400
    assert person.post(f"{url}/verify", json={"code": "12"}).status_code == 422
    assert person.post(f"{url}/verify", json={"cod": "123456"}).status_code == 422
    assert person.post(f"{url}/code", headers=token).status_code == 202
    assert person.post(f"{url}/verify", json={"code": code_of(ack["request_id"])}).json()["status"] == "received"
    assert person.post(f"{url}/verify", json={"code": "123456"}).status_code == 409  # verified already
    assert person.post(f"{url}/code", headers=token).status_code == 409  # waits for no code
    assert person.post("/api/v1/requests/req-nope/code").status_code == 404
    locked = filed("eve")
    code_of(locked["request_id"])
    tries = [person.post(f"/api/v1/requests/{locked['request_id']}/verify", json={"code": c}).status_code
             for c in ("000001", "000002", "000003")]
    assert tries == [400, 400, 423]
    late = filed("fay")
    code = code_of(late["request_id"])
    intake.queue.call(lambda c: c.execute("UPDATE intake SET code_expires = 0 WHERE request_id = ?",
                                          (late["request_id"],)))
    assert person.post(f"/api/v1/requests/{late['request_id']}/verify", json={"code": code}).status_code == 410

    # the operator's side: refused without the token, then each endpoint
    for path, methods in openapi.spec["paths"].items():
        for method in methods:
            if "/operator/" in path:
                assert person.request(method, path.replace("{request_id}", ack["request_id"])).status_code == 401
    listed = operator.get("/api/v1/operator/requests").json()
    assert {"identity_unverified", "locked", "received"} <= {r["status"] for r in listed["requests"]}
    assert operator.post("/api/v1/operator/ingest").json()["moved"] >= 3
    assert person.get(url, headers=token).json()["status"] == "received"  # from the ledger now
    assert operator.get("/api/v1/operator/requests", params={"status": "open", "regulation": "gdpr"}).json()["count"]
    assert operator.get("/api/v1/operator/requests", params={"type": "x" * 41}).status_code == 422
    extend = f"/api/v1/operator/requests/{ack['request_id']}/extend"
    assert operator.post(extend, json={"reason": "many systems"}).json()["extended"] is True
    assert operator.post(extend, json={"reason": "again"}).status_code == 409
    assert operator.post(extend, json={"reason": ""}).status_code == 422
    assert operator.post(f"/api/v1/operator/requests/req-{'0' * 21}/extend", json={"reason": "x"}).status_code == 404
    assert operator.get("/api/v1/operator/runs").json() == {"runs": []}  # a real run's: test_certificate.py
    assert operator.get("/api/v1/operator/runs", params={"limit": 0}).status_code == 422
    assert operator.get("/api/v1/operator/tables").json() == {"tables": []}
    certificate = f"/api/v1/operator/requests/{ack['request_id']}/certificate"
    assert operator.get(certificate).status_code == 409  # not completed
    assert operator.get(certificate, params={"format": "pdf"}).status_code == 422
    assert operator.get(f"/api/v1/operator/requests/req-{'0' * 21}/certificate").status_code == 404
    assert person.get("/healthz").json() == {"ok": True}
    # not started here: no ingester process, so not ready, and the answer names that part alone
    assert person.get("/readyz").json() == {"ready": False, "failing": ["ingester"], "queue": True, "ledger": True,
                                            "ingester": False}
    assert person.get("/nothing/secret-path-123").status_code == 404
    metrics = person.get("/metrics").text  # latency by route template; no path, id or identifier in it
    assert 'route="/api/v1/requests/{request_id}"' in metrics and 'route="unmatched",status="404"' in metrics
    assert not any(s in metrics for s in ("secret-path", ack["request_id"], locked["request_id"], "@example"))
    assert 'dsr_intake_requests_acknowledged_total{type="erase"}' in metrics

    # the outer wall's refusal: the rate limit
    limited = CheckedClient(Guard(service.app, 16_384, rate_limit_per_minute=2), openapi)
    assert [limited.get(url, headers=token).status_code for _ in range(3)] == [200, 200, 429]

    seen = person.seen | operator.seen | limited.seen
    successes = {(path, method) for path, method, status in seen if status < 300}
    operations = {(path, method) for path, methods in openapi.spec["paths"].items() for method in methods}
    # a real run's: test_certificate.py; ready: integration; legal holds: test_operators.py; the batch of
    # another privacy tool: test_webhooks.py (each checked there too)
    assert operations - successes == {("/api/v1/operator/requests/{request_id}/certificate", "get"),
                                      ("/readyz", "get"), ("/api/v1/operator/holds", "get"),
                                      ("/api/v1/operator/holds", "post"),
                                      ("/api/v1/operator/holds/{hold_id}/release", "post"),
                                      ("/api/v1/operator/requests/batch", "post")}
    assert {status for _, _, status in seen} >= {200, 202, 400, 401, 403, 404, 409, 410, 413, 422, 423, 429}
    for client in (person, operator, limited):
        client.close()


def _allows(openapi: OpenAPI, path: str, method: str, body: object, headers: dict[str, str] | None = None) -> bool:
    """Whether the document allows a request with this JSON body and these headers (jsonschema decides)."""
    operation = openapi.spec["paths"][path][method]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    allowed = openapi.validator(schema).is_valid(body)
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "header" and parameter["name"] in (headers or {}):
            allowed = allowed and openapi.validator(parameter["schema"]).is_valid(headers[parameter["name"]])
    return allowed


def test_what_the_server_refuses_for_its_shape_the_document_refuses_too(service):
    """Issue 55: a fuzzer drawing requests from the document met refusals it did not state. Each request
    here is refused (422) and the document forbids it; the ones beside them it allows are accepted."""
    openapi = OpenAPI(service.app.openapi())
    person, operator = CheckedClient(service.guard, openapi), CheckedClient(service.guard, openapi, OPERATOR)
    filing = {"type": "erase", "subject_id": "gil", "email": "gil@example.com"}
    request_id = person.post("/api/v1/requests", json=filing).json()["request_id"]
    refused = [  # (path, body, headers)
        ("/api/v1/requests", {**filing, "subject_id": " \t\u3000\x1f"}, {}),  # blank by str.strip's reckoning
        ("/api/v1/requests", {**filing, "email": "gil at example.com"}, {}),
        ("/api/v1/requests", {**filing, "email": "gil@example.com\u2028"}, {}),
        ("/api/v1/requests", {"type": "access", "subject_id": "gil"}, {}),  # verified by a mailed code: needs one
        ("/api/v1/requests", filing, {"idempotency-key": "k" * 201}),
        ("/api/v1/requests/{request_id}/verify", {"code": "\u0661\u0662\u0663\u0664\u0665\u0666"}, {}),  # not ASCII
        ("/api/v1/operator/holds", {"subject_id": "gil", "table": "demo.orders", "reason": "audit"}, {}),
        ("/api/v1/operator/holds", {"reason": "audit"}, {}),
        ("/api/v1/operator/holds", {"subject_id": "gil", "reason": "\u00a0"}, {}),
        ("/api/v1/operator/requests/{request_id}/extend", {"reason": " "}, {}),
        ("/api/v1/operator/requests/batch", {"source": "fides", "requests": [
            {"external_id": "f-1", "type": "erase", "subject_id": "\u2003"}]}, {}),
        ("/api/v1/operator/requests/batch", {"source": "fides", "requests": [  # a year the ledger cannot keep
            {"external_id": "f-2", "type": "erase", "subject_id": "gil", "received_at": "0999-01-01T00:00:00Z"}]}, {}),
    ]
    for path, body, headers in refused:
        assert not _allows(openapi, path, "post", body, headers), (path, body, headers)
        client = operator if "/operator/" in path else person
        answer = client.post(path.replace("{request_id}", request_id), json=body, headers=headers)
        assert answer.status_code == 422, (path, body, headers, answer.text)
    allowed = [("/api/v1/requests", {**filing, "subject_id": " gil "}, {"idempotency-key": "k" * 200}),
               ("/api/v1/requests", {"type": "opt_out", "subject_id": "gil", "regulation": "ccpa"}, {}),
               ("/api/v1/operator/holds", {"subject_id": "gil", "table": None, "reason": "audit"}, {})]
    for path, body, headers in allowed:
        assert _allows(openapi, path, "post", body, headers), (path, body, headers)
        client = operator if "/operator/" in path else person
        assert client.post(path, json=body, headers=headers).status_code in (201, 202), (path, body, headers)
    for client in (person, operator):
        client.close()


def test_a_body_that_is_not_json_is_a_documented_422(service):
    """Issue 55: a body json.loads cannot read (not UTF-8, nested deeper than its recursion allows) was
    FastAPI's 400, which no operation documents; it is malformed JSON, as a truncated body is."""
    openapi = OpenAPI(service.app.openapi())
    client = CheckedClient(service.guard, openapi, OPERATOR)  # checks each answer is one the operation documents
    taking = [(path, method) for path, methods in openapi.spec["paths"].items()
              for method, operation in methods.items() if "requestBody" in operation]
    assert len(taking) >= 5
    for path, method in taking:
        for body in (b'{"type": "erase", "subject_id": "\xff"}', b"[" * 5000 + b"]" * 5000):
            answer = client.request(method, path.replace("{request_id}", f"req-{'0' * 21}"), content=body,
                                    headers={"Content-Type": "application/json"})
            assert answer.status_code == 422, (path, answer.text)
            assert answer.json()["errors"] == [{"field": "body", "message": "malformed JSON"}]
    client.close()


def test_a_status_token_of_any_characters_is_refused_not_a_500(service):
    """Issue 55: a status token with a non-ASCII character was a 500 (hmac.compare_digest refuses such str),
    on an endpoint anyone may call; as a query parameter or as a header's Latin-1 bytes, it is a 403."""
    openapi = OpenAPI(service.app.openapi())
    person = CheckedClient(service.guard, openapi)
    url = f"/api/v1/requests/req-{'0' * 21}"
    for token in ("t\u00f6ken", "\U0001f600", "\u0000"):
        assert person.get(url, params={"status_token": token}).status_code == 403
        assert person.post(f"{url}/code", params={"status_token": token}).status_code == 403
    assert person.get(url, headers={"X-Status-Token": b"t\xf6ken\xff"}).status_code == 403
    person.close()


def test_a_method_a_path_does_not_take_is_a_405_naming_every_method_it_takes(service):
    """Issue 55: a 405 had no `Allow` (then named only the first route of a path with two)."""

    async def answers() -> list[tuple[str, str, int, str | None]]:  # undocumented methods: no document to check
        found = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service.guard), base_url="http://t") as client:
            for path in allowed:
                for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
                    answer = await client.request(method, path)
                    found.append((method, path, answer.status_code, answer.headers.get("allow")))
        return found

    allowed = {"/api/v1/operator/holds": "GET, POST", "/api/v1/requests": "POST",
               f"/api/v1/requests/req-{'0' * 21}": "GET", "/healthz": "GET", "/static/common.js": "GET, HEAD"}
    for method, path, status, allow in asyncio.run(answers()):
        assert (status, allow) == (405, allowed[path]), (method, path)


def test_every_answer_of_every_path_is_documented_the_outer_walls_too(service):
    """The body limit and an internal error can meet any path (guard.py, the error handler): every
    operation documents 413 and 500, each as a `Refusal`."""
    spec = service.app.openapi()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            for status in ("413", "500"):
                schema = operation["responses"][status]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Refusal"}, (method, path, status)
