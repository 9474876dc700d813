"""Clustering by subject key, so finding, exporting and erasing one person touches few files.

Trade-off: a table clustered by subject key serves subject lookups (erasure, access, joins by
user) from a few files, but time-range scans (yesterday's events) then read every file. Keep the
notebook's time layout for tables that mostly serve time-range analytics, or partition by time
and cluster by subject within partitions.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..datamap import DataMap, column_ref, is_array
from ..exceptions import DataMapError
from .iceberg import IcebergTable


@dataclass
class OptimizeResult:
    table: str
    key: str
    files_before: int
    files_after: int
    bytes_rewritten: int
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def optimize(
    handle: IcebergTable, datamap: DataMap, key: str | None = None, target_file_size_bytes: int = 128 * 1024 * 1024,
) -> OptimizeResult:
    """Cluster a table by its subject key (the data map's, unless `key` is given).

    Sets the table's write order (later appends arrive sorted), enables a Parquet bloom filter on
    the key, and rewrites every data file sorted by the key into files of about the target size.
    Cost: reads and rewrites the whole table once (a sort: one shuffle of all rows).
    """
    start = time.perf_counter()
    spark, table = handle.spark, handle.name
    if key is None:
        mapping = datamap.keyed.get(table)
        if mapping is None:
            raise DataMapError(f"{table} is not in the data map; pass the key column explicitly")
        flat = [c for c in mapping.key_columns if not is_array(c)]
        if not flat:
            raise DataMapError(f"{table}: its only key is an array, which cannot order a table; pass a key column")
        key = flat[0]  # the first key column: a shared row sits with its first person
    name = handle.quoted
    files_before = handle.summary_count("total-data-files")
    spark.sql(f"ALTER TABLE {name} WRITE ORDERED BY {column_ref(key)}")
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('write.parquet.bloom-filter-enabled.column.{key}' = 'true')")
    rewritten = handle.rewrite_sorted(key, target_file_size_bytes)
    files_after = handle.summary_count("total-data-files")
    return OptimizeResult(table, key, files_before, files_after, rewritten, round(time.perf_counter() - start, 3))
