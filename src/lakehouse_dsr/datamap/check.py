"""The data map against the catalog: every mapped table and column must exist with a usable type."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql.types import AtomicType, DataType

from ..exceptions import DataMapError
from .model import DataMap


def check_against_catalog(
    spark: SparkSession, datamap: DataMap, qualify: Callable[[str], str]
) -> dict[str, DataType]:
    """Check that every mapped table and column exists with a usable type; nothing is changed.

    Returns the Spark type of each table's key column. Reads only table schemas (no data).
    """
    problems: list[str] = []
    key_types: dict[str, DataType] = {}
    schemas: dict[str, dict[str, object]] = {}
    needed = {t: [m.key, *m.redact] for t, m in datamap.tables.items()}
    for link in datamap.identifiers.values():
        needed.setdefault(link.table, []).extend([link.subject_column, link.column])
    for table, columns in needed.items():
        try:
            fields = {f.name: f for f in spark.table(qualify(table)).schema.fields}
        except Exception as exc:  # AnalysisException, catalog unreachable, ...
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            problems.append(f"table {table} cannot be read: {first_line}")
            continue
        schemas[table] = fields
        for column in dict.fromkeys(columns):
            if column not in fields:
                problems.append(f"table {table} has no column {column!r} (has: {', '.join(fields)})")
    for table, mapping in datamap.tables.items():
        fields = schemas.get(table)
        if not fields or mapping.key not in fields:
            continue
        key_type = fields[mapping.key].dataType
        if not isinstance(key_type, AtomicType):
            problems.append(f"table {table}: key column {mapping.key!r} has type {key_type.simpleString()}, "
                            "which cannot hold an identifier")
        key_types[table] = key_type
        for column in mapping.redact:
            if column in fields and not fields[column].nullable:
                problems.append(f"table {table}: column {column!r} is required (NOT NULL) and cannot be redacted")
    if problems:
        raise DataMapError("the data map does not match the catalog:\n  - " + "\n  - ".join(problems))
    return key_types
