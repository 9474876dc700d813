"""The data map against the catalog: every mapped table and column must exist with a usable type."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    AtomicType,
    DataType,
    DateType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..datamap import lineage
from ..datamap.model import PSEUDONYM_PATTERN, PSEUDONYMIZED_PROPERTY, DataMap, DerivedMapping, column_path, is_array
from ..datamap.shares import check_shares
from ..exceptions import DataMapError, first_line
from ..lake.lakehouse import Lake
from ..lake.plainfiles import check_dataset

T = TypeVar("T")
KeyTypes = dict[str, dict[str, DataType]]  # table -> key column (or struct path) -> its Spark type


@dataclass(frozen=True)
class Problem:
    """One way the data map does not match the lake: the name it concerns as the data map writes it
    (a mapped table, file dataset, derived table or share) and what is wrong."""

    table: str
    text: str


def field_at(schema: StructType, column: str) -> StructField:
    """The field a column name or struct path (`context.user.email`) names (`[]` ignored); ValueError
    saying where the path leaves the schema ("has no column 'x' (has: ...)", "column 'a.b': a is a
    string, ...")."""
    fields: DataType = schema
    path, parent = column_path(column), ""
    for part in path.split("."):
        where = f"column {path!r}: {parent}" if parent else ""
        if not isinstance(fields, StructType):
            raise ValueError(f"{where} is a {fields.simpleString()}, not a struct")
        by_name = {f.name: f for f in fields.fields}
        if part not in by_name:
            raise ValueError(f"{where} has no {'field' if parent else 'column'} {part!r} (has: {', '.join(by_name)})"
                             .lstrip())
        found, parent = by_name[part], f"{parent}.{part}" if parent else part
        fields = found.dataType
    return found


def schema_of(types: dict[str, DataType]) -> StructType:
    """The smallest schema holding each key column of `types` at its type (fields of one struct
    merged; `x[]` as an array of its element type), for reading only those values from data files."""
    tree: dict = {}
    for column, data_type in types.items():
        *parents, leaf = column_path(column).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = ArrayType(data_type) if is_array(column) else data_type

    def build(node: dict) -> StructType:
        return StructType([StructField(name, build(child) if isinstance(child, dict) else child)
                           for name, child in node.items()])
    return build(tree)


def check_against_catalog(spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]) -> KeyTypes:
    """Check that every mapped table and column exists with a usable type; nothing is changed.

    Returns the Spark type of each table's key columns (shares: of those created already);
    DataMapError naming every problem (`catalog_problems`). Reads table schemas, and for `action:
    shred` tables up to SAMPLE_ROWS key values (only a count reaches the driver).
    """
    problems, key_types = catalog_problems(spark, datamap, qualify)
    if problems:
        raise DataMapError("the data map does not match the catalog:\n  - " + "\n  - ".join(p.text for p in problems))
    return key_types


def catalog_problems(spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]
                     ) -> tuple[list[Problem], KeyTypes]:
    """Every problem `check_against_catalog` finds, each with the table it concerns, and the key
    types it read (those of a table with a problem included, where its key columns were found).
    Costs what `check_against_catalog` does; nothing is changed."""
    problems: list[Problem] = []
    key_types: KeyTypes = {}
    schemas: dict[str, StructType] = {}
    mapped = {**datamap.keyed, **datamap.files}
    needed = {t: [*m.key_columns, *sorted(m.redacted_columns)] for t, m in mapped.items()}
    for link in datamap.identifiers.values():
        needed.setdefault(link.table, []).extend([link.subject_column, link.column])
    for table in datamap.expiring:  # its schema is read; its rules' columns are checked in _expiry_problems
        needed.setdefault(table, [])
    for table, columns in needed.items():
        kind = "files" if table in datamap.files else "table"
        def read_schema(t: str = table, k: str = kind) -> StructType:
            return check_dataset(spark, t, datamap.files[t]).schema if k == "files" else spark.table(qualify(t)).schema

        schema = _read(problems, table, read_schema)
        if schema is None:
            continue
        schemas[table] = schema
        for column in dict.fromkeys(columns):
            try:
                field_at(schema, column)
            except ValueError as exc:
                problems.append(Problem(table, f"{kind} {table} {exc}"))
    for table, mapping in mapped.items():
        if table not in schemas:
            continue
        kind = "files" if table in datamap.files else "table"
        for group in mapping.groups:
            try:
                key_type = field_at(schemas[table], group.column).dataType
            except ValueError:
                continue  # reported above
            if group.is_array:
                if not isinstance(key_type, ArrayType):
                    problems.append(Problem(table, f"{kind} {table}: key column {group.column!r} has type "
                                            f"{key_type.simpleString()}, not an array ([] marks an array of "
                                            "identifiers)"))
                    continue
                key_type = key_type.elementType
            if not isinstance(key_type, AtomicType):
                hint = f" (an array of identifiers is written {group.column}[])" \
                    if isinstance(key_type, ArrayType) and not group.is_array else ""
                problems.append(Problem(table, f"{kind} {table}: key column {group.column!r} has type "
                                        f"{key_type.simpleString()}, which cannot hold an identifier{hint}"))
            key_types.setdefault(table, {})[group.column] = key_type
        for column in sorted(mapping.redacted_columns):
            try:
                if not field_at(schemas[table], column).nullable:
                    problems.append(Problem(table, f"{kind} {table}: column {column!r} is required (NOT NULL) "
                                            "and cannot be redacted"))
            except ValueError:
                continue
    problems += _expiry_problems(datamap, schemas)
    problems += _aggregate_problems(spark, datamap, qualify)
    problems += _shred_problems(spark, datamap, qualify)
    share_problems, share_types = check_shares(spark, datamap, qualify)
    problems += [Problem(share, text) for share, text in share_problems]
    key_types.update(share_types)
    return problems, key_types


