"""Legal holds (ledger/holds.py, `dsr hold`): a held subject's erase request waits with its reason and
completes after the release; a held table is erased for nobody; holds keep no plaintext subject;
bad input is refused with exit 2 and nothing changed."""

from __future__ import annotations

from datetime import date

from pyiceberg.expressions import In

from helpers import SEED, make_settings, write_config
from helpers import dsr_in_process as dsr
from lakehouse_dsr import synth
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.ledger.holds import active_holds, add_hold, list_holds, release_hold
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

SUBJECT = "held-person@example.org"


def _stored_bytes(ledger: Ledger, table: str) -> bytes:
    """Every file under a ledger table's location (data, manifests, metadata), raw."""
    loaded = ledger.store.load(table, create=False)
    blobs = []
    for stored in ledger.store.files(loaded):
        with stored.fs.open_input_file(stored.path) as fh:
            blobs.append(fh.read())
    return b"".join(blobs)


def test_holds_are_audited_and_keep_no_plaintext_subject(tmp_path, monkeypatch, capsys):
    settings = make_settings(tmp_path)
    config = str(write_config(settings, tmp_path / "dsr.yaml"))
    code, out = dsr(monkeypatch, capsys, "-c", config, "hold", "add", "--subject", SUBJECT, "--reason",
                    "tax audit 2024", "--by", "alice")
    assert code == 0 and "subject held" in out and SUBJECT not in out
    code, out = dsr(monkeypatch, capsys, "-c", config, "hold", "add", "--table", "demo.orders", "--reason",
                    "litigation 42", "--until", "2099-12-31")
    assert code == 0, out
    ledger = Ledger(settings)
    subject_hold, table_hold = list_holds(ledger)
    assert (subject_hold.kind, subject_hold.created_by, subject_hold.reason) == ("subject", "alice", "tax audit 2024")
    assert (table_hold.table_name, table_hold.until) == ("demo.orders", date(2099, 12, 31))
    held = active_holds(ledger)
    assert held.subject(SUBJECT) == subject_hold and held.subject("someone else") is None
    assert held.table("demo.orders") == table_hold and held.table("demo.events") is None
    for table in ("holds", "audit"):  # data files, manifests and metadata alike
        assert SUBJECT.encode() not in _stored_bytes(ledger, table), table
    code, out = dsr(monkeypatch, capsys, "-c", config, "hold", "list", "--json")
    assert code == 0 and SUBJECT not in out and '"active": true' in out
    code, out = dsr(monkeypatch, capsys, "-c", config, "hold", "release", subject_hold.hold_id, "--by", "bob")
    assert code == 0, out
    released = {h.hold_id: h for h in list_holds(ledger)}[subject_hold.hold_id]
    assert released.released_by == "bob" and released.released_at is not None
    assert active_holds(ledger).subject(SUBJECT) is None
    events = [r["event"] for r in ledger.store.rows("audit")]
    assert events.count("hold_added") == 2 and events.count("hold_released") == 1
    assert active_holds(ledger, date(2100, 1, 1)).table("demo.orders") is None  # past its --until day


