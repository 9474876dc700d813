import os
import time
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from helpers import make_settings, snapshot_ids
from lakehouse_dsr.exceptions import LedgerError, RequestInputError
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger import ledger as ledger_module
from lakehouse_dsr.ledger.journal import Step
from lakehouse_dsr.ledger.ledger import Ledger, new_request_id, new_request_ids
from lakehouse_dsr.ledger.requests import RequestInput, add_months, due_date, read_requests_csv


@pytest.mark.parametrize(
    "received, regulation, extended, due",
    [
        (date(2025, 1, 31), "gdpr", False, date(2025, 2, 28)),  # calendar month, clamped to February's end
        (date(2024, 1, 31), "gdpr", False, date(2024, 2, 29)),  # leap year
        (date(2025, 3, 15), "gdpr", False, date(2025, 4, 15)),
        (date(2025, 12, 31), "gdpr", False, date(2026, 1, 31)),
        (date(2025, 1, 31), "gdpr", True, date(2025, 4, 30)),   # +2 months on top of the first
        (date(2025, 1, 1), "ccpa", False, date(2025, 2, 15)),   # 45 days
        (date(2025, 1, 1), "ccpa", True, date(2025, 4, 1)),     # 90 days
    ],
)
def test_due_dates(received, regulation, extended, due):
    assert due_date(received, regulation, extended) == due


def test_add_months_across_years():
    assert add_months(date(2025, 11, 30), 3) == date(2026, 2, 28)


def test_unknown_regulation():
    with pytest.raises(RequestInputError, match="unknown regulation"):
        due_date(date(2025, 1, 1), "lgpd")


@pytest.mark.parametrize(
    "content, message",
    [
        ("subject,kind\nu1,erase\n", "header must be"),
        ("subject_id,type,extra\nu1,erase,x\n", "header must be"),
        ("subject_id,type\nu1,forget\n", "line 2: unknown request type 'forget'"),
        ("subject_id,type,regulation\nu1,erase,lgpd\n", "line 2: unknown regulation 'lgpd'"),
        ("subject_id,type\n,erase\n", "line 2: subject id is empty"),
        ("subject_id,type\n   ,erase\n", "subject id is empty"),
        ("subject_id,type\nu1\n", "line 2: expected 2 fields"),
        ("subject_id,type\nu1,erase,too,many\n", "line 2: expected 2 fields"),
        ("subject_id,type,regulation,received_at\nu1,erase,gdpr,yesterday\n", "not an ISO-8601"),
        ("subject_id,type\n", "holds no requests"),
        ("", "header must be"),
    ],
)
def test_bad_csv(tmp_path, content, message):
    f = tmp_path / "r.csv"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(RequestInputError, match=message):
        read_requests_csv(f)


def test_csv_not_utf8(tmp_path):
    f = tmp_path / "r.csv"
    f.write_bytes("subject_id,type\nJos\u00e9,erase\n".encode("utf-16"))
    with pytest.raises(RequestInputError, match="not UTF-8"):
        read_requests_csv(f)


