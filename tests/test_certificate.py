"""Certificates (`dsr certificate`), the run report as a page (`dsr run --html`) and the run history
the operator dashboard reads, all from one real run over a tiny lake."""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from typer.testing import CliRunner

from helpers import SEED, make_settings, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.cli import app
from lakehouse_dsr.evidence.certificate import build_certificate, certificate_html, check_certificate, sign
from lakehouse_dsr.exceptions import DsrError, LedgerError
from lakehouse_dsr.keys import Keyring, keyed_hash, rotate_key
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger, RunRecord
from lakehouse_dsr.ledger.requests import RequestInput, utc_now

DSR = Path(sys.executable).parent / "dsr"
USERS = 30
ERASED = [synth.user_id(SEED, i) for i in range(3)] + [synth.user_id(SEED, USERS + 1)]  # the last: in no table
ACCESS = synth.user_id(SEED, 5)
OPEN = synth.user_id(SEED, 6)  # submitted after the run: stays open


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("certificates")
    settings = make_settings(root)
    attach(spark, settings)
    synth.generate(spark, settings, users=USERS, events=300, seed=SEED, batches=2)
    events = spark.table(settings.table("demo.events"))
    rows_before = {s: events.where(F.col("user_id") == s).count() for s in ERASED}  # counts only reach the driver
    now = utc_now()
    ledger = Ledger(settings)
    received = [now, now - timedelta(days=200), now - timedelta(days=40), now]  # met, missed, extended and met
    ledger.submit([RequestInput(s, "erase", reg, at) for s, reg, at in zip(ERASED, ["gdpr", "ccpa", "gdpr", "gdpr"],
                                                                           received, strict=True)]
                  + [RequestInput(ACCESS, "access", "gdpr")])
    # ids made in the same millisecond do not sort by submission: map them while the ledger holds the ids
    subject_of = {r["request_id"]: r["subject_id"] for r in ledger.requests()}
    request_of = {s: rid for rid, s in subject_of.items()}
    missed, extended = request_of[ERASED[1]], request_of[ERASED[2]]
    ledger.extend(extended, "many systems to search")
    config = write_config(settings, root / "dsr.yaml")
    result = CliRunner().invoke(app, ["-c", str(config), "run", "--report", str(root / "run.json"),
                                      "--html", str(root / "run.html"), "--export-dir", str(root / "exports")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((root / "run.json").read_text())
    (opened,) = ledger.submit([RequestInput(OPEN, "erase")]).created
    access, erase_ids = request_of[ACCESS], [request_of[s] for s in ERASED]
    emails = [r.email for r in synth.users_df(spark, USERS, SEED).select("email").collect()]  # generated, no table
    return {"settings": settings, "root": root, "config": config, "ledger": ledger, "report": report,
            "rows_before": rows_before, "erase_ids": erase_ids, "access": access, "open": opened,
            "missed": missed, "extended": extended, "output": result.output,
            "subjects": [synth.user_id(SEED, i) for i in range(USERS)] + ERASED + [OPEN] + emails,
            "certificates": {rid: build_certificate(ledger, rid) for rid in [*erase_ids, access]}}


def _no_identifier(lake, text: str) -> None:
    found = [s for s in lake["subjects"] if s in text]
    assert not found, f"{len(found)} subject identifier(s) in an artefact"
    key = lake["ledger"].key
    assert not [s for s in ERASED if keyed_hash(key, s) in text], "a subject's keyed hash in an artefact"


def test_figures_match_the_run_report(lake):
    report, certs = lake["report"], lake["certificates"]
    erase_certs = [certs[rid] for rid in lake["erase_ids"]]
    assert len(erase_certs) == len(ERASED)
    for name, figures in report["per_table"].items():
        entries = [c["tables"][name] for c in erase_certs]
        # each row belongs to one subject: the requests' rows add up to the table's rows erased or redacted
        assert sum(e["rows"] for e in entries) == report["tables"][name]["erase"]["rows_changed"] == figures["rows"]
        for e in entries:  # the batch's one commit per table and its purge
            assert e["action"] == figures["action"]
            assert (e["files_rewritten"], e["bytes_rewritten"], e["snapshots_expired"]) == (
                figures["files_rewritten"], figures["bytes_rewritten"], figures["snapshots_expired"])
            assert e["verified"] and e["checks"] == ["live", "history", "storage"] and e["collateral_check"]
            assert e["storage_scan"].startswith("clean: no row of the subject in any file on storage")
            assert e["method"].startswith("keyed hash (HMAC-SHA256) of every key value")
    assert report["per_table"]["demo.events"]["files_rewritten"] >= 1
    assert report["per_table"]["demo.orders"]["action"] == "redact"
    for subject, cert in zip(ERASED, erase_certs, strict=True):
        assert cert["tables"]["demo.events"]["rows"] == lake["rows_before"][subject]
        assert cert["totals"]["rows"] == sum(t["rows"] for t in cert["tables"].values())
        assert cert["runs"]["completed_in"] == report["run_id"]
    assert erase_certs[-1]["totals"]["rows"] == 0  # the subject no table knew: searched, nothing found


def test_deadlines(lake):
    certs, ledger = lake["certificates"], lake["ledger"]
    for rid in lake["erase_ids"]:
        req, status = certs[rid]["request"], ledger.request(rid)
        assert (req["due"], req["extended"], req["regulation"]) == (status.due_date, status.extended,
                                                                     status.regulation)
        assert (req["received"], req["completed"]) == (status.received, status.completed)
        met = req["completed"][:10] <= req["due"]
        assert req["deadline_met"] is met
        assert (req["days_before_due"] >= 0) is met
    assert not certs[lake["missed"]]["request"]["deadline_met"]
    assert certs[lake["missed"]]["request"]["days_before_due"] == -(200 - 45)
    ext = certs[lake["extended"]]["request"]
    assert ext["extended"] and ext["deadline_met"]  # 40 days old: late without the extension
    assert sum(c["request"]["deadline_met"] for c in certs.values()) == 4


def test_access_certificate(lake):
    cert = lake["certificates"][lake["access"]]
    export = lake["report"]["export"]
    assert cert["request"]["type"] == "access" and cert["request"]["deadline_met"]
    assert {t: f["rows"] for t, f in cert["tables"].items() if f["rows"]} == {t: n for t, n in export["rows"].items()
                                                                                if n}
    assert cert["totals"]["rows"] > 0
    manifest = json.loads(Path(export["manifest"]).read_text())
    (entry,) = manifest["requests"]
    assert cert["package"]["sha256"] == entry["sha256"]
    assert check_certificate(cert, lake["ledger"]).intact


def test_signature_detects_any_change(lake):
    ledger = lake["ledger"]
    cert = lake["certificates"][lake["missed"]]
    ok = check_certificate(json.loads(json.dumps(cert, indent=1)), ledger)  # as a file would hold it
    assert ok.intact and ok.reason.startswith("intact") and ok.key_id == ledger.keyring.active_id

    def tampered(change) -> str:
        doc = copy.deepcopy(cert)
        change(doc)
        result = check_certificate(doc, ledger)
        assert not result.intact
        return result.reason

    altered = [
        lambda d: d["request"].update(deadline_met=True),
        lambda d: d["request"].update(due="2099-01-01"),
        lambda d: d["request"].update(completed=d["request"]["received"]),
        lambda d: d["tables"]["demo.events"].update(rows=d["tables"]["demo.events"]["rows"] + 1),
        lambda d: d["tables"]["demo.events"].update(rows=float(d["tables"]["demo.events"]["rows"])),  # 5 -> 5.0
        lambda d: d["tables"]["demo.orders"].update(verified=False),
        lambda d: d["tables"].pop("demo.users"),
        lambda d: d.update(note="approved"),
        lambda d: d["signature"].update(value=("0" if d["signature"]["value"][0] != "0" else "1")
                                        + d["signature"]["value"][1:]),
    ]
    for change in altered:
        assert tampered(change).startswith("ALTERED")
    assert "not a lakehouse-dsr certificate" in tampered(lambda d: d.pop("signature"))
    assert "not a lakehouse-dsr certificate" in tampered(lambda d: d.pop("format"))
    assert "malformed" in tampered(lambda d: d["signature"].update(algorithm="none"))
    assert "does not hold" in tampered(lambda d: d["signature"].update(key_id="deadbeef"))
    assert "(malformed id)" in tampered(lambda d: d["signature"].update(key_id="x" * 500))
    # a well-formed certificate signed by another engine's key
    forged = sign({**copy.deepcopy(cert), "request": {**cert["request"], "deadline_met": True}},
                  Keyring(secrets.token_bytes(32)))
    assert "does not hold" in check_certificate(forged, ledger).reason
    for garbage in (None, [], "text", 3, {"signature": "x", "format": "lakehouse-dsr certificate 1"}):
        assert not check_certificate(garbage, ledger).intact


def test_certificates_survive_key_rotation(lake):
    settings = lake["settings"]
    before = build_certificate(Ledger(settings), lake["access"])
    rotation = rotate_key(settings.key_file())
    after = Ledger(settings)  # a new process's view: the new key active, the old one retired
    old = check_certificate(before, after)
    assert old.intact and old.key_id == rotation.old_id and "(now retired)" in old.reason
    fresh = build_certificate(after, lake["access"])
    assert fresh["signature"]["key_id"] == rotation.new_id and check_certificate(fresh, after).intact


def test_pages(lake):
    certs = lake["certificates"]
    for rid, cert in certs.items():
        page = certificate_html(cert)
        _no_identifier(lake, page)
        _no_identifier(lake, json.dumps(cert))
        assert rid in page and cert["signature"]["value"] in page
        assert "<script" not in page and "src=" not in page and "href=" not in page and "://" not in page
        for name, figures in cert["tables"].items():
            assert f"<td>{name}</td>" in page and f"<td class=n>{figures['rows']:,}</td>" in page
    missed = certificate_html(certs[lake["missed"]])
    assert "deadline missed" in missed and "155 day(s) late" in missed and "Certificate of erasure" in missed
    assert "(extended once)" in certificate_html(certs[lake["extended"]])
    assert "Certificate of access" in certificate_html(certs[lake["access"]])
    hostile = copy.deepcopy(certs[lake["missed"]])
    hostile["tables"]["<script>alert(1)</script>"] = hostile["tables"]["demo.events"]
    assert "<script>" not in certificate_html(hostile) and "&lt;script&gt;" in certificate_html(hostile)


def test_an_erasure_certificate_says_per_topic_what_was_done_and_proven(tmp_path):
    """Evidence with the data map's Kafka topics (as runner/rules.py `with_topics` writes it, through
    the ledger): the certificate lists each topic, signs it, and its page shows it. Spark-free."""
    from jsonschema import Draft202012Validator

    from lakehouse_dsr.evidence.certificate import Certificate
    from lakehouse_dsr.lake.kafka import FOREVER, UNBOUNDED, TopicConfig
    from lakehouse_dsr.ledger.ledger import Outcome
    from lakehouse_dsr.runner import rules
    from lakehouse_dsr.stages.topics import Found, TopicSettlement

    settings = make_settings(tmp_path)
    ledger = Ledger(settings)
    subjects = ["topic-person-1", "topic-person-2"]
    with_topics, without = ledger.submit([RequestInput(s, "erase") for s in subjects]).created
    written = datetime(2026, 11, 20, 8, 30, tzinfo=UTC)
    days = 86_400_000
    settled = {  # a compacted topic compaction has cleaned, a deleting one, and one whose retention is accepted
        "profiles": TopicSettlement("profiles", TopicConfig("profiles", 3, frozenset({"compact"}), FOREVER,
                                                            3_600_000, days, days), None, records_read=40),
        "clicks": TopicSettlement("clicks", TopicConfig("clicks", 2, frozenset({"delete"}), 7 * days, UNBOUNDED,
                                                        days, days), None, records_read=900),
        "audit": TopicSettlement("audit", TopicConfig("audit", 1, frozenset({"delete"}), 400 * days, UNBOUNDED,
                                                      days, days), "fraud audit trail, Art. 17(3)(e)", records_read=12,
                                 found={with_topics: Found(2, written)}),
    }
    table = {"action": "delete", "rows": 3, "snapshot_id": 7, "rounds": 1, "purged": True,
             "data_files_rewritten": 1, "bytes_rewritten": 2048, "snapshots_expired": 1, "files_deleted": 2,
             "orphans_removed": 0, "checks": {"live": True, "history": True, "storage": True},
             "verification": {"method": "keyed hash", "passed": True, "one_scan": False, "refs_checked": []}}
    evidence = {"version": 1, "run_id": "run-topics", "verified_at": "2026-11-24T00:00:00+00:00",
                "tables": {"demo.events": table}}
    [topical] = rules.with_topics([Outcome(with_topics, "completed", evidence=evidence)], settled, {})
    assert topical.status == "completed"  # the audit topic's records are accepted
    ledger.finish([topical, Outcome(without, "completed", evidence=evidence)], "run-topics")

    cert = build_certificate(ledger, with_topics)
    method = ("keyed hash (HMAC-SHA256) of each record's key field, compared with the request's stored hashes, in "
              "every record from the earliest offset of each partition")
    assert cert["topics"] == {
        "audit": {"action": "retention", "cleanup_policy": "delete", "retention_ms": 400 * days, "tombstones": 0,
                  "records_left": 2, "passed": False, "gone_by": "2027-12-26T08:30:00Z",  # + 1 + 400 days
                  "accepted": "fraud audit trail, Art. 17(3)(e)", "method": method},
        "clicks": {"action": "retention", "cleanup_policy": "delete", "retention_ms": 7 * days, "tombstones": 0,
                   "records_left": 0, "passed": True, "gone_by": None, "method": method},
        "profiles": {"action": "tombstone", "cleanup_policy": "compact", "retention_ms": FOREVER, "tombstones": 0,
                     "records_left": 0, "passed": True, "gone_by": None, "method": method},
    }
    assert list(cert["topics"]) == ["audit", "clicks", "profiles"]
    assert cert["totals"] == {"tables": 1, "rows": 3}  # topics hold records, not the tables' rows
    plain = build_certificate(ledger, without)
    assert "topics" not in plain  # evidence without topics: no section (and the same bytes signed as before)
    published = Draft202012Validator(Certificate.model_json_schema())
    for doc in (cert, plain):
        published.validate(doc)
        assert Certificate.model_validate(doc).model_dump(mode="json", exclude_unset=True) == doc

    assert check_certificate(json.loads(json.dumps(cert)), ledger).intact  # the topics are signed
    for change in (lambda d: d["topics"]["audit"].update(passed=True),
                   lambda d: d["topics"]["audit"].pop("accepted"),
                   lambda d: d["topics"]["clicks"].update(records_left=1),
                   lambda d: d["topics"].pop("profiles"),
                   lambda d: d.pop("topics"),
                   lambda d: d.update(topics={})):
        doc = copy.deepcopy(cert)
        change(doc)
        assert check_certificate(doc, ledger).reason.startswith("ALTERED")
    assert not check_certificate({**copy.deepcopy(plain), "topics": cert["topics"]}, ledger).intact

    page = certificate_html(cert)
    assert "What was done, topic by topic" in page and "What was done, topic by topic" not in certificate_html(plain)
    assert "<td>audit</td><td>left to the topic&#x27;s time retention</td><td>delete</td><td>400 day(s)</td>" in page
    assert "<td>profiles</td><td>record keys tombstoned for compaction</td><td>compact</td><td>none (compacted)</td>" \
        in page
    assert "kept (accepted)" in page and "fraud audit trail, Art. 17(3)(e); gone by 2027-12-26T08:30:00Z" in page
    assert page.count("yes: none left") == 2 and "topic audit, topic clicks, topic profiles" in page
    assert not [s for s in subjects if s in page or s in json.dumps(cert)]


def test_run_html_page(lake):
    path, report = lake["root"] / "run.html", lake["report"]
    page = path.read_text()
    assert path.stat().st_mode & 0o077 == 0
    _no_identifier(lake, page)
    _no_identifier(lake, lake["output"])
    _no_identifier(lake, (lake["root"] / "run.json").read_text())
    assert page.count("<svg") == 3 and "<script" not in page and "src=" not in page and "href=" not in page
    assert "://" not in page  # nothing to fetch
    for title in ("Seconds per stage", "Rows erased or redacted per table", "Bytes rewritten per table"):
        assert f'aria-label="{title}' in page
    for stage, seconds in report["seconds"].items():
        assert f"<title>{stage}: {seconds:,.2f} s</title>" in page
    for name, figures in report["per_table"].items():
        assert f"<title>{name}: {figures['rows']:,}</title>" in page
    for r in report["requests"]:
        assert r["request_id"] in page


def test_run_history(lake):
    ledger, report = Ledger(lake["settings"]), lake["report"]
    (row,) = ledger.runs()
    assert row["run_id"] == report["run_id"] and row["seconds"] == report["seconds"]
    assert row["requests_completed"] == report["summary"]["completed"] == len(ERASED) + 1
    assert (row["requests_failed"], row["requests_erased"]) == (0, 0)
    assert row["tables"] == {t: {k: f[k] for k in ("action", "rows", "bytes_rewritten", "files_rewritten")}
                             for t, f in report["per_table"].items()}
    assert row["started_at"] < row["finished_at"]
    _no_identifier(lake, json.dumps(ledger.runs()))

    later = datetime.now(UTC)
    ledger.record_run(RunRecord("run-later", later, later + timedelta(seconds=3), {"erase": 1.5},
                                {"demo.events": {"action": "delete", "rows": 7, "bytes_rewritten": 1000,
                                                 "files_rewritten": 1}}, 1, 1, 0))
    assert [r["run_id"] for r in ledger.runs()] == ["run-later", report["run_id"]]
    assert [r["run_id"] for r in ledger.runs(limit=1)] == ["run-later"]
    totals = {t["table"]: t for t in ledger.table_totals()}
    assert set(totals) == set(report["per_table"])
    events = report["per_table"]["demo.events"]
    assert totals["demo.events"] == {"table": "demo.events", "rows": events["rows"] + 7,
                                     "bytes_rewritten": events["bytes_rewritten"] + 1000, "runs": 2}
    assert totals["demo.users"]["runs"] == 1 and totals["demo.users"]["rows"] == report["per_table"]["demo.users"][
        "rows"] == len(ERASED) - 1


def test_bad_input_changes_nothing(lake):
    ledger = lake["ledger"]
    before = ledger.store.snapshot_id("requests"), ledger.store.snapshot_id("audit")
    with pytest.raises(LedgerError, match="no request 'req-00000000000000000000f'"):
        build_certificate(ledger, "req-00000000000000000000f")
    with pytest.raises(LedgerError, match="no request with that id") as raised:
        build_certificate(ledger, ERASED[0])  # a subject id where a request id belongs: not echoed
    assert ERASED[0] not in str(raised.value)
    with pytest.raises(LedgerError, match="is received, not completed"):
        build_certificate(ledger, lake["open"])
    assert (ledger.store.snapshot_id("requests"), ledger.store.snapshot_id("audit")) == before


def _dsr(lake, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DSR), "-c", str(lake["config"]), "certificate", *args], cwd=lake["root"],
                          capture_output=True, text=True, timeout=120)


