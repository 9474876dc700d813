"""Record keeping (ledger/records.py, `dsr expire-records`, `dsr metrics`): completed records past
their period leave the ledger and its stored files (read back with pyarrow), younger ones stay, an
expired erasure's keyed hashes keep suppressing; old access packages and unverified intake requests
go; the yearly figures match a hand count; bad input exits 2 and changes nothing. Spark-free."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import dsr_in_process as dsr
from helpers import make_settings, write_config
from lakehouse_dsr.ledger import consent
from lakehouse_dsr.ledger.journal import Step
from lakehouse_dsr.ledger.ledger import Ledger, Outcome
from lakehouse_dsr.ledger.records import expire_records, metrics
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.service.queue import SCHEMA

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=800)  # past the default 24 months


def _ledger_values(settings) -> dict[str, list[str]]:
    """Every string value of every Parquet file under each ledger table, as storage holds it (pyarrow)."""
    root = settings.catalog.local_warehouse() / settings.ledger_namespace
    values: dict[str, list[str]] = {}
    for table in sorted(p.name for p in root.iterdir()):
        found = values.setdefault(table, [])
        for f in (root / table).rglob("*.parquet"):
            for column in pq.read_table(f).columns:
                found += [v for v in column.to_pylist() if isinstance(v, str)]
    return values


def _complete(ledger: Ledger, ids: list[str], completed_at: datetime) -> None:
    ledger.finish([Outcome(rid, "completed") for rid in ids], "run-test")
    ledger.store.replace("requests", "request_id", ids, lambda rows: [{**r, "completed_at": completed_at}
                                                                      for r in rows])


@pytest.fixture
def ledger_with_history(tmp_path):
    """Requests received in OLD's year: erase A and access B completed 10 and 4 days after receipt,
    long ago; opt_out D completed long ago with a consent row; erase C completed yesterday (inside the
    period); access E still open."""
    settings = make_settings(tmp_path)
    ledger = Ledger(settings)
    received = OLD - timedelta(days=30)
    inputs = [RequestInput(s, t, "ccpa", received) for s, t in
              (("alice", "erase"), ("bob", "access"), ("carol", "erase"), ("dora", "opt_out"), ("eve", "access"))]
    a, b, c, d, e = ledger.submit(inputs).created
    ledger.record_keys([(a, "user_id", "hash-alice", "k1"), (b, "user_id", "hash-bob", "k1"),
                        (c, "user_id", "hash-carol", "k1")])
    ledger.journal.record([Step("run-test", "demo.users", "erased", 1, {"rows": {a: 2, c: 1}, "rounds": 1})])
    consent.record(ledger, [consent.ConsentChange(d, "dora", True, received)])
    _complete(ledger, [a, d], received + timedelta(days=10))
    _complete(ledger, [b], received + timedelta(days=4))
    _complete(ledger, [c], NOW - timedelta(days=1))
    return settings, ledger, dict(a=a, b=b, c=c, d=d, e=e)


def _drop_item(item: str, hash_: str, request_ids: list[str] | None, status: int | None,
               withdrawn_at: datetime | None = None) -> dict:
    return {"work_item_id": item, "list_type": "email", "hash": hash_, "download": "20240101_4821_DROP.zip",
            "download_day": OLD.date(), "due_date": OLD.date(), "filed_at": OLD, "matched_at": OLD,
            "subjects": len(request_ids or []), "request_ids": json.dumps(request_ids) if request_ids else None,
            "status": status, "status_at": OLD, "withdrawn_at": withdrawn_at, "reported_status": status,
            "reported_at": OLD}


def test_completed_records_leave_the_ledger_and_its_files_hashes_stay(ledger_with_history):
    """... and DROP work items stay on the suppression list (ID, hash, status) without the expired
    requests' ids, while items DROP withdrew long ago go, hash and all."""
    from lakehouse_dsr.drop.items import unmatched_items

    settings, ledger, ids = ledger_with_history
    gone, kept = [ids["a"], ids["b"], ids["d"]], [ids["c"], ids["e"]]
    ledger.store.append("drop_items", [
        _drop_item("ITEMalice001", "hash-drop-alice", [ids["a"]], 3), _drop_item("ITEMcarol001", "hash-drop-carol",
                                                                                 [ids["c"]], 3),
        _drop_item("ITEMnobody01", "hash-drop-nobody", None, 5),
        _drop_item("ITEMwithdrw1", "hash-drop-withdrawn-long-ago", None, None, OLD),
        _drop_item("ITEMwithdrw2", "hash-drop-withdrawn-lately", None, None, NOW - timedelta(days=1))])
    before = metrics(settings, OLD.year)

    dry = expire_records(settings, dry_run=True)
    assert dry.requests_expired == {"erase": 1, "access": 1, "opt_out": 1} and dry.history == {}
    assert dry.drop_withdrawn_removed == 1 and len(ledger.store.rows("drop_items")) == 5
    assert {r["request_id"] for r in ledger.requests()} == set(ids.values())  # a dry run removes nothing

    result = expire_records(settings)
    assert result.requests_expired == {"erase": 1, "access": 1, "opt_out": 1}
    assert result.hashes_kept == 1 and result.ids_found == 0
    assert result.history["requests"]["snapshots_expired"] > 0
    stored = _ledger_values(settings)
    for table, values in stored.items():
        for rid in gone:
            naming = [v for v in values if rid in v]
            if table == "erased_keys" and rid == ids["a"]:
                assert naming, "the expired erasure's keyed hash is kept"
            else:
                assert not naming, (table, rid)
    assert "hash-alice" in stored["erased_keys"] and "hash-bob" not in str(stored)
    assert result.drop_withdrawn_removed == 1 and "hash-drop-withdrawn-long-ago" not in str(stored)
    items = {r["work_item_id"]: r for r in ledger.store.rows("drop_items")}
    assert sorted(items) == ["ITEMalice001", "ITEMcarol001", "ITEMnobody01", "ITEMwithdrw2"]
    assert (items["ITEMalice001"]["hash"], items["ITEMalice001"]["request_ids"], items["ITEMalice001"]["status"]) \
        == ("hash-drop-alice", "[]", 3)  # on the suppression list, its expired request unlinked
    assert json.loads(items["ITEMcarol001"]["request_ids"]) == [ids["c"]]
    assert unmatched_items(ledger).column("work_item_id").to_pylist() == ["ITEMnobody01"]  # not matched again
    assert all(any(rid in v for v in stored["requests"]) for rid in kept)  # inside the period: untouched
    assert {r["request_id"] for r in ledger.requests()} == set(kept)
    assert [r["request_id"] for r in consent.opted_out(ledger)] == [None]  # the opt-out itself stays
    assert json.loads(ledger.store.rows("steps")[0]["detail"])["rows"] == {ids["c"]: 1}
    # the erased person stays out: suppression and the resurrection check still know the hash
    assert ids["a"] in ledger.erased_ids()
    assert {h["key_hash"] for h in ledger.suppression_hashes("user_id")} == {"hash-alice", "hash-carol"}
    # the year's figures survive the expiry
    assert metrics(settings, OLD.year) == before.model_copy(update={"expired_included": 3})
    again = expire_records(settings)
    assert not again.removed_anything and metrics(settings, OLD.year) == before.model_copy(
        update={"expired_included": 3})


