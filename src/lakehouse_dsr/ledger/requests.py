"""Requests as people file them: validation, deadlines and CSV intake. No Spark, no catalog."""

from __future__ import annotations

import calendar
import csv
import io
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from ..exceptions import RequestInputError

RequestType = Literal["erase", "access", "opt_out", "opt_in"]
Regulation = Literal["gdpr", "ccpa"]
REQUEST_TYPES: tuple[str, ...] = ("erase", "access", "opt_out", "opt_in")
CONSENT_TYPES: tuple[str, ...] = ("opt_out", "opt_in")  # sale/sharing of personal data: stop, or resume
REGULATIONS: tuple[str, ...] = ("gdpr", "ccpa")
MAX_SUBJECT_LENGTH = 65_536
REQUEST_ID = re.compile(r"req-[0-9a-f]{21}")
# Python's whitespace (str.strip, str.isspace, re's \s) spelled out, so that the API's JSON Schemas
# (service/app.py, evidence/handoff.py) state exactly the rules checked here: `\s` means other sets in
# ECMA-262 regexes (JSON Schema's) and in pydantic's Rust ones.
SPACE = r"\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK = f"[^{SPACE}]"  # unanchored: somewhere a character that is not whitespace


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_text(at: datetime) -> str:
    """`at` (UTC) as 2026-01-31T12:00:00Z, as statuses, certificates and events show times; the year
    always four digits (glibc's %Y drops the padding of years before 1000, which the documents'
    date-time pattern refuses)."""
    return f"{at.year:04d}-{at:%m-%dT%H:%M:%SZ}"


def add_months(day: date, months: int) -> date:
    """Same day `months` later, clamped to the month's end (Jan 31 + 1 month = Feb 28/29)."""
    month_index = day.month - 1 + months
    year, month = day.year + month_index // 12, month_index % 12 + 1
    return date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


def add_business_days(day: date, days: int) -> date:
    """The `days`-th weekday (Monday to Friday) after `day`: Friday + 1 = Monday, Saturday + 1 = Monday.
    Public holidays are not known here, so they count as business days (the deadline errs early)."""
    while days > 0:
        day += timedelta(days=1)
        days -= day.weekday() < 5
    return day


def due_date(received: date, regulation: str, extended: bool = False, request_type: str = "erase") -> date:
    """GDPR Art. 12(3): one month, extendable by two more, for every type (an opt-out is an objection,
    Art. 21). CCPA §1798.130: 45 days, extendable by 45; but an opt-out of sale/sharing is due in 15
    business days, without extension (11 CCR §7026(f)). Opt-ins have no statutory deadline: they
    follow the opt-out's (RequestInputError for an extension under CCPA)."""
    if regulation not in REGULATIONS:
        raise RequestInputError(f"unknown regulation {regulation!r} (expected one of {', '.join(REGULATIONS)})")
    if regulation == "gdpr":
        return add_months(received, 3 if extended else 1)
    if request_type in CONSENT_TYPES:
        if extended:
            raise RequestInputError(f"CCPA allows no extension for {request_type} requests: due in 15 business days")
        return add_business_days(received, 15)
    return received + timedelta(days=90 if extended else 45)


@dataclass(frozen=True)
class RequestInput:
    """One request to record (`Ledger.submit`): the subject's id, the type (erase, access, opt_out,
    opt_in), the regulation (gdpr, ccpa) and when it was received (default: now); `request_id` only
    for a request the intake service already acknowledged under that id."""

    subject_id: str
    request_type: str
    regulation: str = "gdpr"
    received_at: datetime | None = None
    # Given by the intake service, which acknowledged the request under this id before the ledger saw it.
    request_id: str | None = None
    # California DROP: the work items (12-character ids) this request answers (drop/items.py).
    drop_work_items: tuple[str, ...] = ()

    def validated(self, where: str = "") -> RequestInput:
        prefix = f"{where}: " if where else ""
        if not isinstance(self.subject_id, str) or not self.subject_id.strip():
            raise RequestInputError(f"{prefix}subject id is empty")
        if len(self.subject_id) > MAX_SUBJECT_LENGTH:
            raise RequestInputError(f"{prefix}subject id is longer than {MAX_SUBJECT_LENGTH} characters")
        if not self.subject_id.isascii() and _SURROGATE.search(self.subject_id):  # e.g. undecodable argv bytes
            raise RequestInputError(f"{prefix}subject id is not valid Unicode text (it holds undecodable bytes)")
        if self.request_type not in REQUEST_TYPES:
            raise RequestInputError(
                f"{prefix}unknown request type {_shown(self.request_type)} (expected one of {', '.join(REQUEST_TYPES)})"
            )
        if self.regulation not in REGULATIONS:
            raise RequestInputError(
                f"{prefix}unknown regulation {_shown(self.regulation)} (expected one of {', '.join(REGULATIONS)})"
            )
        received = self.received_at
        if received is not None and received.tzinfo is None:
            received = received.replace(tzinfo=UTC)
        if received is not None and received > utc_now() + timedelta(days=1):
            raise RequestInputError(f"{prefix}received_at {received.isoformat()} is in the future")
        if self.request_id is not None and not REQUEST_ID.fullmatch(self.request_id):
            raise RequestInputError(f"{prefix}request id {_shown(self.request_id)} is not req-<21 hex digits>")
        if received is self.received_at:  # nothing to fill in: no copy (a million of them cost a second)
            return self
        return RequestInput(self.subject_id, self.request_type, self.regulation, received, self.request_id,
                            self.drop_work_items)


