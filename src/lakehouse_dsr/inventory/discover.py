"""Discovery: columns of the catalog's tables that probably hold personal data and that the data map
does not cover.

Three kinds of evidence, per column:
- **name**: the column's name says what it holds (email, phone, ip, user/customer/account ids,
  names in tables about people, addresses, birth dates);
- **pattern**: most sampled values look like emails, phone numbers, IPv4/IPv6 addresses, card
  numbers (with a Luhn check) or dates of birth;
- **overlap**: most sampled values are identifiers the data map already knows (read from the
  columns that define them), whatever the column is called. A numeric column must also spread
  over the identifier's range: counts and quantities that happen to fall among small surrogate
  keys cluster at its low end and are not reported.

Cost: tables are listed through the control-plane catalog (no data read); each table's (and each
`files:` dataset's) first
`sample` rows are read once (a limit: Spark reads the first files only) and summarised in Spark;
each known identifier's defining column is read once. The driver receives counts only, never a value.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import cast

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    AtomicType,
    DataType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampType,
)

from ..config import Settings
from ..datamap.model import column_ref
from ..lake import plainfiles
from ..lake.catalog import open_catalog

_PERSON = {"user", "customer", "cust", "account", "member", "person", "client", "subscriber", "patient",
           "employee", "buyer", "seller", "sender", "recipient", "owner", "contact", "visitor", "subject"}
_ID = {"id", "sk", "key", "no", "number", "uuid", "guid"}
_NAME_WORDS = {"first", "last", "full", "given", "family", "middle", "sur", "display"}
_ADDRESS = {"address", "addr", "street", "zip", "zipcode", "postal", "postcode"}
_BIRTH = {"birth", "dob", "birthdate", "birthday", "born"}

EMAIL = r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$"
PHONE = r"^\+?[0-9][0-9 ().-]{6,18}[0-9]$"
IPV4 = r"^((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])$"
_HEX = "[0-9A-Fa-f]{1,4}"
IPV6 = rf"^(({_HEX}:){{7}}{_HEX}|(({_HEX}:){{0,6}}{_HEX})?::(({_HEX}:){{0,6}}{_HEX})?)$"
CARD = r"^[0-9]{4}([ -]?[0-9]{3,4}){2,4}$"
MIN_SHARE = 0.5  # of a column's sampled non-null values
MIN_VALUES = 5  # fewer sampled values prove nothing


@dataclass
class Finding:
    table: str
    column: str  # as the data map writes it: struct path, [] after an array
    evidence: str  # "name (email); pattern email (98%); overlap with email (97%)"
    share: float | None  # the strongest value evidence's share of sampled non-null values; None: name only
    identifier: str | None  # the data map identifier it most likely holds
    entry: str  # a data-map entry to paste under datamap.tables

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Column:
    table: str
    column: str
    data_type: DataType  # the element type for arrays
    evidence: list[str] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)  # value evidence -> share of sampled values
    values: int = 0  # sampled non-null values (array elements)
    identifier: str | None = None
    names_person: bool = False  # holds someone's identifier (not only data about them): can be a key


def _tokens(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    words = [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words]  # users -> user


def name_evidence(table: str, column: str) -> tuple[str, str | None] | None:
    """(what the name says, the identifier kind it suggests) or None. Names only count in tables
    about people when they say nothing more than "name"."""
    words = _tokens(column.replace("[]", ""))
    leaf = _tokens(column.replace("[]", "").split(".")[-1])
    table_words = set(_tokens(table))
    if any("mail" in w for w in leaf):
        return "email", "email"
    if set(leaf) & {"phone", "mobile", "msisdn", "tel", "telephone", "fax"}:
        return "phone", None
    if set(leaf) & {"ip", "ipv4", "ipv6", "ipaddr", "ipaddress"}:
        return "ip address", None
    if set(leaf) & _BIRTH:
        return "birth date", None
    if set(leaf) & _ADDRESS:
        return "address", None
    if set(words) & _PERSON and set(leaf) & _ID:
        return "person id", None
    if leaf in (["userid"], ["username"], ["customerid"], ["accountid"], ["surname"]):
        return "person id" if leaf[0].endswith("id") else "name", None
    if "name" in leaf and (set(leaf) & (_NAME_WORDS | _PERSON) or (table_words | set(words)) & _PERSON):
        return "name", None
    return None


def _candidates(schema: StructType, prefix: str = "") -> list[tuple[str, DataType]]:
    """(data-map column, atomic type) for every atomic field and array of atomic values, nested included."""
    out = []
    for f in schema.fields:
        path = f"{prefix}{f.name}"
        if isinstance(f.dataType, StructType):
            out += _candidates(f.dataType, f"{path}.")
        elif isinstance(f.dataType, ArrayType) and isinstance(f.dataType.elementType, AtomicType):
            out.append((f"{path}[]", f.dataType.elementType))
        elif isinstance(f.dataType, AtomicType):
            out.append((path, f.dataType))
    return out


def _luhn(digits: Column) -> Column:
    length = F.length(digits)
    total = F.aggregate(F.sequence(F.lit(0), length - 1), F.lit(0), lambda acc, i: acc + _luhn_digit(digits, length, i))
    return (total % 10) == 0


def _luhn_digit(digits: Column, length: Column, i: Column) -> Column:
    d = digits.substr(length - i, F.lit(1)).cast("int")  # i-th digit from the right (1-based)
    doubled = F.when(d * 2 > 9, d * 2 - 9).otherwise(d * 2)
    return F.when(i % 2 == 1, doubled).otherwise(d)


def _patterns(data_type: DataType, today: date) -> dict[str, object]:
    """Pattern name -> predicate on one value (a Column), for values of `data_type`."""
    if isinstance(data_type, DateType | TimestampType):
        oldest, youngest = date(1900, 1, 1), date(today.year - 16, today.month, min(today.day, 28))
        return {"date of birth": lambda v: F.to_date(v).between(F.lit(oldest), F.lit(youngest))}
    if not isinstance(data_type, StringType):
        return {}
    digits = lambda v: F.regexp_replace(v, "[ -]", "")  # noqa: E731
    return {
        "email": lambda v: v.rlike(EMAIL),
        "phone": lambda v: v.rlike(PHONE) & (F.length(F.regexp_replace(v, "[^0-9]", "")).between(7, 15))
        & ~v.rlike(CARD),
        "ipv4": lambda v: v.rlike(IPV4),
        "ipv6": lambda v: v.rlike(IPV6) & v.contains(":"),
        "card number": lambda v: v.rlike(CARD) & F.length(digits(v)).between(13, 19) & _luhn(digits(v)),
        "date of birth": lambda v: v.rlike(r"^\d{4}-\d{2}-\d{2}$")
        & F.to_date(v).between(F.lit(date(1900, 1, 1)), F.lit(date(today.year - 16, 1, 1))),
    }


def _counts(value: Column, is_array: bool, predicate=None) -> Column:
    """Values (elements of an array) that hold `predicate`, or all non-null ones without one."""
    if is_array:
        kept = F.filter(F.coalesce(value, F.array()), predicate) if predicate else F.coalesce(value, F.array())
        return F.sum(F.size(kept))
    return F.sum(F.when(predicate(value), 1).otherwise(0)) if predicate else F.count(value)


def _sample_stats(sample: DataFrame, columns: list[_Column], today: date) -> dict[str, dict[str, int]]:
    """Per column: non-null values and matches of each pattern in the sample. One Spark job."""
    aggs, names = [], []
    for i, c in enumerate(columns):
        value, is_array = F.col(column_ref(c.column)), c.column.endswith("[]")
        aggs.append(_counts(value, is_array).alias(f"n{i}"))
        for j, (pattern, predicate) in enumerate(_patterns(c.data_type, today).items()):
            aggs.append(_counts(value, is_array, predicate).alias(f"p{i}_{j}"))
            names.append((i, j, pattern))
    row = cast(Row, sample.agg(*aggs).first()).asDict()  # an aggregate over the whole sample: one row
    stats = {c.column: {"values": int(row[f"n{i}"] or 0)} for i, c in enumerate(columns)}
    for i, j, pattern in names:
        stats[columns[i].column][pattern] = int(row[f"p{i}_{j}"] or 0)
    return stats


def _known_values(spark: SparkSession, settings: Settings) -> DataFrame | None:
    """(identifier, value, above_median) for every identifier the data map defines through a column:
    a linked identifier's column, and the subject's column beside it (or the first table keyed by
    the subject alone). `above_median`: for numeric identifiers, whether the value lies above the
    identifier's median (NULL for text)."""
    dm = settings.datamap
    sources: dict[str, tuple[str, str]] = {}
    for name, link in dm.identifiers.items():
        sources[name] = (link.table, link.column)
        sources.setdefault(dm.subject, (link.table, link.subject_column))
    if dm.subject not in sources:
        for table, mapping in dm.tables.items():
            group = mapping.groups[0]
            if mapping.simple and group.identifier == dm.subject:
                sources[dm.subject] = (table, group.column)
                break
    parts = []
    for identifier, (table, column) in sources.items():
        values = spark.table(settings.table(table)).select(F.col(column_ref(column)).alias("v")).where("v IS NOT NULL")
        numeric = isinstance(values.schema["v"].dataType, NumericType)
        if numeric:
            median = values.agg(F.percentile_approx(F.col("v").cast("double"), 0.5).alias("m"))
            values = values.crossJoin(F.broadcast(median)).select("v", (F.col("v").cast("double") > F.col("m"))
                                                                  .alias("above_median"))
        else:
            values = values.select("v", F.lit(None).cast("boolean").alias("above_median"))
        parts.append(values.select(F.lit(identifier).alias("identifier"), F.col("v").cast("string").alias("value"),
                                   "above_median").distinct())
    if not parts:
        return None
    known = parts[0]
    for part in parts[1:]:
        known = known.unionByName(part)
    return known