def test_metrics_match_a_hand_count(ledger_with_history, tmp_path, monkeypatch, capsys):
    settings, ledger, _ = ledger_with_history
    figures = {t.request_type: t for t in metrics(settings, OLD.year).types}
    # erase: A 10 days, C received OLD-30 and completed yesterday: 830 days -> median 420, mean 420
    c_days = ((NOW - timedelta(days=1)).date() - (OLD - timedelta(days=30)).date()).days
    assert (figures["erase"].received, figures["erase"].complied, figures["erase"].pending) == (2, 2, 0)
    assert figures["erase"].median_days == figures["erase"].mean_days == (10 + c_days) / 2
    assert (figures["access"].received, figures["access"].complied, figures["access"].pending) == (2, 1, 1)
    assert (figures["access"].median_days, figures["access"].label) == (4.0, "know")
    assert (figures["opt_out"].complied, figures["opt_out"].mean_days) == (1, 10.0)
    assert metrics(settings, OLD.year, "gdpr").types == [] and metrics(settings, OLD.year - 1).types == []
    config = str(write_config(settings, tmp_path / "dsr.yaml"))
    code, out = dsr(monkeypatch, capsys, "-c", config, "metrics", "--year", str(OLD.year), "--json")
    assert code == 0 and json.loads(out)["types"][0]["request_type"] == "erase"
    for name in ("alice", "bob", "carol", "dora", "eve"):
        assert name not in out