def check_formats(lake: Lake) -> None:
    """Refuse, before anything changes, a Delta table the engine cannot erase from and prove (a table
    feature that stops its erasure or keeps what its purge cannot clean, a missing table): DataMapError,
    every problem named."""
    problems = format_problems(lake)
    if problems:
        raise DataMapError("the data map's Delta tables:\n  - " + "\n  - ".join(p.text for p in problems))


def format_problems(lake: Lake) -> list[Problem]:
    """Each Delta table of the lake that `check_formats` refuses, with why. Metadata only."""
    return [Problem(t, p) for t in lake.delta if (p := lake.table(t).refusal()) is not None]


CLOCK_TYPES = (DateType, TimestampType, TimestampNTZType)


def _expiry_problems(datamap: DataMap, schemas: dict[str, StructType]) -> list[Problem]:
    """Retention rules (`expire:`) whose clock is missing or not a date or timestamp column, or that
    redact a missing or required column; each problem names the table, the rule and the column."""
    problems = []
    for table, rules in datamap.expiring.items():
        if table not in schemas:
            continue  # unreadable: reported with the others
        for i, rule in enumerate(rules, 1):
            where = f"table {table}, expire rule {i} ({rule.describe()})"
            # a clock of the subject is a column of another keyed table (its schema is read: it is mapped)
            of = rule.subject_clock
            if of is None:
                column, named, missing, schema = str(rule.clock), f"clock column {rule.clock!r}", "clock", \
                    schemas.get(table)
            else:
                column, named, missing, schema = of.column, f"clock.column {of.column!r} of {of.table}", \
                    f"clock.column: {of.table}", schemas.get(of.table)
            try:
                if schema is not None:
                    clock = field_at(schema, column).dataType
                    if not isinstance(clock, CLOCK_TYPES):
                        problems.append(Problem(table, f"{where}: {named} has type {clock.simpleString()}, not "
                                                "a date or timestamp"))
            except ValueError as exc:
                problems.append(Problem(table, f"{where}: {missing} {exc}"))
            for column in rule.redact:
                try:
                    if not field_at(schemas[table], column).nullable:
                        problems.append(Problem(table, f"{where}: column {column!r} is required (NOT NULL) "
                                                "and cannot be redacted"))
                except ValueError as exc:
                    problems.append(Problem(table, f"{where}: redact {exc}"))
    return problems


def _read(problems: list[Problem], table: str, read: Callable[[], T]) -> T | None:
    """`read()`, or None with the problem noted: a DataMapError as it says, anything else (an
    AnalysisException, a catalog out of reach) as the table that cannot be read."""
    try:
        return read()
    except DataMapError as exc:
        problems.append(Problem(table, str(exc)))
    except Exception as exc:
        problems.append(Problem(table, f"table {table} cannot be read: {first_line(exc)}"))
    return None


SAMPLE_ROWS = 1000


