"""Certificates people can read: per completed request, what was done in each table (and, for an
erasure, in each Kafka topic of the data map) and how it was proven, signed so that any change to
the document is detected.

Built on the control plane: one read of the requests table, pruned to the files that may hold the
request (no Spark, about a second). The figures come from the evidence the run recorded when it
completed the request (runner/rules.py `erasure_outcomes`). A certificate holds no subject
identifier, not even its keyed hash: its fields are picked one by one from the evidence, never copied wholesale.

Signature: HMAC-SHA256 over the canonical JSON (sorted keys, fixed separators, ASCII) of everything
but the `signature` field, under a key derived for this purpose from the engine's secret key
(keys.py). The signature names the secret key's id, so certificates signed before a
`dsr rotate-key` still check against the retired key, and a document signed by any other key fails.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from ..exceptions import DsrError, LedgerError
from ..keys import KEY_ENV, Keyring, derive_key
from ..ledger.ledger import Ledger
from ..ledger.requests import REQUEST_ID, Regulation, RequestType, utc_now, utc_text
from ..ledger.store import EqualTo
from .html import Markup, badge, code, esc, fact_list, human_bytes, page, table

FORMAT = "lakehouse-dsr certificate 1"
ALGORITHM = "HMAC-SHA256"
_PURPOSE = "lakehouse-dsr certificate"  # derives the signing key (keys.derive_key)
_COLUMNS = ("request_id", "request_type", "regulation", "status", "received_at", "due_date", "extended",
            "completed_at", "run_id", "evidence", "drop_work_items")  # no subject_id, no subject_hash
_KEY_ID = re.compile(r"[0-9a-f]{8}")
_TITLES = {"erase": "Certificate of erasure", "access": "Certificate of access",
           "opt_out": "Certificate of opt-out of sale and sharing", "opt_in": "Certificate of opt-in"}
_ACTIONS = {"delete": "rows deleted", "redact": "personal columns set to NULL, rows kept",
            "shred": "vault entry shredded: rows kept, no longer linkable or decryptable",
            "recompute": "recomputed without the erased rows", "export": "rows exported",
            "exclude": "rows taken out of the share", "include": "rows shared again"}
_TOPIC_ACTIONS = {"tombstone": "record keys tombstoned for compaction",
                  "retention": "left to the topic's time retention"}


# -- the document's shape ---------------------------------------------------------------------------
# What build_certificate makes, as models (their JSON Schema is published, and the operator
# certificate endpoint declares it). They describe the document; they never make it: the signed
# dict is written and served as built, so the models cannot change a byte of it or its signature.

def _no_default(schema: dict[str, Any]) -> None:
    """For a field left out of the document when it does not apply (never `null`): no `default` shown."""
    schema.pop("default", None)


_Timestamp = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$",
                                  json_schema_extra={"format": "date-time"})]
_Day = Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}$", json_schema_extra={"format": "date"})]
_Count = Annotated[int, Field(ge=0)]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CertifiedRequest(_Part):
    """The request and its deadline."""

    request_id: str = Field(pattern=r"^req-[0-9a-f]{21}$", description="the request's id in the ledger")
    type: RequestType = Field(description="what was asked: erase, access, opt_out or opt_in")
    regulation: Regulation
    received: _Timestamp = Field(description="when the request was received (UTC)")
    due: _Day = Field(description="the day it was due, the one allowed extension included")
    extended: bool = Field(description="the deadline was extended (once, as the regulation allows)")
    completed: _Timestamp = Field(description="when it was completed (UTC)")
    deadline_met: bool = Field(description="completed on or before the day it was due")
    days_before_due: int = Field(description="days between completion and the due day (negative: days late)")
    drop_work_items: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9]{12}$")]] | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="California DROP: the work items this request answers (absent for a request DROP did not bring)")


class CertificateRuns(_Part):
    """The runs that did the work."""

    completed_in: str = Field(description="the run that completed and proved the request")
    erased_in: str | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="the earlier run that erased the subject, when the physical purge was batched into a later run "
                    "(absent otherwise)")


class TableErasure(_Part):
    """What was done in one table for an erase, opt-out or opt-in request, and how it was proven."""

    action: str = Field(description="delete, redact, shred or recompute; exclude or include for shares; keep for a "
                                    "table exempt from erasure; 'erased in an earlier run' when the evidence names "
                                    "none")
    rows: _Count = Field(description="the subject's rows deleted, redacted or taken out of the share")
    snapshots_expired: _Count = Field(description="snapshots expired by the purge")
    files_rewritten: _Count = Field(description="data files rewritten by the batch's erase commit in this table")
    bytes_rewritten: _Count = Field(description="bytes rewritten by that commit")
    files_deleted: _Count = Field(description="files deleted from storage by the purge")
    orphans_removed: _Count = Field(description="unreferenced files removed from storage")
    checks: list[Literal["live", "history", "storage"]] = Field(
        description="where the verification looked for the subject: the live snapshot, every retained snapshot, "
                    "every file on storage")
    collateral_check: bool | None = Field(
        description="the erase commit changed no row nobody asked about (null: not checked)")
    storage_scan: str = Field(description="the storage scan's verdict, in words ('clean: ...', 'failed', 'not "
                                          "scanned (live data only)', 'not applicable (opt-in)')")
    method: str = Field(description="how the table was proven, in words")
    verified: bool = Field(description="no check found the subject")
    exempt: str | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="the exemption from erasure the table is kept under (absent for other tables)")
    kept: bool | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="an exempt table holds the subject's data, kept under the exemption (then `verified` is false)")


class TableExport(_Part):
    """What an access request exported from one table."""

    action: Literal["export"]
    rows: _Count = Field(description="the subject's rows exported")


class TopicErasure(_Part):
    """What an erasure did in one Kafka topic of the data map, and how the topic was proven: read back
    from the earliest offset of each partition (stages/topics.py)."""

    action: Literal["tombstone", "retention"] = Field(
        description="tombstone: the record keys of the subject's latest records were tombstoned for compaction "
                    "(compacted topics); retention: left to the topic's time retention (deleting topics)")
    cleanup_policy: str = Field(description="the topic's cleanup.policy when the run read it (delete, compact, or "
                                            "compact,delete)")
    retention_ms: int = Field(ge=-1, description="the topic's retention.ms when the run read it (-1: kept forever)")
    tombstones: _Count = Field(description="record keys of the subject's latest records tombstoned by the run that "
                                         "completed the request (0 where an earlier run's tombstones left nothing "
                                         "to tombstone: that run kept the request open until compaction)")
    records_left: _Count = Field(description="the subject's records the read-back found still in the topic")
    passed: bool = Field(description="no record of the subject was left in the topic")
    gone_by: _Timestamp | None = Field(
        description="when the topic's own settings guarantee the records left are gone (UTC); null when none "
                    "was left, or when nothing in the topic's configuration removes them")
    accepted: str | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="the data map's accepted reason for the records left (accept_retention): the request was "
                    "completed with them in the topic (absent when none was left, or none accepted)")
    method: str = Field(description="how the topic was read and the subject looked for, in words")


class CertificateTotals(_Part):
    tables: _Count = Field(description="tables listed under `tables`")
    rows: _Count = Field(description="the sum of their rows")


class AccessPackage(_Part):
    """An access request's package: its checksum, as the run's manifest holds it."""

    sha256: str = Field(description="the package file's SHA-256 (hex)")
    bytes: _Count = Field(description="the package file's size")
    verification: str = Field(description="how the checksum was checked, in words")


class CertificateSignature(_Part):
    """HMAC-SHA256 over the canonical JSON (sorted keys, separators `,` and `:`, ASCII) of every field but
    `signature`, under a key derived from the engine's secret key."""

    algorithm: Literal["HMAC-SHA256"]
    key_id: str = Field(pattern=r"^[0-9a-f]{8}$", description="the engine key that signed (first 8 hex digits of "
                                                              "its SHA-256); retired keys still check")
    value: str = Field(pattern=r"^[0-9a-f]{64}$", description="the HMAC, hex")


