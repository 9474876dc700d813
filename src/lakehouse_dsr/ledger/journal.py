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

from ..exceptions import LedgerError
from .store import Store


@dataclass
class Step:
    run_id: str | None
    table: str
    step: str
    snapshot_id: int | None = None
    detail: dict = field(default_factory=dict)
    at: datetime | None = None


class Journal:
    def __init__(self, store: Store):
        self.store = store
        self.table = store.name("steps")

    def record(self, steps: list[Step]) -> None:
        """Append steps in one commit. Details are written in their own key order: sorting an erase
        step's rows per request took 3 s at a million requests."""
        now = datetime.now(UTC)
        self.store.append("steps", [
            {"step_id": uuid.uuid4().hex, "run_id": s.run_id, "table_name": s.table, "step": s.step,
             "snapshot_id": s.snapshot_id, "at": s.at or now, "detail": json.dumps(s.detail)}
            for s in steps])

    def steps(self, run_ids: list[str] | None = None, step: str | None = None, table: str | None = None
              ) -> list[Step]:
        """Steps (oldest first), optionally of some runs, of one kind, of one table. Small: a few rows per
        run and table; one read."""
        if run_ids is not None and not run_ids:
            return []
        rows = sorted(self.store.rows("steps"), key=lambda r: (r["at"], r["step_id"]))
        return [Step(r["run_id"], r["table_name"], r["step"], r["snapshot_id"], json.loads(r["detail"] or "{}"),
                     r["at"])
                for r in rows if (run_ids is None or r["run_id"] in run_ids) and step in (None, r["step"])
                and table in (None, r["table_name"])]

    def holds(self, steps: list[Step] | None = None) -> dict[str, Step]:
        """Tables whose latest hold/release step is a hold: {table: the hold step}."""
        latest: dict[str, Step] = {}
        for s in steps if steps is not None else self.steps():
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