def test_cli(lake, tmp_path):
    rid = lake["missed"]
    made = _dsr(lake, rid, "--json", str(tmp_path / "c.json"), "--html", str(tmp_path / "c.html"))
    assert made.returncode == 0, made.stderr
    assert f"{rid}: erase (ccpa)" in made.stdout and "deadline missed" in made.stdout
    assert (tmp_path / "c.json").stat().st_mode & 0o077 == 0
    _no_identifier(lake, made.stdout + (tmp_path / "c.json").read_text() + (tmp_path / "c.html").read_text())
    checked = _dsr(lake, "--check", str(tmp_path / "c.json"))
    assert checked.returncode == 0 and "intact: signed by this engine" in checked.stdout

    doc = json.loads((tmp_path / "c.json").read_text())
    doc["request"]["deadline_met"] = True
    (tmp_path / "t.json").write_text(json.dumps(doc))
    (tmp_path / "other.json").write_text('{"tables": {}}')
    (tmp_path / "garbage.json").write_bytes(b"\x00\x01 not json")
    (tmp_path / "half.json").write_text('{"format": "lakehouse-dsr certificate 1", ')
    for args, code, message in [  # the console script's exit codes
        (["--check", str(tmp_path / "t.json")], 1, "ALTERED"),
        (["--check", str(tmp_path / "other.json")], 1, "not a lakehouse-dsr certificate"),
        (["--check", str(tmp_path / "garbage.json")], 2, "is not JSON"),
        (["req-00000000000000000000f"], 2, "no request"),
    ]:
        result = _dsr(lake, *args)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert message in result.stdout + result.stderr, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    for args, message in [  # in process: the error the console script turns into exit 2
        (["--check", str(tmp_path / "half.json")], "is not JSON (line 1"),
        (["--check", str(tmp_path / "absent.json")], "does not exist"),
        (["--check", str(tmp_path / "c.json"), rid], "--check FILE takes no request id"),
        ([], "give a completed request's id"),
        ([lake["open"]], "is received, not completed"),
    ]:
        result = CliRunner().invoke(app, ["-c", str(lake["config"]), "certificate", *args])
        assert isinstance(result.exception, DsrError) and message in str(result.exception), (args, result.output)
    assert not (tmp_path / "absent.json").exists()