class Certificate(_Part):
    """A signed certificate of a completed request: what was done in each table (and each Kafka topic of
    an erasure) and how it was proven (erasure, opt-out, opt-in), or what was exported (access). It
    holds no subject identifier.

    Any change to a field (added, removed or altered) breaks the signature: `dsr certificate --check FILE`
    says whether a file is intact."""

    format: Literal["lakehouse-dsr certificate 1"] = Field(description="the document's format and version")
    issued_at: _Timestamp = Field(description="when this copy was issued (UTC)")
    request: CertifiedRequest
    runs: CertificateRuns
    tables: dict[str, TableErasure | TableExport] = Field(
        description="per table (by name): erase, opt-out and opt-in requests list what was done and proven "
                    "(TableErasure), access requests what was exported (TableExport)")
    topics: dict[str, TopicErasure] | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="per Kafka topic of the data map (by name), for an erase request: what was done and how the "
                    "topic was proven (absent when the request's evidence has no topic: no topic in the data map, "
                    "or completed before topics were settled)")
    totals: CertificateTotals
    package: AccessPackage | SkipJsonSchema[None] = Field(
        None, json_schema_extra=_no_default,
        description="an access request's package (absent for other requests, and for an access request whose "
                    "run recorded no package checksum)")
    signature: CertificateSignature

