"""Named operators (issue 29, item 3): tokens kept as hashes in the operators file, `$DSR_API_TOKEN` as the
operator `default`, JWTs checked against a JWKS file; each operator call recorded in the ledger's audit
under the operator's name. The application runs in this process (no server, no Spark)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import jsonschema
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from typer.testing import CliRunner

from helpers import make_settings, write_config
from intake_server import OPERATOR_TOKEN
from lakehouse_dsr.cli import app as cli
from lakehouse_dsr.service.app import create_app
from lakehouse_dsr.service.intake import Filing, Intake
from lakehouse_dsr.service.operators import (
    OperatorError,
    add_operator,
    expiry,
    list_operators,
    operators_file,
    revoke_operator,
)
from openapi_check import CheckedClient, OpenAPI

LIST = "/api/v1/operator/requests"


def _signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("operators")
    key = _signing_key()
    jwks = root / "jwks.json"
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    settings = make_settings(root, intake={"rate_limit_per_minute": 0, "jwt": {
        "jwks": str(jwks), "issuer": "https://idp.example", "audience": "dsr"}})
    intake = Intake(settings)
    guard = create_app(settings, intake, OPERATOR_TOKEN)
    openapi = OpenAPI(guard.app.openapi())
    try:
        yield SimpleNamespace(settings=settings, intake=intake, guard=guard, openapi=openapi, key=key,
                              file=operators_file(settings), root=root)
    finally:
        intake.close()


def _call(service, token: str | None, method: str = "GET", path: str = LIST, **kwargs):
    client = CheckedClient(service.guard, service.openapi,
                           {"Authorization": f"Bearer {token}"} if token is not None else None)
    try:
        return client.request(method, path, **kwargs)
    finally:
        client.close()


def _operator_events(service) -> list[dict]:
    rows = sorted(service.intake.ledger.store.rows("audit"), key=lambda r: r["at"])
    return [{"request_id": r["request_id"], **json.loads(r["detail"])} for r in rows if r["event"] == "operator"]


def _jwt(service, key=None, **claims) -> str:
    now = int(time.time())
    body = {"sub": "ops-lead", "iss": "https://idp.example", "aud": "dsr", "iat": now, "exp": now + 300, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key or service.key, algorithm="RS256",
                      headers={"kid": "k1"})


def test_tokens_are_kept_hashed_and_bad_input_changes_nothing(tmp_path):
    path = tmp_path / "ops" / "operators.json"
    token = add_operator(path, "alice", expiry("2099-12-31"))
    text = path.read_text()
    assert token not in text and hashlib.sha256(token.encode()).hexdigest() in text
    assert path.stat().st_mode & 0o077 == 0
    (alice,) = list_operators(path)
    assert (alice.name, alice.expires) == ("alice", datetime(2100, 1, 1, tzinfo=UTC))  # through the last day
    assert expiry("2030-06-01T12:00:00+02:00") == datetime(2030, 6, 1, 10, tzinfo=UTC)

    refused = {"a taken name": ("alice", None, "exists"), "the shared token's name": ("default", None, "DSR_API_TOKEN"),
               "not a plain name": ("bad name\n", None, "letters"), "an expiry past": (
                   "bob", datetime(2000, 1, 1, tzinfo=UTC), "already past")}
    for why, (name, expires, message) in refused.items():
        with pytest.raises(OperatorError, match=message):
            add_operator(path, name, expires)
        assert path.read_text() == text, why
    with pytest.raises(OperatorError, match="no operator 'carol'"):
        revoke_operator(path, "carol")
    with pytest.raises(OperatorError, match="neither a date"):
        expiry("next week")
    assert path.read_text() == text
    path.write_text("{not json")
    with pytest.raises(OperatorError, match="cannot be read"):
        list_operators(path)


def test_named_operators_are_checked_audited_and_revoked_one_by_one(service):
    alice, bob = add_operator(service.file, "alice"), add_operator(service.file, "bob")
    expired = add_operator(service.file, "carol", datetime(2020, 1, 2, tzinfo=UTC),
                           now=datetime(2020, 1, 1, tzinfo=UTC))
    filed = service.intake.file(Filing("erase", "operator-subject-1")).result()
    assert _call(service, alice).status_code == 200
    assert _call(service, OPERATOR_TOKEN).status_code == 200  # $DSR_API_TOKEN: the operator "default"
    assert _call(service, bob, "POST", "/api/v1/operator/ingest").json()["moved"] >= 1
    extended = _call(service, alice, "POST", f"/api/v1/operator/requests/{filed.request_id}/extend",
                     json={"reason": "many systems"})
    assert extended.status_code == 200
    events = _operator_events(service)
    assert [(e["operator"], e["action"], e["request_id"]) for e in events] == [
        ("alice", "list requests", None), ("default", "list requests", None), ("bob", "ingest", None),
        ("alice", "extend", filed.request_id)]

    # unknown, expired, malformed: 401, nothing echoed, nothing recorded
    for token in (expired, "not-a-token", alice + "x", alice.upper(), "a.b.c", ""):
        answer = _call(service, token)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", token
        assert (not token or token not in answer.text) and "carol" not in answer.text
    assert _call(service, None).status_code == 401
    assert len(_operator_events(service)) == len(events)

    # revoking one, adding another: the running service sees both at once, and nobody else is affected
    revoke_operator(service.file, "bob")
    dave = add_operator(service.file, "dave")
    assert _call(service, bob).status_code == 401
    assert [_call(service, t).status_code for t in (alice, dave, OPERATOR_TOKEN)] == [200, 200, 200]
    assert "dave" in [e["operator"] for e in _operator_events(service)]
    assert not any(t in json.dumps(_operator_events(service)) for t in (alice, bob, dave, OPERATOR_TOKEN))


def test_jwts_are_verified_against_the_jwks(service):
    assert _call(service, _jwt(service)).status_code == 200
    assert _operator_events(service)[-1]["operator"] == "jwt:ops-lead"
    now = int(time.time())
    bad = {
        "expired": _jwt(service, exp=now - 600, iat=now - 900),
        "no expiry": _jwt(service, exp=None),
        "another issuer": _jwt(service, iss="https://evil.example"),
        "another audience": _jwt(service, aud="other"),
        "no subject": _jwt(service, sub=None),
        "signed by another key": _jwt(service, key=_signing_key()),
        "unsigned": jwt.encode({"sub": "x", "exp": now + 60, "iss": "https://idp.example", "aud": "dsr"}, None,
                               algorithm="none"),
        "HS256 (a shared secret)": jwt.api_jws.PyJWS().encode(
            json.dumps({"sub": "x", "exp": now + 60, "iss": "https://idp.example", "aud": "dsr"}).encode(),
            b"k" * 32, algorithm="HS256", headers={"kid": "k1"}),
        "an unknown key id": jwt.encode({"sub": "x", "exp": now + 60}, service.key, algorithm="RS256",
                                        headers={"kid": "k2"}),
    }
    for why, token in bad.items():
        answer = _call(service, token)
        assert answer.status_code == 401, why
        assert token not in answer.text, why
    assert _operator_events(service)[-1]["operator"] == "jwt:ops-lead"  # none of them was recorded


def test_operator_access_is_off_without_any_credential(tmp_path):
    settings = make_settings(tmp_path, intake={"rate_limit_per_minute": 0})
    intake = Intake(settings)
    try:
        guard = create_app(settings, intake, operator_token="")
        service = SimpleNamespace(guard=guard, openapi=OpenAPI(guard.app.openapi()))
        answer = _call(service, "anything")
        assert answer.status_code == 401 and "operator access is off" in answer.json()["detail"]
        add_operator(operators_file(settings), "erin", datetime.now(UTC) + timedelta(days=1))
        assert _call(service, "anything").json()["detail"] == "a valid operator bearer token is required"
    finally:
        intake.close()


def test_the_command_line(tmp_path):
    config = write_config(make_settings(tmp_path), tmp_path / "dsr.yaml")
    runner = CliRunner()

    def dsr(*args: str):
        return runner.invoke(cli, ["-c", str(config), "operator", *args])

    added = dsr("add", "frank", "--expires", "2099-01-31")
    assert added.exit_code == 0, added.output
    token = added.stdout.strip().splitlines()[-1]
    assert len(token) >= 40
    listed = json.loads(dsr("list", "--json").stdout)
    assert listed == [{"name": "frank", "created": listed[0]["created"], "expires": "2099-02-01T00:00:00+00:00",
                       "active": True}]
    assert token not in dsr("list").stdout
    before = (tmp_path / "dsr-operators.json").read_text()
    for args, message in ((("add", "frank"), "exists"), (("add", "x", "--expires", "soon"), "neither a date"),
                          (("revoke", "nobody"), "no operator 'nobody'")):
        result = dsr(*args)  # `dsr` (entry) prints the message and exits 2
        assert isinstance(result.exception, OperatorError) and message in str(result.exception), result.output
    assert (tmp_path / "dsr-operators.json").read_text() == before
    assert dsr("revoke", "frank").exit_code == 0
    assert json.loads(dsr("list", "--json").stdout) == []


def test_operators_place_list_and_release_legal_holds(service):
    """Issue 28: the operator endpoints for legal holds call the ledger's (ledger/holds.py): the hold names
    its operator, lists never show a subject (not even its hash), bad input changes nothing."""
    token = add_operator(service.file, "dana")
    subject = "hold-subject-7731"
    placed = _call(service, token, "POST", "/api/v1/operator/holds",
                   json={"subject_id": subject, "reason": "litigation 2026-17"})
    assert placed.status_code == 201, placed.text
    hold = placed.json()
    assert (hold["kind"], hold["created_by"], hold["active"], hold["until"]) == ("subject", "dana", True, None)
    on_table = _call(service, token, "POST", "/api/v1/operator/holds",
                     json={"table": "demo.orders", "reason": "tax audit", "until": "2099-01-31"})
    assert on_table.status_code == 201 and on_table.json()["table"] == "demo.orders", on_table.text

    before = service.intake.ledger.store.snapshot_id("holds")
    for body, field in (({"reason": "x"}, "subject/table"), ({"table": "demo.nope", "reason": "x"}, "table"),
                        ({"subject_id": "s", "table": "demo.orders", "reason": "x"}, "subject/table"),
                        ({"table": "demo.orders", "reason": "x", "until": "2000-01-01"}, "until")):
        refused = _call(service, token, "POST", "/api/v1/operator/holds", json=body)
        assert (refused.status_code, refused.json()["field"]) == (422, field), refused.text
    assert service.intake.ledger.store.snapshot_id("holds") == before
    # the published schema refuses what the server refuses for want of exactly one of subject_id and table
    document = service.guard.app.openapi()
    schema = {**document["components"]["schemas"]["HoldBody"], "components": document["components"]}
    bodies = {"both": {"subject_id": "s", "table": "demo.orders", "reason": "x"}, "neither": {"reason": "x"},
              "subject": {"subject_id": "s", "reason": "x"}, "table": {"table": "demo.orders", "reason": "x"},
              "subject, null table": {"subject_id": "s", "table": None, "reason": "x"}}
    valid = {name for name, body in bodies.items() if jsonschema.Draft202012Validator(schema).is_valid(body)}
    assert valid == {"subject", "table", "subject, null table"}

    listed = _call(service, token, "GET", "/api/v1/operator/holds")
    assert listed.status_code == 200 and subject not in listed.text and "subject_hash" not in listed.text
    assert {h["hold_id"] for h in listed.json()["holds"]} >= {hold["hold_id"], on_table.json()["hold_id"]}

    path = f"/api/v1/operator/holds/{hold['hold_id']}/release"
    released = _call(service, token, "POST", path)
    assert released.status_code == 200 and released.json()["released_by"] == "dana"
    assert not released.json()["active"]
    assert _call(service, token, "POST", path).status_code == 409
    assert _call(service, token, "POST", "/api/v1/operator/holds/hold-0000000000000000/release").status_code == 404
    actions = [e["action"] for e in _operator_events(service) if e["operator"] == "dana"]
    assert actions[:2] == ["place hold", "place hold"] and "release hold" in actions
