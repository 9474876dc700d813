"""DROP work items in the ledger: filing a download, withdrawals, and where the cycle stands.

Two ledger tables (ledger/store.py): `drop_items`, one row per work item as DROP sent it (its ID, its
list, the hash, the download it came in, its deadline) and what became of it; `drop_downloads`, one
row per download imported, which is also the record of each access of DROP the law requires. No
Spark, no JVM: pyiceberg, like the rest of the ledger.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from ..config import DropSettings
from ..exceptions import LedgerError
from ..keys import private_dir, write_private
from ..lake.arrow import plain_offsets
from ..ledger.ledger import TIMESTAMP, Ledger
from ..ledger.requests import RequestInput, utc_now
from ..ledger.store import SCHEMAS, Among, EqualTo, In
from .download import Download, read_download
from .lists import DROP_NAMES

# DROP's status codes for a work item (0 and 1 are unused).
STATUS_NAMES = {2: "exempted", 3: "deleted", 4: "opted_out", 5: "not_found"}


@dataclass(frozen=True)
class ImportResult:
    """What importing one download filed. `repeated`: this very download (same bytes) was imported
    before; `already_filed`: its work items the ledger had (from it or an earlier download)."""

    download: str
    day: date
    broker_id: str
    lists: dict[str, int]
    filed: int
    already_filed: int
    withdrawn: int
    due_date: date
    repeated: bool


def import_download(ledger: Ledger, path: Path, settings: DropSettings | None = None,
                    now: datetime | None = None) -> ImportResult:
    """File a DROP download's work items in the ledger, due `processing_days` after the download's day,
    and withdraw the ones its `Removed` file names (those not settled yet: a deleted person stays
    deleted). Checked whole first (drop/download.py): a malformed download files nothing. Importing the
    same download again, or items an earlier one carried, files nothing twice. Cost: reads the download,
    the ledger's work-item IDs (one column), and appends in one commit each: items, withdrawals, the
    download's record."""
    settings = settings or DropSettings()
    download = read_download(path)
    now = now or utc_now()
    due = download.day + timedelta(days=settings.processing_days)
    store = ledger.store
    repeated = bool(store.rows("drop_downloads", EqualTo("sha256", download.sha256), ("download",)))
    filed = 0

    def attempt(loaded: Table) -> None:
        nonlocal filed
        items = download.items
        if loaded.current_snapshot() is not None and items.num_rows:
            have = Among("work_item_id", _ids(items)).read(loaded, ("work_item_id",))
            items = items.filter(pc.invert(pc.is_in(items.column("work_item_id"), value_set=have.column(0))))
        filed = items.num_rows
        if filed:
            loaded.append(_new_items(items, download, due, now))

    store.compact(store.transact("drop_items", attempt))
    withdrawn = _withdraw(ledger, download, now)
    store.append("drop_downloads", [{
        "download": download.name, "sha256": download.sha256, "broker_id": download.broker_id,
        "download_day": download.day, "imported_at": now, "lists": json.dumps(download.counts()),
        "items": download.items.num_rows, "filed": filed, "withdrawn": withdrawn}])
    return ImportResult(download.name, download.day, download.broker_id, download.counts(), filed,
                        download.items.num_rows - filed, withdrawn, due, repeated)


def _new_items(items: pa.Table, download: Download, due: date, now: datetime) -> pa.Table:
    schema, n = SCHEMAS["drop_items"], items.num_rows
    columns = {"work_item_id": items.column("work_item_id"), "list_type": items.column("list_type"),
               "hash": items.column("hash"), "download": pa.repeat(download.name, n),
               "download_day": pa.repeat(pa.scalar(download.day, pa.date32()), n),
               "due_date": pa.repeat(pa.scalar(due, pa.date32()), n),
               "filed_at": pa.repeat(pa.scalar(now, TIMESTAMP), n)}
    return pa.table({f.name: columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in schema},
                    schema=schema)


