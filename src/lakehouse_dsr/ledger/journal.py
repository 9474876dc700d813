"""The step journal `<ns>.steps`: what each run did to each table, and which tables are on hold.

The ledger says where each request stands; the journal says where each table stands. A run
records its erase commits (snapshot id, rows per request) after the erase stage and its purges
after the purge stage, one small append each. A run killed before it recorded its outcomes is
finished by the next one: that run purges the tables the killed run erased and keeps the killed
run's erase evidence, since re-erasing finds nothing left to count. A collateral-check failure
puts the table on hold: no run erases or purges there until `dsr release` (history still holds
the pre-erase snapshot, so a rollback stays possible until then). Holds no identifiers.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ..config import Settings
from ..exceptions import LedgerError

STEPS_SCHEMA = ("step_id string, run_id string, table_name string, step string, snapshot_id bigint, "
                "at timestamp, detail string")
STEPS = ("erased", "purged", "held", "released")


@dataclass
class Step:
    run_id: str | None
    table: str
    step: str
    snapshot_id: int | None = None
    detail: dict = field(default_factory=dict)
    at: datetime | None = None


class Journal:
    def __init__(self, spark: SparkSession, settings: Settings):
        self.spark, self.settings = spark, settings
        self.table = f"{settings.ledger_namespace}.steps"

    def ensure(self) -> None:
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self.settings.table(self.table)} ({STEPS_SCHEMA}) USING iceberg "
                       "TBLPROPERTIES ('format-version' = '2')")

    def record(self, steps: list[Step]) -> None:
        """Append steps in one commit."""
        if not steps:
            return
        now = datetime.now(UTC)
        rows = [(uuid.uuid4().hex, s.run_id, s.table, s.step, s.snapshot_id, s.at or now,
                 json.dumps(s.detail, sort_keys=True)) for s in steps]
        self.spark.createDataFrame(rows, STEPS_SCHEMA).writeTo(self.settings.table(self.table)).append()

    def steps(self, run_ids: list[str] | None = None, step: str | None = None, table: str | None = None
              ) -> list[Step]:
        """Steps (oldest first), optionally of some runs, of one kind, of one table. Small: a few rows per
        run and table."""
        df = self.spark.table(self.settings.table(self.table))
        if run_ids is not None:
            if not run_ids:
                return []
            df = df.where(F.col("run_id").isin(*run_ids))
        if step is not None:
            df = df.where(F.col("step") == step)
        if table is not None:
            df = df.where(F.col("table_name") == table)
        return [Step(r.run_id, r.table_name, r.step, r.snapshot_id, json.loads(r.detail or "{}"), r.at)
                for r in df.orderBy("at", "step_id").collect()]

    def holds(self) -> dict[str, Step]:
        """Tables whose latest hold/release step is a hold: {table: the hold step}."""
        latest: dict[str, Step] = {}
        for s in self.steps():
            if s.step in ("held", "released"):
                latest[s.table] = s
        return {t: s for t, s in latest.items() if s.step == "held"}

    def release(self, table: str, reason: str) -> Step:
        """Lift a hold once a person has looked (and rolled back if needed); the reason is kept."""
        if not reason.strip():
            raise LedgerError("a release needs a reason (what was checked or rolled back)")
        hold = self.holds().get(table)
        if hold is None:
            raise LedgerError(f"table {table} is not on hold")
        step = Step(None, table, "released", hold.snapshot_id, {"reason": reason, "hold_run_id": hold.run_id})
        self.record([step])
        return step
