"""Apache Iceberg behind the format seam (lake/table.py): every Iceberg procedure, action and
metadata table the engine uses, as the methods of `IcebergTable`.

The handle holds names, never a loaded table: Iceberg's Java table is loaded through Spark's
catalog on each call, as commits (ours and other writers') move it on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import ArrayType, MapType, StructType

from ..datamap import column_ref
from .bridge import bridge, call, jclass
from .catalyst import spark4
from .table import (
    Capabilities,
    Commit,
    CommitFiles,
    CommitStats,
    ExpireResult,
    Ref,
    RewriteResult,
    Snapshot,
    changes_by_difference,
    is_conflict,
    listing,
    only_current,
    parquet_files_under,
    read_columns_from_files,
    same_file,
    type_holds,
)

if TYPE_CHECKING:
    from .lakehouse import Lake
    from .skipping import Candidates

_CAPABILITIES = Capabilities(file_rewrite=True, driver_files=True, statement_modes=False, subquery_dml=True,
                             refs=True, commit_files=True)

# Larger than any file: with min 0 and max this, rewrite_data_files selects files only for their deletes.
_NO_SIZE_LIMIT = str(2**62)


@dataclass(frozen=True)
class IcebergTable:
    """One Iceberg table of a Lake: its snapshots, refs, files, rewrites, expiry and reads.

    Each operation loads the table's current state (through Spark's catalog: its cache, its FileIO);
    the handle itself holds only the lake and the name, so it never serves a stale snapshot.
    """

    lake: Lake
    name: str  # namespace.table

    @property
    def spark(self) -> SparkSession:
        return self.lake.spark

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def identifier(self) -> str:
        """`catalog.namespace.table`, as Spark's readers and writers and Iceberg's Spark3Util take it."""
        return f"{self.lake.catalog.name}.{self.name}"

    def exists(self) -> bool:
        """Whether the catalog has the table. Metadata only."""
        return bool(self.spark.catalog.tableExists(self.identifier))

    def append_stream(self, stream: DataStreamWriter) -> StreamingQuery:
        """Start `stream` (its trigger and checkpoint set) appending to the table: Iceberg's streaming
        sink commits each micro-batch once, by its batch id, so a restart from the checkpoint never
        appends a batch twice."""
        return stream.format("iceberg").outputMode("append").toTable(self.identifier)

    @property
    def quoted(self) -> str:
        """The quoted, fully qualified name for SQL text (`lakehouse`.`ns`.`t`)."""
        return self.lake.quoted(self.name)

    @property
    def procedure_name(self) -> str:
        """A procedure's table argument with the catalog spelled out: a bare `ns.t` whose namespace is also
        a catalog's name would be read as table `t` of that catalog."""
        return f"`{self.lake.catalog.name}`.{self.name}"

    def java(self):
        """Iceberg's Java Table, loaded now (through Spark's catalog: its cache, its FileIO)."""
        return jclass(self.spark, "org.apache.iceberg.spark.Spark3Util").loadIcebergTable(
            self.spark._jsparkSession, self.identifier
        )

    def _call_procedure(self, procedure: str, arguments: str):
        # Data-map names are validated plain identifiers; the catalog name is validated too.
        return self.spark.sql(
            f"CALL `{self.lake.catalog.name}`.system.{procedure}(table => '{self.procedure_name}'{arguments})"
        ).collect()[0]

    # Metadata

    def current_snapshot(self) -> Snapshot | None:
        return snapshot_of(self.spark, self.java().currentSnapshot())

    def current_snapshot_id(self) -> int | None:
        """The current snapshot's id (None: no snapshot), without its summary. Metadata only."""
        current = self.java().currentSnapshot()
        return None if current is None else int(current.snapshotId())

    def properties(self) -> dict[str, str]:
        return call(self.spark, "toJson", self.java().properties())

    def location(self) -> str:
        return str(self.java().location())

    def write_mode(self, operation: str) -> str:
        """`copy-on-write` or `merge-on-read` for operation delete | update | merge."""
        return self.properties().get(f"write.{operation}.mode", "copy-on-write")

    def format_version(self) -> int:
        return int(self.java().operations().current().formatVersion())

    def statements_in_mode(self, mode: str) -> AbstractContextManager[None]:
        """Spark's statements on an Iceberg table follow its write-mode properties, which the plan's
        `mode` was read from: nothing to change."""
        return nullcontext()

    def sorted_by_order(self) -> bool:
        """Whether the table declares a sort order (see `sorted_by_order` of a Java table)."""
        return sorted_by_order(self.java())

    def replace_files(self, jtable: Any, old_files: Any, new_files: Any, read_snapshot_id: int,
                      conflict_filter: Any) -> None:
        """`replace_files` on `jtable` (the Java table the old files were planned from)."""
        replace_files(self.spark, jtable, old_files, new_files, read_snapshot_id, conflict_filter)

    def add_position_deletes(self, jtable: Any, delete_files: Any, data_locations: list[str], read_snapshot_id: int,
                             conflict_filter: Any) -> None:
        """`add_position_deletes` on `jtable` (the Java table the data files were planned from)."""
        add_position_deletes(self.spark, jtable, delete_files, data_locations, read_snapshot_id, conflict_filter)

    def summary_count(self, key: str) -> int:
        """A count from the current snapshot's summary (`total-data-files`, `total-delete-files`, ...)."""
        snap = self.current_snapshot()
        return int(snap.summary.get(key, "0")) if snap else 0

    def history(self) -> list[Snapshot]:
        """Every snapshot the table's metadata still holds. Metadata only."""
        return list(_snapshots_by_id(self.spark, self.java()).values())

    # Refs

    def refs(self) -> list[Ref]:
        """Branches and tags other than main: each pins its snapshots against expiry. Table metadata only."""
        found = call(self.spark, "refs", self.java())
        return sorted((Ref(r["name"], r["kind"], r["snapshot_id"]) for r in found if r["name"] != "main"),
                      key=lambda r: r.name)

    def drop_ref(self, ref: Ref) -> None:
        kind = "TAG" if ref.kind == "TAG" else "BRANCH"
        self.spark.sql(f"ALTER TABLE {self.quoted} DROP {kind} IF EXISTS `{ref.name.replace('`', '``')}`")

    def create_branch(self, name: str, snapshot_id: int) -> None:
        """Branch `name` at snapshot `snapshot_id`: one metadata commit."""
        self.java().manageSnapshots().createBranch(name, snapshot_id).commit()

    def move_tag(self, tag: str, snapshot_id: int, drop_branch: str) -> None:
        """Re-point tag `tag` at `snapshot_id` (its retention kept) and remove branch `drop_branch`, in one
        metadata commit: a reader sees the tag at its old snapshot or at the new one, never without it."""
        self.java().manageSnapshots().replaceTag(tag, snapshot_id).removeBranch(drop_branch).commit()

    # Rows

    def read_at(self, snapshot_id: int | None) -> DataFrame:
        """The table as of a snapshot (the current one when None), under the current schema: the names
        the data map uses. Spark 3.5 reads a `snapshot-id` with the table's current schema (Spark 3.5
        ignores `versionAsOf` on a DataFrameReader's table()). Iceberg 1.11 refuses that option and
        reads `versionAsOf` with the snapshot's own schema; where that differs from the current one,
        the snapshot's files are planned here and read as a staged task set of the current table
        (Iceberg 1.11.0's Spark scan also fails to bind a pushed filter on a column renamed since:
        apache/iceberg#16523, fixed after 1.11.0). Planning reads manifests only."""
        if snapshot_id is None:
            return self.spark.table(self.quoted)
        if not spark4(self.spark):
            return self.spark.read.option("snapshot-id", str(snapshot_id)).table(self.identifier)
        jtable = self.java()
        if jtable.snapshot(snapshot_id).schemaId() == jtable.schema().schemaId():
            return self.spark.read.option("versionAsOf", str(snapshot_id)).table(self.identifier)
        return read_staged(self.spark, jtable, self.identifier,
                           planned(self.spark, jtable.newScan().useSnapshot(snapshot_id)))

    def read_appends(self, after_id: int, until_id: int) -> DataFrame:
        """The rows the append commits after `after_id` up to `until_id` added (Iceberg's incremental read:
        other commits, such as deletes and rewrites, are skipped). Reads only the appended files."""
        return (self.spark.read.format("iceberg").option("start-snapshot-id", str(after_id))
                .option("end-snapshot-id", str(until_id)).load(self.identifier))

    def read_changes(self, after_id: int | None, until_id: int) -> DataFrame:
        """The table's changes after `after_id` (None: from its start) up to `until_id`: its columns and
        `_change_type`, insert or delete, duplicates counted. A pipeline's incremental read of a table
        whose rows are also deleted: Iceberg's changelog scan refuses snapshots with delete files, so
        the two snapshots' rows are compared (both read whole, one shuffle)."""
        return changes_by_difference(None if after_id is None else self.read_at(after_id), self.read_at(until_id))

    def live_rows(self, snapshot_id: int | None) -> int:
        """Rows a reader sees at a snapshot. From its summary when that tells exactly (no equality
        deletes: the records of its data files less its position deletes, one row each: deletion
        vectors and file-scoped deletes never name a position twice); otherwise a count with deletes
        applied."""
        if snapshot_id is None:
            return 0
        s = snapshot_at(self.spark, self.java(), snapshot_id).counts()
        if "total-records" in s and "total-position-deletes" in s and not s.get("total-equality-deletes"):
            return s["total-records"] - s["total-position-deletes"]
        return self.read_at(snapshot_id).count()

    def rows_after_commit(self, snapshot_id: int | None, rows_before: int) -> int:
        """Rows a reader sees at a commit, given the rows before it (no commit: counted now).

        Metadata only when the commit's summary tells exactly: a commit that only added position
        deletes or deletion vectors removed one live row per new position (a vector replacing an older
        one for the same file carries the old positions too, counted as removed); a commit between two
        snapshots without delete files removed the difference of their record totals. Otherwise a
        count with deletes applied, since dangling delete files would make totals wrong.
        """
        if snapshot_id is None:
            return self.read_at(None).count()
        jtable = self.java()
        snap = snapshot_at(self.spark, jtable, snapshot_id)
        s = snap.counts()
        if (not s.get("added-data-files") and not s.get("deleted-data-files") and not s.get("added-equality-deletes")
                and "added-position-deletes" in s):
            return rows_before - s["added-position-deletes"] + s.get("removed-position-deletes", 0)
        parent = snapshot_at(self.spark, jtable, snap.parent_id).counts() if snap.parent_id is not None else {}
        if "total-records" in s and s.get("total-delete-files") == 0 and parent.get("total-delete-files") == 0:
            return rows_before - (parent["total-records"] - s["total-records"])
        return self.read_at(snap.snapshot_id).count()

    # Commits of our own

    def rewritable(self) -> bool:
        """Whether a rewrite keeps what the format tracks per row: format v3's row lineage would be
        lost (its statements keep it). Metadata only."""
        return self.format_version() <= 2

    def overwrite_files(self, files: Candidates, rows: DataFrame, *, redacting: bool = False,
                        branch: str | None = None, commit_if: Callable[[], bool] | None = None) -> bool:
        """Replace the candidate `files` (planned at a snapshot) by `rows` in one `overwrite` commit, as
        Spark's copy-on-write DELETE would, but for exactly these files (`redacting`: an Iceberg
        overwrite names no kind of change).

        `rows` are written through Iceberg's rewrite path (option `rewritten-file-scan-task-set-id`: the
        new files are staged, not committed), each task's rows in the order they come, as Iceberg's
        bin-pack compaction writes: no shuffle, no sort (rows read file by file keep a clustered
        table's order). The commit is validated like a serializable copy-on-write operation: it fails (and the
        caller retries) when another writer meanwhile added data the candidates' predicate may match, or
        deleted from the old files. `branch`: commit on that branch instead of main (the candidates'
        snapshot is then one of the branch's line). `commit_if`: asked once the rows are written; False deletes the
        new files and commits nothing. Returns whether it committed. Cost: one read and one write of
        the rows.
        """
        spark = self.spark
        set_id = f"dsr-rewrite-{uuid.uuid4().hex}"
        jtable = self.java()
        coordinator = jclass(spark, "org.apache.iceberg.spark.FileRewriteCoordinator").get()
        try:
            (rows.write.format("iceberg").option("rewritten-file-scan-task-set-id", set_id)
             .option("use-table-distribution-and-ordering", "false").option("fanout-enabled", "true")
             .mode("append").save(staged_table(spark, jtable, set_id, self.identifier)))
            jvm: Any = spark._jvm  # py4j's view of the driver JVM: untyped, and set on every started session
            new_files = coordinator.fetchNewFiles(jtable, set_id) or jvm.java.util.ArrayList()
            if commit_if is not None and not commit_if():
                io = jtable.io()
                for location in call(spark, "locations", new_files):
                    io.deleteFile(location)
                return False
            replace_files(spark, jtable, files.data_files(spark), new_files, cast(int, files.snapshot_id),
                          files.predicate, branch)
            return True
        finally:
            coordinator.clearRewrite(jtable, set_id)
            unstage_table(spark, set_id)

    def commit_files(self, snapshot_id: int) -> CommitFiles:
        """What commit `snapshot_id` changed. Reads only the manifests that commit wrote; a position
        delete file that is not scoped to one data file (older writers) names its data files only in
        its rows, so its `file_path` column is read (a small Spark job over that delete file)."""
        spark = self.spark
        jtable = self.java()
        snap, io = jtable.snapshot(snapshot_id), jtable.io()
        targets = call(spark, "deleteTargets", snap.addedDeleteFiles(io))
        deleted_from = {referenced for referenced, _ in targets if referenced is not None}
        unscoped = [location for referenced, location in targets if referenced is None]
        if unscoped:
            deleted_from.update(r.file_path for r in spark.read.parquet(*unscoped).select("file_path").distinct()
                                .collect())
        added_rows = snap.summary().get("added-records")
        return CommitFiles(snap.parentId(), frozenset(call(spark, "locations", snap.removedDataFiles(io))),
                           frozenset(call(spark, "locations", snap.addedDataFiles(io))),
                           None if added_rows is None else int(added_rows), frozenset(deleted_from))

    def own_commit_since(self, after_id: int | None, appends: bool = False) -> Snapshot | None:
        """This Spark application's newest commit after `after_id` that is not an append (`appends`: or
        is one), found by the `spark.app.id` Iceberg writes into each summary: other writers may have
        committed after it. Metadata only."""
        app_id = self.spark.sparkContext.applicationId
        jtable = self.java()  # one state of the table: its current snapshot and its history
        current = jtable.currentSnapshot()
        for snap in _ancestors(_snapshots_by_id(self.spark, jtable), current.snapshotId() if current else None,
                               after_id):
            if snap.summary.get("spark.app.id") == app_id and (appends or snap.operation != "append"):
                return snap
        return None

    # Rewrites

    def cluster_by_key(self, key: str, target_file_size_bytes: int) -> tuple[int, int, int]:
        """Cluster the table by `key`: its write order (later appends arrive sorted), a Parquet bloom
        filter on the key, and every data file rewritten sorted by it (`rewrite_sorted`); returns
        (data files before, after, bytes rewritten). Reads and rewrites the whole table (a sort)."""
        files_before = self.summary_count("total-data-files")
        self.spark.sql(f"ALTER TABLE {self.quoted} WRITE ORDERED BY {column_ref(key)}")
        self.spark.sql(f"ALTER TABLE {self.quoted} SET TBLPROPERTIES "
                       f"('write.parquet.bloom-filter-enabled.column.{key}' = 'true')")
        rewritten = self.rewrite_sorted(key, target_file_size_bytes)
        return files_before, self.summary_count("total-data-files"), rewritten

    def rewrite_sorted(self, key: str, target_file_size_bytes: int) -> int:
        """Rewrite all data files sorted by `key`; returns bytes rewritten. Reads and writes the whole table."""
        row = self._call_procedure(
            "rewrite_data_files",
            f", strategy => 'sort', sort_order => '{key} ASC NULLS LAST', options => map("
            f"'rewrite-all', 'true', 'target-file-size-bytes', '{int(target_file_size_bytes)}')",
        )
        return row.rewritten_bytes_count

    def rewrite_files_with_deletes(self, target_file_size_bytes: int) -> RewriteResult:
        """Rewrite exactly the data files that carry delete files, so deleted rows leave the live files.

        Reads and rewrites only those files (not the whole table); dangling delete files are dropped.
        A table with a declared sort order (`dsr optimize` sets one) is rewritten in that order, which
        adds a shuffle of the rewritten rows; an unsorted table is bin-packed (no shuffle). The new
        files take the commit's sequence number, so the old position deletes no longer apply to any
        file and are dropped as dangling (with the starting number they would stay in every scan).
        """
        strategy = ", strategy => 'sort'" if sorted_by_order(self.java()) else ""
        row = self._call_procedure(
            "rewrite_data_files",
            f"{strategy}, options => map("
            f"'delete-file-threshold', '1', 'min-file-size-bytes', '0', 'max-file-size-bytes', '{_NO_SIZE_LIMIT}',"
            f" 'remove-dangling-deletes', 'true', 'use-starting-sequence-number', 'false',"
            f" 'target-file-size-bytes', '{int(target_file_size_bytes)}')",
        )
        return RewriteResult(
            row.rewritten_data_files_count,
            row.added_data_files_count,
            row.rewritten_bytes_count,
            row.removed_delete_files_count,
        )

    def compact_deletes(self, target_file_size_bytes: int) -> RewriteResult:
        """Make deleted rows leave the live files: the data files carrying delete files rewritten
        (`rewrite_files_with_deletes`), then position delete files that apply to no live file
        dropped. Nothing to do (no Spark job) for a table without delete files."""
        if not self.summary_count("total-delete-files"):
            return RewriteResult(0, 0, 0, 0)
        rewrite = self.rewrite_files_with_deletes(target_file_size_bytes)
        if not self.summary_count("total-position-deletes"):
            return rewrite
        if type_holds(self.spark.table(self.quoted).schema, ArrayType, MapType):
            # Iceberg 1.10's position-delete rewrite fails on such tables (apache/iceberg#14619). The
            # dangling files hold file paths and positions only, no values: kept, they cost scan planning.
            return replace(rewrite, dangling_deletes_kept=True)
        return replace(rewrite, delete_files_removed=rewrite.delete_files_removed
                       + self.drop_dangling_position_deletes())

    def scrub_metadata(self) -> int:
        """Metadata that describes removed files made to stop doing so: the manifests rewritten
        (`rewrite_manifests`: their DELETED entries keep removed files' column bounds); returns the
        manifests replaced. The expiry then deletes the old ones."""
        return self.rewrite_manifests()

    def refusal(self) -> str | None:
        """None: the engine erases from and proves every Iceberg table the catalog serves."""
        return None

    def data_files_on_storage(self) -> list[str]:
        """Every Parquet file under the location, referenced or not: one listing."""
        return parquet_files_under(self.spark, self.location())

    def metadata_files(self) -> list[str]:
        """Metadata files whose raw text the proof scans for identifiers: none. Iceberg's metadata JSON
        names no value; manifests keep column bounds (16-character prefixes), which `scrub_metadata`
        and the expiry remove, and which are not read back here."""
        return []

    def drop_dangling_position_deletes(self) -> int:
        """Drop position delete files that apply to no live data file; returns how many were removed.

        Iceberg's `remove-dangling-deletes` skips unpartitioned tables, so after a rewrite their old
        delete files would stay in every scan plan. Reads only the delete files; a commit when any.
        """
        row = self._call_procedure("rewrite_position_delete_files", ", options => map('rewrite-all', 'true')")
        return row.rewritten_delete_files_count - row.added_delete_files_count

    def rewrite_manifests(self) -> int:
        """Rewrite the current snapshot's manifests keeping only live entries; returns how many were replaced.

        A commit that removes files keeps DELETED entries in its manifests, with the removed files'
        column bounds (16-character prefixes of values such as erased ids). After this commit and an
        expiry, no manifest describes removed files. Metadata only: reads and writes manifests. A table
        without delete manifests is rewritten by Iceberg's core operation in the driver (no Spark job:
        about a second less per table on a small lake); the Spark action serves the others, as the core
        rewrite keeps delete manifests as they are.
        """
        jtable = self.java()
        current = jtable.currentSnapshot()
        if current is None:
            return 0
        io = jtable.io()
        if current.deleteManifests(io).isEmpty():
            before = current.dataManifests(io).size()
            jtable.rewriteManifests().clusterBy(bridge(self.spark).oneGroup()).commit()
            return before
        result = self.lake._actions().rewriteManifests(jtable).execute()
        return sum(1 for _ in result.rewrittenManifests())

    # Expiry and orphans

    def expire_snapshots_before_current(self) -> ExpireResult:
        """Expire every snapshot older than the current one that no branch or tag retains.

        Deletes from storage the data, delete and manifest files only those snapshots referenced.
        Without branches, tags or retention settings on main, Iceberg's core expiry runs in the driver,
        no Spark job: it reads the manifest lists and manifests of the snapshots (a few small Avro files
        per commit), never a data file. Iceberg's Spark action plans the same set difference with Spark
        jobs over metadata tables (about 1 s of fixed cost per table on a small lake); it serves the rest.
        """
        spark = self.spark
        jtable = self.java()
        current = snapshot_of(spark, jtable.currentSnapshot())
        if current is None:
            return ExpireResult(0, 0)
        snapshots = call(spark, "snapshots", jtable)
        older = [s["id"] for s in snapshots if s["ms"] < current.committed_ms]
        if not older:  # only the current snapshot (or newer ones): nothing to expire
            return ExpireResult(0, 0)
        refs = call(spark, "refs", jtable)
        if len(refs) != 1 or refs[0]["name"] != "main" or refs[0]["min_snapshots_to_keep"] is not None \
                or refs[0]["max_snapshot_age_ms"] is not None:  # refs, or main's own retention: Iceberg decides
            result = (self.lake._actions().expireSnapshots(jtable).expireOlderThan(current.committed_ms)
                      .retainLast(1).execute())
            deleted = (result.deletedDataFilesCount() + result.deletedPositionDeleteFilesCount()
                       + result.deletedEqualityDeleteFilesCount())
        else:
            deleted = _expire_in_driver(spark, jtable, current.committed_ms, older[0])
        jtable.refresh()
        return ExpireResult(len(snapshots) - _snapshot_count(jtable), deleted)

    def remove_orphan_files(self, min_age_minutes: float) -> int:
        """Delete files under the table location that no metadata references and are older than the window.

        Lists the whole table location and reads all manifests. The window protects writers that are
        still committing; Iceberg's procedure refuses windows under 24 h, the action does not.
        """
        cutoff = int((time.time() - min_age_minutes * 60) * 1000)
        jtable = self.java()
        if not self._may_hold_orphans(jtable, cutoff):
            return 0
        result = self.lake._actions().deleteOrphanFiles(jtable).olderThan(cutoff).execute()
        return sum(1 for _ in result.orphanFileLocations())

    def _may_hold_orphans(self, jtable, cutoff_ms: int) -> bool:
        """Whether some file under the location, older than the cutoff, is not among the files the table's
        metadata names (data, delete, manifest, manifest-list, metadata and statistics files). Cheap: one
        listing, and the manifests read in the driver (one snapshot, as the expiry leaves a table without
        refs) or two metadata-table queries, against the orphan action's distributed listing and
        anti-join; when in doubt (a file kind not accounted for) it says yes, so the action runs."""
        spark = self.spark
        old = [same_file(path) for path, modified_ms in listing(spark, jtable.location())
               if modified_ms < cutoff_ms]
        if not old:
            return False
        one_snapshot = _snapshot_count(jtable) == 1
        if one_snapshot:
            known = set(_live_files(spark, jtable, jtable.currentSnapshot()))
        else:
            name = self.quoted
            known = {r[0] for r in spark.sql(f"SELECT file_path FROM {name}.all_files UNION ALL "
                                             f"SELECT path FROM {name}.all_manifests").collect()}
        known.update(call(spark, "metadataFiles", jtable, one_snapshot))
        known = {same_file(k) for k in known if k}
        return any(f not in known and not f.endswith("version-hint.text") for f in old)

    # Files

    def retained_files(self) -> tuple[list[str], set[str]]:
        """(paths of every data and delete file any retained snapshot references, the current snapshot's
        among them). Metadata only: a table with one snapshot (as a purge leaves it) has its manifests
        read in the driver, others take one query over its metadata tables."""
        jtable = self.java()
        if _snapshot_count(jtable) == 1:
            files = _live_files(self.spark, jtable, jtable.currentSnapshot())
            return files, set(files)
        name = self.quoted
        # Deduplicated here, not in Spark: a GROUP BY would add a shuffle stage to a query of a few rows.
        rows = self.spark.sql(f"SELECT file_path, false AS current FROM {name}.all_files "
                              f"UNION ALL SELECT file_path, true FROM {name}.files").collect()
        return list(dict.fromkeys(r.file_path for r in rows)), {r.file_path for r in rows if r.current}

    def read_raw(self, paths: list[str], schema: StructType) -> DataFrame:
        """The columns of `schema` read straight from Parquet files by name, deleted rows included
        (delete files yield NULLs)."""
        return read_columns_from_files(self.spark, paths, schema)

    def files_not_within(self, column: str, prefix: str) -> list[str]:
        """Data and delete files of every retained snapshot whose column bounds do not prove each value
        of `column` null or a string starting with `prefix` (a position delete file holds no value:
        proven), plus Parquet files on storage no snapshot references. The `all_files` metadata table
        and one listing; only paths reach the driver."""
        metrics = f"readable_metrics.{column_ref(column)}"
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string past every one with the prefix
        proven = (f"({metrics}.value_count = {metrics}.null_value_count) OR ({metrics}.lower_bound >= '{prefix}' "
                  f"AND {metrics}.upper_bound >= '{prefix}' AND {metrics}.upper_bound < '{after}')")
        rows = self.spark.sql(f"SELECT file_path, content = 1 OR coalesce({proven}, false) AS proven "
                              f"FROM {self.quoted}.all_files").collect()
        known = {same_file(r.file_path) for r in rows}
        unproven = list(dict.fromkeys(r.file_path for r in rows if not r.proven))
        return unproven + [p for p in self.data_files_on_storage() if same_file(p) not in known]

    def files_at(self, snapshot_id: int) -> list[str]:
        """Every data and delete file one retained snapshot references: its manifests, read in the driver."""
        return snapshot_files(self.spark, self.java(), snapshot_id)

    def file_sizes(self) -> DataFrame:
        """(dsr_path, dsr_rows, dsr_bytes) of each current data file: its path spelled as `same_file`
        does, rows stored (deleted ones included), bytes. The `data_files` metadata table, in Spark."""
        return self.spark.sql(f"SELECT regexp_replace(file_path, '^file:/+', '/') AS dsr_path, record_count AS "
                              f"dsr_rows, file_size_in_bytes AS dsr_bytes FROM {self.quoted}.data_files")

    def history_is_live(self) -> bool:
        """Whether the retained snapshots and the storage listing hold exactly the current snapshot's
        files and no delete file (the state a purge leaves): then a scan of live data reads the same
        rows as a scan of history or of storage would. Metadata and one listing of the location."""
        paths, current = self.retained_files()
        return not self.row_masks() and only_current(current, paths, self.data_files_on_storage())

    def row_masks(self) -> int:
        """Live delete files (each masks rows its data files still hold). Metadata only."""
        return self.summary_count("total-delete-files")

    # The line of commits

    def commits_between(self, after_id: int | None, before_id: int) -> list[Commit] | None:
        """Commits after `after_id` and before `before_id` on `before_id`'s line, oldest first.

        None when `after_id` is not an ancestor (the table was rolled back or replaced meanwhile).
        Metadata only.
        """
        snapshots = _snapshots_by_id(self.spark, self.java())
        start = snapshots[before_id].parent_id
        chain = list(_ancestors(snapshots, start, after_id))
        if (chain[-1].parent_id if chain else start) != after_id:  # the line ended or expired first
            return None
        return [Commit(s.snapshot_id, s.operation, s.summary) for s in reversed(chain)]

    def commits_since(self, after_id: int, until_id: int) -> list[Commit] | None:
        """Commits after `after_id` up to `until_id` included, oldest first; None when `after_id` is not an
        ancestor of `until_id` (expired, rolled back or replaced meanwhile). Metadata only."""
        if after_id == until_id:
            return []
        chain = list(_ancestors(_snapshots_by_id(self.spark, self.java()), until_id, after_id))
        if not chain or chain[-1].parent_id != after_id:
            return None
        return [Commit(s.snapshot_id, s.operation, s.summary) for s in reversed(chain)]

    def descends_from(self, snapshot_id: int) -> bool:
        """Whether the table's current snapshot is `snapshot_id` or a later commit on its line (not a
        rollback, a replaced table or a line whose history expired in between). Metadata only."""
        current = self.current_snapshot()
        return current is not None and self.commits_since(snapshot_id, current.snapshot_id) is not None

    def own_line_since(self, after_id: int) -> bool:
        """Whether no writer but this Spark application added rows after snapshot `after_id`: every commit
        since, up to the current snapshot, is this application's erase (an overwrite or delete carrying
        its `spark.app.id`) or a `replace`, which by Iceberg's contract moves rows without changing them
        (a compaction, a purge's rewrite). False when `after_id` is no ancestor any more. Metadata only."""
        current = self.current_snapshot()
        if current is None:
            return False
        commits = self.commits_since(after_id, current.snapshot_id)
        app_id = self.spark.sparkContext.applicationId
        return commits is not None and all(
            c.operation == "replace"
            or (c.operation in ("overwrite", "delete") and c.summary.get("spark.app.id") == app_id)
            for c in commits)


