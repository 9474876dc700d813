"""The run report: JSON for machines, a Rich summary for people. Holds no subject identifier."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table


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
    tables: dict[str, dict] = field(default_factory=dict)
    ledger_purge: dict = field(default_factory=dict)
    export: dict = field(default_factory=dict)
    requests: list[RequestResult] = field(default_factory=list)
    not_processed: dict[str, int] = field(default_factory=dict)

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "completed"]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status != "completed"]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = {"requests": len(self.requests), "completed": len(self.completed), "failed": len(self.failed),
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
        console.print(f"requests: [green]{len(self.completed)} completed[/], "
                      f"[{'red' if self.failed else 'default'}]{len(self.failed)} open with a reason[/]")
        for r in self.failed[:10]:
            console.print(f"  {r.request_id}: {r.reason}")
        if self.export:
            e = self.export
            console.print(f"exports: {e['packages']} package(s) ({e['format']}) in {e['directory']}, "
                          f"manifest {e['manifest']}")
        for kind, n in self.not_processed.items():
            console.print(f"  {n} {kind} request(s) recorded, not processed by this version")

    def _render_tables(self, console: Console) -> None:
        table = Table(title=f"run {self.run_id}: erasure per table", title_justify="left")
        for column in ("table", "action", "strategy", "mode", "rows matched", "rows erased/redacted",
                       "files rewritten", "MB rewritten", "snapshots expired", "verified"):
            table.add_column(column, justify="right" if column[0].isdigit() or " " in column else "left")
        for name, t in self.tables.items():
            e, p, v = t["erase"], t.get("purge", {}), t.get("verification", {})
            table.add_row(
                name, e["action"], e["strategy"], e["write_mode"], str(e["rows_matched"]), str(e["rows_changed"]),
                str(e["data_files_rewritten"] + p.get("data_files_rewritten", 0)),
                f"{(e['bytes_rewritten'] + p.get('bytes_rewritten', 0)) / 1e6:.1f}",
                str(p.get("snapshots_expired", 0)),
                "[green]yes[/]" if v.get("passed") else "[red]no[/]",
            )
        console.print(table)