def _stacked(sample: DataFrame, table: str, columns: list[_Column]) -> DataFrame:
    """(table, column, value): every sampled value of `columns`, array elements one by one, as text."""
    entries = []
    for c in columns:
        value = F.col(column_ref(c.column))
        if c.column.endswith("[]"):
            entries.append(F.transform(F.coalesce(value, F.array()), _entry(table, c.column)))
        else:
            entries.append(F.array(_entry(table, c.column)(value)))
    return sample.select(F.explode(F.concat(*entries)).alias("e")).select("e.*").where("value IS NOT NULL")


def _entry(table: str, column: str):
    return lambda v: F.struct(F.lit(table).alias("table"), F.lit(column).alias("column"),
                              v.cast("string").alias("value"))


def discover(spark: SparkSession, settings: Settings, namespaces: list[str] | None = None, sample: int = 1000
             ) -> list[Finding]:
    """Columns that probably hold personal data and are not in the data map (see the module doc).

    `namespaces`: where to look (default: every namespace but the ledger's); the data map's `files:`
    datasets are always examined (their unmapped columns), its aggregates never (an erasure rebuilds
    them from their sources). `sample`: rows read per table.
    """
    today = date.today()
    catalog = open_catalog(settings)
    spaces = namespaces or [".".join(ns) for ns in catalog.list_namespaces()
                            if ".".join(ns) != settings.ledger_namespace]
    mapped = _mapped_columns(settings)
    columns: dict[tuple[str, str], _Column] = {}
    stacks = []
    sources = [(".".join(t), lambda t=t: spark.table(settings.table(".".join(t))))
               for namespace in spaces for t in catalog.list_tables(namespace)
               if ".".join(t) not in settings.datamap.aggregates]  # rebuilt from their sources on erasure
    sources += [(name, lambda m=m: plainfiles.read_dataset(spark, m)) for name, m in settings.datamap.files.items()]
    for table, read in sources:
        rows = read().limit(sample)
        found = [_Column(table, c, t) for c, t in _candidates(rows.schema) if c not in mapped.get(table, set())]
        if not found:
            continue
        for c in found:
            columns[(table, c.column)] = c
            named = name_evidence(table, c.column)
            if named:
                c.evidence.append(f"name ({named[0]})")
                c.identifier = named[1]
                c.names_person = named[0] in ("email", "person id")
        rows = rows.localCheckpoint()  # read once: the stats and the overlap use the same sample
        stats = _sample_stats(rows, found, today)
        for c in found:
            n = stats[c.column]["values"]
            for pattern, hits in stats[c.column].items():
                if pattern != "values" and n >= MIN_VALUES and hits / n >= MIN_SHARE:
                    c.evidence.append(f"pattern {pattern} ({hits / n:.0%})")
                    c.shares[pattern] = hits / n
                    if pattern == "email" and "email" in settings.datamap.identifier_types():
                        c.identifier = c.identifier or "email"
            c.values = n
        stacks.append(_stacked(rows, table, found))
    _overlap(spark, settings, columns, stacks)
    found = [c for c in columns.values() if c.evidence and not _covered(settings, c)]
    keys: dict[str, _Column] = {}  # unmapped table -> its likeliest key: the first column holding an identifier
    for c in found:
        if c.names_person and settings.datamap.keyed.get(c.table) is None and c.table not in settings.datamap.files:
            keys.setdefault(c.table, c)
    return sorted((_finding(settings, c, keys.get(c.table)) for c in found), key=lambda f: (f.table, f.column))