def build_certificate(ledger: Ledger, request_id: str, now: datetime | None = None) -> dict:
    """The signed certificate of a completed request (a JSON-ready dict).

    Raises LedgerError for an unknown request or one not completed. Cost: one read of the requests
    table pruned to files that may hold `request_id`, and the key file.
    """
    rows = ledger.store.rows("requests", EqualTo("request_id", request_id), _COLUMNS)
    if not rows:  # what was asked for is echoed only when it is shaped like an id (it may be an identifier)
        shown = repr(request_id) if REQUEST_ID.fullmatch(request_id) else "with that id (ids look like req-<21 hex>)"
        raise LedgerError(f"no request {shown} in the ledger")
    r = rows[0]
    if r["status"] != "completed":
        raise LedgerError(f"request {request_id} is {r['status']}, not completed: a certificate is issued once the "
                          "request is completed and proven")
    evidence = json.loads(r["evidence"]) if r["evidence"] else {}
    completed, due = r["completed_at"], r["due_date"]
    runs = {"completed_in": r["run_id"]}
    if evidence.get("erased_in_run"):
        runs["erased_in"] = evidence["erased_in_run"]
    tables = _access_tables(evidence) if r["request_type"] == "access" else \
        {name: _table(entry) for name, entry in sorted(evidence.get("tables", {}).items())}
    request: dict[str, Any] = {
        "request_id": r["request_id"], "type": r["request_type"], "regulation": r["regulation"],
        "received": utc_text(r["received_at"]), "due": due.isoformat(), "extended": bool(r["extended"]),
        "completed": utc_text(completed), "deadline_met": completed.date() <= due,
        "days_before_due": (due - completed.date()).days,
    }
    if r["drop_work_items"]:
        request["drop_work_items"] = json.loads(r["drop_work_items"])
    doc = {
        "format": FORMAT,
        "issued_at": utc_text(now or utc_now()),
        "request": request,
        "runs": runs,
        "tables": tables,
        "totals": {"tables": len(tables), "rows": sum(t["rows"] for t in tables.values())},
    }
    if r["request_type"] != "access" and evidence.get("topics"):
        doc["topics"] = {name: _topic(entry) for name, entry in sorted(evidence["topics"].items())}
    if r["request_type"] == "access" and evidence.get("sha256"):
        doc["package"] = {"sha256": evidence["sha256"], "bytes": evidence.get("bytes", 0),
                          "verification": "the package's SHA-256 matched the run's manifest"}
    return sign(doc, ledger.keyring)