def test_csv_good(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("\ufeffsubject_id,type,regulation,received_at\nu1,ERASE,ccpa,2025-01-31\n\u00e9l\u00e8ve,access,,\n",
                 encoding="utf-8")
    rows = read_requests_csv(f)
    assert rows[0] == RequestInput("u1", "erase", "ccpa", datetime(2025, 1, 31, tzinfo=UTC))
    assert rows[1] == RequestInput("\u00e9l\u00e8ve", "access", "gdpr", None)


@pytest.fixture
def ledger(spark, tmp_path):
    settings = make_settings(tmp_path)
    attach(spark, settings)
    return Ledger(settings)


def test_submit_statuses_duplicates_and_extension(ledger):
    jan31 = datetime(2025, 1, 31, 9, 30, tzinfo=UTC)
    result = ledger.submit([
        RequestInput("alice", "erase", "gdpr", jan31),
        RequestInput("alice", "erase", "gdpr", jan31),      # duplicate within the batch
        RequestInput("alice", "access", "gdpr", jan31),     # another type is another request
        RequestInput("bob", "erase", "ccpa", jan31),
        RequestInput("carol", "opt_out", "ccpa", jan31),
    ])
    assert len(result.created) == 4 and result.duplicates == 1
    again = ledger.submit([RequestInput("alice", "erase"), RequestInput("dave", "erase")])
    assert len(again.created) == 1 and again.duplicates == 1  # alice's erase is still open

    statuses = {(s.request_type, s.regulation, s.due_date): s for s in ledger.statuses(today=date(2025, 2, 20))}
    alice = statuses[("erase", "gdpr", "2025-02-28")]
    assert alice.status == "received" and alice.days_left == 8 and alice.received == "2025-01-31T09:30:00Z"
    assert statuses[("erase", "ccpa", "2025-03-17")].days_left == 25
    assert statuses[("opt_out", "ccpa", "2025-02-21")].status_reason is None  # 15 business days (a Friday)
    assert statuses[("access", "gdpr", "2025-02-28")].status_reason is None  # fulfilled by dsr run

    extended = ledger.extend(alice.request_id, "complex request across many systems")
    assert extended.extended and extended.due_date == "2025-04-30"
    with pytest.raises(LedgerError, match="already extended"):
        ledger.extend(alice.request_id, "again")
    with pytest.raises(LedgerError, match="no request"):
        ledger.extend("req-unknown", "why")
    with pytest.raises(LedgerError, match="needs a reason"):
        ledger.extend(statuses[("erase", "ccpa", "2025-03-17")].request_id, "  ")


def test_status_never_shows_subject(ledger):
    ledger.submit([RequestInput("secret-subject-1", "erase")])
    assert "secret-subject-1" not in repr(ledger.statuses())


def test_invalid_request_changes_nothing(ledger, spark):
    ledger.submit([RequestInput("someone", "erase")])
    before = snapshot_ids(spark, ledger.settings, ledger.tables())
    for bad in (RequestInput("", "erase"), RequestInput("x", "delete"), RequestInput("x", "erase", "pipeda"),
                RequestInput("x" * 70_000, "erase")):
        with pytest.raises(RequestInputError):
            ledger.submit([RequestInput("fine", "erase"), bad])
    assert snapshot_ids(spark, ledger.settings, ledger.tables()) == before


def test_request_ids_made_in_the_same_millisecond_with_the_same_random_part_differ(monkeypatch):
    randoms = iter([bytes.fromhex("00000000aa"), bytes.fromhex("00000000aa"), bytes.fromhex("00000000bb")])
    monkeypatch.setattr(ledger_module.os, "urandom", lambda n: next(randoms))
    monkeypatch.setattr(ledger_module.time, "time", lambda: 1_700_000_000.0)
    taken: set[str] = set()
    first, second = new_request_id(taken), new_request_id(taken)
    assert first != second and taken == {first, second} and second.endswith("bb")
    drawn = new_request_ids(set(), draw=3)  # one draw per three ids; the repeat within a draw is skipped
    randoms = iter([bytes.fromhex("0000000001" "0000000001" "0000000002"), bytes.fromhex("0000000003" * 3)])
    assert [next(drawn)[-10:] for _ in range(3)] == ["0000000001", "0000000002", "0000000003"]


def test_a_request_received_before_year_1000_shows_a_four_digit_year(ledger):
    """glibc's %Y drops the padding below 1000; the status document's date-time pattern needs it."""
    ledger.submit([RequestInput("old", "erase", received_at=datetime(999, 5, 1, tzinfo=UTC))])
    assert [s.received for s in ledger.statuses()] == ["0999-05-01T00:00:00Z"]


def test_a_large_batch_gets_one_id_per_request(ledger):
    created = ledger.submit([RequestInput(f"person-{i}", "access") for i in range(3000)]).created
    assert len(created) == len(set(created)) == 3000
    assert len({r["request_id"] for r in ledger.store.rows("requests", columns=("request_id",))}) == 3000


def test_requests_with_ids_are_added_once_by_id_whatever_else_is_open(ledger):
    """The intake's ingester hands over acknowledged ids; after a crash it may hand some again."""
    older = [new_request_id(set()) for _ in range(3)]
    first = ledger.submit([RequestInput(f"p{i}", "erase", request_id=r) for i, r in enumerate(older)])
    assert first.created == older
    ledger.submit([RequestInput("someone", "access")])  # another file between them
    newer = [new_request_id(set()) for _ in range(2)]
    # The same person's second erase request with an id of its own is added (the person holds a status
    # token for each); ids already in the ledger, from an older file, are not added again.
    again = ledger.submit([RequestInput("p0", "erase", request_id=older[0]), RequestInput("p0", "erase",
                           request_id=newer[0]), RequestInput("p2", "erase", request_id=older[2]),
                           RequestInput("p9", "access", request_id=newer[1])])
    assert again.created == newer and again.duplicates == 2
    ids = [r["request_id"] for r in ledger.store.rows("requests", columns=("request_id",))]
    assert len(ids) == len(set(ids)) == 6 and set(ids) >= {*older, *newer}


def test_appended_tables_are_compacted_and_their_history_purged_so_reads_stay_one_file(tmp_path, monkeypatch):
    """The journal gains a file and a snapshot per append; past the store's limits it is rewritten as
    one file, older snapshots and their files go (those of the snapshot the rewrite replaced at the
    next rewrite: a reader may have planned on it), and every step appended is still there (pyiceberg
    and pyarrow read the table and its files independently)."""
    from pathlib import Path
    from urllib.parse import urlparse

    import pyarrow.parquet as pq
    from pyiceberg.table import Table

    from lakehouse_dsr.ledger import store as store_module
    from lakehouse_dsr.ledger.journal import Step

    monkeypatch.setattr(store_module, "COMPACT_FILES", 3)
    ledger = Ledger(make_settings(tmp_path))  # pyiceberg only: no Spark
    recorded = 0

    def record() -> Table:
        nonlocal recorded
        ledger.journal.record([Step(f"run-{recorded}", "demo.events", "checked", recorded)])
        recorded += 1
        return ledger.store.load("steps")

    def paths(snapshot_id: int) -> set[Path]:
        return {Path(urlparse(f.file.file_path).path) for f in table.scan(snapshot_id=snapshot_id).plan_files()}

    for _ in range(10):
        table = record()
        assert int(table.current_snapshot().summary["total-data-files"]) <= 3
        assert len(table.metadata.snapshots) <= 5  # the one a rewrite replaced, the rewrite, appends since
    assert sorted(s.snapshot_id for s in ledger.journal.steps()) == list(range(10))
    on_disk = {p for p in (tmp_path / "wh" / "dsr" / "steps" / "data").rglob("*.parquet")}
    assert on_disk == set().union(*(paths(s.snapshot_id) for s in table.snapshots()))  # nothing else left
    assert sum(pq.read_table(f).num_rows for f in paths(table.current_snapshot().snapshot_id)) == 10
    while int(table.current_snapshot().summary["total-data-files"]) < 3:
        table = record()
    stale, stale_files = table, paths(table.current_snapshot().snapshot_id)
    table = record()  # rewritten as one file: the data files `stale` planned are still there
    assert table.current_snapshot().summary["total-data-files"] == "1" and all(f.exists() for f in stale_files)
    assert sum(pq.read_table(f).num_rows for f in stale_files) == recorded - 1
    for _ in range(3):  # rewritten again: now it is gone
        table = record()
    assert not any(f.exists() for f in stale_files)
    handed, fresh = [stale], ledger.store.load
    monkeypatch.setattr(ledger.store, "load",
                        lambda table, create=True: handed.pop() if handed else fresh(table, create))
    assert len(ledger.store.rows("steps")) == recorded  # a reader holding the old table reads the new file
    for n in range(10):  # the requests table: one file per submission, until compacted
        ledger.submit([RequestInput(f"user-{n}", "erase", "gdpr", None)])
        assert int(ledger.store.load("requests").current_snapshot().summary["total-data-files"]) <= 3
    assert sorted(r["subject_id"] for r in ledger.requests()) == sorted(f"user-{n}" for n in range(10))


def test_a_late_version_hint_does_not_send_a_commit_back_to_an_old_version(tmp_path):
    """Concurrent commits to a hadoop-catalog table (the service's handlers and its intake loop both
    append to the audit): a writer can replace `version-hint.text` after later writers replaced it,
    and the versions just after its hint may already be deleted (old metadata files go). The table
    is still read at its newest version, and the next commit follows that one: no step recorded is
    lost (CI once answered a 500 here: the old version's purged files were read)."""
    import pyarrow.parquet as pq

    ledger = Ledger(make_settings(tmp_path))  # pyiceberg only: no Spark
    for n in range(14):
        ledger.journal.record([Step(f"run-{n}", "demo.events", "checked", n)])
    metadata = tmp_path / "wh" / "dsr" / "steps" / "metadata"
    versions = sorted(int(p.name[1:].split(".")[0]) for p in metadata.glob("v*.metadata.json"))
    newest, oldest = versions[-1], versions[0]
    assert oldest > 2  # older versions were deleted: the gap a stale hint falls into
    (metadata / "v1.metadata.json").write_bytes((metadata / f"v{oldest}.metadata.json").read_bytes())
    (metadata / "version-hint.text").write_text("1")  # the late writer's hint, its version still there
    assert ledger.store.load("steps").metadata_location.endswith(f"v{newest}.metadata.json")
    ledger.journal.record([Step("run-14", "demo.events", "checked", 14)])
    assert (metadata / f"v{newest + 1}.metadata.json").is_file()
    assert sorted(s.snapshot_id for s in ledger.journal.steps()) == list(range(15))
    live = {f.file.file_path for f in ledger.store.load("steps").scan().plan_files()}
    assert sum(pq.read_table(p.removeprefix("file:")).num_rows for p in live) == 15  # read by pyarrow


@pytest.mark.parametrize("lands, at, after", [("before its read of the history", 0, False),
                                              ("before its expiry commits", 0, True),
                                              ("between its expiry and its deletes", 1, False)])
def test_two_purges_of_one_table_at_once_both_finish_and_keep_every_row(tmp_path, monkeypatch, lands, at, after):
    """Two writers compacting one ledger table at once purge its history at once (the service's
    handlers and its intake loop both append to the audit). A purge that runs to its end inside
    another one, before that one reads the history, before its expiry commits (pyiceberg then finds
    the snapshots it expires gone: CI answered a 500 there), or after it expired snapshots and before
    it deletes their files, leaves it nothing to fail on: it reads the new state again, and a file
    the other deleted first is not deleted twice. Every row stays (pyarrow reads the live files)."""
    import pyarrow.parquet as pq

    from lakehouse_dsr.ledger import store as store_module

    settings = make_settings(tmp_path, purge={"orphan_min_age_minutes": 0})
    ledger, other = Ledger(settings), Ledger(settings)
    for n in range(5):
        ledger.journal.record([Step(f"run-{n}", "demo.events", "checked", n)])
    reads, reachable = [], store_module._reachable

    def another_purge() -> None:
        with monkeypatch.context() as m:
            m.setattr(store_module, "_reachable", reachable)
            other.store.purge_history("steps", 0)

    def reachable_amid_another_purge(loaded, snapshots):
        reads.append(1)
        landing = len(reads) - 1 == at
        if landing and not after:
            another_purge()
        found = reachable(loaded, snapshots)
        if landing and after:
            another_purge()
        return found

    monkeypatch.setattr(store_module, "_reachable", reachable_amid_another_purge)
    ledger.store.purge_history("steps", 0)
    monkeypatch.setattr(store_module, "_reachable", reachable)
    table = ledger.store.load("steps")
    assert len(table.metadata.snapshots) == 1
    live = {f.file.file_path for f in table.scan().plan_files()}
    assert sum(pq.read_table(p.removeprefix("file:")).num_rows for p in live) == 5
    on_disk = {f"file://{p}" for p in (tmp_path / "wh" / "dsr" / "steps" / "data").rglob("*.parquet")}
    assert on_disk == {store_module._normal(p) for p in live}  # the expired snapshots' files are gone


def test_rows_named_by_id_are_read_replaced_and_deleted_without_touching_the_unnamed_ones_between(tmp_path):
    """`Among` reads the span [min, max] of the named ids and matches them in Arrow: rows inside that
    span that are not named (every other id here) are neither returned, changed nor deleted. Checked
    by pyiceberg's own scan of the table."""
    from lakehouse_dsr.ledger.store import Among

    ledger = Ledger(make_settings(tmp_path))  # pyiceberg only: no Spark
    ledger.submit([RequestInput(f"p{i}", "erase") for i in range(6)])
    ids = sorted(r["request_id"] for r in ledger.store.rows("requests", columns=("request_id",)))
    named, between = ids[0::2], ids[1::2]
    assert named[0] < between[0] < between[1] < named[-1]  # two unnamed rows inside the named span

    def statuses() -> dict[str, str]:
        table = ledger.store.load("requests").scan(selected_fields=("request_id", "status")).to_arrow()
        return dict(zip(table.column("request_id").to_pylist(), table.column("status").to_pylist(), strict=True))

    read = ledger.store.rows("requests", Among("request_id", named), ("status",))
    assert read == [{"status": "received"}] * 3  # only the asked columns, only the named rows
    assert ledger.store.rows("requests", Among("request_id", [])) == []
    ledger.store.replace("requests", "request_id", named, lambda rows: [{**r, "status": "failed"} for r in rows])
    assert statuses() == {**{i: "failed" for i in named}, **{i: "received" for i in between}}
    ledger.store.delete("requests", Among("request_id", named))
    assert statuses() == {i: "received" for i in between}


def test_a_writer_whose_snapshot_another_writer_purged_meanwhile_writes_again_from_the_new_state(tmp_path, monkeypatch):
    """Two writers of an appending ledger table (the service's intake and a request handler, say): one
    loads the table, the other commits past the compaction limits, rewrites it and purges the history
    the first loaded, files and all. The first one's commit then cannot read its parent snapshot's
    manifests; it is a lost race like a refused commit, so it loads the new state and commits again:
    no 500, nothing lost (pyiceberg reads every step back)."""
    from lakehouse_dsr.ledger import store as store_module
    from lakehouse_dsr.ledger.journal import Step

    monkeypatch.setattr(store_module, "COMPACT_FILES", 3)
    ledger = Ledger(make_settings(tmp_path))
    other = Ledger(make_settings(tmp_path))
    for n in range(3):
        ledger.journal.record([Step(f"run-{n}", "demo.events", "checked", n)])
    stale = ledger.store.load("steps")
    for n in range(3, 9):  # compacted and purged by the other writer, past the stale snapshot
        other.journal.record([Step(f"run-{n}", "demo.events", "checked", n)])
    with pytest.raises(FileNotFoundError):  # what a stale writer meets: its parent's manifests are gone
        stale.append(stale.scan().to_arrow().slice(0, 0))
    handed, fresh = [stale], ledger.store.load
    monkeypatch.setattr(ledger.store, "load",
                        lambda table, create=True: handed.pop() if handed else fresh(table, create))
    ledger.journal.record([Step("run-9", "demo.events", "checked", 9)])
    assert sorted(s.snapshot_id for s in other.journal.steps()) == list(range(10))


def test_the_ledger_purge_removes_torn_files_of_every_ledger_table_but_not_their_live_ones(tmp_path):
    """A write a full disk cut short leaves a torn file beside a ledger table (a zero-length Parquet
    file no snapshot references): the ledger's purge removes it once older than the orphan window,
    whatever table it is in, and every committed row stays."""
    ledger = Ledger(make_settings(tmp_path))  # pyiceberg only: no Spark
    ledger.submit([RequestInput("p1", "erase")])
    ledger.journal.record([Step("run-1", "demo.events", "erased")])
    torn = []
    for table in ("steps", "audit"):
        data = Path(ledger.store.load(table).location().removeprefix("file://")) / "data"
        torn.append(data / "00000-0-torn.parquet")
        torn[-1].write_bytes(b"")
        old = time.time() - 2 * 24 * 3600  # past any orphan window
        os.utime(torn[-1], (old, old))
    young = torn[0].with_name("00000-1-young.parquet")  # a writer's file not committed yet: kept
    young.write_bytes(b"")

    result = ledger.purge_history()
    assert result["orphans_removed"] >= 2 and not any(t.exists() for t in torn) and young.exists()
    assert [s.step for s in ledger.journal.steps()] == ["erased"]
    assert len(ledger.statuses()) == 1
