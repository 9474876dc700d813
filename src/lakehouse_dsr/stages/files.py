"""Erasure of plain-file datasets (the data map's `files:`).

There are no snapshots: a file holding an erased subject is rewritten without them (delete) or with
their groups nulled (redact), published, and the old file deleted (lake/plainfiles.py), so the
dataset's storage is its only state and one read of every file proves it (verify.verify_dataset).
"""

from __future__ import annotations

import time
from collections import Counter

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ..datamap import DataMap
from ..exceptions import first_line
from ..lake import plainfiles
from . import collateral, matching
from .collateral import CollateralResult
from .erase import Found, TableErasure, TablePlan
from .matching import TableKeys

_FILE = "dsr_file"


def erase_dataset(spark: SparkSession, datamap: DataMap, name: str, keys: TableKeys) -> TableErasure:
    """Rewrite only the files holding an erased subject; one new file per old one.

    Cost: one read of the dataset's key columns (with each row's file name) to find the files and
    count their rows; then each such file is read and written once, and the new file counted. The
    driver receives per-file counts, never a value.
    The check after: each rewritten file holds exactly its rows not requested (delete) or all of
    them (redact), counted from the new file.
    """
    start = time.perf_counter()
    mapping = datamap.files[name]
    plainfiles.recover(spark, mapping.path)
    rows = plainfiles.read_dataset(spark, mapping).withColumn(_FILE, F.input_file_name())
    groups = (matching.mark(rows, keys).select(matching.request_ids(keys).alias("request_ids"), _FILE)
              .groupBy("request_ids", _FILE).count().collect())
    rows_in: Counter[str] = Counter()  # per file: rows
    for g in groups:
        rows_in[g[_FILE]] += g["count"]
    found = Found.of_groups([(g[_FILE], g.request_ids, g["count"]) for g in groups])
    hits_in = found.requested_by_file  # per file holding some: rows naming a requested subject
    table_plan = TablePlan.from_found(name, mapping, found, "file_rewrite", "files", None)
    result = TableErasure(table_plan, rows_after=table_plan.expected_rows_after, collateral=CollateralResult(True))
    try:
        for old in sorted(hits_in):
            content = plainfiles.reader(spark, mapping).load(old)
            new = plainfiles.replace(spark, old, collateral.erased_rows(content, keys, mapping.action), mapping)
            after = plainfiles.reader(spark, mapping).load(new).count()
            expected = rows_in[old] - (0 if mapping.action == "redact" else hits_in[old])
            result.data_files_rewritten += 1
            if after != expected:
                result.collateral = CollateralResult(False, True, f"{new}: {after} rows, expected {expected}")
    except Exception as exc:  # recorded; verification then shows what is left
        result.error = first_line(exc, with_type=True)
    result.seconds = round(time.perf_counter() - start, 3)
    return result