def _table(entry: dict) -> dict:
    """One table of an erasure, from the request's evidence (only named fields: nothing else passes)."""
    checks = entry.get("checks", {})
    proof = entry.get("verification", {})
    # completed evidence written before `verification` existed: the batch-wide checks
    passed = proof.get("passed", all(checks.values()))
    action = entry.get("action", "erased in an earlier run")
    return {
        "action": action,
        "rows": entry.get("rows", 0),
        "snapshots_expired": entry.get("snapshots_expired", 0),
        "files_rewritten": entry.get("data_files_rewritten", 0),
        "bytes_rewritten": entry.get("bytes_rewritten", 0),
        "files_deleted": entry.get("files_deleted", 0),
        "orphans_removed": entry.get("orphans_removed", 0),
        "checks": [c for c in ("live", "history", "storage") if c in checks],
        "collateral_check": checks.get("collateral"),
        "storage_scan": _storage_scan(action, "storage" in checks, passed),
        "method": proof.get("method") or "not recorded (completed by an earlier version)",
        "verified": passed,
        **({"exempt": entry["exempt"], "kept": bool(entry.get("kept"))} if entry.get("exempt") else {}),
    }


def _topic(entry: dict) -> dict:
    """One topic of an erasure, from the request's evidence (models.TopicProof; only named fields pass)."""
    gone_by = entry.get("gone_by")
    return {
        "action": entry["action"],
        "cleanup_policy": entry["cleanup_policy"],
        "retention_ms": entry["retention_ms"],
        "tombstones": entry.get("tombstones", 0),
        "records_left": entry.get("records_left", 0),
        "passed": entry["passed"],
        "gone_by": utc_text(datetime.fromisoformat(gone_by).astimezone(UTC)) if gone_by else None,
        **({"accepted": entry["accepted"]} if entry.get("accepted") else {}),
        "method": entry["method"],
    }


def _storage_scan(action: str, scanned: bool, passed: bool) -> str:
    if action == "include":  # an opt-in: the subject's rows are meant to be there
        return "not applicable (opt-in)"
    if action == "keep":
        return "not applicable (exempt from erasure)"
    if not scanned:
        return "not scanned (live data only)"
    if not passed:
        return "failed"
    if action == "recompute":
        return "clean: no file on storage but the live ones"
    if action == "shred":
        return "clean: no vault entry of the subject in any vault file on storage"
    return "clean: no row of the subject in any file on storage, unreferenced files included"


def _access_tables(evidence: dict) -> dict:
    return {name: {"action": "export", "rows": int(n)} for name, n in sorted(evidence.get("rows", {}).items())}


# -- signature ----------------------------------------------------------------------------------------
def _canonical(doc: dict) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def certificate_digest(doc: dict) -> str:
    """What identifies a certificate's content: `sha256:` and the hex SHA-256 of the canonical JSON of
    every field but `issued_at` and `signature`. Every copy issued for a request (each has its own
    `issued_at`, and a signature by whichever key is active) has the same digest, so a receiver can
    check that a copy it downloads later certifies what it was told of (webhooks). Cost: hashing the
    document."""
    content = {k: v for k, v in doc.items() if k != "issued_at"}
    return f"sha256:{hashlib.sha256(_canonical(content)).hexdigest()}"


def _mac(secret: bytes, doc: dict) -> str:
    return hmac.new(derive_key(secret, _PURPOSE), _canonical(doc), hashlib.sha256).hexdigest()


def sign(doc: dict, keyring: Keyring) -> dict:
    """`doc` with its signature under the active key (any earlier signature replaced)."""
    return {**doc, "signature": {"algorithm": ALGORITHM, "key_id": keyring.active_id,
                                 "value": _mac(keyring.active, doc)}}