def _encrypted_by_pseudonymize(spark: SparkSession, table: str) -> list[str]:
    """The columns `dsr pseudonymize` recorded encrypting in `table` (none if it did not write it).
    Cost: the table's properties (metadata, a few small rows)."""
    found = spark.sql(f"SHOW TBLPROPERTIES {table}").where(F.col("key") == PSEUDONYMIZED_PROPERTY).collect()
    return list(json.loads(found[0].value).get("encrypted", {})) if found else []


def _shred_problems(spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]) -> list[Problem]:
    """Each `action: shred` table: its key is a string column whose values are vault pseudonyms (on a
    sample of its first rows: a plaintext identifier there would survive the shred), its encrypted
    columns are binary and include every column `dsr pseudonymize` recorded encrypting (an
    unnamed one would reach access packages as ciphertext), its quasi-identifiers exist. Reads
    the table's properties and at most SAMPLE_ROWS key values; only the count of non-pseudonyms
    reaches the driver."""
    problems: list[Problem] = []
    for name, mapping in datamap.shredded.items():
        def read_table(n: str = name) -> DataFrame:
            return spark.table(qualify(n))

        df = _read(problems, name, read_table)
        if df is None:
            continue
        fields = {f.name: f.dataType for f in df.schema.fields}
        for column in [mapping.key, *mapping.encrypted, *mapping.quasi_identifiers]:
            if column not in fields:
                problems.append(Problem(name, f"table {name} has no column {column!r} (has: {', '.join(fields)})"))
        if mapping.key not in fields:
            continue
        if fields[mapping.key].simpleString() != "string":
            problems.append(Problem(name, f"table {name}: action: shred needs pseudonyms in {mapping.key!r}, a "
                                    f"{fields[mapping.key].simpleString()} column holds none; run dsr pseudonymize "
                                    "first"))
            continue
        for column in mapping.encrypted:
            if column in fields and fields[column].simpleString() != "binary":
                problems.append(Problem(name, f"table {name}: encrypted column {column!r} is a "
                                        f"{fields[column].simpleString()}, not the binary dsr pseudonymize writes"))
        unnamed = sorted(set(_encrypted_by_pseudonymize(spark, qualify(name))) - set(mapping.encrypted))
        if unnamed:
            listed = ", ".join(unnamed)
            problems.append(Problem(name, f"table {name}: dsr pseudonymize encrypted column(s) {listed} (table "
                                    f"property {PSEUDONYMIZED_PROPERTY}) but its encrypted: list does not name them, "
                                    f"so access packages would deliver them as ciphertext; add encrypted: [{listed}]"))
        sample = df.select(mapping.key).where(F.col(mapping.key).isNotNull()).limit(SAMPLE_ROWS)
        plain = sample.where(~F.col(mapping.key).rlike(PSEUDONYM_PATTERN)).count()
        if plain:
            problems.append(Problem(name, f"table {name}: {plain} of the first {SAMPLE_ROWS} values of "
                                    f"{mapping.key!r} are not vault pseudonyms, so a shred would leave them "
                                    "identifying; pseudonymize the table (dsr pseudonymize) or use action: delete"))
    return problems


def _aggregate_problems(spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]) -> list[Problem]:
    """Each aggregate's sql parses, reads only tables of the data map named in its `from:`, returns its
    `group_by` columns and exactly the table's columns. Analysis only: nothing is read."""
    problems: list[Problem] = []
    known = {*datamap.tables, *datamap.derived}
    catalog = qualify("a.b").split(".")[0].strip("`")
    for name, mapping in datamap.aggregates.items():
        def parse(n: str = name, m: DerivedMapping = mapping) -> tuple[lineage.Query, list[str]]:
            return lineage.parse(spark, n, m, known, catalog), spark.table(qualify(n)).columns

        read = _read(problems, name, parse)
        if read is None:
            continue
        query, columns = read
        try:
            result = lineage.shape(lineage.bound(spark, query, lambda t: spark.table(qualify(t))),
                                   mapping.group_by).columns
        except Exception as exc:  # DataMapError (group_by), AnalysisException (an unknown column ...)
            problems.append(Problem(name, f"derived {name}: {first_line(exc)}"))
            continue
        if sorted(result) != sorted(columns):
            problems.append(Problem(name, f"derived {name}: the sql returns {', '.join(result)} but the table "
                                    f"has {', '.join(columns)}"))
    return problems
