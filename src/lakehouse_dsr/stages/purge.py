"""Physical purge: make erased rows leave storage, not just the current snapshot.

Per table: (1) rewrite the data files that carry delete files (merge-on-read erasure), (2) rewrite
the manifests, whose entries for removed files keep those files' column bounds (prefixes of
erased values), (3) deal with branches/tags that pin older snapshots (keep, or clean those holding
erased rows: refs.py), (4) expire every snapshot older than the now-clean current one, deleting the files
only they referenced, (5) remove orphan files older than the safety window.

When: `purge.policy: immediate` purges in the run that erases. `batched` lets logically erased
requests wait (at most `max_delay_days`, and never closer than `safety_margin_days` to their due
date) so one rewrite serves many runs' requests; `purge_deadline` and `purge_due` decide it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from typing import cast

from ..config import PurgeSettings
from ..datamap import DataMap
from ..lake.lakehouse import Lake
from ..lake.table import RefKeeping
from . import refs


@dataclass
class TablePurge:
    table: str
    data_files_rewritten: int = 0
    bytes_rewritten: int = 0
    delete_files_removed: int = 0
    manifests_rewritten: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0
    orphans_removed: int = 0
    # Each branch/tag not at the current snapshot, by what the purge did with it (refs.settle):
    refs_dropped: list[str] = field(default_factory=list)  # tags holding erased (or expired) rows (pinned_refs: drop)
    refs_kept: list[str] = field(default_factory=list)  # left as they were (block; or not checked)
    refs_rewritten: list[str] = field(default_factory=list)  # branches erased in place, tags re-pointed
    refs_clean: list[str] = field(default_factory=list)  # checked: they hold no erased row, left alone
    dangling_deletes_kept: bool = False  # see purge_table
    seconds: float = 0.0
    error: str | None = None
    # For the resurrection check (stages/resurrection.py), decided just before the expiry erases the
    # history that shows it: the snapshot the expiry kept, and whether only this application's erases
    # and row-preserving rewrites were committed between `line_from` and it.
    kept_snapshot: int | None = None
    own_line: bool = False

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("kept_snapshot", "own_line")}


def evidence(purged: TablePurge | None, files_rewritten: int = 0, bytes_rewritten: int = 0) -> dict:
    """A table's purge as a request's evidence records it, with the data files and bytes the erase
    rewrote before it (batch-wide costs, shared by the batch's requests)."""
    p = purged
    return {"purged": p is not None,
            "data_files_rewritten": files_rewritten + (p.data_files_rewritten if p else 0),
            "bytes_rewritten": bytes_rewritten + (p.bytes_rewritten if p else 0),
            "snapshots_expired": p.snapshots_expired if p else 0,
            "files_deleted": p.files_deleted if p else 0,  # from storage: files only expired snapshots held
            "orphans_removed": p.orphans_removed if p else 0}


def purge_deadline(erased_on: date, due: date, policy: PurgeSettings) -> date:
    """Latest day the physical purge may run for a request logically erased on `erased_on`.

    Today or earlier means: purge in this run (always so under the immediate policy).
    """
    if policy.policy == "immediate":
        return erased_on
    return min(erased_on + timedelta(days=policy.max_delay_days), due - timedelta(days=policy.safety_margin_days))


def purge_due(deadlines: Iterable[date], today: date) -> bool:
    """Whether this run must purge: some waiting request has reached its purge deadline."""
    return any(d <= today for d in deadlines)


def purge_table(lake: Lake, datamap: DataMap, purge: PurgeSettings, table: str, line_from: int | None = None,
                erased: refs.Unwanted | None = None) -> TablePurge:
    """Purge one table. Cost: rewrites only files with delete files; expiry and orphan removal read
    metadata and list the table location; deletes files no retained snapshot needs; under
    `pinned_refs: drop | rewrite`, one scan of the key columns per branch/tag not at the current
    snapshot, and a rewrite of the files holding erased rows in those that hold some (refs.settle).
    `line_from`: the snapshot whose line `TablePurge.own_line` is decided from (None: not decided).
    `erased`: the rows no ref may keep, erased subjects' (refs.ErasedHashes) or past a retention
    rule (stages/retention.py); None: no ref can be told clean, so every one is kept. `datamap`: the
    mapping a ref's unwanted rows are found and cleaned by; `purge`: the file size, the refs policy
    and the orphans' age."""
    handle = lake.table(table)
    result = TablePurge(table)
    rewrite = handle.compact_deletes(purge.target_file_size_mb * 1024 * 1024)
    result.data_files_rewritten = rewrite.data_files_rewritten
    result.bytes_rewritten = rewrite.bytes_rewritten
    result.delete_files_removed = rewrite.delete_files_removed
    result.dangling_deletes_kept = rewrite.dangling_deletes_kept
    result.manifests_rewritten = handle.scrub_metadata()
    current = handle.current_snapshot()
    settled = {"kept": result.refs_kept, "clean": result.refs_clean, "dropped": result.refs_dropped,
               "rewritten": result.refs_rewritten}
    for ref in refs.without_leftovers(handle):  # none where the format has no refs (capabilities.refs)
        if current and ref.snapshot_id == current.snapshot_id:
            continue  # points at the clean snapshot: pins nothing old
        settled[refs.settle(cast(RefKeeping, handle), datamap, purge, ref, erased)].append(refs.label(ref))
    kept = handle.current_snapshot()
    result.kept_snapshot = kept.snapshot_id if kept else None
    result.own_line = line_from is not None and handle.own_line_since(line_from)
    expired = handle.expire_snapshots_before_current()
    result.snapshots_expired = expired.snapshots_expired
    result.files_deleted = expired.files_deleted
    result.orphans_removed = handle.remove_orphan_files(purge.orphan_min_age_minutes)
    return result
