"""The run report: JSON for machines, a Rich summary for people. Holds no subject identifier."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.table import Table

from ..keys import write_private
from ..lake.metrics import IoCost
from ..ledger.ledger import RunRecord
from ..ledger.records import RecordExpiry
from ..stages.retention_models import RetentionPass
from .html import run_report_page
from .models import VERSION, RunReportDocument

_REQUESTS = "\u0000requests\u0000"  # where `write` sets the requests' lines


class RequestResult(Protocol):
    """A request's result as the report lists it: the run's outcomes (ledger.Outcome) are listed as
    they are, not copied (a million of them)."""

    @property
    def request_id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def reason(self) -> str | None: ...


def _line(r: RequestResult) -> dict:
    return {"request_id": r.request_id, "status": r.status, "reason": r.reason}


def _encoded_lines(results: Sequence[RequestResult]) -> Iterator[str]:
    """Each result's line as `json.dumps(_line(r), sort_keys=True)` writes it, its status and reason
    encoded once per distinct pair (a dict encoded per request cost 3.5 s at a million)."""
    text = json.encoder.encode_basestring_ascii  # json.dumps's own string encoder
    tails: dict[tuple[str, str | None], tuple[str, str]] = {}
    for r in results:
        shape = (r.status, r.reason)
        if shape not in tails:
            tails[shape] = ('{"reason": ' + json.dumps(r.reason) + ', "request_id": ',
                            ', "status": ' + text(r.status) + "}")
        head, tail = tails[shape]
        yield head + text(r.request_id) + tail


@dataclass
class RunReport:
    run_id: str
    started_at: str
    seconds: dict[str, float] = field(default_factory=dict)
    cost: dict[str, dict] = field(default_factory=dict)  # per stage: Spark's rows/bytes read, written, shuffled
    tables: dict[str, dict] = field(default_factory=dict)
    ledger_purge: dict = field(default_factory=dict)
    export: dict = field(default_factory=dict)
    requests: Sequence[RequestResult] = field(default_factory=list)
    not_processed: dict[str, int] = field(default_factory=dict)
    # batched purge policy: whether this run purged, how many requests wait, and the next deadline
    purge_schedule: dict = field(default_factory=dict)
    # tables whose collateral check failed in this run (the run stopped before the purge)
    collateral_failures: dict[str, str] = field(default_factory=dict)
    # tables on hold from an earlier collateral failure: no erasure ran ({table: reason})
    held: dict[str, str] = field(default_factory=dict)
    # tables under a legal hold (ledger/holds.py): neither erased nor purged ({table: the hold})
    legal_holds: dict[str, str] = field(default_factory=dict)
    # tables where people erased earlier were found again and erased again (stages/resurrection.py)
    resurrections: dict[str, dict] = field(default_factory=dict)
    # per share (stages/share.py ShareRefresh.as_dict): refresh mode, rows added/removed, purge, verification
    shares: dict[str, dict] = field(default_factory=dict)
    # our own records past their period (ledger/records.py), removed at the start of the run
    records: RecordExpiry | None = None
    # California DROP work items matched at the start of the run (drop/matching.py): counts only
    drop: dict = field(default_factory=dict)
    # the data map's retention rules enforced by this run (stages/retention.py)
    retention: RetentionPass | None = None
    # the data map's Kafka topics settled for the erase batch (stages/topics.py TopicSettlement.as_dict)
    topics: dict[str, dict] = field(default_factory=dict)
    # derived tables: seconds from the run's start until each was clean of the batch (runner/erasure.py)
    clean_after_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def needs_attention(self) -> bool:
        return bool(self.failed or self.held or self.collateral_failures
                    or any(s["error"] for s in self.shares.values()) or (self.records and self.records.ids_found)
                    or (self.retention is not None and not self.retention.passed))

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "completed"]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "failed"]

    @property
    def awaiting_purge(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "erased"]

    @property
    def legally_held(self) -> list[RequestResult]:
        return [r for r in self.requests if r.status == "held"]

    def document(self) -> RunReportDocument:
        """The report as its published, versioned model (evidence/models.py): fails if the report
        drifted from its schema. Its `requests` hold one line per distinct status and reason (each
        line's shape checked once: a million requests' lines cost seconds of validation); `as_dict`
        gives them all."""
        # asdict copies every nested value: done for the requests' flat rows, it took 0.6 s at 100,000
        shapes = {(r.status, r.reason): r for r in self.requests}
        return RunReportDocument.model_validate({
            "version": VERSION, **asdict(replace(self, requests=[])), "requests": [_line(r) for r in shapes.values()],
            "per_table": self.per_table,
            "summary": {"requests": len(self.requests), "completed": len(self.completed), "failed": len(self.failed),
                        "awaiting_purge": len(self.awaiting_purge), "held": len(self.legally_held),
                        "seconds_total": round(sum(self.seconds.values()), 3)}})

    def as_dict(self) -> dict:
        return {**self.document().model_dump(exclude_unset=True), "requests": [_line(r) for r in self.requests]}

    @property
    def per_table(self) -> dict[str, dict]:
        """Per table: action, rows erased or redacted (0 for aggregates recomputed and tables shredded:
        no row of anyone's is taken out there), data files and bytes rewritten by the erase and the
        purge, snapshots expired, and whether it was verified ("yes", "live only", "no")."""
        figures = {}
        for name, t in self.tables.items():
            e, p, v = t["erase"], t.get("purge", {}), t.get("verification", {})
            figures[name] = {
                "action": e.get("action", "aggregate" if t.get("aggregate") else "erased earlier"),
                "rows": e.get("rows_changed", 0) if e.get("action") in ("delete", "redact") else 0,
                "files_rewritten": e.get("data_files_rewritten", 0) + p.get("data_files_rewritten", 0),
                "bytes_rewritten": e.get("bytes_rewritten", 0) + p.get("bytes_rewritten", 0),
                "snapshots_expired": p.get("snapshots_expired", 0),
                "verified": ("yes" if v.get("physical", True) else "live only") if v.get("passed") else "no"}
        return figures

    def record(self, finished_at: datetime) -> RunRecord:
        """The run as one row of the ledger's run history (the operator dashboard)."""
        return RunRecord(self.run_id, datetime.fromisoformat(self.started_at), finished_at, dict(self.seconds),
                         {t: {k: f[k] for k in ("action", "rows", "bytes_rewritten", "files_rewritten")}
                          for t, f in self.per_table.items()},
                         len(self.completed), len(self.failed), len(self.awaiting_purge))

    def write(self, path: str | Path) -> None:
        """Write the JSON report, readable by its owner only."""
        # Indented JSON is encoded in Python, compact JSON in C: the requests' lines (a million in a
        # large batch) are encoded compactly, one per line, and set into the indented rest.
        document = {**self.document().model_dump(exclude_unset=True), "requests": _REQUESTS}
        lines = ",\n    ".join(_encoded_lines(self.requests))
        text = json.dumps(document, indent=2, sort_keys=True)
        write_owner_only(path, text.replace(json.dumps(_REQUESTS), f"[\n    {lines}\n  ]" if lines else "[]", 1))

    def write_html(self, path: str | Path) -> None:
        """Write the report as a self-contained page with charts (evidence/html.py), owner-only."""
        write_owner_only(path, run_report_page(self.as_dict()))

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
        for r in self.legally_held[:10]:
            console.print(f"  {r.request_id} held: {r.reason}")
        for table, hold in self.legal_holds.items():
            console.print(f"{table} is under a legal hold ({hold}): not erased or purged; `dsr hold list`")
        for table, back in self.resurrections.items():
            console.print(f"[yellow]{table}: people erased earlier came back[/] ({back['rows']} row(s) "
                          f"of {back['requests']} completed request(s), in {back['files']} file(s)); erased again")
        for kind, n in self.not_processed.items():
            console.print(f"  {n} {kind} request(s) recorded, not processed by this version")
        if self.records and self.records.removed_anything:
            console.print(self.records.summary())
        for name, s in self.shares.items():  # no verification: nothing to prove in this run
            verified = s["verification"].get("passed")
            console.print(f"share {name}: {s['mode']}" + (f" ({s['reason']})" if s["reason"] else "")
                          + f", {s['rows_added']:,} rows added, {s['rows_removed']:,} removed, {s['seconds']:.1f}s"
                          + ("" if verified is None else ", verified" if verified else ", [red]not verified[/]")
                          + (f", [red]{s['error']}[/]" if s["error"] else ""))

        for name, t in self.topics.items():
            left = t["records_left"]
            console.print(f"topic {name} ({t['cleanup_policy']}): {t['tombstones']:,} key(s) tombstoned, "
                          f"{t['records_read']:,} records read back: " + (
                              "no record of the batch left" if not left else
                              f"[yellow]{left:,} record(s) of {t['requests_found']:,} request(s) left[/]"
                              + (f" (accepted: {t['accepted']})" if t["accepted"] else "")))

    def _render_tables(self, console: Console) -> None:
        table = Table(title=f"run {self.run_id}: erasure per table", title_justify="left")
        for column in ("table", "action", "strategy", "mode", "rows matched", "rows erased/redacted",
                       "files rewritten", "MB rewritten", "snapshots expired", "seconds", "verified"):
            table.add_column(column, justify="right" if column[0].isdigit() or " " in column else "left")
        figures = self.per_table
        for name, t in self.tables.items():
            e, p, v, f = t["erase"], t.get("purge", {}), t.get("verification", {}), figures[name]
            if e and e["action"] == "recompute":  # an aggregate: groups replaced, no rows of anyone's
                groups = "all" if e["strategy"] == "full_refresh" else f"{e['rows_matched']} groups"
                erased = [e["action"], e["strategy"], e["write_mode"], groups, "–"]
            elif e:
                erased = [e["action"], e["strategy"], e["write_mode"], str(e["rows_matched"]), str(e["rows_changed"])]
            else:
                erased = ["(not fed by this batch)" if t.get("aggregate") else "(erased in an earlier run)",
                          "", "", "", ""]
            colour = {"yes": "green", "live only": "yellow"}.get(f["verified"], "red")
            table.add_row(
                name, *erased, str(f["files_rewritten"]), f"{f['bytes_rewritten'] / 1e6:.1f}",
                str(f["snapshots_expired"]), f"{e.get('seconds', 0) + p.get('seconds', 0) + v.get('seconds', 0):.1f}",
                f"[{colour}]{f['verified']}[/]",
            )
        console.print(table)
        for name, t in self.tables.items():
            if t["erase"].get("action") == "shred":
                d = t.get("verification", {}).get("details", {})
                console.print(f"{name}: shredded {d.get('vault_entries_deleted', 0)} vault entries; the table's "
                              f"{d.get('rows_kept', 0):,} rows stay, the shredded people's now unlinkable and "
                              "undecryptable; nothing of the table was rewritten (MB rewritten: the vault's files)")


def write_owner_only(path: str | Path, text: str) -> None:
    """Replace `path` (its folder created if missing) atomically with `text`, readable by its owner only."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_private(file, text)