def _withdraw(ledger: Ledger, download: Download, now: datetime) -> int:
    """Mark the work items of the download's `Removed` file withdrawn, unless settled or withdrawn
    already, in one commit (none when nothing changes); the requests filed for them and not carried
    out yet are withdrawn from the ledger (`Ledger.withdraw`), unless another work item still needs
    them (a person matched by two items, one of them withdrawn)."""
    if not download.removed.num_rows:
        return 0
    changed: list[str] = []
    freed: set[str] = set()
    downloads: set[str] = set()

    def change(loaded: Table, rows: pa.Table) -> pa.Table:
        open_ = pc.and_(pc.is_null(rows.column("withdrawn_at")), pc.is_null(rows.column("status")))
        chosen = rows.filter(open_)
        changed[:] = [str(i) for i in chosen.column("work_item_id").to_pylist()]
        freed.clear()
        freed.update(r for ids in chosen.column("request_ids").to_pylist() if ids for r in json.loads(str(ids)))
        downloads.update(str(d) for d in chosen.column("download").to_pylist())
        stamp = pc.if_else(open_, pa.scalar(now, TIMESTAMP), rows.column("withdrawn_at"))
        return rows.set_column(rows.schema.get_field_index("withdrawn_at"), "withdrawn_at", stamp)

    ledger.store.replace_arrow("drop_items", "work_item_id", _ids(download.removed), change)
    if freed:  # a request answers items of one download (its id is derived from it): only theirs are read
        items = ledger.store.arrow("drop_items", In("download", sorted(downloads)), ("request_ids", "withdrawn_at"))
        live = items.filter(pc.and_(pc.is_null(items.column("withdrawn_at")), pc.is_valid(items.column("request_ids"))))
        needed = {r for ids in live.column("request_ids").to_pylist() for r in json.loads(str(ids))}
        ledger.withdraw(sorted(freed - needed), "withdrawn by DROP (a Removed entry of the download)", now)
    return len(changed)


@dataclass(frozen=True)
class DropStatus:
    """Where the DROP cycle stands. `items`: work items per state (pending, withdrawn, and DROP's status
    names); `next_access_by`: the last day the next download is due (last access + interval);
    `next_deadline`: the earliest due date of a pending work item."""

    last_download: str | None
    last_download_day: date | None
    last_access: datetime | None
    items: dict[str, int]
    unreported: int
    next_access_by: date | None
    days_left_in_cycle: int | None
    next_deadline: date | None


def drop_status(ledger: Ledger, settings: DropSettings | None = None, today: date | None = None) -> DropStatus:
    """The last download, the work items per state, the days left before DROP must be accessed again
    and the next processing deadline. Cost: reads the downloads table and four columns of the items."""
    settings, today = settings or DropSettings(), today or utc_now().date()
    downloads = ledger.store.rows("drop_downloads", columns=("download", "download_day", "imported_at"))
    last = max(downloads, key=lambda d: d["imported_at"], default=None)
    items = ledger.store.arrow("drop_items", columns=("status", "withdrawn_at", "due_date", "reported_status"))
    withdrawn, status = pc.is_valid(items.column("withdrawn_at")), items.column("status")
    pending = pc.and_(pc.invert(withdrawn), pc.is_null(status))
    counts = {"pending": _count(pending), "withdrawn": _count(withdrawn)}
    for code, name in STATUS_NAMES.items():
        counts[name] = _count(pc.and_(pc.invert(withdrawn), pc.equal(status, pa.scalar(code, pa.int64()))))
    # settled, less settled and reported as it stands (equal: null where either is, which counts as no)
    unreported = _count(pc.is_valid(status)) - _count(pc.equal(status, items.column("reported_status")))
    deadline = pc.min(pc.filter(items.column("due_date"), pending)).as_py() if counts["pending"] else None
    access = last["imported_at"] if last else None
    access_by = access.date() + timedelta(days=settings.interval_days) if access else None
    return DropStatus(last["download"] if last else None, last["download_day"] if last else None, access, counts,
                      unreported, access_by, (access_by - today).days if access_by else None, deadline)


