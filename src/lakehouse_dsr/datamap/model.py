"""The data map: which tables hold personal data, by which key, and what erasure means there.

```yaml
datamap:
  subject: user_id                 # the primary identifier requests are filed under
  identifiers:                     # other identifiers, found through a table
    email: {table: demo.users, subject_column: user_id, column: email}
  tables:
    demo.events:     {key: user_id, identifier: user_id}              # action: delete
    demo.newsletter: {key: email, identifier: email}
    demo.orders:     {key: user_id, identifier: user_id, action: redact,
                      redact: [user_id, customer_name, shipping_address]}
    sales.web_sales:               # one row, two people: each group is redacted on its own key's match
      action: redact
      keys:
        ws_bill_customer_sk: {identifier: customer_sk, redact: [ws_bill_customer_sk, ws_bill_addr_sk]}
        ws_ship_customer_sk: {identifier: customer_sk, redact: [ws_ship_customer_sk, ws_ship_addr_sk]}
    web.clicks: {key: context.user.email, identifier: email}   # a struct path
  derived:                         # tables built from others: erased after their sources (lineage.py)
    demo_silver.user_daily: {from: [demo.events], key: user_id}
    demo_gold.daily_by_type: {from: [demo.events], sql: "SELECT ...", group_by: [event_type, day]}
  shares:                          # tables that leave the company, kept free of opted-out subjects (stages/share.py)
    partner.events: {from: demo.events, key: user_id, sql: "SELECT user_id, event_type FROM demo.events"}
  topics:                          # Kafka topics holding the subject (cluster: `kafka:` in dsr.yaml; stages/topics.py)
    clicks:   {key: user_id}                                  # the field of each record's JSON value
    profiles: {key: contact.email, identifier: email}
```
"""

from __future__ import annotations

import copy
import importlib.resources
import re
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Literal, cast, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")  # \Z: "$" would let a newline through
_ARRAY = "[]"  # after a key column: an array of identifiers
# What an `action: shred` key holds: a vault pseudonym, `psn:` and a random (version 4) UUID
PSEUDONYM_PREFIX = "psn:"
PSEUDONYM_PATTERN = r"^psn:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
# Table property `dsr pseudonymize` sets on the tables it writes: {key, identifier, encrypted: {column: type}}.
# Here, not in vault/, so the data-map check against the catalog can compare it with `encrypted:`.
PSEUDONYMIZED_PROPERTY = "dsr.pseudonymized"


def check_table_name(name: str) -> str:
    if not _TABLE.match(name):
        raise ValueError(f"table {name!r} must be written namespace.table (letters, digits, _)")
    return name


def _check_column(name: str, array_allowed: bool = True) -> str:
    if not _COLUMN.match(name.removesuffix(_ARRAY) if array_allowed else name):
        raise ValueError(f"column {name!r} must be a column name or a struct path (letters, digits, _ and dots)"
                         + (", with [] after an array of identifiers" if array_allowed else ""))
    return name


def column_path(column: str) -> str:
    """The column or struct path of a data-map column, without the array marker `[]`."""
    return column.removesuffix(_ARRAY)


def _with_identifiers(mapping: Any, subject: str) -> Any:
    """A mapping (raw or built) with its identifier and its key columns' identifiers filled in; an
    aggregate (no key) is left as it is."""
    raw = mapping.model_dump(by_alias=True, exclude_unset=True) if isinstance(mapping, BaseModel) else mapping
    if not isinstance(raw, dict) or (raw.get("key") is None and raw.get("keys") is None):
        return mapping
    identifier = raw.get("identifier") or subject
    keys = raw.get("keys")
    if isinstance(keys, dict):
        keys = {column: ({**spec, "identifier": spec.get("identifier") or identifier} if isinstance(spec, dict)
                         else spec.model_copy(update={"identifier": spec.identifier or identifier})
                         if isinstance(spec, KeySpec) else spec)
                for column, spec in keys.items()}
    return {**raw, "identifier": identifier, **({"keys": keys} if keys is not None else {})}


def _topic_defaults(mapping: Any, subject: str) -> Any:
    """A topic's identifier defaults to the subject, its key field to the identifier's name."""
    if not isinstance(mapping, dict):
        return mapping
    identifier = mapping.get("identifier") or subject
    return {**mapping, "identifier": identifier, "key": mapping.get("key") or identifier}


def is_array(column: str) -> bool:
    return column.endswith(_ARRAY)