@dataclass(frozen=True)
class CertificateCheck:
    intact: bool
    reason: str
    key_id: str | None = None  # the engine key that signed it (intact certificates only)


def check_certificate(doc: object, ledger: Ledger) -> CertificateCheck:
    """Whether `doc` (a parsed certificate) is exactly as this engine signed it, under its active key
    or a retired one. Not intact: any field changed, added or removed, the signature removed or
    changed, or a signature by a key this engine does not hold. Cost: reads the key files only."""
    signature = doc.get("signature") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(signature, dict) or doc.get("format") != FORMAT:
        return CertificateCheck(False, "not a lakehouse-dsr certificate (no signature or no certificate format)")
    key_id, value = signature.get("key_id"), signature.get("value")
    if signature.get("algorithm") != ALGORITHM or not isinstance(key_id, str) or not isinstance(value, str):
        return CertificateCheck(False, f"the signature is malformed (expected {ALGORITHM} with a key id and a value)")
    shown = key_id if _KEY_ID.fullmatch(key_id) else "(malformed id)"
    key_file = ledger.settings.key_file()
    if not os.environ.get(KEY_ENV) and not key_file.exists():  # reading the key would create one
        return CertificateCheck(False, f"this engine has no secret key to check with ({key_file} does not exist)")
    keys = ledger.keyring.keys()
    if key_id not in keys:
        return CertificateCheck(False, f"signed with key {shown}, which this engine's keyring (active and retired "
                                       "keys) does not hold: not issued here, or that key was destroyed")
    if not hmac.compare_digest(_mac(keys[key_id], doc), value):
        return CertificateCheck(False, "ALTERED: the signature does not match the content (a field was changed, "
                                       "added or removed since it was signed)")
    retired = "" if key_id == ledger.keyring.active_id else " (now retired)"
    return CertificateCheck(True, f"intact: signed by this engine with key {key_id}{retired}", key_id)


def read_certificate(path: Path) -> object:
    """The parsed JSON of a certificate file; DsrError when it cannot be read or is not JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DsrError(f"{path} does not exist") from None
    except UnicodeDecodeError:
        raise DsrError(f"{path} is not UTF-8 text, so not a certificate") from None
    except OSError as exc:  # a directory, no permission, ...
        raise DsrError(f"{path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsrError(f"{path} is not JSON (line {exc.lineno}, column {exc.colno}), so not a certificate") from None


# -- the page ---------------------------------------------------------------------------------------
def _retention(topic: dict) -> str:
    """A topic's time retention in words (a compacted-only topic has none: retention.ms does not apply)."""
    if "delete" not in topic["cleanup_policy"].split(","):
        return "none (compacted)"
    ms = topic["retention_ms"]
    if ms == -1:
        return "forever (retention.ms -1)"
    days, rest = divmod(ms, 86_400_000)
    return f"{days:,} day(s)" if days and not rest else f"{ms / 1000:,g} s"


def _topic_verdict(topic: dict) -> Markup:
    if topic["passed"]:
        return badge("yes: none left", "ok")
    until = f"gone by {topic['gone_by']}" if topic["gone_by"] else "nothing removes them"
    if topic.get("accepted"):
        return Markup(f"{badge('kept (accepted)', 'warn')} {esc(topic['accepted'])}; {esc(until)}")
    return Markup(f"{badge('no', 'bad')} {esc(until)}")


