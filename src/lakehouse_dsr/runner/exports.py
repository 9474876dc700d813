"""A run's access requests: one package per request, checked against the manifest's checksums."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..exceptions import first_line
from ..lake.metrics import described
from ..ledger.ledger import Outcome
from ..stages import access, matching
from . import rules
from .context import EXPORT_JOBS, Context


@dataclass(frozen=True)
class Exported:
    outcomes: list[Outcome] = field(default_factory=list)
    summary: dict | None = None  # the report's export section (None: nothing exported)


def export_requests(ctx: Context, requests: dict[str, dict], read_at: dict[str, access.ReadAt] | None = None
                    ) -> Exported:
    """Resolve the access requests' identifiers, export one package per request
    (stages/access.py) and check every package against the manifest. An export that fails leaves
    every request of the batch open with the reason. Cost: see access.export. `read_at`: tables an
    erasure committed to before the export (SharedExport). Its Spark jobs are described as
    EXPORT_JOBS, and only they count in the export's I/O (it may run beside the erasure)."""
    request_ids = sorted(requests)
    if not request_ids:
        return Exported()
    settings = ctx.settings
    out_dir = Path(settings.export.directory) / ctx.run_id
    with ctx.timed("export", EXPORT_JOBS), described(ctx.spark.sparkContext, EXPORT_JOBS):
        ctx.progress.stage("export", 1)
        ctx.progress.step(f"{len(request_ids)} package(s), {settings.export.format}")
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
            ctx.progress.done()
    datamap = settings.datamap
    summary = rules.export_summary(result, settings.export.format,
                                   [*datamap.keyed, *datamap.files, *datamap.shredded])
    return Exported(rules.access_outcomes(request_ids, result, checked, ctx.run_id), summary)


class SharedExport:
    """The run's access export, run by the erasure (runner/erasure.py) before its first commits.

    Where the erasure cannot share a read with it, the export starts as soon as the run's identifiers
    are resolved, on a thread of its own (`start`), beside the erasure's hashing and planning: both
    are mostly the driver JVM's work on one thread each, and a small run left one of two cores idle.
    The first commit waits for it (`run`), so its packages are those an export run first writes.
    Otherwise it runs between the first wave's commits and their content checks, so that a table the
    erasure rewrote is read once, by the export, with the check's "after" side observed on that scan:
    at 10M events and 100 erasures the rewrite touches every file, and the export would otherwise
    read all of them again. An erased table is then read as before its erase commit unless the
    commit changed no row an access request names (`unchanged_by`)."""

    def __init__(self, ctx: Context, requests: dict[str, dict]):
        self.ctx, self.requests = ctx, requests
        self.exported: Exported | None = None  # None until `run`
        self._keys: dict[str, matching.TableKeys] = {}  # the access requests' keys per table, built once
        self._beside: Future[Exported] | None = None  # the export started by `start`

    @property
    def started(self) -> bool:
        """Whether the export runs (or ran) beside the erasure."""
        return self._beside is not None

    def start(self) -> None:
        """Start the export on a thread of its own, reading the tables as they are now; returns at once."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="dsr-export")
        self._beside = pool.submit(export_requests, self.ctx, self.requests)
        pool.shutdown(wait=False)  # the thread ends with the export

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

    def run(self, read_at: dict[str, access.ReadAt]) -> None:
        """The export, reading the erased tables where `read_at` says; one started beside the erasure
        (read before any commit, `read_at` empty) is waited for."""
        if self._beside is not None:
            assert not read_at, "an export started beside the erasure read the tables before any commit"
            self.exported = self._beside.result()
        else:
            self.exported = export_requests(self.ctx, self.requests, read_at)

    def result(self) -> Exported | None:
        """What the export did, once the erasure ran it or started it (waited for); None if neither."""
        if self.exported is None and self._beside is not None:
            self.run({})
        return self.exported
