"""Physical purge: make erased rows leave storage, not just the current snapshot.

Per table: (1) rewrite the data files that carry delete files (merge-on-read erasure), (2) rewrite
the manifests, whose entries for removed files keep those files' column bounds (prefixes of
erased values), (3) deal with branches/tags that pin older snapshots (report, or drop when
configured), (4) expire every snapshot older than the now-clean current one, deleting the files
only they referenced, (5) remove orphan files older than the safety window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pyspark.sql import SparkSession

from . import iceberg
from .config import Settings


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
    refs_dropped: list[str] = field(default_factory=list)
    refs_kept: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def purge_table(spark: SparkSession, settings: Settings, table: str, sort_column: str | None = None) -> TablePurge:
    """Purge one table. Cost: rewrites only files with delete files; expiry and orphan removal read
    metadata and list the table location; deletes files no retained snapshot needs."""
    result = TablePurge(table)
    if iceberg.summary_count(spark, settings, table, "total-delete-files"):
        rewrite = iceberg.rewrite_files_with_deletes(spark, settings, table, sort_column)
        result.data_files_rewritten = rewrite.data_files_rewritten
        result.bytes_rewritten = rewrite.bytes_rewritten
        result.delete_files_removed = rewrite.delete_files_removed
    result.manifests_rewritten = iceberg.rewrite_manifests(spark, settings, table)
    current = iceberg.current_snapshot(spark, settings, table)
    for ref in iceberg.refs(spark, settings, table):
        if current and ref.snapshot_id == current.snapshot_id:
            continue  # points at the clean snapshot: pins nothing old
        if settings.purge.pinned_refs == "drop":
            iceberg.drop_ref(spark, settings, table, ref)
            result.refs_dropped.append(f"{ref.kind.lower()} {ref.name}")
        else:
            result.refs_kept.append(f"{ref.kind.lower()} {ref.name}")
    expired = iceberg.expire_snapshots_before_current(spark, settings, table)
    result.snapshots_expired = expired.snapshots_expired
    result.files_deleted = expired.data_files_deleted + expired.delete_files_deleted
    result.orphans_removed = iceberg.remove_orphan_files(
        spark, settings, table, settings.purge.orphan_min_age_minutes
    )
    return result
