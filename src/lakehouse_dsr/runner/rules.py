"""The outcome rules: what completes a request, what keeps it open, and what the evidence says.

Pure functions of the stages' results (no Spark, no ledger): tested on their own in
tests/test_rules.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

from ..datamap import DataMap
from ..evidence.models import VERSION, AccessEvidence, ErasureEvidence, TableProof, TopicProof
from ..ledger.journal import Step
from ..ledger.ledger import Outcome
from ..stages import access, erase, purge, topics, verify


def schedule(policy: str, purged: bool, waiting: dict[str, date]) -> dict:
    """The report's purge schedule: the policy, whether this run purged, and the requests still
    waiting for a purge with the earliest day one is due."""
    return {"policy": policy, "purged": purged, "waiting": len(waiting),
            "next_purge_by": min(waiting.values()).isoformat() if waiting else None}


def with_collateral(erasure: erase.TableErasure | None, checked: verify.TableVerification
                    ) -> verify.TableVerification:
    """`checked` failing the collateral check when the table's erasure failed or damaged other rows
    (a new result: the verification's own is left as it was)."""
    if erasure is None:
        return checked
    if erasure.error:
        return replace(checked, collateral_ok=False, collateral_detail=f"erasure failed: {erasure.error}")
    if erasure.collateral and not erasure.collateral.ok:
        return replace(checked, collateral_ok=False, collateral_detail=erasure.collateral.detail)
    return checked


def proof_method(datamap: DataMap, table: str, v: verify.TableVerification) -> str:
    """How `table` was proven, in words for certificates (shredded tables name their own method)."""
    if table in datamap.aggregates:
        return "groups recomputed from the erased sources and compared row for row" + (
            "; no file of an older snapshot and no unreferenced file left" if v.physical else "")
    if table in datamap.files:
        where = "every file of the dataset (its live data, history and storage at once)"
    elif v.physical:
        where = ("the live snapshot, the files of every retained snapshot, every file on storage (unreferenced ones "
                 "included), branches and tags")
        if v.one_scan:
            where += "; history and storage held only the live files, so one scan covered all three"
    else:
        where = "the live snapshot"
    return f"keyed hash (HMAC-SHA256) of every key value, compared with the request's stored hashes, in {where}"


def table_entry(request_id: str, e: erase.TableErasure | None, p: purge.TablePurge | None,
                v: verify.TableVerification, resumed: Step | None, earlier: dict) -> dict:
    """One table's part of a request's evidence: what was done to the subject's rows there (by this
    run, by an interrupted run it finished, or by the earlier run that erased them), what the purge
    removed, and how the verification proved it."""
    if e is None:
        entry = dict(earlier)
    elif not e.plan.matches_by_request.get(request_id) and resumed and resumed.detail["rows"].get(request_id):
        entry = {"action": e.plan.action, "rows": resumed.detail["rows"][request_id],
                 "snapshot_id": resumed.snapshot_id, "erased_in_run": resumed.run_id}
    else:
        entry = {"action": e.plan.action, "rows": e.plan.matches_by_request.get(request_id, 0),
                 "snapshot_id": e.snapshot_id, "rounds": e.rounds}
    if e is not None and e.plan.action == "recompute":
        entry["strategy"] = e.plan.strategy
    rewritten = (e.data_files_rewritten, e.bytes_rewritten) if e is not None else (
        entry.get("data_files_rewritten", 0), entry.get("bytes_rewritten", 0))  # an earlier run's erase
    entry.update(purge.evidence(p, *rewritten), **v.evidence(request_id))
    return entry


class _Validated:
    """Evidence validated against its published models once per distinct content: in a batch, most
    requests' table entries are equal (a million requests, a handful of entries), and validating
    each again cost a minute. Content is told apart by its `repr` (half the cost of sorted JSON per
    request; an equal entry built in another key order is only validated once more). The dicts
    returned are shared: read-only."""

    def __init__(self) -> None:
        self._seen: dict[object, dict] = {}

    def _once(self, key: object, model: type[TableProof] | type[ErasureEvidence], raw: dict) -> dict:
        if key not in self._seen:
            self._seen[key] = model.model_validate(raw).model_dump(exclude_unset=True)
        return self._seen[key]

    def table(self, raw: dict) -> dict:
        return self._once(repr(raw), TableProof, raw)

    def evidence(self, raw: dict) -> dict:
        """`raw`'s tables must come from `table`: they are told apart by identity (held here)."""
        rest = repr({k: v for k, v in raw.items() if k != "tables"})
        return self._once((rest, *((t, id(d)) for t, d in raw["tables"].items())), ErasureEvidence, raw)


def request_reasons(request_id: str, table: str, e: erase.TableErasure | None, v: verify.TableVerification
                    ) -> list[str]:
    """Why `table` keeps the request open: its verification found the subject, or its erase commit
    failed or changed other rows while erasing this subject (or erased nothing: an error)."""
    reasons = list(v.failing.get(request_id, []))
    if e and not v.collateral_ok and (request_id in e.plan.matches_by_request or e.error):
        reasons.append(f"{table}: collateral check failed ({v.collateral_detail})")
    return reasons


def erasure_outcomes(request_ids: list[str], erasures: dict[str, erase.TableErasure],
                     purges: dict[str, purge.TablePurge], verifications: dict[str, verify.TableVerification],
                     run_id: str, verified_at: str, prior: dict[str, dict], resumed: dict[str, Step],
                     deadlines: dict[str, date], stop_reason: str | None, legal_tables: dict[str, str],
                     exempt_tables: dict[str, str] | None = None) -> list[Outcome]:
    """Per request: failed (with every reason), held (only tables under a legal hold, which the run
    left alone, still hold the subject: `legal_tables` -> the hold), erased (live data proven, purge
    due by its deadline: requests in `deadlines`), or completed (proven). What an exempt table
    (`exempt_tables` -> the exemption) holds of the subject is kept: its entry says `exempt` and
    `kept`, and it keeps no request open. Requests erased in an
    earlier run keep that run's erase evidence (`prior`), and so do requests an interrupted run
    erased (`resumed`, from the step journal). `stop_reason`: why the run stopped before the purge
    (fails every request).

    Cost: the outcome of a request nothing singles out (no earlier or interrupted run erased it, no
    check found it) depends only on its rows per table and its purge deadline, so it is decided once
    per distinct such signature: a batch of a million requests makes a handful of decisions."""
    validated, exempt = _Validated(), exempt_tables or {}
    singled_out = {*prior, *(rid for v in verifications.values() for rid in v.failing),
                   *(rid for step in resumed.values() for rid in step.detail.get("rows", {}))}
    matches = [(erasures[t].plan.matches_by_request if t in erasures else {}) for t in verifications]
    decided: dict[tuple, tuple] = {}

    def decide(request_id: str) -> tuple:
        earlier = prior.get(request_id, {})
        reasons: list[str] = []
        held: list[str] = []  # findings in tables under a legal hold
        tables = {}
        for table, v in verifications.items():
            e = erasures.get(table)
            found = request_reasons(request_id, table, e, v)
            reasons += [] if table in legal_tables or table in exempt else found
            held += [legal_tables[table]] if table in legal_tables and found else []
            entry = table_entry(request_id, e, purges.get(table), v, resumed.get(table),
                                earlier.get("tables", {}).get(table, {}))
            if table in exempt:
                entry.update(action="keep", exempt=exempt[table], kept=bool(found))
            tables[table] = validated.table(entry)
        if stop_reason:
            reasons.append(stop_reason)
        evidence: dict[str, Any] = {"version": VERSION, "run_id": run_id, "verified_at": verified_at,
                                    "tables": tables}
        if earlier:
            evidence["erased_in_run"] = earlier.get("run_id")
        evidence = validated.evidence(evidence)
        if reasons:
            return "failed", "; ".join([*reasons, *held]), evidence, None
        if held:
            return "held", "; ".join(held), evidence, None
        if request_id in deadlines:
            by = deadlines[request_id]
            return "erased", f"logically erased; physical purge due by {by}", evidence, by
        return "completed", None, evidence, None

    outcomes = []
    # the signatures' parts column by column, zipped into tuples in C (a generator per request cost 3 s at 1M)
    parts = [[deadlines.get(r) for r in request_ids], *([m.get(r) for r in request_ids] for m in matches)]
    for request_id, signature in zip(request_ids, zip(*parts, strict=True), strict=True):
        if request_id in singled_out:
            outcome = decide(request_id)
        else:
            outcome = decided.get(signature) or decided.setdefault(signature, decide(request_id))
        outcomes.append(Outcome(request_id, *outcome))
    return outcomes


def with_topics(outcomes: list[Outcome], settled: dict[str, topics.TopicSettlement], dues: dict[str, date]
                ) -> list[Outcome]:
    """`outcomes` with each settled topic's part in their evidence, and open (failed) with the topics'
    reasons where a topic still holds the subject (`TopicSettlement.reason`, against the request's due
    date in `dues`). A request already failed keeps its reasons, the topics' added; a held one stays
    held with them added. Evidence of requests no topic singles out is shared: built once."""
    if not settled:
        return outcomes
    proof = lambda raw: TopicProof.model_validate(raw).model_dump(exclude_unset=True)  # noqa: E731
    plain = {name: proof(s.evidence("")) for name, s in settled.items()}  # what a request with nothing left gets
    out = []
    for o in outcomes:
        singled = [name for name, s in settled.items() if s.singles_out(o.request_id)]
        parts = {**plain, **{name: proof(settled[name].evidence(o.request_id)) for name in singled}} if singled \
            else plain
        reasons = [r for name in singled if (r := settled[name].reason(o.request_id, dues.get(o.request_id)))]
        evidence = {**o.evidence, "topics": parts}
        if not reasons:
            out.append(replace(o, evidence=evidence))
        else:
            kept = [o.reason] if o.reason and o.status != "erased" else []  # "erased"'s reason: the purge to come
            out.append(replace(o, status="held" if o.status == "held" else "failed", evidence=evidence,
                               purge_by=None, reason="; ".join([*kept, *reasons])))
    return out


def access_outcomes(request_ids: list[str], result: access.ExportResult, checked: dict[str, bool], run_id: str
                    ) -> list[Outcome]:
    """Per access request: completed when its package is on disk with the checksum the manifest
    records, else failed (kept open for the next run)."""
    packages = {p.request_id: p for p in result.packages}
    outcomes = []
    for rid in request_ids:
        p = packages.get(rid)
        found = {"file": str(Path(result.directory) / p.file), "sha256": p.sha256, "bytes": p.bytes, "rows": p.rows,
                 "manifest": result.manifest} if p else {}
        evidence = AccessEvidence.model_validate({"version": VERSION, "run_id": run_id, **found}).model_dump(
            exclude_unset=True)
        ok = checked.get(rid, False)
        outcomes.append(Outcome(rid, "completed" if ok else "failed",
                                None if ok else "export package missing or its checksum does not match the manifest",
                                evidence))
    return outcomes


def export_summary(result: access.ExportResult, fmt: str, tables: list[str]) -> dict:
    """The report's export section: where the packages are, how many, and rows per table."""
    return {"directory": result.directory, "manifest": result.manifest, "format": fmt,
            "packages": len(result.packages),
            "rows": {t: sum(p.rows.get(t, 0) for p in result.packages) for t in tables}}