# Helpers that take a Java table, a path or a type, not a table of the lake.


def snapshot_of(spark: SparkSession, jsnapshot) -> Snapshot | None:
    """A Java Snapshot (or None) as a Snapshot, read in one round trip."""
    return _snapshot(call(spark, "snapshot", jsnapshot))


def snapshot_at(spark: SparkSession, jtable, snapshot_id: int) -> Snapshot:
    """Snapshot `snapshot_id` of a Java table that has it (an id read from the table's metadata)."""
    return cast(Snapshot, snapshot_of(spark, jtable.snapshot(snapshot_id)))


_staged: list = []  # (session, task set manager, java table, task set id) staged by this process, until released


def planned(spark: SparkSession, scan: Any) -> Any:
    """The file scan tasks of a Java TableScan, planned on the driver (manifests only) into a java.util.List."""
    return jclass(spark, "org.apache.iceberg.relocated.com.google.common.collect.Lists").newArrayList(
        scan.planFiles())


def read_staged(spark: SparkSession, jtable: Any, identifier: str, tasks: Any,
                options: dict[str, str] | None = None, position: str | None = None) -> DataFrame:
    """The scan tasks `tasks` (a java.util.List planned from `jtable`, the Java table of `identifier`)
    read through a task set staged with Iceberg's ScanTaskSetManager, the mechanism Iceberg's own
    compaction uses: Spark plans nothing (the plan shows only the set's id), and each task's residual
    and delete files apply. The table's own columns in the current schema (a format-v3 table's staged
    read also yields its row-lineage columns: left out), and with `position` each row's position in
    its file (Iceberg's `_pos`) under that name. The set stays staged until `release_staged`."""
    set_id = f"dsr-{uuid.uuid4().hex}"
    manager = jclass(spark, "org.apache.iceberg.spark.ScanTaskSetManager").get()
    manager.stageTasks(jtable, set_id, tasks)
    _staged.append((spark, manager, jtable, set_id))
    reader = spark.read.format("iceberg").option("scan-task-set-id", set_id)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    columns = [F.col(f"`{c}`") for c in call(spark, "columns", jtable)]
    return reader.load(staged_table(spark, jtable, set_id, identifier)).select(
        *columns, *([F.col("_pos").alias(position)] if position else []))


