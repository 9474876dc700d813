"""An independent reader of the lakehouse: pyiceberg through the same catalog, pyarrow over the storage,
DuckDB on the metadata. Nothing here goes through Spark or lakehouse_dsr."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysTrue, In
from pyiceberg.table import StaticTable


class HadoopTables:
    """The part of pyiceberg's Catalog the reader uses, for the embedded (hadoop) catalog, which pyiceberg
    has no catalog for: each table's current metadata file is named by its `version-hint.text`."""

    def __init__(self, warehouse: Path):
        self.warehouse = warehouse

    def load_table(self, name: str) -> StaticTable:
        metadata = self.warehouse.joinpath(*name.split("."), "metadata")
        version = (metadata / "version-hint.text").read_text().strip()
        return StaticTable.from_metadata(f"file://{metadata}/v{version}.metadata.json")

    def list_tables(self, namespace: str) -> list[tuple[str, str]]:
        return [(namespace, p.name) for p in sorted((self.warehouse / namespace).iterdir()) if p.is_dir()]


def _strings(table: pa.Table) -> set[str]:
    """Every string value in every column, nested ones included (flattened)."""
    values: set[str] = set()
    for column in table.flatten().columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            values.update(v for v in column.to_pylist() if v is not None)
    return values


@dataclass
class Reader:
    catalog: Catalog | HadoopTables
    storage: fs.FileSystem

    def count(self, table: str, column: str | None = None, values: set[str] | None = None,
              snapshot_id: int | None = None) -> int:
        """Rows of `table` (at `snapshot_id`, default current) whose `column` is one of `values`."""
        row_filter = In(column, list(values)) if column else AlwaysTrue()
        return self.catalog.load_table(table).scan(row_filter=row_filter, snapshot_id=snapshot_id).to_arrow().num_rows

    def table(self, table: str) -> pa.Table:
        return self.catalog.load_table(table).scan().to_arrow()

    def found_in_history(self, table: str, needles: set[str]) -> list[int]:
        """Snapshots still reachable from the table's metadata whose rows contain any of `needles`."""
        loaded = self.catalog.load_table(table)
        return [s.snapshot_id for s in loaded.snapshots()
                if _strings(loaded.scan(snapshot_id=s.snapshot_id).to_arrow()) & needles]

    def found_in_storage(self, table: str, needles: set[str]) -> list[str]:
        """Every Parquet file under the table's location (referenced or orphaned) holding any of `needles`."""
        hits = []
        for path in self.parquet_files(table):
            with self.storage.open_input_file(path) as fh:
                if _strings(pq.read_table(fh)) & needles:
                    hits.append(path)
        return hits

    def parquet_files(self, table: str) -> list[str]:
        """Every Parquet file under the table's location, as the storage lists it."""
        location = urlparse(self.catalog.load_table(table).location())
        root = location.path if location.scheme in ("", "file") else location.netloc + location.path
        return [i.path for i in self.storage.get_file_info(fs.FileSelector(root, recursive=True))
                if i.type == fs.FileType.File and i.path.endswith(".parquet")]


def duckdb_count(metadata_location: str, column: str, values: set[str]) -> tuple[int, int]:
    """(all rows, rows whose `column` is in `values`) as DuckDB's iceberg extension reads one metadata file."""
    con = duckdb.connect()
    for module in (duckdb_extension_avro, duckdb_extension_iceberg):  # INSTALL would need the internet
        con.load_extension(str(next(Path(module.__file__).parent.glob("extensions/*/*.duckdb_extension"))))
    total, matched = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {column} IN (SELECT unnest($2))) FROM iceberg_scan($1)",
        [metadata_location, sorted(values)],
    ).fetchone()
    return total, matched
