"""A run's access requests: one package per request, checked against the manifest's checksums."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..exceptions import first_line
from ..ledger.ledger import Outcome
from ..progress import Silent
from ..stages import access, matching
from . import rules
from .context import Context
from .work import RequestRows


@dataclass(frozen=True)
class Exported:
    outcomes: list[Outcome] = field(default_factory=list)
    summary: dict | None = None  # the report's export section (None: nothing exported)


def export_requests(ctx: Context, requests: RequestRows, read_at: dict[str, access.ReadAt] | None = None,
                    background: bool = False) -> Exported:
    """Resolve the access requests' identifiers, export one package per request
    (stages/access.py) and check every package against the manifest. An export that fails leaves
    every request of the batch open with the reason. Cost: see access.export. `read_at`: tables an
    erasure committed to before the export (SharedExport). `background`: run on a thread beside the
    run's other stages: its jobs are described so (lake/metrics.py's `beside`) and counted as the
    export's alone, and it shows no progress (the caller's thread owns the display)."""
    request_ids = sorted(requests)
    if not request_ids:
        return Exported()
    settings = ctx.settings
    out_dir = Path(settings.export.directory) / ctx.run_id
    progress = Silent() if background else ctx.progress
    with ctx.timed("export", beside_the_run="the access export" if background else None):
        progress.stage("export", 1)
        progress.step(f"{len(request_ids)} package(s), {settings.export.format}")
        try:
            batch = ctx.batch(requests)
            keys = ctx.identifiers(request_ids)
            result = access.export(ctx.lake, settings.datamap, batch, out_dir, settings.export.format, ctx.key_types,
                                   keys, ctx.vault_keys, ctx.vault_table, read_at, settings.run.parallel_tables)
            checked = access.checked_packages(result)
        except Exception as exc:  # every request of the batch stays open with the reason
            return Exported([Outcome(rid, "failed", f"export failed: {first_line(exc, with_type=True)}")
                             for rid in request_ids])
        finally:
            progress.done()
    datamap = settings.datamap
    summary = rules.export_summary(result, settings.export.format,
                                   [*datamap.keyed, *datamap.files, *datamap.shredded])
    return Exported(rules.access_outcomes(request_ids, result, checked, ctx.run_id), summary)


class SharedExport:
    """The run's access export run by the erasure (runner/erasure.py) between its first commits and
    their content checks, so that a table the erasure rewrote is read once, by the export, with the
    check's "after" side observed on that scan: at 10M events and 100 erasures the rewrite touches
    every file, and the export would otherwise read all of them again. Packages are those an export
    run first writes: an erased table is read as before its erase commit unless the commit changed
    no row an access request names (`unchanged_by`)."""

    def __init__(self, ctx: Context, requests: RequestRows):
        self.ctx, self.requests = ctx, requests
        self._keys: dict[str, matching.TableKeys] = {}  # the access requests' keys per table, built once
        self._exported: Future[Exported] | None = None  # None until `run`

    @property
    def exported(self) -> Exported | None:
        """The export's outcomes, once it has finished (waits for it); None before `run`."""
        return self._exported.result() if self._exported is not None else None

    def finished(self) -> bool:
        """Whether the export has finished (or failed), after `run`."""
        return self._exported is not None and self._exported.done()

    def unchanged_by(self, table: str, erase_keys: matching.TableKeys) -> bool:
        """Whether erasing `erase_keys` changes no row of `table` the access requests name: the table
        has one key column and no value of it is named by both batches (a row holds one value of it).
        Cost: none when both batches' values are held in the driver's JVM, else one small Spark job."""
        if not erase_keys.single:
            return False
        if table not in self._keys:
            ctx = self.ctx
            self._keys[table] = matching.key_sets(ctx.settings.datamap, ctx.identifiers(sorted(self.requests)),
                                                  ctx.key_types, [table])[table]
        return matching.disjoint(erase_keys.sets[0], self._keys[table].sets[0])

    def run(self, read_at: dict[str, access.ReadAt], background: bool = False) -> None:
        """Export; with `background`, on a thread of its own (export_requests's `background`): the
        caller goes on once what it observes on the export's scans is complete (hashsum.StageDone),
        while the export groups and writes the packages (at 10M events, 1,000 packages take about
        1.3 s after the scan). `exported` waits for it."""
        if not background:
            self._exported = Future()
            self._exported.set_result(export_requests(self.ctx, self.requests, read_at))
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="dsr-export")
        self._exported = pool.submit(export_requests, self.ctx, self.requests, read_at, True)
        pool.shutdown(wait=False)  # the thread ends with the export
