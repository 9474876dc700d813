"""The outcome rules on their own (runner/rules.py): what completes a request, what keeps it open,
and what its evidence says, from the stages' results alone. No Spark session is started."""

from __future__ import annotations

import json
from datetime import date

import pytest

from lakehouse_dsr.datamap import DataMap
from lakehouse_dsr.evidence.models import ErasureEvidence
from lakehouse_dsr.evidence.report import RunReport
from lakehouse_dsr.ledger.journal import Step
from lakehouse_dsr.ledger.ledger import Outcome
from lakehouse_dsr.runner import rules
from lakehouse_dsr.stages.access import ExportResult, Package
from lakehouse_dsr.stages.collateral import CollateralResult
from lakehouse_dsr.stages.erase import TableErasure, TablePlan
from lakehouse_dsr.stages.purge import TablePurge
from lakehouse_dsr.stages.verify import TableVerification

RUN, AT = "run-1", "2026-11-24T00:00:00+00:00"


def erasure(matches: dict[str, int], snapshot_id: int | None = 7, **changes) -> TableErasure:
    plan = TablePlan("demo.events", "user_id", "user_id", "delete", "rewrite_files", "copy-on-write",
                     rows_before=100, rows_matched=sum(matches.values()), matches_by_request=matches,
                     snapshot_before=6)
    return TableErasure(plan, snapshot_id=snapshot_id, rows_after=100 - sum(matches.values()),
                        data_files_rewritten=2, bytes_rewritten=2048, **changes)


def outcomes(request_ids, erasures, verifications, purges=None, deadlines=None, stop=None, prior=None, resumed=None,
             legal=None):
    return {o.request_id: o for o in rules.erasure_outcomes(
        request_ids, erasures, purges or {}, verifications, RUN, AT, prior or {}, resumed or {}, deadlines or {}, stop,
        legal or {})}


def test_a_request_completes_only_when_every_table_proves_it():
    erasures = {"demo.events": erasure({"r1": 3, "r2": 1})}
    clean = TableVerification("demo.events")
    failing = TableVerification("demo.events", live=1, failing={"r2": ["demo.events: 1 row left"]})
    done = outcomes(["r1", "r2"], erasures, {"demo.events": clean}, {"demo.events": TablePurge("demo.events")})
    assert {r: o.status for r, o in done.items()} == {"r1": "completed", "r2": "completed"}
    entry = done["r1"].evidence["tables"]["demo.events"]
    assert (entry["action"], entry["rows"], entry["snapshot_id"], entry["purged"]) == ("delete", 3, 7, True)
    assert entry["data_files_rewritten"] == 2 and entry["bytes_rewritten"] == 2048
    assert done["r1"].evidence["run_id"] == RUN and done["r1"].evidence["verified_at"] == AT

    kept = outcomes(["r1", "r2"], erasures, {"demo.events": failing})
    assert kept["r1"].status == "completed"  # another subject's leftover row does not fail this one
    assert (kept["r2"].status, kept["r2"].reason) == ("failed", "demo.events: 1 row left")


def test_collateral_damage_fails_the_requests_the_commit_erased_and_a_stop_fails_all():
    damaged = erasure({"r1": 3}, collateral=CollateralResult(False, True, "2 rows not requested changed"))
    checked = rules.with_collateral(damaged, TableVerification("demo.events"))
    assert (checked.collateral_ok, checked.collateral_detail) == (False, "2 rows not requested changed")
    done = outcomes(["r1", "r2"], {"demo.events": damaged}, {"demo.events": checked})
    assert done["r1"].status == "failed"
    assert "collateral check failed (2 rows not requested changed)" in done["r1"].reason
    assert done["r2"].status == "completed"  # the commit erased nothing of r2's

    stopped = outcomes(["r2"], {"demo.events": damaged}, {"demo.events": checked}, stop="run stopped before the purge")
    assert (stopped["r2"].status, stopped["r2"].reason) == ("failed", "run stopped before the purge")


def test_a_failed_erasure_fails_every_request_of_the_table_and_the_verification_is_left_as_it_was():
    broken = erasure({}, snapshot_id=None, error="CommitConflictError: gave up")
    verification = TableVerification("demo.events")
    checked = rules.with_collateral(broken, verification)
    assert checked is not verification and verification.collateral_ok  # a new result
    assert checked.collateral_detail == "erasure failed: CommitConflictError: gave up"
    assert outcomes(["r1"], {"demo.events": broken}, {"demo.events": checked})["r1"].status == "failed"
    assert rules.with_collateral(None, verification) is verification