def release_staged() -> None:
    """Drop every task set staged so far (their DataFrames can no longer be read): a run calls it
    when it ends, so a long-lived session does not accumulate file lists."""
    while _staged:
        spark, manager, jtable, set_id = _staged.pop()
        manager.removeTasks(jtable, set_id)
        unstage_table(spark, set_id)


def staged_table(spark: SparkSession, jtable: Any, set_id: str, identifier: str) -> str:
    """What a read or write of task set `set_id` of `jtable` loads: on Spark 3.5 (Iceberg's 3.5 runtime)
    the table itself, the set named by the `scan-task-set-id` or `rewritten-file-scan-task-set-id`
    option; on Spark 4.1 (Iceberg 1.11, which dropped those options) the set's id, under which the
    table is registered with Iceberg's table cache until `unstage_table`."""
    if not spark4(spark):
        return identifier
    bridge(spark).cacheTable(set_id, jtable)
    return set_id


def unstage_table(spark: SparkSession, set_id: str) -> None:
    """The end of `staged_table`'s registration (none on Spark 3.5)."""
    if spark4(spark):
        bridge(spark).cacheTable(set_id, None)


def replace_files(spark: SparkSession, jtable, old_files: list, new_files, read_snapshot_id: int,
                  conflict_filter, branch: str | None = None) -> None:
    """Commit `new_files` (Java DataFiles written, not yet committed) in place of `old_files` as one
    `overwrite` (on `branch`, default main), validated like a serializable copy-on-write operation (see
    IcebergTable.overwrite_files). On a conflict nothing is committed, the new files are deleted, and
    the error is raised for a retry."""
    jtable.refresh()
    operation = (jtable.newOverwrite().caseSensitive(False).validateFromSnapshot(read_snapshot_id)
                 .conflictDetectionFilter(conflict_filter).validateNoConflictingData()
                 .validateNoConflictingDeletes())
    if branch is not None:
        operation = operation.toBranch(branch)
    bridge(spark).replace(operation, old_files, new_files)
    _commit_written(spark, jtable, operation, new_files)


