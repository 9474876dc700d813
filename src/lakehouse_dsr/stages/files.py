"""Erasure of plain-file datasets (the data map's `files:`).

There are no snapshots: a file holding an erased subject is rewritten without them (delete) or with
their groups nulled (redact), published, and the old file deleted (lake/plainfiles.py), so the
dataset's storage is its only state and one read of every file proves it (verify.verify_dataset).
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..lake import plainfiles
from . import collateral, matching
from .collateral import CollateralResult
from .erase import TableErasure, TablePlan
from .matching import TableKeys

_FILE = "dsr_file"


def erase_dataset(spark: SparkSession, settings: Settings, name: str, keys: TableKeys) -> TableErasure:
    """Rewrite only the files holding an erased subject; one new file per old one.

    Cost: one read of the dataset's key columns (with each row's file name) to find the files;
    then each such file is read and written once. The driver receives per-file counts, never a value.
    The check after: each rewritten file holds exactly its rows not requested (delete) or all of
    them (redact), counted from the new file.
    """
    start = time.perf_counter()
    mapping = settings.datamap.files[name]
    plainfiles.recover(spark, mapping.path)
    rows = plainfiles.read_dataset(spark, mapping).withColumn(_FILE, F.input_file_name())
    groups = (matching.mark(rows, keys).select(matching.request_ids(keys).alias("request_ids"), _FILE)
              .groupBy("request_ids", _FILE).count().collect())
    matches: dict[str, int] = {}
    per_file: dict[str, int] = {}
    for g in groups:
        if g.request_ids:
            per_file[g[_FILE]] = per_file.get(g[_FILE], 0) + g["count"]
            for request_id in g.request_ids:
                matches[request_id] = matches.get(request_id, 0) + g["count"]
    table_plan = TablePlan(table=name, key=", ".join(mapping.key_columns),
                           identifier=", ".join(dict.fromkeys(g.identifier for g in mapping.groups)),
                           action=mapping.action, strategy="file_rewrite", write_mode="files",
                           rows_before=sum(g["count"] for g in groups), rows_matched=sum(per_file.values()),
                           matches_by_request=matches, snapshot_before=None)
    result = TableErasure(table_plan, rows_after=table_plan.expected_rows_after, collateral=CollateralResult(True))
    try:
        for old, hits in sorted(per_file.items()):
            content = plainfiles.reader(spark, mapping).load(old)
            before = content.count()
            new = plainfiles.replace(spark, old, _erased(content, keys, mapping.action), mapping)
            after = plainfiles.reader(spark, mapping).load(new).count()
            expected = before if mapping.action == "redact" else before - hits
            result.data_files_rewritten += 1
            if after != expected:
                result.collateral = CollateralResult(False, True, f"{new}: {after} rows, expected {expected}")
    except Exception as exc:  # recorded; verification then shows what is left
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:500]
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _erased(content: DataFrame, keys: TableKeys, action: str) -> DataFrame:
    """A file's rows as the erasure leaves them: without the requested rows, or with their groups nulled."""
    marked = matching.mark(content, keys)
    if action == "delete":
        return marked.where(~matching.any_hit(keys)).select(*[F.col(f"`{c}`") for c in content.columns])
    redactions = matching.redactions(keys)
    return marked.select(*[collateral.erased_value(f, redactions).alias(f.name) for f in content.schema.fields])