def test_a_table_under_a_legal_hold_holds_only_the_requests_it_still_holds():
    hold = "legal hold hold-1 on table demo.orders: litigation until released"
    erasures = {"demo.events": erasure({"r1": 3, "r2": 1, "r3": 2})}
    events = TableVerification("demo.events", live=1, failing={"r3": ["demo.events: 1 row left"]})
    orders = TableVerification("demo.orders", live=2, failing={"r1": ["demo.orders: 2 live rows"],
                                                               "r3": ["demo.orders: 1 live row"]})
    done = outcomes(["r1", "r2", "r3"], erasures, {"demo.events": events, "demo.orders": orders},
                    deadlines={"r2": date(2030, 1, 1)}, legal={"demo.orders": hold})
    assert (done["r1"].status, done["r1"].reason) == ("held", hold)
    assert done["r2"].status == "erased"  # not in the held table: erased everywhere else as usual
    assert done["r3"].status == "failed" and done["r3"].reason == f"demo.events: 1 row left; {hold}"


def test_a_request_with_a_deadline_is_erased_not_completed_until_its_purge():
    done = outcomes(["r1"], {"demo.events": erasure({"r1": 1})}, {"demo.events": TableVerification(
        "demo.events", physical=False)}, deadlines={"r1": date(2026, 12, 1)})
    assert (done["r1"].status, done["r1"].purge_by) == ("erased", date(2026, 12, 1))
    assert done["r1"].reason == "logically erased; physical purge due by 2026-12-01"
    assert set(done["r1"].evidence["tables"]["demo.events"]["checks"]) == {"live", "collateral"}  # no history yet


def test_earlier_and_interrupted_runs_keep_their_own_erase_evidence():
    earlier = {"r0": {"run_id": "run-0", "tables": {"demo.events": {"action": "delete", "rows": 4, "snapshot_id": 3,
                                                                    "data_files_rewritten": 1, "bytes_rewritten": 10}}}}
    proven = outcomes(["r0"], {}, {"demo.events": TableVerification("demo.events")},
                      {"demo.events": TablePurge("demo.events", bytes_rewritten=5)}, prior=earlier)
    entry = proven["r0"].evidence["tables"]["demo.events"]
    assert proven["r0"].evidence["erased_in_run"] == "run-0"
    assert (entry["rows"], entry["snapshot_id"], entry["bytes_rewritten"]) == (4, 3, 15)  # erase's and purge's

    resumed = {"demo.events": Step("run-k", "demo.events", "erased", 5, {"rows": {"r1": 2}})}
    again = outcomes(["r1"], {"demo.events": erasure({})}, {"demo.events": TableVerification("demo.events")},
                     resumed=resumed)
    entry = again["r1"].evidence["tables"]["demo.events"]
    assert (entry["rows"], entry["snapshot_id"], entry["erased_in_run"]) == (2, 5, "run-k")


@pytest.mark.parametrize(("physical", "one_scan", "words"), [
    (True, False, "every file on storage"), (True, True, "one scan covered all three"),
    (False, False, "in the live snapshot")])
def test_the_proof_method_says_where_the_subject_was_looked_for(physical, one_scan, words):
    datamap = DataMap.model_validate({"tables": {"demo.events": {"key": "user_id", "identifier": "user_id"}}})
    method = rules.proof_method(datamap, "demo.events", TableVerification("demo.events", physical=physical,
                                                                            one_scan=one_scan))
    assert method.startswith("keyed hash (HMAC-SHA256)") and words in method


def test_the_purge_schedule_names_the_earliest_deadline():
    assert rules.schedule("batched", False, {"a": date(2026, 12, 9), "b": date(2026, 12, 2)}) == {
        "policy": "batched", "purged": False, "waiting": 2, "next_purge_by": "2026-12-02"}
    assert rules.schedule("immediate", True, {})["next_purge_by"] is None


def test_access_requests_complete_only_with_a_package_whose_checksum_holds():
    result = ExportResult("/exports/run-1", "/exports/run-1/manifest.json",
                          [Package("a1", "a1.json", "f" * 64, 10, {"demo.events": 2}),
                           Package("a2", "a2.json", "e" * 64, 10, {})])
    done = {o.request_id: o for o in rules.access_outcomes(["a1", "a2", "a3"], result, {"a1": True, "a2": False}, RUN)}
    assert done["a1"].status == "completed" and done["a1"].evidence["file"] == "/exports/run-1/a1.json"
    assert done["a2"].status == "failed" and "checksum" in done["a2"].reason
    assert done["a3"].status == "failed" and done["a3"].evidence == {"version": 1, "run_id": RUN}
    assert rules.export_summary(result, "json", ["demo.events", "demo.users"])["rows"] == {
        "demo.events": 2, "demo.users": 0}


def test_the_written_report_is_its_document_with_every_request_line(tmp_path):
    """RunReport.write encodes its request lines itself (fast at a million): the file must read back as
    the document (`as_dict`) with every request, escaping included; `document` validates one line per
    distinct status and reason."""
    report = RunReport("run-1", "2026-12-04T00:00:00+00:00")
    report.requests = [Outcome("req-1", "completed"), Outcome('odd "id" é\\', "failed", 'why "é"\n'),
                       Outcome("req-2", "erased", "later"), Outcome("req-3", "completed")]
    report.write(tmp_path / "report.json")
    written = json.loads((tmp_path / "report.json").read_text())
    assert written == report.as_dict()
    assert [r["request_id"] for r in written["requests"]] == ["req-1", 'odd "id" é\\', "req-2", "req-3"]
    assert written["summary"]["requests"] == 4 and len(report.document().requests) == 3


