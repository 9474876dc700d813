"""A zip access package's file, written where Spark holds the request's grouped rows (a Python UDF).

Unpickled in each Python worker that writes packages, so it imports only what writing needs: the
export's own module would cost each new worker about half a second of imports (Spark, pydantic,
the data map, pyarrow). pyarrow is imported only for parquet packages.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from .. import faults
from ..keys import write_private

if TYPE_CHECKING:
    import pyarrow as pa

class PackageWriter:
    """Runs on executors (a Python UDF): turns each request's header and grouped rows into its zip
    package file (csv or parquet members; JSON packages are written by the JVM, stages/access.py)."""

    def __init__(self, out: str, fmt: str, tables: list[str], columns: dict, kill_pid: int | None = None):
        self.out, self.fmt, self.tables, self.columns, self.kill_pid = out, fmt, tables, columns, kill_pid

    def __call__(self, p) -> tuple:
        """Write request `p`'s package (its header as JSON text, its rows, each table's row count); returns
        (request_id, file name, sha256, bytes, {table: rows})."""
        by_table: dict[str, list[str]] = {}
        for r in p.rows:
            by_table.setdefault(r.table_name, []).append(r.row)
        for rows in by_table.values():
            rows.sort()  # code point order, as Spark's sort_array of UTF-8 strings: reproducible packages
        data, name = self._zip(json.loads(p.header), by_table), f"{p.request_id}.{self.fmt}.zip"
        # Not synced (1 ms a package): written before the run records anything, checked right after.
        write_private(Path(self.out) / name, data, sync=False)
        if self.kill_pid:
            faults.kill(self.kill_pid)
        return (p.request_id, name, hashlib.sha256(data).hexdigest(), len(data), dict(p.counts))

    def _zip(self, header: dict, by_table: dict[str, list[str]]) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("request.json", json.dumps(header, ensure_ascii=False, indent=2))
            for table in self.tables:
                rows = [json.loads(r, parse_float=Decimal) for r in by_table.get(table, [])]
                member = _csv(rows, self.columns[table]) if self.fmt == "csv" else _parquet(rows, self.columns[table])
                zf.writestr(f"{table}.{self.fmt}", member)
        return buffer.getvalue()


def _csv(rows: list[dict], columns: list[tuple[str, str]]) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow([c for c, _ in columns])
    writer.writerows([[_csv_value(r.get(c)) for c, _ in columns] for r in rows])
    return text.getvalue().encode("utf-8")


def _csv_value(value) -> str:
    if isinstance(value, list | dict):  # nested values as JSON text
        return json.dumps(value, ensure_ascii=False, default=str)
    return "" if value is None else value


def _parquet(rows: list[dict], columns: list[tuple[str, str]]) -> bytes:
    import pyarrow as pa  # here, not at the top: a worker writing JSON packages never loads it
    import pyarrow.parquet as pq

    arrays = []
    for c, t in columns:
        values, arrow_type = [r.get(c) for r in rows], _arrow_type(t)
        arrays.append(pa.array(values) if arrow_type is None else pa.array(values).cast(arrow_type))
    buffer = io.BytesIO()
    pq.write_table(pa.table(arrays, names=[c for c, _ in columns]), buffer)
    return buffer.getvalue()


def _arrow_type(spark_type: str) -> pa.DataType | None:
    """The Arrow type of a Spark column for a package; None for nested types (inferred from the values)."""
    import pyarrow as pa  # loaded by _parquet already

    if spark_type.startswith(("array<", "struct<", "map<")):
        return None
    if spark_type.startswith("decimal("):
        precision, scale = spark_type[8:-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    types: dict[str, pa.DataType] = {
        "string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "smallint": pa.int16(),
        "double": pa.float64(), "float": pa.float32(), "boolean": pa.bool_(), "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us")}
    return types.get(spark_type, pa.string())