def sql_literal(text: str) -> str:
    """`text` (a table name, a property, one of our own notes: never data) as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def column_ref(column: str) -> str:
    """A data-map column (a column or a struct path `a.b.c`, `[]` ignored) quoted for Spark SQL and
    `F.col`: `a`.`b`.`c`."""
    return ".".join(f"`{part}`" for part in column_path(column).split("."))


@dataclass(frozen=True)
class KeyGroup:
    """One subject column of a table, the identifier it holds, and what an erasure sets to NULL when
    that column names an erased subject (its own group only: another key's person keeps their columns)."""

    column: str  # as written in the data map: a struct path, `[]` after an array of identifiers
    identifier: str
    redact: tuple[str, ...] = ()

    @property
    def is_array(self) -> bool:
        return is_array(self.column)


class KeySpec(BaseModel):
    """A value under `keys:`: the identifier one key column holds, and (action: redact) its group."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    identifier: str | None = None  # defaults to the table's identifier, then the data map's subject
    redact: list[str] = Field(default_factory=list)


_PERIOD = re.compile(r"^\s*(\d{1,5})\s*(day|week|month|year)s?\s*\Z", re.IGNORECASE)


def _months_before(day: date, months: int) -> date:
    """`day` less `months` calendar months, the day of the month clamped (31 March - 1 month: 28/29 Feb)."""
    index = day.year * 12 + day.month - 1 - months
    year, month = divmod(index, 12)
    following = date(year + (month + 1) // 12, (month + 1) % 12 + 1, 1)  # first day of the next month
    return date(year, month + 1, min(day.day, (following - timedelta(days=1)).day))


class SubjectClock(BaseModel):
    """A clock of the subject rather than of the row (`clock: {table: crm.accounts, column:
    account_closed_at}`): a date or timestamp column of another keyed table of the data map, joined
    with the rule's table on the key both hold (the same identifier). A subject's clock is the
    latest value among their rows there; a subject with a NULL there (or no row) has no clock, and
    their rows are never past the rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    table: str
    column: str

    @model_validator(mode="after")
    def _names(self) -> SubjectClock:
        try:
            check_table_name(self.table)
            _check_column(self.column, array_allowed=False)
        except ValueError as exc:
            raise ValueError(f"clock: {exc}") from None
        return self

    def __str__(self) -> str:
        return f"{self.table}.{self.column}"


class ExpiryRule(BaseModel):
    """One enforced retention rule of a table (`expire:`): a row whose `clock` (a date or timestamp
    column of the row, or `{table, column}`: one of its subject in another keyed table, see
    SubjectClock) is older than `after` (N days | weeks | months | years) before the run's date
    is deleted (`delete: true`) or has its `redact` columns set to NULL (the rest of the row kept).
    The free-text `retention:` stays what the person is told; these rules are what runs enforce."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    after: str
    clock: str | SubjectClock
    delete: bool = False
    redact: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ExpiryRule:
        if not _PERIOD.match(self.after):
            shown = repr(self.after) if len(self.after) <= 40 else "(too long)"
            raise ValueError(f"after: {shown} is not a period (write e.g. '30 days', '12 weeks', '25 months', "
                             "'7 years')")
        if isinstance(self.clock, str):
            _check_column(self.clock, array_allowed=False)
        if self.delete == bool(self.redact):
            raise ValueError("give either 'delete: true' (the row goes) or 'redact: [columns]' (set to NULL), "
                             "not " + ("both" if self.delete else "neither"))
        for column in self.redact:
            _check_column(column, array_allowed=False)
        if self.clock in self.redact:
            raise ValueError(f"redact: the clock column {self.clock!r} cannot be redacted (the rule would lose "
                             "its clock)")
        return self

    @property
    def row_clock(self) -> str | None:
        """The clock column of the row (None: a clock of the subject)."""
        return self.clock if isinstance(self.clock, str) else None

    @property
    def subject_clock(self) -> SubjectClock | None:
        return self.clock if isinstance(self.clock, SubjectClock) else None

    @property
    def period(self) -> tuple[int, str]:
        """(amount, unit): unit day, week, month or year."""
        found = _PERIOD.match(self.after)
        assert found is not None  # validated
        return int(found.group(1)), found.group(2).lower()

    def cutoff(self, today: date) -> date:
        """Rows whose clock is before this day (00:00 UTC) are past the rule on `today`. A whole day,
        so the limit falls on a day boundary, which a time-partitioned table's partitions share."""
        amount, unit = self.period
        if unit in ("day", "week"):
            return today - timedelta(days=amount * (7 if unit == "week" else 1))
        return _months_before(today, amount * (12 if unit == "year" else 1))

    def crossing(self, clock_day: date) -> date:
        """The first run date on which a row whose clock is on `clock_day` is past the rule (the
        cutoff only grows with the date: step forward from the period added to the next day)."""
        day = clock_day + timedelta(days=1)
        amount, unit = self.period
        run = (day + timedelta(days=amount * (7 if unit == "week" else 1)) if unit in ("day", "week")
               else _months_before(day, -amount * (12 if unit == "year" else 1)))
        while self.cutoff(run) <= clock_day:
            run += timedelta(days=1)
        return run

    @property
    def days(self) -> float:
        """The period in days, months and years at their average length: for comparing rules."""
        amount, unit = self.period
        return amount * {"day": 1, "week": 7, "month": 30.44, "year": 365.25}[unit]

    @property
    def action(self) -> str:
        return "delete" if self.delete else "redact " + ", ".join(self.redact)

    def describe(self) -> str:
        """The rule in words: `delete after 25 months by event_timestamp`, or with a clock of the
        subject `delete after 30 days by the subject's crm.accounts.account_closed_at`."""
        clock = self.clock if isinstance(self.clock, str) else f"the subject's {self.clock}"
        return f"{self.action} after {self.after.strip()} by {clock}"


class LinkedIdentifier(BaseModel):
    """An identifier other than the subject id, read from `table` where `subject_column` is the subject."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    table: str
    subject_column: str
    column: str

    @model_validator(mode="after")
    def _names(self) -> LinkedIdentifier:
        check_table_name(self.table)
        _check_column(self.subject_column, array_allowed=False)
        _check_column(self.column, array_allowed=False)
        return self


# California DROP's lists (drop/), by the names the `drop:` section uses, with the fields each list's
# hash is made of, in order.
DROP_LISTS: dict[str, tuple[str, ...]] = {
    "email": ("email",), "phone": ("phone",), "maid": ("maid",), "ctvid": ("ctvid",),
    "ndz": ("first_name", "last_name", "dob", "zip"), "namevin": ("first_name", "last_name", "vin"),
}


class DropList(BaseModel):
    """Where the identifiers of one DROP list are in the lake (`drop:`): a single-identifier list by
    `identifier` (a linked identifier, or the subject itself); a composite list (ndz, namevin) by
    `table`, its `subject_column`, and a column per field of the list."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    identifier: str | None = None
    table: str | None = None
    subject_column: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    dob: str | None = None
    zip: str | None = None
    vin: str | None = None

    def columns(self, list_name: str) -> dict[str, str]:
        """{field: column} of a composite list."""
        return {f: getattr(self, f) for f in DROP_LISTS[list_name]}

    def checked(self, list_name: str) -> DropList:
        fields = DROP_LISTS[list_name]
        named = {f for f in ("first_name", "last_name", "dob", "zip", "vin") if getattr(self, f) is not None}
        if len(fields) == 1:
            if self.identifier is None or self.table or self.subject_column or named:
                raise ValueError(f"drop: {list_name} is found by an identifier alone: "
                                 f"{{identifier: NAME}} (a linked identifier or the subject)")
            return self
        if self.identifier is not None or self.table is None or self.subject_column is None \
                or named != set(fields):
            raise ValueError(f"drop: {list_name} needs table, subject_column and a column for each of "
                             f"{', '.join(fields)} (and nothing else)")
        check_table_name(self.table)
        for column in [self.subject_column, *self.columns(list_name).values()]:
            _check_column(column, array_allowed=False)
        return self


class TableMapping(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str | None = None
    keys: dict[str, KeySpec] | None = None  # several subject columns: {column: {identifier, redact}}
    identifier: str | None = None  # defaults to the data map's subject identifier
    action: Literal["delete", "redact", "shred"] = "delete"
    redact: list[str] = Field(default_factory=list)
    # The table format (lake/table.py): an Iceberg table of the catalog, or a Delta table at `path`
    # (default `<delta.warehouse>/<namespace>/<table>`). None: Delta where `path` is given or a Delta
    # log exists at the default place, else Iceberg (Settings.delta_tables).
    format: Literal["iceberg", "delta"] | None = None
    path: str | None = None
    # action: shred (the key holds vault pseudonyms): the columns `dsr pseudonymize` encrypted, and the
    # columns that may still single a person out, with the k-anonymity a shred must leave
    encrypted: list[str] = Field(default_factory=list)
    quasi_identifiers: list[str] = Field(default_factory=list)
    min_k: int | None = Field(default=None, ge=2)
    # Told to the subject with an access export (GDPR Art. 15(1)); optional.
    purpose: str | None = None
    recipients: list[str] = Field(default_factory=list)
    retention: str | None = None
    # Enforced retention (stages/retention.py): rules on the row's own clock; `retention:` above is the text.
    expire: list[ExpiryRule] = Field(default_factory=list)
    # A statutory exemption from erasure (CCPA §1798.105(d), GDPR Art. 17(3)), in words: the table is
    # erased and purged for no erase request; a request completes with its rows there kept, and its
    # evidence says so (runner/rules.py). Unlike a legal hold (`dsr hold`) it does not end.
    exempt: str | None = None

    def disclosure(self) -> dict:
        """What a person is told about the table (an access package's manifest): purpose, recipients,
        the stated retention and, where the data map enforces it, the rules in words."""
        return {"purpose": self.purpose, "recipients": self.recipients, "retention": self.retention,
                **({"retention_enforced": [rule.describe() for rule in self.expire]} if self.expire else {})}

    @model_validator(mode="after")
    def _consistent(self) -> TableMapping:
        return self._checked()

    def _checked(self) -> TableMapping:
        """The rules of a keyed mapping (DerivedMapping's own validator applies them to keyed derived tables)."""
        if self.format == "iceberg" and self.path is not None:
            raise ValueError("'path' belongs to Delta tables: an Iceberg table is found through the catalog")
        if (self.key is None) == (self.keys is None):
            raise ValueError("give either 'key' (one subject column) or 'keys' (several), not "
                             + ("both" if self.key else "neither"))
        if self.action == "shred":
            if self.keys is not None or self.key is None or is_array(self.key) or "." in self.key or self.redact:
                raise ValueError("action: shred needs one top-level 'key' column holding vault pseudonyms "
                                 "(no keys:, [] or struct path, no redact)")
            if self.min_k is not None and not self.quasi_identifiers:
                raise ValueError("min_k needs the 'quasi_identifiers' it is measured over")
            for column in [*self.encrypted, *self.quasi_identifiers]:
                _check_column(column, array_allowed=False)
        elif self.encrypted or self.quasi_identifiers or self.min_k is not None:
            raise ValueError("'encrypted', 'quasi_identifiers' and 'min_k' belong to action: shred tables")
        if self.exempt is not None and not self.exempt.strip():
            raise ValueError("exempt: give the exemption the table is kept under (e.g. 'CCPA 1798.105(d)(8): "
                             "tax records')")
        if self.exempt is not None and self.action == "shred":
            raise ValueError("exempt: a shredded table (action: shred) is erased through the vault, which every "
                             "table shares; it cannot be exempt on its own")
        for column in [*(self.keys or [self.key]), *self.redact,
                       *(c for spec in (self.keys or {}).values() for c in spec.redact)]:
            _check_column(column)
        for group in self.groups:
            for column in group.redact:
                if is_array(column) and column != group.column:
                    # only a key's own array loses the erased person's element; other columns are nulled
                    raise ValueError(f"redact {column!r}: [] (remove the erased person's element) is only "
                                     f"allowed for the group's own key column; write {column_path(column)!r} "
                                     "to set the whole column to NULL")
        if self.keys is not None:
            if not self.keys:
                raise ValueError("'keys' lists no key column")
            if self.redact:
                raise ValueError("with 'keys', each key column lists its own 'redact' group")
            for column, spec in self.keys.items():
                if self.action == "delete" and spec.redact:
                    raise ValueError(f"key {column!r}: 'redact' is only meaningful with action: redact "
                                     "(action: delete deletes a row when any key column names an erased subject)")
                if self.action == "redact" and column not in spec.redact:
                    # Otherwise the kept row would still point to the subject.
                    raise ValueError(f"key {column!r}: its redact group must include the key column itself")
        elif self.action == "redact":
            if not self.redact:
                raise ValueError("action 'redact' needs the list of columns to set to NULL")
            if self.key not in self.redact:
                raise ValueError(f"redacted columns must include the key column {self.key!r}")
        elif self.redact:
            raise ValueError("'redact' columns are only meaningful with action: redact")
        return self

    @property
    def groups(self) -> list[KeyGroup]:
        """Every subject column with its identifier and redact group; one for the `key:` form.
        (Identifiers are filled in by DataMap, which knows the subject.)"""
        if self.keys is None:
            # `key:` is given when `keys:` is not (validated; aggregates, which have neither, have no groups)
            return [KeyGroup(cast(str, self.key), self.identifier or "", tuple(self.redact))]
        return [KeyGroup(column, spec.identifier or self.identifier or "", tuple(spec.redact))
                for column, spec in self.keys.items()]

    @property
    def simple(self) -> bool:
        """One flat key column: the MERGE on key equality serves it."""
        return self.keys is None and not is_array(cast(str, self.key))

    @property
    def redacted_columns(self) -> frozenset[str]:
        return frozenset(c for g in self.groups for c in g.redact)

    @property
    def key_columns(self) -> list[str]:
        return [g.column for g in self.groups]


_DATASET = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\Z")
FileFormat = Literal["parquet", "json", "csv"]
FILE_FORMATS: tuple[str, ...] = get_args(FileFormat)


class FileMapping(TableMapping):
    """A plain-file dataset outside the catalog (`files:`): every file under `path` is read; an
    erasure rewrites only the files holding an erased subject."""

    path: str  # a folder: local, file:, s3a:, hdfs: ...
    format: FileFormat  # type: ignore[assignment]  # a file format here, where a table names its table format
    options: dict[str, str] = Field(default_factory=dict)  # Spark reader/writer options (csv: header ...)

    def spark_options(self) -> dict[str, str]:
        return {**({"header": "true"} if self.format == "csv" else {}), **self.options}


class DerivedMapping(TableMapping):
    """A table built from others (`derived:`). With `key`/`keys` it carries the subject's key and is
    erased like a mapped table (`kind: scd2`: every version of the subject goes, so only
    `action: delete`); with `sql` it is an aggregate holding no key, rebuilt from its sources after
    they are erased: only the groups the erased rows fed (`group_by`), or whole (`refresh: full`).

    `propagation: pipeline` (keyed tables of `kind: table`): the company's own pipeline carries its
    sources' deletes here (a change feed applied as deletes: SCD type 1); a run erases the sources,
    waits up to `wait_seconds` for the pipeline to take the batch's people out, then proves the table
    like any other, and erases it itself where the pipeline has not (runner/erasure.py). SCD type 2
    (versions only marked expired) and append-only tables with duplicate keys do not propagate
    deletes: map them as `kind: scd2` or leave `propagation: engine`, and the engine erases them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    sources: list[str] = Field(alias="from")
    kind: Literal["table", "scd2"] = "table"
    sql: str | None = None
    group_by: list[str] = Field(default_factory=list)
    refresh: Literal["groups", "full"] | None = None
    propagation: Literal["engine", "pipeline"] = "engine"
    wait_seconds: float = Field(default=300.0, gt=0)  # propagation: pipeline: how long a run waits for it

    @model_validator(mode="before")
    @classmethod
    def _default_refresh(cls, data: Any) -> Any:
        """An aggregate with `group_by` recomputes those groups unless told `refresh: full`."""
        if isinstance(data, dict) and data.get("sql") is not None and data.get("refresh") is None \
                and data.get("group_by"):
            return {**data, "refresh": "groups"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> DerivedMapping:
        if not self.sources:
            raise ValueError("'from' lists no source table")
        for name in self.sources:
            check_table_name(name)
        if self.sql is None:
            if self.group_by or self.refresh:
                raise ValueError("'group_by' and 'refresh' belong to an aggregate, which needs 'sql'")
            self._checked()
            if self.kind == "scd2" and self.action != "delete":
                raise ValueError("kind: scd2 keeps every version of a subject: erasure deletes them all "
                                 "(action: delete)")
            if self.propagation == "pipeline" and self.kind == "scd2":
                raise ValueError("an SCD type 2 pipeline only marks a deleted source row expired: the engine erases "
                                 "a kind: scd2 table itself (drop propagation: pipeline)")
            return self
        if self.propagation == "pipeline":
            raise ValueError("propagation: pipeline is for a table carrying the subject's key; an aggregate ('sql') "
                             "is recomputed by the engine")
        if self.key is not None or self.keys is not None or self.redact or self.action != "delete":
            raise ValueError("an aggregate ('sql') holds no subject key: it is recomputed, not erased; "
                             "drop key/keys/action/redact")
        if self.kind != "table":
            raise ValueError("kind: scd2 needs the subject's key, not 'sql'")
        if not self.sql.strip():
            raise ValueError("'sql' is empty")
        for column in self.group_by:
            _check_column(column, array_allowed=False)
        if self.refresh is None:
            raise ValueError("an aggregate needs 'group_by' (recompute the groups erased rows fed) or "
                             "'refresh: full'")
        if self.refresh == "groups" and not self.group_by:
            raise ValueError("refresh: groups needs 'group_by'")
        return self

    @property
    def is_aggregate(self) -> bool:
        return self.sql is not None

    @property
    def groups(self) -> list[KeyGroup]:
        return [] if self.is_aggregate else super().groups


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SELECT = re.compile(r"\s*SELECT\b", re.IGNORECASE)


class ShareMapping(BaseModel):
    """A table that leaves the company (`shares:`): the result of `sql`, one SELECT reading the data-map
    table `from`, without the rows of any subject who opted out of sale/sharing; `key` is the result
    column holding the subject id. `dsr run` creates and refreshes it (datamap/shares.py, stages/share.py)."""

    # The YAML says `from`, never `source`, and a dump (write_config, the service) says it too.
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, frozen=True)
    source: str = Field(alias="from")
    key: str
    sql: str
    _subject: str = PrivateAttr(default="")  # the data map's subject identifier, which `key` holds

    @model_validator(mode="after")
    def _consistent(self) -> ShareMapping:
        try:
            check_table_name(self.source)
        except ValueError as exc:
            raise ValueError(f"'from': {exc}") from None
        if not _NAME.match(self.key):
            raise ValueError(f"'key' {self.key!r} must name a column of the sql's result (letters, digits, _)")
        if not _SELECT.match(self.sql):
            raise ValueError("'sql' must be one SELECT statement reading the 'from' table")
        return self

    @property
    def sources(self) -> list[str]:
        return [self.source]

    @property
    def groups(self) -> list[KeyGroup]:
        return [KeyGroup(self.key, self._subject)]


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}\Z")  # Kafka's own rule for topic names


class TopicMapping(BaseModel):
    """A Kafka topic holding the subject (`topics:`): each record's value is JSON, and `key` names the
    field (a dotted path into nested objects) holding an identifier of the kind `identifier` (default
    the data map's subject). A run settles every mapped topic for each erase request by the topic's own
    `cleanup.policy` (stages/topics.py): compacted topics get tombstones, deleting ones are checked
    against the request's deadline, and either is proven by reading the topic from its earliest offset.
    `accept_retention`: a documented reason under which a retention (or compaction) that outlives a
    request's deadline is accepted; the request's evidence then says when the records go."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str | None = None  # default: the identifier's own name
    identifier: str | None = None
    accept_retention: str | None = Field(default=None, min_length=1)

    @property
    def field(self) -> str:
        return cast(str, self.key)

    @property
    def group(self) -> KeyGroup:
        """The topic's one key, as the verification's hashing takes it."""
        return KeyGroup(self.field, cast(str, self.identifier))


class DataMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    subject: str = "user_id"
    identifiers: dict[str, LinkedIdentifier] = Field(default_factory=dict)
    tables: dict[str, TableMapping]
    files: dict[str, FileMapping] = Field(default_factory=dict)
    derived: dict[str, DerivedMapping] = Field(default_factory=dict)
    shares: dict[str, ShareMapping] = Field(default_factory=dict)
    drop: dict[str, DropList] = Field(default_factory=dict)  # California DROP: where each list's identifiers are
    topics: dict[str, TopicMapping] = Field(default_factory=dict)  # Kafka topics, by their names on the cluster

    @model_validator(mode="before")
    @classmethod
    def _default_identifiers(cls, data: Any) -> Any:
        """A keyed mapping's identifier defaults to the data map's subject, and each of its key
        columns' to the mapping's: filled in before the (frozen) mappings are built."""
        if not isinstance(data, dict):
            return data
        subject = data.get("subject", cls.model_fields["subject"].default)
        out = dict(data)
        for section in ("tables", "files", "derived"):
            if isinstance(data.get(section), dict):
                out[section] = {name: _with_identifiers(m, subject) for name, m in data[section].items()}
        if isinstance(data.get("topics"), dict):
            out["topics"] = {name: _topic_defaults(m, subject) for name, m in data["topics"].items()}
        return out

    @model_validator(mode="after")
    def _consistent(self) -> DataMap:
        if not self.tables:
            raise ValueError("the data map lists no tables")
        if self.subject in self.identifiers:
            raise ValueError(f"{self.subject!r} is the subject identifier; it cannot also be linked")
        for name in self.files:
            if not _DATASET.match(name) or name in self.tables:
                raise ValueError(f"files: dataset name {name!r} must be letters, digits, _ . / - and differ from "
                                 "every table's")
        for name in self.derived:
            check_table_name(name)
            if name in self.tables or name in self.files:
                raise ValueError(f"derived: {name} is also listed under tables/files; list it once")
            outside = [s for s in self.derived[name].sources if s not in self.tables and s not in self.derived]
            if outside:
                raise ValueError(f"derived: {name} reads {', '.join(outside)}, which the data map does not list "
                                 "(under tables: or derived:)")
        self.derived_levels()  # a cycle fails here
        for name in self.aggregates:
            kept = [s for s in self.derived[name].sources if s in self.exempt and name not in self.exempt]
            if kept:
                raise ValueError(f"derived: {name} is recomputed from {', '.join(kept)}, which is exempt from erasure "
                                 "(exempt:) and keeps erased people's rows: mark it exempt too")
        for name, mapping in [*self.files.items(), *self.aggregates.items()]:
            if mapping.expire:
                raise ValueError(f"{name}: 'expire' rules apply to catalog tables holding rows of people (tables: "
                                 "or keyed derived:), not to files: datasets or aggregates")
        for name, rules in self.expiring.items():
            clocks = {rule.row_clock for rule in rules if rule.row_clock is not None}
            for i, rule in enumerate(rules):
                if clocks & set(rule.redact):
                    raise ValueError(f"table {name}, expire rule {i + 1}: redacts {sorted(clocks & set(rule.redact))}, "
                                     "the clock of a rule of the table")
                if rule.subject_clock is not None:
                    self.subject_clock_keys(name, rule.subject_clock, f"table {name}, expire rule {i + 1}")
        for name, share in self.shares.items():
            if not _TABLE.match(name):
                raise ValueError(f"shares: {name!r} must be written namespace.table (letters, digits, _)")
            if name in self.tables or name in self.derived or name in self.files:
                raise ValueError(f"shares: {name} is also listed under tables/derived/files; dsr run writes a share")
            if share.source not in self.tables and share.source not in self.derived:
                raise ValueError(f"shares: {name} reads {share.source} ('from'), which is not a table of the data map "
                                 "(under tables: or derived:)")
            if share.source in self.shredded:
                raise ValueError(f"shares: {name} reads {share.source}, whose key holds vault pseudonyms "
                                 "(action: shred), so opted-out subjects could not be found in it")
            share._subject = self.subject
        for list_name, where in self.drop.items():
            if list_name not in DROP_LISTS:
                raise ValueError(f"drop: no DROP list {list_name!r}; one of {', '.join(DROP_LISTS)}")
            where.checked(list_name)
            if where.identifier is not None and where.identifier != self.subject \
                    and where.identifier not in self.identifiers:
                raise ValueError(f"drop: {list_name}: identifier {where.identifier!r} is neither the subject "
                                 f"({self.subject!r}) nor one of the linked identifiers {sorted(self.identifiers)}")
        for name, topic in self.topics.items():
            if not _TOPIC.match(name) or name in (".", ".."):
                raise ValueError(f"topics: {name!r} is not a Kafka topic name (letters, digits, . _ -; at most 249)")
            _check_column(topic.field, array_allowed=False)
            if topic.identifier != self.subject and topic.identifier not in self.identifiers:
                raise ValueError(f"topic {name}, key {topic.field}: identifier {topic.identifier!r} is neither the "
                                 f"subject ({self.subject!r}) nor one of the linked identifiers "
                                 f"{sorted(self.identifiers)}")
        for name, mapping in [*self.tables.items(), *self.files.items(), *self.keyed_derived.items()]:
            if name not in self.files:
                check_table_name(name)
            for group in mapping.groups:
                if group.identifier != self.subject and group.identifier not in self.identifiers:
                    raise ValueError(
                        f"table {name}, key {group.column}: identifier {group.identifier!r} is neither the subject "
                        f"({self.subject!r}) nor one of the linked identifiers {sorted(self.identifiers)}"
                    )
        return self

    def mapping(self, name: str) -> TableMapping | ShareMapping:
        """The mapping of a table, a derived table, a file dataset or a share."""
        for section in (self.tables, self.derived, self.files, self.shares):
            if name in section:
                return section[name]
        raise KeyError(name)

    def table_mapping(self, name: str) -> TableMapping:
        """The mapping of a table, a derived table or a file dataset: what an erasure changes by key
        (`mapping` without the shares, which a run rewrites whole)."""
        mapping = self.mapping(name)
        if isinstance(mapping, ShareMapping):
            raise KeyError(name)
        return mapping

    @property
    def pipelined(self) -> dict[str, DerivedMapping]:
        """Keyed derived tables the company's pipeline propagates deletes to (`propagation: pipeline`)."""
        return {n: d for n, d in self.keyed_derived.items() if d.propagation == "pipeline"}

    @property
    def keyed_derived(self) -> dict[str, DerivedMapping]:
        """Derived tables carrying the subject's key (erased by key, like mapped tables)."""
        return {n: d for n, d in self.derived.items() if not d.is_aggregate}

    @property
    def aggregates(self) -> dict[str, DerivedMapping]:
        return {n: d for n, d in self.derived.items() if d.is_aggregate}

    @property
    def keyed(self) -> dict[str, TableMapping]:
        """Every catalog table holding subject keys: mapped tables and keyed derived tables (not the
        shredded ones: they hold pseudonyms, which only the vault links to anyone)."""
        return {**{n: m for n, m in self.tables.items() if m.action != "shred"}, **self.keyed_derived}

    @property
    def shredded(self) -> dict[str, TableMapping]:
        """Tables erased by shredding the subject's vault entry (`action: shred`)."""
        return {n: m for n, m in self.tables.items() if m.action == "shred"}

    @property
    def exempt(self) -> dict[str, str]:
        """{table: the exemption it is kept under}: tables, datasets and derived tables erased for nobody."""
        return {n: m.exempt for n, m in [*self.tables.items(), *self.files.items(), *self.derived.items()]
                if m.exempt is not None}

    @property
    def expiring(self) -> dict[str, list[ExpiryRule]]:
        """{table: its enforced retention rules (`expire:`)}, tables and keyed derived tables that have some."""
        return {n: list(m.expire) for n, m in [*self.tables.items(), *self.keyed_derived.items()] if m.expire}

    def subject_clock_keys(self, table: str, clock: SubjectClock, where: str = "") -> tuple[str, str]:
        """(the key column of `table`, the key column of the clock's table) a clock of the subject
        joins on: each table's one plain key column holding the identifier they share. ValueError
        naming the field when the clock's table is not a keyed table of the data map, is `table`
        itself, or is not keyed by the same identifier as `table` (pure: no catalog is read)."""
        where = f"{where}: " if where else ""
        if clock.table == table:
            raise ValueError(f"{where}clock.table {clock.table} is the rule's own table: write 'clock: "
                             f"{clock.column}' for a clock of the row")
        own = self.keyed.get(table)
        other = self.keyed.get(clock.table)
        if other is None:
            raise ValueError(f"{where}clock.table {clock.table} is not a keyed table of the data map (under tables: "
                             f"or keyed derived:, not action: shred), so its rows cannot be joined to a subject")
        plain = [g for g in other.groups if not g.is_array]
        if len(other.groups) != 1 or not plain:
            raise ValueError(f"{where}clock.table {clock.table} must have one plain key column (it has "
                             f"{', '.join(g.column for g in other.groups)}), so each of its rows names one subject")
        identifier = plain[0].identifier
        if own is None:
            raise ValueError(f"{where}clock: {table} holds vault pseudonyms (action: shred), which cannot be joined "
                             f"to {clock.table}")
        matching = [g for g in own.groups if g.identifier == identifier and not g.is_array]
        if len(matching) != 1:
            keys = ", ".join(f"{g.column} ({g.identifier})" for g in own.groups)
            raise ValueError(f"{where}clock.table {clock.table} is keyed by {identifier!r} ({plain[0].column}); "
                             f"{table} is not keyed by the same subject in one plain key column (its keys: {keys})")
        return matching[0].column, plain[0].column

    def kept_longer_than_sources(self) -> dict[str, str]:
        """Keyed derived tables that keep people's rows longer than a source deletes them -> why: the
        strictest delete rule of its sources (through lineage: a source's own sources count too),
        against the table's own strictest delete rule (none: kept as long as it exists). Pure: no
        catalog is read."""
        def strictest(name: str, seen: frozenset[str] = frozenset()) -> tuple[float, str] | None:
            mapping = self.tables.get(name) or self.derived.get(name)
            own = [(r.days, f"{name}: {r.describe()}") for r in (mapping.expire if mapping else []) if r.delete]
            inherited = [found for s in (self.derived[name].sources if name in self.derived else [])
                         if s not in seen and (found := strictest(s, seen | {name})) is not None]
            return min([*own, *inherited], default=None)

        longer = {}
        for name, mapping in self.keyed_derived.items():
            limit = min((found for s in mapping.sources if (found := strictest(s)) is not None), default=None)
            own = min((r.days for r in mapping.expire if r.delete), default=None)
            if limit is not None and (own is None or own > limit[0]):
                longer[name] = (f"keeps rows its source deletes sooner ({limit[1]}); give it an expire: rule that "
                                f"deletes by then")
        return longer

    def identifier_types(self) -> list[str]:
        return [self.subject, *self.identifiers]

    def erase_order(self) -> list[str]:
        """Every catalog table in the order a run erases them: mapped tables (those identifiers are
        resolved through last, so a resumed run can still resolve), then derived tables level by level."""
        return [t for wave in self.erase_waves() for t in wave]

    def keyed_order(self) -> list[str]:
        """`erase_order` without the aggregates: the tables a key-based check reads."""
        return [t for t in self.erase_order() if t in self.keyed]

    def erase_waves(self) -> list[list[str]]:
        """`erase_order` as waves whose tables are independent of each other (erased side by side)."""
        sources = {link.table for link in self.identifiers.values()}
        plain = [t for t in self.tables if t not in self.shredded]
        waves = [sorted(t for t in plain if t not in sources), sorted(t for t in plain if t in sources)]
        return [w for w in waves + self.derived_levels() if w]

    def derived_levels(self) -> list[list[str]]:
        """Derived tables by depth: level 1 reads mapped tables only, level n reads level n-1 at most.
        ValueError naming the tables of a cycle in `from:`."""
        level: dict[str, int] = {}
        pending = dict(self.derived)
        while pending:
            ready = {n: d for n, d in pending.items()
                     if all(s in self.tables or s in level for s in d.sources)}
            if not ready:
                raise ValueError("derived: a cycle in 'from' among " + ", ".join(sorted(pending)))
            for name, d in ready.items():
                level[name] = 1 + max(level.get(s, 0) for s in d.sources)
                del pending[name]
        depth = max(level.values(), default=0)
        return [sorted(n for n, lv in level.items() if lv == d) for d in range(1, depth + 1)]

    def derived_from(self, name: str) -> list[str]:
        """Derived tables that read `name`, directly or through others."""
        out = [n for n, d in self.derived.items() if name in d.sources]
        return out + [m for n in out for m in self.derived_from(n) if m not in out]


# The demo lakehouse's data map is a file of the package (demo/datamap.yaml): what `dsr` maps when no
# dsr.yaml is found, and what synth.generate builds. Everything below is read from it.
DEMO_DATAMAP_FILE = importlib.resources.files("lakehouse_dsr") / "demo" / "datamap.yaml"
_DEMO: dict[str, Any] = yaml.safe_load(DEMO_DATAMAP_FILE.read_text(encoding="utf-8"))
DEMO_DERIVED: dict[str, dict[str, Any]] = _DEMO["derived"]
DEMO_SHREDDED: dict[str, dict[str, Any]] = {t: m for t, m in _DEMO["tables"].items() if m.get("action") == "shred"}
DAILY_BY_TYPE: str = DEMO_DERIVED["demo_gold.daily_by_type"]["sql"]


def demo_datamap(derived: bool = True, vault: bool | None = None, expire: bool = False,
                 table_format: Literal["iceberg", "delta"] = "iceberg") -> DataMap:
    """The demo lake's data map (demo/datamap.yaml, the whole file by default); `derived`: with its
    silver and gold layers, `vault` (default: as `derived`): with the pseudonymized copy of the events
    (synth.generate builds them); `expire`: with the events' 25 months enforced (`dsr demo` shows it on
    the demo's lake; other runs of the demo's map, the example configs and the tests leave the demo's
    data as generated). `table_format: delta`: the tables and layers as Delta tables (`format: delta`),
    without what the engine does not do on Delta yet (the vault copy)."""
    if table_format == "delta":
        vault = False
    vault = derived if vault is None else vault
    raw = copy.deepcopy(_DEMO)
    if table_format == "delta":
        for mapping in [*raw["tables"].values(), *raw["derived"].values()]:
            mapping["format"] = "delta"
    if not derived:
        raw["derived"] = {}
    if not vault:
        raw["tables"] = {t: m for t, m in raw["tables"].items() if t not in DEMO_SHREDDED}
    if expire:  # the daily silver keeps what it counts no longer than its source
        rule = {"after": "25 months", "delete": True}
        raw["tables"]["demo.events"]["expire"] = [{**rule, "clock": "event_timestamp"}]
        if derived:
            raw["derived"]["demo_silver.user_daily"]["expire"] = [{**rule, "clock": "day"}]
    return DataMap.model_validate(raw)
