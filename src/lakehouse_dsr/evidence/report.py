"""The run report: JSON for machines, a Rich summary for people. Holds no subject identifier."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..lake.metrics import IoCost


@dataclass
class RequestResult:
    request_id: str
    status: str
    reason: str | None = None


@dataclass
class RunReport:
    run_id: str
    started_at: str
    seconds: dict[str, float] = field(default_factory=dict)
    cost: dict[str, dict] = field(default_factory=dict)  # per stage: Spark's rows/bytes read, written, shuffled
    tables: dict[str, dict] = field(default_factory=dict)
    ledger_purge: dict = field(default_factory=dict)
    export: dict = field(default_factory=dict)
    requests: list[RequestResult] = field(default_factory=list)
    not_processed: dict[str, int] = field(default_factory=dict)
    # batched purge policy: whether this run purged, how many requests wait, and the next deadline
    purge_schedule: dict = field(default_factory=dict)
    # tables whose collateral check failed in this run (the run stopped before the purge)
    collateral_failures: dict[str, str] = field(default_factory=dict)
    # tables on hold from an earlier collateral failure: no erasure ran ({table: reason})
    held: dict[str, str] = field(default_factory=dict)

    @property
    def needs_attention(self) -> bool:
        return bool(self.failed or self.held or self.collateral_failures)

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "completed"]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "failed"]

    @property
    def awaiting_purge(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "erased"]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = {"requests": len(self.requests), "completed": len(self.completed), "failed": len(self.failed),
                        "awaiting_purge": len(self.awaiting_purge),
                        "seconds_total": round(sum(self.seconds.values()), 3)}
        return d

    def write(self, path: str | Path) -> None:
        """Write the JSON report, readable by its owner only."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.as_dict(), fh, indent=2, sort_keys=True)

    def render(self, console: Console) -> None:
        if self.tables:
            self._render_tables(console)
        stages = ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())
        console.print(f"stages: {stages}")
        if self.cost:
            total = IoCost()
            for c in self.cost.values():
                total = total.add(IoCost(**c))
            console.print(f"spark I/O: {total.rows_read:,} rows / {total.bytes_read / 1e6:,.1f} MB read, "
                          f"{total.bytes_written / 1e6:,.1f} MB written, {total.shuffle_bytes / 1e6:,.1f} MB shuffled")
        console.print(f"requests: [green]{len(self.completed)} completed[/], "
                      f"[{'red' if self.failed else 'default'}]{len(self.failed)} open with a reason[/]")
        for r in self.failed[:10]:
            console.print(f"  {r.request_id}: {r.reason}")
        schedule = self.purge_schedule
        if schedule.get("waiting"):
            console.print(f"purge: {schedule['waiting']} request(s) logically erased, waiting for the batched purge "
                          f"(due by {schedule['next_purge_by']})")
        if self.export:
            e = self.export
            console.print(f"exports: {e['packages']} package(s) ({e['format']}) in {e['directory']}, "
                          f"manifest {e['manifest']}")
        for table, detail in self.collateral_failures.items():
            console.print(f"[red]collateral check failed in {table}[/]: {detail}; the run stopped before the purge")
        for table, detail in self.held.items():
            console.print(f"[red]{table} is on hold[/] after a collateral-check failure ({detail}); no erasure ran. "
                          f"Inspect it (roll back with CALL <catalog>.system.rollback_to_snapshot if rows were "
                          f"lost), then `dsr release {table} --reason ...`")
        for kind, n in self.not_processed.items():
            console.print(f"  {n} {kind} request(s) recorded, not processed by this version")

    def _render_tables(self, console: Console) -> None:
        table = Table(title=f"run {self.run_id}: erasure per table", title_justify="left")
        for column in ("table", "action", "strategy", "mode", "rows matched", "rows erased/redacted",
                       "files rewritten", "MB rewritten", "snapshots expired", "seconds", "verified"):
            table.add_column(column, justify="right" if column[0].isdigit() or " " in column else "left")
        for name, t in self.tables.items():
            e, p, v = t["erase"], t.get("purge", {}), t.get("verification", {})
            if e and e["action"] == "recompute":  # an aggregate: groups replaced, no rows of anyone's
                groups = "all" if e["strategy"] == "full_refresh" else f"{e['rows_matched']} groups"
                erased = [e["action"], e["strategy"], e["write_mode"], groups, "–"]
            elif e:
                erased = [e["action"], e["strategy"], e["write_mode"], str(e["rows_matched"]), str(e["rows_changed"])]
            else:
                erased = ["(not fed by this batch)" if t.get("aggregate") else "(erased in an earlier run)",
                          "", "", "", ""]
            verified = ("[green]yes[/]" if v.get("physical", True) else "[yellow]live only[/]") if v.get("passed") \
                else "[red]no[/]"
            table.add_row(
                name, *erased,
                str(e.get("data_files_rewritten", 0) + p.get("data_files_rewritten", 0)),
                f"{(e.get('bytes_rewritten', 0) + p.get('bytes_rewritten', 0)) / 1e6:.1f}",
                str(p.get("snapshots_expired", 0)),
                f"{e.get('seconds', 0) + p.get('seconds', 0) + v.get('seconds', 0):.1f}", verified,
            )
        console.print(table)
        for name, t in self.tables.items():
            if t["erase"].get("action") == "shred":
                d = t.get("verification", {}).get("details", {})
                console.print(f"{name}: shredded {d.get('vault_entries_deleted', 0)} vault entries; the table's "
                              f"{d.get('rows_kept', 0):,} rows stay, the shredded people's now unlinkable and "
                              "undecryptable; nothing of the table was rewritten (MB rewritten: the vault's files)")
