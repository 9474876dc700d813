"""A run's access requests: one package per request, checked against the manifest's checksums."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..exceptions import first_line
from ..ledger.ledger import Outcome
from ..stages import access
from . import rules
from .context import Context


@dataclass(frozen=True)
class Exported:
    outcomes: list[Outcome] = field(default_factory=list)
    summary: dict | None = None  # the report's export section (None: nothing exported)


def export_requests(ctx: Context, requests: dict[str, dict]) -> Exported:
    """Resolve the access requests' identifiers, export one package per request
    (stages/access.py) and check every package against the manifest. An export that fails leaves
    every request of the batch open with the reason. Cost: see access.export."""
    request_ids = sorted(requests)
    if not request_ids:
        return Exported()
    settings = ctx.settings
    out_dir = Path(settings.export.directory) / ctx.run_id
    with ctx.timed("export"):
        ctx.progress.stage("export", 1)
        ctx.progress.step(f"{len(request_ids)} package(s), {settings.export.format}")
        try:
            batch = ctx.batch(requests)
            keys = ctx.identifiers(request_ids)
            result = access.export(ctx.lake, settings.datamap, batch, out_dir, settings.export.format, ctx.key_types,
                                   keys, ctx.vault_keys, ctx.vault_table)
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
