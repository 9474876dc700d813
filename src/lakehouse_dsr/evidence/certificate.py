"""Certificates people can read: per completed request, what was done in each table and how it was
proven, signed so that any change to the document is detected.

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
from datetime import datetime
from pathlib import Path

from ..exceptions import DsrError, LedgerError
from ..keys import KEY_ENV, Keyring, derive_key
from ..ledger.ledger import Ledger
from ..ledger.requests import REQUEST_ID, utc_now
from ..ledger.store import EqualTo
from .html import Markup, badge, code, esc, fact_list, human_bytes, page, table

FORMAT = "lakehouse-dsr certificate 1"
ALGORITHM = "HMAC-SHA256"
_PURPOSE = "lakehouse-dsr certificate"  # derives the signing key (keys.derive_key)
_COLUMNS = ("request_id", "request_type", "regulation", "status", "received_at", "due_date", "extended",
            "completed_at", "run_id", "evidence")  # no subject_id, no subject_hash
_KEY_ID = re.compile(r"[0-9a-f]{8}")
_TITLES = {"erase": "Certificate of erasure", "access": "Certificate of access",
           "opt_out": "Certificate of opt-out of sale and sharing", "opt_in": "Certificate of opt-in"}
_ACTIONS = {"delete": "rows deleted", "redact": "personal columns set to NULL, rows kept",
            "shred": "vault entry shredded: rows kept, no longer linkable or decryptable",
            "recompute": "recomputed without the erased rows", "export": "rows exported",
            "exclude": "rows taken out of the share", "include": "rows shared again"}


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
    doc = {
        "format": FORMAT,
        "issued_at": _iso(now or utc_now()),
        "request": {
            "request_id": r["request_id"], "type": r["request_type"], "regulation": r["regulation"],
            "received": _iso(r["received_at"]), "due": due.isoformat(), "extended": bool(r["extended"]),
            "completed": _iso(completed), "deadline_met": completed.date() <= due,
            "days_before_due": (due - completed.date()).days,
        },
        "runs": runs,
        "tables": tables,
        "totals": {"tables": len(tables), "rows": sum(t["rows"] for t in tables.values())},
    }
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
    }


def _storage_scan(action: str, scanned: bool, passed: bool) -> str:
    if action == "include":  # an opt-in: the subject's rows are meant to be there
        return "not applicable (opt-in)"
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


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- signature ----------------------------------------------------------------------------------------
def _canonical(doc: dict) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


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
             *((f"run ({k.replace('_', ' ')})", v) for k, v in doc["runs"].items())]
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
        body.append("<h2>How it was verified</h2>")
        methods: dict[str, list[str]] = {}
        for name, f in tables.items():
            methods.setdefault(f["method"], []).append(name)
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