def test_old_packages_and_unverified_intake_requests_go(tmp_path):
    settings = make_settings(tmp_path, records={"keep_packages_days": 30, "keep_unverified_days": 7})
    ledger = Ledger(settings)
    old_pkg, new_pkg = "req-0000000000a0000000001", "req-0000000000a0000000002"
    run_dir = Path(settings.export.directory) / "run-20240101T000000Z-abcdef"
    run_dir.mkdir(parents=True)
    for rid in (old_pkg, new_pkg):
        (run_dir / f"{rid}.json").write_text("{}")
    (run_dir / "manifest.json").write_text("{}")
    month_ago = time.time() - 31 * 86400
    os.utime(run_dir / f"{old_pkg}.json", (month_ago, month_ago))
    queue = settings.intake_queue_file()
    with sqlite3.connect(queue) as db:
        db.executescript(SCHEMA)
        for rid, state, age, ingested in (("q1", "identity_unverified", 9, None), ("q2", "locked", 8, None),
                                          ("q3", "identity_unverified", 2, None), ("q4", "received", 9, None),
                                          ("q5", "received", 9, NOW.isoformat())):
            db.execute("INSERT INTO intake (request_id, fingerprint, request_type, regulation, subject_id, email, "
                       "received_at, state, ingested_at) VALUES (?, 'f', 'erase', 'ccpa', ?, 'x@example.org', ?, ?, ?)",
                       (rid, f"subject-{rid}", (NOW - timedelta(days=age)).isoformat(), state, ingested))
    assert expire_records(settings, dry_run=True).intake_dropped == 2 and (run_dir / f"{old_pkg}.json").exists()

    report = run(lambda: pytest.fail("no work: Spark must not start"), settings)
    records = report.records
    assert records is not None and records.intake_dropped == 2
    assert [(p.request_id, p.export_run) for p in records.packages_deleted] == [(old_pkg, run_dir.name)]
    assert not (run_dir / f"{old_pkg}.json").exists() and (run_dir / f"{new_pkg}.json").exists()
    events = [r for r in ledger.store.rows("audit") if r["event"] == "package_deleted"]
    assert [(e["request_id"], e["run_id"]) for e in events] == [(old_pkg, report.run_id)]
    with sqlite3.connect(queue) as db:
        assert sorted(r[0] for r in db.execute("SELECT request_id FROM intake")) == ["q3", "q4", "q5"]
    assert b"subject-q1" not in queue.read_bytes() and b"subject-q2" not in queue.read_bytes()
    erase = {t.request_type: t for t in metrics(settings, (NOW - timedelta(days=9)).year).types}["erase"]
    assert erase.denied >= 1 and erase.received >= erase.denied  # dropped ones count as denied in their year
    assert report.document().records == records


@pytest.mark.parametrize("args, yaml_records, message", [
    (("metrics", "--year", "20x5"), None, "--year: '20x5' is not a year"),
    (("metrics", "--year", "99999"), None, "--year: '99999' is not a year"),
    (("metrics", "--year", "2025", "--regulation", "lgpd"), None, "--regulation: unknown regulation"),
    (("expire-records",), {"keep_completed_months": "two years"}, "records.keep_completed_months"),
    (("expire-records",), {"keep_packages_days": -1}, "records.keep_packages_days"),
])
def test_bad_input_exits_2_names_the_field_and_changes_nothing(ledger_with_history, tmp_path, monkeypatch, capsys,
                                                              args, yaml_records, message):
    settings, ledger, ids = ledger_with_history
    overrides = {"records": yaml_records} if yaml_records else {}
    config = str(write_config(settings, tmp_path / "dsr.yaml", **overrides))
    before = {t: ledger.store.snapshot_id(t) for t in ("requests", "request_keys", "audit", "record_years")}
    code, out = dsr(monkeypatch, capsys, "-c", config, *args)
    assert code == 2 and message in out, out
    assert {t: ledger.store.snapshot_id(t) for t in before} == before