def test_bad_hold_input_exits_2_names_the_field_and_changes_nothing(tmp_path, monkeypatch, capsys):
    settings = make_settings(tmp_path)
    config = str(write_config(settings, tmp_path / "dsr.yaml"))
    ledger = Ledger(settings)
    existing = add_hold(ledger, "kept", "alice", table="demo.events")
    before = ledger.store.snapshot_id("holds"), ledger.store.snapshot_id("audit")
    add = ["-c", config, "hold", "add", "--reason", "r"]
    cases = [
        ([*add, "--table", "demo.nope"], "table: 'demo.nope' is not a table of the data map"),
        (["-c", config, "hold", "release", "hold-0000000000000000"], "no hold 'hold-0000000000000000'"),
        ([*add, "--table", "demo.orders", "--until", "2024-13-45"], "until: '2024-13-45' is not a date"),
        ([*add, "--table", "demo.orders", "--until", "2001-01-01"], "until: 2001-01-01 is in the past"),
        (add, "subject/table: give exactly one of them"),
        ([*add, "--table", "demo.orders", "--subject", SUBJECT], "subject/table: give exactly one of them"),
        (["-c", config, "hold", "add", "--table", "demo.orders", "--reason", " "], "reason: a hold needs a reason"),
    ]
    for args, message in cases:
        code, out = dsr(monkeypatch, capsys, *args)
        assert code == 2 and message in " ".join(out.split()), (args, out)
        assert "Traceback" not in out and SUBJECT not in out
    release_hold(ledger, existing.hold_id, "bob")
    after_release = ledger.store.snapshot_id("holds"), ledger.store.snapshot_id("audit")
    code, out = dsr(monkeypatch, capsys, "-c", config, "hold", "release", existing.hold_id)
    assert code == 2 and "already released" in out
    assert after_release != before  # the release itself wrote; the refusals around it did not
    assert (ledger.store.snapshot_id("holds"), ledger.store.snapshot_id("audit")) == after_release
    assert [h.hold_id for h in list_holds(ledger)] == [existing.hold_id]


def _user_ids(settings, table: str, ids: list[str]) -> list[str]:
    """The user_id of every live row of `table` among `ids`, read with pyiceberg (no Spark)."""
    loaded = open_catalog(settings).load_table(table)
    return loaded.scan(row_filter=In("user_id", ids), selected_fields=("user_id",)).to_arrow().column(
        "user_id").to_pylist()


def test_held_requests_wait_with_their_reason_and_complete_after_the_release(spark, new_lakehouse):
    settings = new_lakehouse(users=20, events=200)
    users = [synth.user_id(SEED, i) for i in range(20)]
    with_orders = set(_user_ids(settings, "demo.orders", users))
    held_subject = users[0]
    in_orders = next(u for u in users[1:] if u in with_orders)  # erased elsewhere, kept in the held table
    no_orders = next(u for u in users[1:] if u not in with_orders)  # nothing in the held table: completes
    ledger = Ledger(settings)
    on_subject = add_hold(ledger, "tax audit", "alice", subject=held_subject)
    on_table = add_hold(ledger, "litigation 42", "alice", table="demo.orders")
    ids = dict(zip((held_subject, in_orders, no_orders), ledger.submit(
        [RequestInput(s, "erase") for s in (held_subject, in_orders, no_orders)]).created, strict=True))
    orders_before = open_catalog(settings).load_table("demo.orders").current_snapshot().snapshot_id

    report = run(spark, settings)
    status = {s.request_id: s for s in ledger.statuses()}
    assert (status[ids[held_subject]].status, status[ids[held_subject]].status_reason) == ("held", on_subject.why)
    assert (status[ids[in_orders]].status, status[ids[in_orders]].status_reason) == ("held", on_table.why)
    assert status[ids[no_orders]].status == "completed"
    assert "tax audit" in on_subject.why and "litigation 42" in on_table.why
    assert report.legal_holds == {"demo.orders": on_table.why} and report.as_dict()["summary"]["held"] == 2
    assert held_subject in _user_ids(settings, "demo.events", [held_subject])  # nothing of it erased
    assert held_subject in _user_ids(settings, "demo.users", [held_subject])
    assert not _user_ids(settings, "demo.events", [in_orders, no_orders])  # erased where not held
    assert in_orders in _user_ids(settings, "demo.orders", [in_orders])  # the held table keeps it
    assert open_catalog(settings).load_table("demo.orders").current_snapshot().snapshot_id == orders_before

    for hold in (on_subject, on_table):
        release_hold(ledger, hold.hold_id, "bob")
    run(spark, settings)
    status = {s.request_id: s for s in ledger.statuses()}
    assert {status[r].status for r in ids.values()} == {"completed"}
    for table in ("demo.users", "demo.events", "demo.orders"):
        assert not _user_ids(settings, table, [held_subject, in_orders, no_orders]), table