def _ids(items: pa.Table) -> list[str]:
    return [str(i) for i in items.column("work_item_id").to_pylist()]


def _count(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


# -- matching's outcomes ----------------------------------------------------------------------------
def unmatched_items(ledger: Ledger) -> pa.Table:
    """The work items a match has to look for (work_item_id, list_type, hash, download, download_day):
    those no request was filed for, not withdrawn, never matched or found nobody before (status 5: a
    person the lake gained since must be acted on). Cost: one read of the items table."""
    items = ledger.store.arrow("drop_items", columns=("work_item_id", "list_type", "hash", "download", "download_day",
                                                       "request_ids", "withdrawn_at"))
    wanted = pc.and_(pc.is_null(items.column("request_ids")), pc.is_null(items.column("withdrawn_at")))
    return items.filter(wanted).select(["work_item_id", "list_type", "hash", "download", "download_day"])


@dataclass(frozen=True)
class MatchResult:
    """What one match did: work items looked for; of them, those matched to one person (an erase
    request each person), to several (an opt-out of sale/sharing for each of them) or to nobody
    (status 5); requests filed (a person matched by several items of a download gets one)."""

    items: int
    one_person: int
    several_people: int
    not_found: int
    erase_requests: int
    opt_out_requests: int


def file_matches(ledger: Ledger, looked_for: pa.Table, matches: pa.Table, now: datetime | None = None) -> MatchResult:
    """File what the match of `looked_for` (unmatched_items) found (`matches`: work_item_id, subject_id):
    a work item matched to exactly one person asks for that person's erasure (CCPA, received on the
    download's day, so due with the download); one matched to several people opts each of them out of
    sale and sharing, and deletes nothing; one matched to nobody is settled as status 5, its hash kept
    for the next match. Requests get ids derived from the download, the person and the type under the
    ledger's key: filing the same match again files nothing twice. Then one commit of the items.
    Cost: Arrow joins and group-bys, one keyed hash per request, `Ledger.submit`, one rewrite of the
    items' files."""
    now = now or utc_now()
    looked_for, matches = plain_offsets(looked_for), plain_offsets(matches)  # joins need one string type on both sides
    pairs = matches.group_by(["work_item_id", "subject_id"]).aggregate([])  # each pair once
    people = pairs.group_by("work_item_id").aggregate([("subject_id", "count")]).rename_columns(
        ["work_item_id", "subjects"])
    pairs = pairs.join(people, "work_item_id", join_type="inner").join(
        looked_for.select(["work_item_id", "download", "download_day"]), "work_item_id", join_type="inner")
    kind = pc.if_else(pc.equal(pairs.column("subjects"), pa.scalar(1, pa.int64())), "erase", "opt_out")
    key, ids = ledger.key, []
    requests: dict[str, RequestInput] = {}
    answers: dict[str, list[str]] = {}  # request id -> the work items it answers
    for item, download, day, person, request_type in zip(*(c.to_pylist() for c in (
            pairs.column("work_item_id"), pairs.column("download"), pairs.column("download_day"),
            pairs.column("subject_id"), kind)), strict=True):
        received = datetime(day.year, day.month, day.day, tzinfo=UTC)
        request_id = _request_id(key, str(download), str(person), str(request_type), received)
        earlier = requests.get(request_id)
        if earlier is not None and (earlier.subject_id, earlier.request_type) != (str(person), str(request_type)):
            raise LedgerError(f"two DROP requests of download {download} were given the same id {request_id}; "
                              "nothing was filed, run the match again after rotating the ledger's key")
        if earlier is None:
            requests[request_id] = RequestInput(str(person), str(request_type), "ccpa", received, request_id)
        # the request row lists the items it was filed for; an item matched later to a request already
        # filed links to it from its own row only (submit adds an id once)
        answers.setdefault(request_id, []).append(str(item))
        ids.append(request_id)
    ledger.submit([replace(r, drop_work_items=tuple(sorted(answers[i]))) for i, r in requests.items()], now)
    # per item its requests as a JSON list (ids are letters, digits and '-': nothing to escape)
    linked = pairs.select(["work_item_id"]).append_column("request_id", pa.array(ids, pa.string())).group_by(
        "work_item_id").aggregate([("request_id", "list")])
    joined = pc.binary_join(linked.column("request_id_list"), "\",\"")
    listed = pc.binary_join_element_wise(pa.scalar("[\""), joined, pa.scalar("\"]"), pa.scalar(""))  # type: ignore[type-var]
    linked = pa.table({"work_item_id": linked.column("work_item_id"), "request_ids": listed}).join(
        people, "work_item_id", join_type="inner")

    def change(loaded: Table, rows: pa.Table) -> pa.Table:
        keys = plain_offsets(rows.select(["work_item_id"]))
        found = keys.join(linked, "work_item_id", join_type="inner")  # row order: restored by take
        at = pc.index_in(keys.column("work_item_id"), value_set=found.column("work_item_id"))
        none = pc.is_null(at)
        columns = {
            "matched_at": pa.repeat(pa.scalar(now, TIMESTAMP), rows.num_rows),
            "subjects": pc.fill_null(found.column("subjects").take(at), pa.scalar(0, pa.int64())),
            "request_ids": found.column("request_ids").take(at),
            "status": pc.if_else(none, pa.scalar(5, pa.int64()), pa.scalar(None, pa.int64())),
            "status_at": pc.if_else(none, pc.fill_null(rows.column("status_at"), pa.scalar(now, TIMESTAMP)),
                                    pa.scalar(None, TIMESTAMP))}
        for name, values in columns.items():
            rows = rows.set_column(rows.schema.get_field_index(name), name, values)
        return rows

    ledger.store.replace_arrow("drop_items", "work_item_id", _ids(looked_for), change)
    several = _count(pc.greater(people.column("subjects"), pa.scalar(1, pa.int64())))
    kinds = [r.request_type for r in requests.values()]
    return MatchResult(looked_for.num_rows, people.num_rows - several, several, looked_for.num_rows - people.num_rows,
                       kinds.count("erase"), kinds.count("opt_out"))


def _request_id(key: bytes, download: str, subject: str, kind: str, received: datetime) -> str:
    """`req-` + a millisecond of the download's day + 40 more bits, both from a keyed hash (BLAKE2b keyed
    with the ledger's key: a MAC) of download, person and type: the same for the same match, telling
    nothing of the person, sorting by day like every request id. 66 bits in all: half a million
    requests of one download collide with a chance of about one in a billion (40 bits alone: one in
    ten), and `file_matches` refuses a collision rather than merge two people's requests."""
    digest = hashlib.blake2b(f"{download}\0{subject}\0{kind}".encode(), key=key[:64], digest_size=9).digest()
    millisecond = int.from_bytes(digest[5:], "big") % 86_400_000
    return f"req-{int(received.timestamp() * 1000) + millisecond:011x}{digest[:5].hex()}"


# -- settling and answering ---------------------------------------------------------------------------
def settle(ledger: Ledger, now: datetime | None = None) -> int:
    """Give each matched work item the status its requests have earned: an erase request completed ->
    3 (deleted; also when exempt data was kept), or 2 (exempted) when it erased nothing and only
    tables exempt from erasure (the data map's `exempt:`) hold the person; held by a legal hold -> 2
    (exempted, until the hold ends and the erasure completes: then 3); every opt-out of an item
    matched to several people completed -> 4. Items whose requests are still open stay pending.
    Returns how many items changed status. Cost: reads the items waiting and their requests (status
    column; the evidence too where the data map exempts a table), then one commit when something
    changed."""
    now = now or utc_now()
    items = ledger.store.arrow("drop_items", columns=("work_item_id", "request_ids", "status", "withdrawn_at"))
    # pending, or exempted by a hold that may since have been released
    status = items.column("status")
    unsettled = pc.or_kleene(pc.is_null(status), pc.equal(status, pa.scalar(2, pa.int64())))
    waiting = items.filter(pc.and_(pc.and_(pc.is_valid(items.column("request_ids")), unsettled),
                                   pc.is_null(items.column("withdrawn_at"))))
    if not waiting.num_rows:
        return 0
    linked = {str(i): json.loads(str(r)) for i, r in zip(waiting.column("work_item_id").to_pylist(),
                                                       waiting.column("request_ids").to_pylist(), strict=True)}
    before = dict(zip(linked, waiting.column("status").to_pylist(), strict=True))
    wanted = sorted({r for ids in linked.values() for r in ids})
    exemptions = bool(ledger.settings.datamap.exempt)
    rows = ledger.store.arrow("requests", Among("request_id", wanted),
                              ("request_id", "request_type", "status", *(("evidence",) if exemptions else ())))
    state = {str(i): (str(t), str(s)) for i, t, s in zip(*(rows.column(c).to_pylist() for c in
                                                            ("request_id", "request_type", "status")), strict=True)}
    exempted = _all_kept(rows) if exemptions else set()
    earned: dict[str, int] = {}
    for item, ids in linked.items():
        if any(r not in state for r in ids):
            continue  # a request not in the ledger (yet): wait
        kinds = {state[r][0] for r in ids}
        statuses = {state[r][1] for r in ids}
        if kinds == {"erase"}:  # one person
            code = {"completed": 2 if exempted.issuperset(ids) else 3, "held": 2}.get(statuses.pop())
        else:
            code = 4 if statuses == {"completed"} else None
        if code is not None and code != before[item]:
            earned[item] = code
    if not earned:
        return 0

    def change(loaded: Table, rows: pa.Table) -> pa.Table:
        codes = [earned.get(str(i)) for i in rows.column("work_item_id").to_pylist()]
        status = pa.array(codes, pa.int64())
        rows = rows.set_column(rows.schema.get_field_index("status"), "status", status)
        stamp = pc.if_else(pc.is_valid(status), pa.scalar(now, TIMESTAMP), rows.column("status_at"))
        return rows.set_column(rows.schema.get_field_index("status_at"), "status_at", stamp)

    ledger.store.replace_arrow("drop_items", "work_item_id", list(earned), change)
    return len(earned)


def _all_kept(requests: pa.Table) -> set[str]:
    """The completed erase requests of `requests` (request_id, request_type, status, evidence) that
    erased nothing because only exempt tables hold their subject: DROP's status 2 applies only when
    everything matched is exempt."""
    done = requests.filter(pc.and_(pc.equal(requests.column("request_type"), pa.scalar("erase")),
                                   pc.equal(requests.column("status"), pa.scalar("completed"))))
    kept = set()
    for request_id, evidence in zip(done.column("request_id").to_pylist(), done.column("evidence").to_pylist(),
                                    strict=True):
        tables = json.loads(evidence or "{}").get("tables", {}).values()
        if any(t.get("kept") for t in tables) and not any(t.get("rows") for t in tables):
            kept.add(str(request_id))
    return kept


@dataclass(frozen=True)
class ExportResult:
    """What `export_answers` wrote: {file name: work items} of first statuses and of amendments, and the
    work items still pending (no status to send yet)."""

    uploads: dict[str, int]
    amendments: dict[str, int]
    pending: int


def export_answers(ledger: Ledger, out: Path, now: datetime | None = None) -> ExportResult:
    """Settle what can be settled (`settle`), then write DROP's upload files into `out` (owner-only):
    per download and list, the work items with a first status in `YYYYMMDD_BROKER_Type.csv` (header
    `Id,Status`; a later file of the same list gets a suffix `_partNN`, since DROP accepts a name once
    per download), and statuses changed since they were sent in `..._amendNN.csv`, for `POST
    /data/amend`. Withdrawn items need no status. The items are then marked sent with that status.
    Cost: reads the items and the record of files written; one commit each for items and record."""
    now = now or utc_now()
    settle(ledger, now)
    items = ledger.store.arrow("drop_items", columns=("work_item_id", "list_type", "download", "status",
                                                       "reported_status", "withdrawn_at"))
    live = items.filter(pc.is_null(items.column("withdrawn_at")))
    pending = _count(pc.is_null(live.column("status")))
    settled = live.filter(pc.is_valid(live.column("status")))
    first = settled.filter(pc.is_null(settled.column("reported_status")))
    # sent before with another status (not_equal is null where nothing was sent: not selected)
    changed = settled.filter(pc.not_equal(settled.column("status"), settled.column("reported_status")))
    written = ledger.store.rows("drop_uploads", columns=("download", "file_name"))
    taken = {(str(w["download"]), str(w["file_name"])) for w in written}
    downloads = {str(d["download"]): d for d in ledger.store.rows("drop_downloads",
                                                                   columns=("download", "download_day", "broker_id"))}
    private_dir(out)
    uploads: dict[str, int] = {}
    amendments: dict[str, int] = {}
    record: list[dict] = []
    for kind, chosen, into in (("upload", first, uploads), ("amend", changed, amendments)):
        groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for i, lst, d, s in zip(*(chosen.column(c).to_pylist() for c in ("work_item_id", "list_type", "download",
                                                                         "status")), strict=True):
            groups.setdefault((str(d), str(lst)), []).append((str(i), int(s)))
        for (download, list_type), rows in sorted(groups.items()):
            if download not in downloads:  # an import stopped between its items and its record
                raise LedgerError(f"download {download} has work items but no record of its import: import it "
                                  "again (nothing is filed twice), then export")
            day, broker = downloads[download]["download_day"], downloads[download]["broker_id"]
            name = _file_name(f"{day:%Y%m%d}_{broker}_{DROP_NAMES[list_type]}", kind, download, taken)
            write_private(out / name, "Id,Status\n" + "".join(f"{i},{s}\n" for i, s in sorted(rows)))
            taken.add((download, name))
            into[name] = len(rows)
            record.append({"download": download, "file_name": name, "kind": kind, "items": len(rows),
                           "written_at": now})
    sent = {**_statuses(first), **_statuses(changed)}
    if sent:
        def change(loaded: Table, rows: pa.Table) -> pa.Table:
            codes = pa.array([sent[str(i)] for i in rows.column("work_item_id").to_pylist()], pa.int64())
            rows = rows.set_column(rows.schema.get_field_index("reported_status"), "reported_status", codes)
            return rows.set_column(rows.schema.get_field_index("reported_at"), "reported_at",
                                   pa.repeat(pa.scalar(now, TIMESTAMP), rows.num_rows))

        ledger.store.replace_arrow("drop_items", "work_item_id", list(sent), change)
        ledger.store.append("drop_uploads", record)
    return ExportResult(uploads, amendments, pending)


def _statuses(items: pa.Table) -> dict[str, int]:
    """{work item: status} of settled items."""
    return {str(i): int(s or 0) for i, s in zip(items.column("work_item_id").to_pylist(),
                                                items.column("status").to_pylist(), strict=True)}


def _file_name(stem: str, kind: str, download: str, taken: set[tuple[str, str]]) -> str:
    """The downloaded file's name for a list's first upload; then `_partNN` (more first statuses) or
    `_amendNN` (amendments), the first number not used for this download."""
    if kind == "upload" and (download, f"{stem}.csv") not in taken:
        return f"{stem}.csv"
    suffix = "part" if kind == "upload" else "amend"
    n = 1
    while (download, f"{stem}_{suffix}{n:02d}.csv") in taken:
        n += 1
    return f"{stem}_{suffix}{n:02d}.csv"