def test_the_service_serves_certificates_runs_and_totals_to_operators_only(lake):
    """`dsr serve` on this lake's config: what the dashboard and a compliance officer download."""
    from intake_server import served

    ledger, request_id = Ledger(lake["settings"]), lake["erase_ids"][0]  # fresh: a test above rotates the key
    with served(lake["config"]) as server, server.operator() as operator, server.client() as anyone:
        url = f"/api/v1/operator/requests/{request_id}/certificate"
        assert anyone.get(url).status_code == 401 and anyone.get("/api/v1/operator/runs").status_code == 401
        downloaded = operator.get(url)
        assert downloaded.status_code == 200 and "attachment" in downloaded.headers["content-disposition"]
        document = downloaded.json()
        assert check_certificate(document, ledger).intact
        expected = build_certificate(ledger, request_id)
        assert {k: v for k, v in document.items() if k not in ("issued_at", "signature")} == {
            k: v for k, v in expected.items() if k not in ("issued_at", "signature")}
        page = operator.get(url, params={"format": "html"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert request_id in page.text
        assert operator.get(f"/api/v1/operator/requests/{lake['open']}/certificate").status_code == 409
        assert operator.get(f"/api/v1/operator/requests/req-{'0' * 21}/certificate").status_code == 404
        assert operator.get("/api/v1/operator/runs").json()["runs"] == ledger.runs(10)
        assert operator.get("/api/v1/operator/tables").json()["tables"] == ledger.table_totals()
        for text in (downloaded.text, page.text, operator.get("/api/v1/operator/requests").text):
            _no_identifier(lake, text)


def test_the_certificate_model_and_the_service_schemas_describe_real_certificates_runs_and_totals(lake):
    """The published Certificate model (and the OpenAPI document of the operator endpoints) describe what
    a real run's certificates, run history and table totals are, field for field: checked with an
    independent validator (jsonschema), and documents that drift fail."""
    from jsonschema import Draft202012Validator, ValidationError

    from intake_server import OPERATOR_TOKEN
    from lakehouse_dsr.evidence.certificate import Certificate
    from lakehouse_dsr.service.app import create_app
    from lakehouse_dsr.service.intake import Intake
    from openapi_check import CheckedClient, OpenAPI

    published = Draft202012Validator(Certificate.model_json_schema())
    for cert in lake["certificates"].values():
        published.validate(cert)
        assert Certificate.model_validate(cert).model_dump(mode="json", exclude_unset=True) == cert
    access = lake["certificates"][lake["access"]]
    assert "package" in access and not any("package" in c for c in lake["certificates"].values() if c is not access)
    drifted = copy.deepcopy(lake["certificates"][lake["missed"]])
    for change in (lambda d: d.update(note="approved"), lambda d: d["tables"]["demo.events"].update(rows="5"),
                   lambda d: d["request"].pop("deadline_met"), lambda d: d["signature"].update(algorithm="none")):
        doc = copy.deepcopy(drifted)
        change(doc)
        with pytest.raises(ValidationError):
            published.validate(doc)

    intake = Intake(lake["settings"])
    try:
        app = create_app(lake["settings"], intake, OPERATOR_TOKEN)
        openapi = OpenAPI(app.app.openapi())
        operator = CheckedClient(app, openapi, {"Authorization": f"Bearer {OPERATOR_TOKEN}"})
        ledger = Ledger(lake["settings"])
        for request_id in lake["certificates"]:  # each answer checked against the OpenAPI document
            document = operator.get(f"/api/v1/operator/requests/{request_id}/certificate").json()
            assert check_certificate(document, ledger).intact
            page = operator.get(f"/api/v1/operator/requests/{request_id}/certificate", params={"format": "html"})
            assert page.headers["content-type"].startswith("text/html")
        runs, totals = operator.get("/api/v1/operator/runs").json(), operator.get("/api/v1/operator/tables").json()
        assert runs["runs"] and totals["tables"]
        # what the ledger holds, in its order of fields: the models changed nothing
        assert [list(r.items()) for r in runs["runs"]] == [list(r.items()) for r in ledger.runs(10)]
        assert totals["tables"] == ledger.table_totals()
        assert {(path, status) for path, _, status in operator.seen} == {
            ("/api/v1/operator/requests/{request_id}/certificate", 200), ("/api/v1/operator/runs", 200),
            ("/api/v1/operator/tables", 200)}
        operator.close()
    finally:
        intake.close()