_SURROGATE = re.compile("[\ud800-\udfff]")
# Values echoed in messages: mistyped keywords and dates. Anything else may be an identifier in the wrong
# column (or a header that is really a row of data), and messages never show identifiers.
_SHOWABLE = re.compile(r"[A-Za-z_]{0,20}|(?=[^:-]*[:-])[0-9TZ:+. -]{1,40}")


def _shown(value: object) -> str:
    return repr(value) if isinstance(value, str) and _SHOWABLE.fullmatch(value) else "(value not shown)"


def parse_received(text: str, where: str = "") -> datetime:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RequestInputError(f"{where}: received_at {_shown(text)} is not an ISO-8601 date or time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RequestBatch:
    """Validated requests as columns, in the order given: `Ledger.submit`'s input at any size (a
    million `RequestInput` objects cost seconds that a list per field does not). Made by `of` or
    `read_requests_csv`, which validate every request; iterating gives `RequestInput`s."""

    subject_id: list[str]
    request_type: list[str]
    regulation: list[str]
    received_at: list[datetime | None]
    request_id: list[str | None]
    drop_work_items: list[tuple[str, ...]]

    @staticmethod
    def of(inputs: Iterable[RequestInput]) -> RequestBatch:
        valid = [r.validated() for r in inputs]
        return RequestBatch([r.subject_id for r in valid], [r.request_type for r in valid],
                            [r.regulation for r in valid], [r.received_at for r in valid],
                            [r.request_id for r in valid], [r.drop_work_items for r in valid])

    def __len__(self) -> int:
        return len(self.subject_id)

    def __getitem__(self, i: int) -> RequestInput:
        return RequestInput(self.subject_id[i], self.request_type[i], self.regulation[i], self.received_at[i],
                            self.request_id[i], self.drop_work_items[i])

    def __iter__(self) -> Iterator[RequestInput]:
        return map(self.__getitem__, range(len(self)))


_COLUMNS = ("subject_id", "type", "regulation", "received_at")


def read_requests_csv(path: str | Path) -> RequestBatch:
    """Parse and validate a whole CSV (`subject_id,type[,regulation][,received_at]`) before anything is
    submitted. A malformed file is refused with its first bad line and the reason.

    Cost: the text split into columns (`_plain_fields`; a quoted file by the csv module's C reader),
    then the checks column by column: keywords and dates once per distinct value, subject ids with a
    few string methods each; only a row those find suspect (a subject id that is not plain ASCII, a
    value that is not valid) goes through `RequestInput.validated`, which gives the verdict and the
    message."""
    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8-sig")  # bytes: a "\r" inside a field stays "\r"
    except FileNotFoundError:
        raise RequestInputError(f"{file} does not exist") from None
    except UnicodeDecodeError as exc:
        raise RequestInputError(f"{file} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:  # a directory, no permission, ...
        raise RequestInputError(f"{file} cannot be read: {exc.strerror or type(exc).__name__}") from None
    # newline="": a line break inside a quoted field (and U+2028, U+0085 anywhere) belongs to the field.
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        columns = [c.strip() for c in next(reader, [])]
        _check_header(file, columns)
        width = len(columns)
        plain = _plain_fields(text, width)
        rows = [] if plain else list(filter(None, reader))  # blank lines hold no request
    except csv.Error as exc:  # e.g. a field longer than the csv module's limit
        raise RequestInputError(f"{file} line {reader.line_num}: not valid CSV ({exc})") from None
    if not (plain or rows):
        raise RequestInputError(f"{file} holds no requests")

    def where(index: int) -> str:
        """The line the `index`-th request ends on (a quoted field may span lines): the file read again,
        only to name a bad line."""
        again = csv.reader(io.StringIO(text, newline=""))
        next(again)
        for i, _ in enumerate(filter(None, again)):
            if i == index:
                break
        return f"{file} line {again.line_num}"

    # A row of the wrong width is refused once every row before it has been checked.
    cut = next((i for i, r in enumerate(rows) if len(r) != width), len(rows))
    given = plain or [list(map(itemgetter(i), rows[:cut])) for i in range(width)]
    count = len(given[0])
    field = {c: given[columns.index(c)] if c in columns else [""] * count for c in _COLUMNS}
    subjects = field["subject_id"]
    types = _each_distinct(field["type"], _keyword)
    regulations = _each_distinct(field["regulation"], _regulation)
    latest = utc_now() + timedelta(days=1)
    received = _each_distinct(field["received_at"], lambda v: _received_or_bad(v, latest) if v else None)
    suspect = {i for i, s in enumerate(subjects) if not (s and s.isascii() and len(s) <= MAX_SUBJECT_LENGTH
                                                         and not s.isspace())}
    suspect.update(i for i, v in enumerate(types) if v not in REQUEST_TYPES)
    suspect.update(i for i, v in enumerate(regulations) if v not in REGULATIONS)
    suspect.update(i for i, v in enumerate(received) if v is _BAD)
    for i in sorted(suspect):  # the verdict and the message of the row-by-row check
        try:
            request = _request(field, i).validated()
        except RequestInputError:
            line = where(i)
            _request(field, i, line).validated(line)
            raise
        subjects[i], types[i], regulations[i], received[i] = (request.subject_id, request.request_type,
                                                              request.regulation, request.received_at)
    if cut < len(rows):
        raise RequestInputError(f"{where(cut)}: expected {width} fields")
    return RequestBatch(subjects, types, regulations, received, [None] * count, [()] * count)


def _plain_fields(text: str, width: int) -> list[list[str]] | None:
    """The columns of a CSV with no quote, carriage return or NUL, no field over the csv module's limit
    and `width` fields on every line, split as the csv module splits them without making a list per
    row (a million of those cost a second); None for any other text, which the csv module reads."""
    if '"' in text or "\r" in text or "\x00" in text:
        return None
    lines = [line for line in text.split("\n")[1:] if line]
    if not lines or max(map(len, lines)) > csv.field_size_limit() \
            or set(map(str.count, lines, repeat(","))) != {width - 1}:
        return None
    fields = ",".join(lines).split(",")
    return [fields[c::width] for c in range(width)]


def _check_header(file: Path, columns: list[str]) -> None:
    if any("\x00" in c for c in columns):
        raise RequestInputError(f"{file} is not UTF-8 text (NUL bytes in the header: UTF-16?); save it as UTF-8")
    missing = [c for c in _COLUMNS[:2] if c not in columns]
    unknown = [_shown(c) for c in columns if c not in _COLUMNS]
    twice = [c for c in _COLUMNS if columns.count(c) > 1]
    if missing or unknown or twice:
        found = "; ".join([*([f"missing {', '.join(missing)}"] if missing else []),
                           *([f"unknown column(s) {', '.join(unknown)}"] if unknown else []),
                           *([f"{', '.join(twice)} given twice"] if twice else [])])
        if any(c.lower() in REQUEST_TYPES for c in columns):  # a request, not a header: show none of it
            found = "the first line looks like a request (is the header line missing?)"
        raise RequestInputError(
            f"{file}: header must be subject_id,type[,regulation][,received_at]; "
            + (found if columns else "the file is empty")
        )


_BAD = object()  # a value the row-by-row check must judge (and refuse)


def _received_or_bad(text: str, latest: datetime) -> datetime | object:
    try:
        received = parse_received(text)
    except RequestInputError:
        return _BAD
    return _BAD if received > latest else received


def _each_distinct(values: list[str], convert: Callable[[str], Any]) -> list[Any]:
    """`convert` of each value, called once per distinct value (a batch repeats its keywords and dates)."""
    converted = {v: convert(v) for v in set(values)}
    return [converted[v] for v in values]


def _request(field: dict[str, list[str]], i: int, where: str = "") -> RequestInput:
    """Row `i` as the row-by-row reader made it (`where`: the line, for a date that is not one)."""
    received = field["received_at"][i]
    return RequestInput(field["subject_id"][i], _keyword(field["type"][i]), _regulation(field["regulation"][i]),
                        parse_received(received, where) if received else None)


def _keyword(text: str) -> str:
    return text.strip().lower()


def _regulation(text: str) -> str:
    """A regulation as given, GDPR when the field is empty."""
    return _keyword(text or "gdpr")