def _covered(settings: Settings, c: _Column) -> bool:
    """Data about a person (a name, an address, an IP) in a table that deletes that person's rows goes
    with them; only a column naming someone (possibly someone else) is a miss there."""
    mapping = settings.datamap.keyed.get(c.table) or settings.datamap.files.get(c.table)
    return mapping is not None and mapping.action == "delete" and not c.names_person


def _overlap(spark: SparkSession, settings: Settings, columns: dict[tuple[str, str], _Column],
             stacks: list[DataFrame]) -> None:
    known = _known_values(spark, settings)
    if known is None or not stacks:
        return
    sampled = stacks[0]
    for part in stacks[1:]:
        sampled = sampled.unionByName(part)
    matched = (sampled.join(F.broadcast(known), "value")
               .groupBy("table", "column", "identifier")
               .agg(F.count(F.lit(1)).alias("hits"), F.countDistinct("value").alias("distinct_hits"),
                    F.avg(F.col("above_median").cast("double")).alias("above")).collect())
    for r in matched:
        c = columns[(r.table, r.column)]
        n = c.values
        share = r.hits / n if n else 0.0
        spread = r.above is None or 0.1 <= r.above <= 0.9  # numeric keys spread across the identifier's range
        varied = r.distinct_hits >= min(MIN_VALUES, n)
        if n >= MIN_VALUES and share >= MIN_SHARE and spread and varied:
            c.evidence.append(f"overlap with {r.identifier} ({share:.0%})")
            c.shares[f"overlap {r.identifier}"] = share
            c.identifier, c.names_person = r.identifier, True