def test_requests_alike_share_one_decision_and_each_keeps_its_own_counts_and_deadline():
    """A batch's requests are decided once per signature (rows per table, purge deadline): equal ones
    share their evidence object, and any difference (rows, deadline, a finding) still shows."""
    erasures = {"demo.events": erasure({"r1": 1, "r2": 1, "r3": 2, "r5": 1, "r6": 1})}
    failing = TableVerification("demo.events", live=1, failing={"r6": ["demo.events: 1 row left"]})
    later = date(2026, 12, 31)
    done = outcomes(["r1", "r2", "r3", "r4", "r5", "r6"], erasures, {"demo.events": failing},
                    deadlines={"r5": later})
    rows = {r: o.evidence["tables"]["demo.events"]["rows"] for r, o in done.items()}
    assert rows == {"r1": 1, "r2": 1, "r3": 2, "r4": 0, "r5": 1, "r6": 1}
    assert done["r1"].evidence is done["r2"].evidence and done["r1"].evidence is not done["r3"].evidence
    assert [done[r].request_id for r in ("r1", "r2")] == ["r1", "r2"]
    assert (done["r5"].status, done["r5"].purge_by) == ("erased", later) and done["r1"].status == "completed"
    assert (done["r6"].status, done["r6"].reason) == ("failed", "demo.events: 1 row left")
    assert done["r6"].evidence["tables"]["demo.events"]["verification"]["passed"] is False
    assert done["r1"].evidence["tables"]["demo.events"]["verification"]["passed"] is True


def test_a_topic_still_holding_the_subject_keeps_the_request_open_with_its_reason():
    from datetime import UTC, datetime

    from lakehouse_dsr.lake.kafka import FOREVER, UNBOUNDED, TopicConfig
    from lakehouse_dsr.stages.topics import Found, TopicSettlement

    written = datetime(2026, 11, 20, tzinfo=UTC)
    day = 86_400_000
    week = TopicConfig("clicks", 1, frozenset({"delete"}), 7 * day, UNBOUNDED, day, day)  # segments closed daily
    forever = TopicConfig("audit", 1, frozenset({"delete"}), FOREVER, UNBOUNDED, day, day)
    compacted = TopicConfig("profiles", 1, frozenset({"compact"}), FOREVER, 3_600_000, day, 7 * day)
    clicks = TopicSettlement("clicks", week, None, records_read=10,
                             found={"r1": Found(2, written), "r2": Found(1, written)})
    audit = TopicSettlement("audit", forever, "fraud audit", records_read=5, found={"r1": Found(1, written)})
    profiles = TopicSettlement("profiles", compacted, None, records_read=4, tombstones=1, tombstoned_at=written,
                               tombstones_by_request={"r3": 1}, found={"r3": Found(2, written)})
    settled = {"clicks": clicks, "audit": audit, "profiles": profiles}
    done = {o.request_id: o for o in rules.with_topics(
        [Outcome("r1", "completed"), Outcome("r2", "erased", "logically erased; purge due", purge_by=date(2026, 12, 1)),
         Outcome("r3", "completed"), Outcome("r4", "failed", "demo.events: 1 row left")], settled,
        {"r1": date(2026, 12, 20), "r2": date(2026, 11, 25), "r3": date(2026, 12, 20), "r4": date(2026, 12, 20)})}
    assert done["r1"].status == "failed" and done["r1"].reason == (
        "topic clicks (cleanup.policy=delete, retention.ms=604800000 (7 d)) still holds 2 record(s) of the subject, "
        "guaranteed gone by 2026-11-28T00:00:00+00:00; a run after that proves them gone")  # a day's segment + 7 days
    assert done["r2"].reason.endswith("after the request's due date 2026-11-25") and done["r2"].purge_by is None
    assert "guaranteed gone by 2026-11-20T01:00:00+00:00" in done["r3"].reason  # tombstone + max.compaction.lag.ms
    assert done["r4"].reason == "demo.events: 1 row left"  # nothing of r4 in any topic: its own reason only
    kept = done["r1"].evidence["topics"]["audit"]
    assert (kept["records_left"], kept["passed"], kept["gone_by"], kept["accepted"]) == (1, False, None, "fraud audit")
    assert done["r4"].evidence["topics"]["clicks"]["passed"]
    assert done["r3"].evidence["topics"]["profiles"]["tombstones"] == 1
    for o in done.values():
        ErasureEvidence.model_validate({"version": 1, "run_id": RUN, "verified_at": AT, "tables": {}, **o.evidence})
