"""A DROP download, read and checked strictly: no Spark, no catalog (the control plane).

`GET /data/download` gives a ZIP with one `ID,Hash` CSV per list the broker selected (header-only
when nothing is new) and, when something was withdrawn, a `Removed` CSV (`ID,Hash,ListType`). Every
file, header and row is checked before anything is filed: a download that breaks the format is
refused with the file, line and reason. Rows are checked column by column in Arrow (a million work
items in about a second), never one Python object per row.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..exceptions import DsrError
from .lists import DROP_NAMES

FILE_NAME = re.compile(r"^(?P<day>[0-9]{8})_(?P<broker>[0-9]{4})_(?P<type>[A-Za-z]+)\.csv$")
WORK_ITEM_ID = "[A-Za-z0-9]{12}"
HASH = "[A-Za-z0-9+/]{43}="
_LIST_TYPES = {drop: ours for ours, drop in DROP_NAMES.items()}  # Email -> email
_ROW = {False: re.compile(f"^{WORK_ITEM_ID},{HASH}$"),
        True: re.compile(f"^{WORK_ITEM_ID},{HASH},({'|'.join(_LIST_TYPES)})$")}
_HEADER = {False: "ID,Hash", True: "ID,Hash,ListType"}
ITEMS = pa.schema([("work_item_id", pa.string()), ("list_type", pa.string()), ("hash", pa.string())])


class DropFileError(DsrError):
    """A DROP download breaks the published format (the file, line and reason are in the message)."""


@dataclass(frozen=True)
class Download:
    """What one download carries. `items`: every work item (work_item_id, list_type as the data map
    names lists, hash); `removed`: the withdrawn ones, same columns; `sha256`: of the ZIP's bytes."""

    name: str
    day: date
    broker_id: str
    lists: tuple[str, ...]
    items: pa.Table
    removed: pa.Table
    sha256: str

    def counts(self) -> dict[str, int]:
        """Work items per list (every list the download carries, empty ones too)."""
        per = dict.fromkeys(self.lists, 0)
        counted = pc.value_counts(self.items.column("list_type"))
        for name, count in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True):
            per[str(name)] = int(count or 0)
        return per


def read_download(path: Path) -> Download:
    """Read and check a DROP download (`YYYYMMDD_BROKER_DROP.zip`). Raises DropFileError naming the
    file, line and reason at the first fault: a member that is not one of the published CSVs, files of
    different days or brokers, a list twice, a wrong header, a row that is not `ID,Hash` (a 12-character
    Base62 ID, a 44-character SHA-256 Base64 hash; `Removed` adds a known ListType), a work-item ID
    twice. Cost: reads the archive once; rows are checked in Arrow."""
    try:
        data = path.read_bytes()
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise DropFileError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise DropFileError(f"{path}: not a ZIP archive ({exc})") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        if not members:
            raise DropFileError(f"{path.name}: the archive holds no file")
        named = [(m, _file_name(m.filename)) for m in members]
        days = {(n["day"], n["broker"]) for _, n in named}
        if len(days) > 1:
            raise DropFileError(f"{path.name}: its files are of different days or brokers "
                                f"({', '.join(sorted(f'{d}_{b}' for d, b in days))})")
        lists: dict[str, pa.Table] = {}
        removed = None
        for member, name in named:
            kind = name["type"]
            if kind in lists or (kind == "Removed" and removed is not None):
                raise DropFileError(f"{member.filename}: a second file of type {kind}")
            table = _rows(member.filename, archive.read(member), kind)
            if kind == "Removed":
                removed = table
            else:
                lists[kind] = table.append_column("list_type", pa.repeat(_LIST_TYPES[kind], table.num_rows))
    ((day, broker),) = days
    try:
        on = datetime.strptime(day, "%Y%m%d").date()
    except ValueError:
        raise DropFileError(f"{path.name}: {day} in its file names is not a date") from None
    items = pa.concat_tables([t.select(ITEMS.names).cast(ITEMS) for t in lists.values()]) if lists \
        else ITEMS.empty_table()
    _unique(items, [(k, t.num_rows) for k, t in lists.items()])
    return Download(path.name, on, broker, tuple(_LIST_TYPES[k] for k in lists), items,
                    removed.select(ITEMS.names).cast(ITEMS) if removed is not None else ITEMS.empty_table(),
                    hashlib.sha256(data).hexdigest())


def _file_name(member: str) -> dict[str, str]:
    found = FILE_NAME.match(member)
    if found is None or (found["type"] not in _LIST_TYPES and found["type"] != "Removed"):
        raise DropFileError(f"{member}: not a DROP file (YYYYMMDD_BROKER_TYPE.csv, TYPE one of "
                            f"{', '.join([*_LIST_TYPES, 'Removed'])})")
    return found.groupdict()


def _rows(member: str, raw: bytes, kind: str) -> pa.Table:
    """The rows of one CSV as (work_item_id, hash[, list_type]), checked; UTF-8 with or without a byte
    order mark, lines ended by LF or CRLF."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DropFileError(f"{member}, line {line}: not UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
    is_removed = kind == "Removed"
    if not lines or lines[0] != _HEADER[is_removed]:
        raise DropFileError(f"{member}, line 1: the header must be exactly {_HEADER[is_removed]!r}, "
                            f"found {(lines[0] if lines else '')[:80]!r}")
    rows = pa.array(lines[1:], pa.string())
    good = pc.match_substring_regex(rows, _ROW[is_removed].pattern)
    if not pc.all(good).as_py() and len(rows):
        bad = pc.index(good, False).as_py()
        raise DropFileError(f"{member}, line {bad + 2}: {_fault(lines[bad + 1], is_removed)}")
    ids = pc.utf8_slice_codeunits(rows, 0, 12)
    hashes = pc.utf8_slice_codeunits(rows, 13, 57)
    columns = {"work_item_id": ids, "hash": hashes}
    if is_removed:  # DROP's spelling (NameVIN) lowered is the data map's (namevin)
        columns["list_type"] = pc.utf8_lower(pc.utf8_slice_codeunits(rows, 58))
    return pa.table(columns)


def _fault(line: str, is_removed: bool) -> str:
    """Why a row that failed the row pattern fails, in words (the row itself is not quoted: a hash is
    personal data)."""
    fields = line.split(",")
    want = 3 if is_removed else 2
    if len(fields) != want:
        return f"{len(fields)} fields, not {want}"
    if not re.fullmatch(WORK_ITEM_ID, fields[0]):
        return "the ID is not 12 letters or digits"
    if not re.fullmatch(HASH, fields[1]):
        return "the Hash is not a SHA-256 in Base64 (44 characters ending in '=')"
    return f"the ListType is not one of {', '.join(_LIST_TYPES)}"


def _unique(items: pa.Table, sizes: list[tuple[str, int]]) -> None:
    """Every work-item ID once across the download's lists."""
    counted = pc.value_counts(items.column("work_item_id"))
    repeated = pc.greater(counted.field("counts"), pa.scalar(1, pa.int64()))
    if not pc.any(repeated).as_py():
        return
    first = pc.filter(counted, repeated)[0]
    index = pc.index(items.column("work_item_id"), first["values"]).as_py()
    for kind, size in sizes:
        if index < size:
            raise DropFileError(f"work-item ID at line {index + 2} of the {kind} list appears "
                                f"{first['counts'].as_py()} times in the download")
        index -= size
