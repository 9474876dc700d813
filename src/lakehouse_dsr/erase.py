"""Logical erasure: one DELETE or UPDATE commit per mapped table for a whole batch.

Strategy rule (measured; see README "Choosing DELETE or MERGE"): delete tables use
`DELETE ... WHERE EXISTS` against a broadcast key view, which lets Iceberg prune to the files
holding keys before rewriting; redact tables use `MERGE ... WHEN MATCHED THEN UPDATE` with a
broadcast source. Both honour the table's write mode (copy-on-write rewrites the files holding
matches; merge-on-read writes delete files / deletion vectors and leaves the purge to purge.py).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from . import iceberg
from .config import Settings
from .datamap import TableMapping


@dataclass
class TablePlan:
    table: str
    key: str
    identifier: str
    action: str
    strategy: str
    write_mode: str
    rows_before: int
    rows_matched: int
    matches_by_request: dict[str, int]
    snapshot_before: int | None


@dataclass
class TableErasure:
    plan: TablePlan
    snapshot_id: int | None = None
    rows_after: int = 0
    data_files_rewritten: int = 0
    bytes_rewritten: int = 0
    delete_files_added: int = 0
    seconds: float = 0.0
    error: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rows_changed(self) -> int:
        return self.plan.rows_matched if self.plan.action == "redact" else self.plan.rows_before - self.rows_after

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("plan")
        return {**{k: v for k, v in asdict(self.plan).items() if k != "matches_by_request"}, **d,
                "rows_changed": self.rows_changed}


def keys_for_table(keys: DataFrame, mapping: TableMapping, key_type: DataType) -> DataFrame:
    """Distinct identifier values for this table's key, cast to the key column's type.

    Values that cannot be that type (a text id against a numeric key) become NULL and are dropped:
    they cannot match any row.
    """
    return (
        keys.where(F.col("key_type") == mapping.identifier)
        .select("request_id", F.col("key_value").cast(key_type).alias("key_value"))
        .where(F.col("key_value").isNotNull())
    )


def plan(spark: SparkSession, settings: Settings, table: str, keys: DataFrame, key_type: DataType) -> TablePlan:
    """Count matches per request (one scan of the key column, broadcast join) and pick the strategy."""
    mapping = settings.datamap.tables[table]
    table_keys = keys_for_table(keys, mapping, key_type)
    rows = spark.table(settings.table(table))
    per_request = (
        rows.select(F.col(mapping.key).alias("key_value"))
        .join(F.broadcast(table_keys), "key_value")
        .groupBy("request_id").count().collect()
    )
    matches = {r.request_id: r["count"] for r in per_request}
    snapshot = iceberg.current_snapshot(spark, settings, table)
    action = mapping.action
    return TablePlan(
        table=table,
        key=mapping.key,
        identifier=mapping.identifier or settings.datamap.subject,
        action=action,
        strategy="delete_where_exists" if action == "delete" else "merge_update",
        write_mode=iceberg.write_mode(spark, settings, table, "delete" if action == "delete" else "merge"),
        rows_before=rows.count(),
        rows_matched=sum(matches.values()),
        matches_by_request=matches,
        snapshot_before=snapshot.snapshot_id if snapshot else None,
    )


def apply(
    spark: SparkSession, settings: Settings, table_plan: TablePlan, keys: DataFrame, key_type: DataType
) -> TableErasure:
    """Run the plan as one commit. Skips tables without matches (no empty commits).

    Copy-on-write: reads and rewrites every data file holding a match. Merge-on-read: reads the
    key column of candidate files and writes delete files only.
    """
    result = TableErasure(table_plan)
    if table_plan.rows_matched == 0:
        result.rows_after = table_plan.rows_before
        return result
    mapping = settings.datamap.tables[table_plan.table]
    view = f"dsr_keys_{uuid.uuid4().hex[:12]}"
    keys_for_table(keys, mapping, key_type).select("key_value").distinct().createOrReplaceTempView(view)
    target, key = settings.table(table_plan.table), f"`{mapping.key}`"
    try:
        if table_plan.strategy == "delete_where_exists":
            spark.sql(f"DELETE FROM {target} AS t WHERE EXISTS (SELECT 1 FROM {view} s WHERE s.key_value = t.{key})")
        elif table_plan.strategy == "merge_delete":
            spark.sql(f"MERGE INTO {target} AS t USING (SELECT /*+ BROADCAST({view}) */ key_value FROM {view}) AS s "
                      f"ON t.{key} = s.key_value WHEN MATCHED THEN DELETE")
        else:
            nulls = ", ".join(f"t.`{c}` = NULL" for c in mapping.redact)
            spark.sql(f"MERGE INTO {target} AS t USING (SELECT /*+ BROADCAST({view}) */ key_value FROM {view}) AS s "
                      f"ON t.{key} = s.key_value WHEN MATCHED THEN UPDATE SET {nulls}")
    finally:
        spark.catalog.dropTempView(view)
    snapshot = iceberg.current_snapshot(spark, settings, table_plan.table)
    if snapshot and snapshot.snapshot_id != table_plan.snapshot_before:
        s = snapshot.summary
        result.snapshot_id = snapshot.snapshot_id
        result.data_files_rewritten = int(s.get("deleted-data-files", 0))
        result.bytes_rewritten = int(s.get("removed-files-size", 0))
        result.delete_files_added = int(s.get("added-delete-files", 0))
    result.rows_after = spark.table(target).count()
    return result
