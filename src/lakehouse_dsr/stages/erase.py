"""Logical erasure: one DELETE or UPDATE commit per mapped table for a whole batch.

Both statements honour the table's write mode: copy-on-write rewrites the files holding
matches; merge-on-read writes delete files / deletion vectors and leaves the purge to purge.py.
The statement is chosen by `choose_strategy`, a rule measured with bench/strategy.py.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, fields

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ..config import Settings
from ..datamap import TableMapping
from ..lake import iceberg
from . import collateral
from .collateral import CollateralResult, Fingerprint


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
    # collateral check (content mode): the rows not requested, and what requested rows must become
    other_before: Fingerprint | None = None
    requested_after: Fingerprint | None = None

    @property
    def expected_rows_after(self) -> int:
        """What the table must hold after the erase commit: fewer rows only by the matches deleted."""
        return self.rows_before if self.action == "redact" else self.rows_before - self.rows_matched


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
    attempts: int = 1  # statements run: more than one when concurrent commits conflicted
    rounds: int = 1  # erase rounds: more than one when late rows of requested subjects arrived
    collateral: CollateralResult | None = None
    # The erase snapshot's key values (collateral.by_value), when the content check read them
    values_at_commit: DataFrame | None = None

    @property
    def rows_changed(self) -> int:
        return self.plan.rows_matched if self.plan.action == "redact" else self.plan.rows_before - self.rows_after

    def absorb(self, later: TableErasure) -> None:
        """Fold a later round (late rows erased) into this result: counts add up, the newest commit wins."""
        self.plan.rows_matched += later.plan.rows_matched
        for request_id, n in later.plan.matches_by_request.items():
            self.plan.matches_by_request[request_id] = self.plan.matches_by_request.get(request_id, 0) + n
        self.snapshot_id = later.snapshot_id or self.snapshot_id
        self.data_files_rewritten += later.data_files_rewritten
        self.bytes_rewritten += later.bytes_rewritten
        self.delete_files_added += later.delete_files_added
        self.attempts += later.attempts
        self.rounds += later.rounds
        self.error = later.error or self.error
        if later.collateral and not later.collateral.ok or self.collateral is None:
            self.collateral = later.collateral
        self.values_at_commit = later.values_at_commit if later.snapshot_id else self.values_at_commit

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("plan", "values_at_commit")}
        d["collateral"] = asdict(self.collateral) if self.collateral else None
        plan = {k: v for k, v in asdict(self.plan).items()
                if k not in ("matches_by_request", "other_before", "requested_after")}
        return {**plan, **d, "rows_changed": self.rows_changed}


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


@dataclass(frozen=True)
class KeySet:
    """A batch's values of one identifier, cast to one key type, grouped by value with the requests
    naming each (`key_value`, `request_ids`). Kept (local checkpoint, one small row per value) and
    built once per run for every table keyed by that identifier and type, so no table's plan,
    statement or check shuffles the batch again."""

    requesters: DataFrame
    size: int  # distinct values: decides whether the statement may broadcast them

    @property
    def hits(self) -> DataFrame:
        """The distinct requested values (column `key_value`)."""
        return self.requesters.select("key_value")


def key_set(keys: DataFrame, mapping: TableMapping, key_type: DataType) -> KeySet:
    """The KeySet of `mapping`'s identifier at `key_type`. Cost: two small jobs over the batch's keys."""
    grouped = keys_for_table(keys, mapping, key_type).groupBy("key_value").agg(
        F.collect_set("request_id").alias("request_ids")).localCheckpoint(eager=True)
    return KeySet(grouped, grouped.count())


def key_sets(settings: Settings, keys: DataFrame, key_types: dict[str, DataType], tables: list[str]
             ) -> dict[str, KeySet]:
    """Each table's KeySet, built once per (identifier, key type): a hundred tables keyed by user_id
    share one."""
    built: dict[tuple[str, str], KeySet] = {}
    for table in tables:
        mapping = settings.datamap.tables[table]
        shape = (mapping.identifier, key_types[table].simpleString())
        if shape not in built:
            built[shape] = key_set(keys, mapping, key_types[table])
    return {t: built[(settings.datamap.tables[t].identifier, key_types[t].simpleString())] for t in tables}


def choose_strategy(action: str, distinct_keys: int, broadcast_max_keys: int, modes: dict[str, str]) -> str:
    """MERGE with a broadcast key set while it fits and the table's modes allow, else DELETE/UPDATE.

    Measured at 1M events / 100 subjects (medians of 3, bench/strategy.py): MERGE with a broadcast
    source took 1.69 s against 3.47 s for DELETE ... WHERE EXISTS on copy-on-write, 0.40 s against
    0.75 s on merge-on-read; both rewrote the same files. DELETE ... WHERE EXISTS plans an extra
    pass over the table to find the affected files. Broadcasting stops paying once the key set
    is too large for every executor's memory, hence the limit. A MERGE follows the table's
    `write.merge.mode`, so it is used only where that equals the mode the table set for this kind
    of change (`write.delete.mode` / `write.update.mode`): the owner's choice is respected.
    """
    natural = "delete" if action == "delete" else "update"
    if distinct_keys <= broadcast_max_keys and modes["merge"] == modes[natural]:
        return "merge_broadcast"
    return f"{natural}_where_exists"


def write_modes(spark: SparkSession, settings: Settings, table: str) -> dict[str, str]:
    return {op: iceberg.write_mode(spark, settings, table, op) for op in ("delete", "update", "merge")}


def plan(spark: SparkSession, settings: Settings, table: str, keys: KeySet, fingerprint: bool = False
         ) -> TablePlan:
    """Count matches per request and pick the strategy: one scan, one Spark job.

    The same scan counts the table's rows (a row two requests share counts once in the totals)
    and, with `fingerprint` (the content collateral check), fingerprints the rows not requested and
    what the requested rows must become. Cost: reads the key column, or every column with
    `fingerprint`; the driver receives one row per matched key value (request ids, a count and hash
    parts; never the value).
    """
    mapping = settings.datamap.tables[table]
    snapshot = iceberg.current_snapshot(spark, settings, table)
    rows = iceberg.read_at(spark, settings, table, snapshot.snapshot_id if snapshot else None)
    nulled = frozenset(mapping.redact)  # empty for deleting tables (the data map allows redact columns only there)
    hashes = [*collateral.row_hashes(rows, "o_"), *(collateral.row_hashes(rows, "r_", nulled) if nulled else [])
              ] if fingerprint else []
    # One group per matched key value, with the requests naming it, plus one (no requests) for every other row.
    groups = (
        rows.select(F.col(f"`{mapping.key}`").alias("key_value"), *hashes)
        .join(F.broadcast(keys.requesters), "key_value", "left")
        .groupBy("request_ids")
        .agg(F.count(F.lit(1)).alias("count"), *(collateral.group_aggregates(nulled) if fingerprint else []))
        .collect()
    )
    matched = [g for g in groups if g.request_ids]
    matches: dict[str, int] = {}
    for g in matched:
        for request_id in g.request_ids:
            matches[request_id] = matches.get(request_id, 0) + g["count"]
    action = mapping.action
    modes = write_modes(spark, settings, table)
    strategy = choose_strategy(action, keys.size, settings.erase.broadcast_max_keys, modes)
    other_before = requested_after = None
    if fingerprint:
        other_before = sum((collateral.part(g, "o_") for g in groups if not g.request_ids), Fingerprint())
        requested_after = sum((collateral.part(g, "r_") for g in matched), Fingerprint()) if nulled else Fingerprint()
    return TablePlan(
        table=table,
        key=mapping.key,
        identifier=mapping.identifier or settings.datamap.subject,
        action=action,
        strategy=strategy,
        write_mode=modes[strategy.split("_")[0]],
        rows_before=sum(g["count"] for g in groups),
        rows_matched=sum(g["count"] for g in matched),
        matches_by_request=matches,
        snapshot_before=snapshot.snapshot_id if snapshot else None,
        other_before=other_before,
        requested_after=requested_after,
    )


def apply(spark: SparkSession, settings: Settings, table_plan: TablePlan, keys: KeySet) -> TableErasure:
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
    keys.hits.createOrReplaceTempView(view)
    target, key = settings.table(table_plan.table), f"`{mapping.key}`"
    nulls = ", ".join(f"t.`{c}` = NULL" for c in mapping.redact)
    exists = f"EXISTS (SELECT 1 FROM {view} s WHERE s.key_value = t.{key})"
    statements = {
        "merge_broadcast": f"MERGE INTO {target} AS t USING (SELECT /*+ BROADCAST({view}) */ key_value FROM {view}) "
                           f"AS s ON t.{key} = s.key_value WHEN MATCHED THEN "
                           + ("DELETE" if mapping.action == "delete" else f"UPDATE SET {nulls}"),
        "delete_where_exists": f"DELETE FROM {target} AS t WHERE {exists}",
        "update_where_exists": f"UPDATE {target} AS t SET {nulls} WHERE {exists}",
    }
    try:
        result.attempts = iceberg.with_conflict_retries(settings, f"table {table_plan.table}: the erase commit",
                                                        lambda: spark.sql(statements[table_plan.strategy]))[1]
    finally:
        spark.catalog.dropTempView(view)
    snapshot = iceberg.own_commit_since(spark, settings, table_plan.table, table_plan.snapshot_before)
    if snapshot:
        s = snapshot.summary
        result.snapshot_id = snapshot.snapshot_id
        result.data_files_rewritten = int(s.get("deleted-data-files", 0))
        result.bytes_rewritten = int(s.get("removed-files-size", 0))
        result.delete_files_added = int(s.get("added-delete-files", 0))
    # Counted at the erase commit, so a concurrent append cannot pass for collateral damage.
    result.rows_after = iceberg.rows_after_commit(spark, settings, table_plan.table, result.snapshot_id,
                                                  table_plan.rows_before)
    return result