def add_position_deletes(spark: SparkSession, jtable, delete_files, data_locations: list[str], read_snapshot_id: int,
                         conflict_filter) -> None:
    """Commit `delete_files` (Java position DeleteFiles written, not yet committed, against the data
    files at `data_locations`) as one row delta, validated as Spark validates a serializable
    merge-on-read delete: the data files still live, no file another writer added since
    `read_snapshot_id` that `conflict_filter` may match, no delete file another writer attached to
    them meanwhile. On a conflict nothing is committed, the delete files are deleted, and the error is
    raised for a retry. Metadata only: one manifest written."""
    jtable.refresh()
    operation = (jtable.newRowDelta().caseSensitive(False).validateFromSnapshot(read_snapshot_id)
                 .conflictDetectionFilter(conflict_filter).validateDataFilesExist(data_locations)
                 .validateDeletedFiles().validateNoConflictingDataFiles().validateNoConflictingDeleteFiles())
    for delete_file in delete_files:
        operation.addDeletes(delete_file)
    _commit_written(spark, jtable, operation, delete_files)


def _commit_written(spark: SparkSession, jtable, operation, written) -> None:
    """Commit `operation`, marked as this application's; on a conflict delete the files it would have
    added (`written`: nobody else references them)."""
    try:
        operation.set("spark.app.id", spark.sparkContext.applicationId).commit()
    except Exception as exc:
        if is_conflict(exc):  # nothing committed: the new files belong to nobody
            for location in call(spark, "locations", written):  # (an unknown commit state keeps them:
                jtable.io().deleteFile(location)  # the commit may have landed)
        raise