def certificate_html(doc: dict) -> str:
    """A certificate as a self-contained page for a compliance officer (no script, no external
    resource, everything escaped). The signed JSON is what `dsr certificate --check` checks; the page
    shows its signature."""
    req, tables = doc["request"], doc["tables"]
    met = req["deadline_met"]
    deadline = badge("deadline met" if met else "deadline missed", "ok" if met else "bad")
    due = req["due"] + (" (extended once)" if req["extended"] else "")
    spare = req["days_before_due"]
    facts = [("request", req["request_id"]), ("type", req["type"]), ("regulation", req["regulation"].upper()),
             ("received", req["received"]), ("due", due), ("completed", req["completed"]),
             ("deadline", Markup(f"{deadline} {esc(f'{spare} day(s) to spare' if met else f'{-spare} day(s) late')}")),
             *((f"run ({k.replace('_', ' ')})", v) for k, v in doc["runs"].items()),
             *((("DROP work items", ", ".join(req["drop_work_items"])),) if req.get("drop_work_items") else ())]
    body = [f'<div class="card">{fact_list(facts)}</div>']
    access = req["type"] == "access"
    body.append(f"<h2>{'What was exported' if access else 'What was done, table by table'}</h2>")
    if access:
        body.append(table(["table", "action", "rows"], ([t, f["action"], f"{f['rows']:,}"]
                                                        for t, f in tables.items()), numeric=(2,)))
        if doc.get("package"):
            p = doc["package"]
            package = fact_list([("package SHA-256", code(p["sha256"])), ("package size", human_bytes(p["bytes"])),
                                 ("verification", p["verification"])])
            body.append(f'<div class="card">{package}</div>')
    else:
        body.append(table(
            ["table", "action", "rows", "snapshots expired", "files rewritten", "bytes rewritten",
             "storage scan", "verified"],
            ([t, _ACTIONS.get(f["action"], f["action"]), f"{f['rows']:,}", f"{f['snapshots_expired']:,}",
              f"{f['files_rewritten']:,}", human_bytes(f["bytes_rewritten"]), f["storage_scan"],
              badge("yes", "ok") if f["verified"] else badge("no", "bad")] for t, f in tables.items()),
            numeric=(2, 3, 4, 5)))
        body.append('<p class="sub">Files and bytes rewritten are those of the one commit per table that erased '
                    "the whole batch of requests this one was part of.</p>")
        topics = doc.get("topics") or {}
        if topics:
            body.append("<h2>What was done, topic by topic</h2>")
            body.append(table(
                ["topic", "action", "cleanup policy", "retention", "keys tombstoned", "records left", "proven"],
                ([t, _TOPIC_ACTIONS.get(f["action"], f["action"]), f["cleanup_policy"], _retention(f),
                  f"{f['tombstones']:,}", f"{f['records_left']:,}", _topic_verdict(f)] for t, f in topics.items()),
                numeric=(4, 5)))
            notes = ["Each topic was read back from the earliest offset of every partition after the run settled "
                     "it, and every record's value searched for the subject."]
            if any(not f["passed"] for f in topics.values()):
                notes.append("Records left are kept under the retention the data map accepts, for the reason "
                             "shown.")
            if any(f["action"] == "tombstone" for f in topics.values()):
                notes.append("A tombstone carries the record key (not a value) and stays in a compacted topic for "
                             "its delete.retention.ms after compaction.")
            body.append(f'<p class="sub">{esc(" ".join(notes))}</p>')
        body.append("<h2>How it was verified</h2>")
        methods: dict[str, list[str]] = {}
        for name, f in tables.items():
            methods.setdefault(f["method"], []).append(name)
        for name, f in topics.items():
            methods.setdefault(f["method"], []).append(f"topic {name}")
        body.append("<ul>" + "".join(f"<li><strong>{esc(', '.join(names))}</strong>: {esc(method)}</li>"
                                     for method, names in methods.items()) + "</ul>")
    s = doc.get("signature", {})
    signature = fact_list([("algorithm", s.get("algorithm", "none")), ("key id", s.get("key_id", "none")),
                           ("value", code(s.get("value", "")))])
    body.append(f'<h2>Signature</h2><div class="card">{signature}<p class="sub">The signed JSON certificate is the '
                "original; check it with <code>dsr certificate --check FILE</code>. This page shows it and is not "
                "signed itself.</p></div>")
    return page(_TITLES.get(req["type"], f"Certificate: {req['type']} request"),
                f"request {req['request_id']} · issued {doc['issued_at']} · lakehouse-dsr · no subject identifier",
                "\n".join(body))
