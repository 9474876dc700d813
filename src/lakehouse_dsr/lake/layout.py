"""Clustering by subject key, so finding, exporting and erasing one person touches few files.

Trade-off: a table clustered by subject key serves subject lookups (erasure, access, joins by
user) from a few files, but time-range scans (yesterday's events) then read every file. Keep the
notebook's time layout for tables that mostly serve time-range analytics, or partition by time
and cluster by subject within partitions.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..datamap import DataMap, is_array
from ..exceptions import DataMapError
from .table import TableHandle


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
    handle: TableHandle, datamap: DataMap, key: str | None = None, target_file_size_bytes: int = 128 * 1024 * 1024,
) -> OptimizeResult:
    """Cluster a table by its subject key (the data map's, unless `key` is given): the handle's
    `cluster_by_key` (Iceberg: write order, bloom filter, a sorted rewrite; Delta: Z-order, or
    liquid clustering where the table uses it). Cost: reads and rewrites the whole table once."""
    start = time.perf_counter()
    table = handle.name
    if key is None:
        mapping = datamap.keyed.get(table)
        if mapping is None:
            raise DataMapError(f"{table} is not in the data map; pass the key column explicitly")
        flat = [c for c in mapping.key_columns if not is_array(c)]
        if not flat:
            raise DataMapError(f"{table}: its only key is an array, which cannot order a table; pass a key column")
        key = flat[0]  # the first key column: a shared row sits with its first person
    files_before, files_after, rewritten = handle.cluster_by_key(key, target_file_size_bytes)
    return OptimizeResult(table, key, files_before, files_after, rewritten, round(time.perf_counter() - start, 3))