def sorted_by_order(jtable) -> bool:
    """Whether the Java Table declares a sort order (`dsr optimize` sets one): its files are then
    clustered, and a rewrite must keep each file's rows apart to keep their narrow column bounds."""
    return not jtable.sortOrder().isUnsorted()


def _snapshot_count(jtable) -> int:
    return jtable.operations().current().snapshots().size()


def _expire_in_driver(spark: SparkSession, jtable, before_ms: int, one_expired: int) -> int:
    """Core expiry of a table without refs; returns the data and delete files it deleted.

    Naming one snapshot the expiry removes anyway makes Iceberg clean up by reachability (files no
    retained snapshot references), like its Spark action; its default incremental cleanup only
    deletes files whose removal an expired snapshot recorded, so it would leave the files the
    current snapshot replaced.
    """
    # Paths that are metadata, to tell them from data and delete files among the deleted ones.
    known_metadata = set(call(spark, "metadataFiles", jtable, True))
    deleted = jclass(spark, "java.util.stream.Stream").builder()  # a Consumer<String>: what the expiry drops
    (jtable.expireSnapshots().expireOlderThan(before_ms).retainLast(1).expireSnapshotId(one_expired)
     .deleteWith(deleted).commit())
    paths = deleted.build().collect(jclass(spark, "java.util.stream.Collectors").toList())
    # After the commit, as Iceberg's own expiry does (bulk where the FileIO can; failures are logged,
    # and a file left behind is an orphan that the orphan removal and the storage check both see).
    jclass(spark, "org.apache.iceberg.CatalogUtil").deleteFiles(jtable.io(), paths, "expired", False)
    return sum(1 for path in call(spark, "toJson", paths) if path not in known_metadata)