def _mapped_columns(settings: Settings) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for table, mapping in [*settings.datamap.keyed.items(), *settings.datamap.files.items()]:
        out.setdefault(table, set()).update(mapping.key_columns, mapping.redacted_columns,
                                            (c.removesuffix("[]") for c in mapping.redacted_columns))
    for link in settings.datamap.identifiers.values():
        out.setdefault(link.table, set()).update((link.column, link.subject_column))
    return out


def _finding(settings: Settings, c: _Column, table_key: _Column | None) -> Finding:
    """The finding, with a data-map entry to paste: a mapped table's entry with this column as one
    more key (or, in a redacting table, one more redacted column); for an unmapped table, keyed by
    this column if it names someone, else by the table's likeliest key."""
    shares = list(c.shares.values())
    identifier = c.identifier or settings.datamap.subject
    files = settings.datamap.files.get(c.table)
    mapping = settings.datamap.keyed.get(c.table) or files
    where = f"path: {files.path}, format: {files.format}, " if files else ""
    if mapping is None:
        key = c if c.names_person else table_key
        entry = (f"{c.table}: {{key: {key.column}, identifier: {key.identifier or settings.datamap.subject}}}"
                 if key else f"{c.table}: {{key: <the column naming the person>}}")
    else:
        groups = [(g.column, g.identifier, [*g.redact, *([c.column] if i == 0 and not c.names_person else [])])
                  for i, g in enumerate(mapping.groups)]
        if c.names_person:
            groups.append((c.column, identifier, [c.column] if mapping.action == "redact" else []))
        keys = ", ".join(f"{column}: {{identifier: {ident}" + (f", redact: [{', '.join(redact)}]}}" if redact else "}")
                         for column, ident, redact in groups)
        entry = f"{c.table}: {{{where}action: {mapping.action}, keys: {{{keys}}}}}"
    return Finding(c.table, c.column, "; ".join(c.evidence), round(max(shares), 3) if shares else None,
                   c.identifier, entry)