def _live_files(spark: SparkSession, jtable, snapshot) -> list[str]:
    """Every data and delete file one snapshot references (its manifests' live entries), read in
    the driver."""
    return call(spark, "liveFiles", jtable, snapshot)


def snapshot_files(spark: SparkSession, jtable, snapshot_id: int) -> list[str]:
    """Every data and delete file one retained snapshot references, read in the driver."""
    return _live_files(spark, jtable, jtable.snapshot(snapshot_id))


def _snapshots_by_id(spark: SparkSession, jtable) -> dict[int, Snapshot]:
    """Every snapshot in the table's metadata, read in one round trip."""
    return {s["id"]: cast(Snapshot, _snapshot(s)) for s in call(spark, "snapshots", jtable)}


def _ancestors(snapshots: dict[int, Snapshot], start_id: int | None, stop_id: int | None):
    """Snapshots from `start_id` back along the parent line, up to (not including) `stop_id`; stops
    early where the line ends or a snapshot has expired."""
    snap = snapshots.get(start_id) if start_id is not None else None
    while snap is not None and snap.snapshot_id != stop_id:
        yield snap
        snap = snapshots.get(snap.parent_id) if snap.parent_id is not None else None


def _snapshot(answer: dict | None) -> Snapshot | None:
    """A Snapshot from the bridge's JSON for one snapshot (None: no snapshot), its summary read into
    CommitStats."""
    if answer is None:
        return None
    summary = answer["summary"]

    def count(key: str) -> int:
        return int(summary.get(key, 0))
    stats = CommitStats(files_added=count("added-data-files"), files_removed=count("deleted-data-files"),
                        bytes_removed=count("removed-files-size"),
                        rows_added=int(summary["added-records"]) if "added-records" in summary else None,
                        rows_removed=int(summary["deleted-records"]) if "deleted-records" in summary else None,
                        delete_files_added=count("added-delete-files"), app_id=summary.get("spark.app.id"))
    return Snapshot(answer["id"], answer["ms"], summary, answer["parent"], answer["operation"],
                    answer.get("sequence"), stats)
