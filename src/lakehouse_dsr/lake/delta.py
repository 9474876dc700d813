"""Delta Lake behind the format seam (lake/table.py): `DeltaTable`, a handle on a Delta table at a
path, with the operations the stages use.

Versions come from the table's history (`DESCRIBE HISTORY`: its commit log; the `operationParameters`
column, where other writers' DELETE predicates keep their literals, is never read), files from the
log's replay (its checkpoint and later commits read in the driver's JVM, or Delta's own `allFiles`
for a large log: paths, sizes and row counts reach Python, never a column statistic), rows through
Spark's Delta reader.

What a purge removes, and why: a deletion vector only masks rows, so `compact_deletes` runs
`REORG TABLE … APPLY (PURGE)`; a commit's removed files (and the change data feed's `_change_data`
copies of the rows it changed) stay on storage for time travel, so the expiry deletes them itself
(VACUUM's one retention window would also take files a concurrent writer has written but not yet
committed: orphans go only past `purge.orphan_min_age_minutes`); and the log itself
holds values (`add` actions carry per-file min/max statistics, strings up to 32 characters; `.crc`
files list files with theirs): after a checkpoint of a version whose commit holds no statistic,
the log files before it are deleted. Delta's own log cleanup never removes today's commits (its
cutoff is truncated to the day, and it runs only at checkpoints), hence the engine's.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from py4j.java_gateway import JavaClass
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from ..datamap import column_path, column_ref
from .bridge import compiled, jclass
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
    listing,
    only_current,
    read_columns_from_files,
    same_file,
)

if TYPE_CHECKING:
    from .lakehouse import Lake
    from .skipping import Candidates, KeyValues

_CAPABILITIES = Capabilities(file_rewrite=True, driver_files=False, statement_modes=True, subquery_dml=False,
                             refs=False, commit_files=True)

# What marks this application's commits (Delta writes the session's value into each commitInfo).
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
MARK = "lakehouse-dsr "
FILES_IN_CRC = "spark.databricks.delta.allFilesInCrc.enabled"

# Operations that change no row: compaction, the purge's rewrite, metadata and protocol changes.
_ROW_PRESERVING = {"OPTIMIZE", "REORG", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "ADD COLUMNS", "CHANGE COLUMN",
                   "RENAME COLUMN", "DROP COLUMNS", "REPLACE COLUMNS", "UPGRADE PROTOCOL", "ADD CONSTRAINT",
                   "DROP CONSTRAINT", "COMPUTE STATS", "VACUUM START", "VACUUM END", "CLUSTER BY", "ADD FEATURE",
                   "DROP FEATURE", "ADD DELETION VECTORS TOMBSTONES"}
# A log file of a version: its commit, checksum, checkpoint (classic, multi-part or v2) or log compaction.
_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+)*(\.[0-9a-f-]+)?\.(parquet|json)"
                       r"|\d{20}\.compacted\.json)$")
_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
# Column mapping (`name` or `id`): Parquet columns and the log's statistics carry physical names.
MAPPING_MODE = "delta.columnMapping.mode"
PHYSICAL_NAME = "delta.columnMapping.physicalName"


def mark_commits(spark: SparkSession) -> None:
    """Make this session's Delta commits name this Spark application (`own_commit_since` finds ours by
    it), and keep their `.crc` files from listing the table's files: with their statistics, that list
    is one more copy of the values (and Delta prints it at INFO with every new snapshot). Session-wide
    settings: other Delta commits of this application get both, as Iceberg's snapshots carry the
    application's id."""
    spark.conf.set(USER_METADATA, MARK + spark.sparkContext.applicationId)
    spark.conf.set(FILES_IN_CRC, "false")


def _metric(metrics: dict[str, str] | None, *names: str) -> int | None:
    """The first of `names` a commit's operationMetrics record (None: none)."""
    for name in names:
        if metrics and name in metrics:
            return int(metrics[name])
    return None


def _version(row: Row) -> Snapshot:
    """A Snapshot from one row of DESCRIBE HISTORY (version, timestamp, operation, isBlindAppend,
    operationMetrics, userMetadata)."""
    m = row.operationMetrics or {}
    operation = row.operation
    kind = ("append" if row.isBlindAppend else "replace" if operation in _ROW_PRESERVING
            else "delete" if operation == "DELETE" else "overwrite")
    marker = row.userMetadata or ""
    stats = CommitStats(
        files_added=_metric(m, "numTargetFilesAdded", "numAddedFiles", "numFiles") or 0,
        files_removed=_metric(m, "numTargetFilesRemoved", "numRemovedFiles") or 0,
        bytes_removed=_metric(m, "numTargetBytesRemoved", "numRemovedBytes") or 0,
        rows_added=_metric(m, "numTargetRowsInserted", "numOutputRows") if kind == "append" or
        operation == "MERGE" else None,
        rows_removed=_metric(m, "numTargetRowsDeleted", "numDeletedRows"),
        delete_files_added=_metric(m, "numTargetDeletionVectorsAdded", "numDeletionVectorsAdded") or 0,
        app_id=marker.removeprefix(MARK) if marker.startswith(MARK) else None)
    version = int(row.version)
    return Snapshot(version, int(row.timestamp.timestamp() * 1000), {}, version - 1 if version else None, kind,
                    version, stats)


@dataclass(frozen=True)
class DeltaTable:
    """One Delta table of a Lake, at `location`: its versions, files, reads and purge.

    Each operation reads the table's log afresh (Delta's log cache checks for new commits), so the
    handle never serves a stale version.
    """

    lake: Lake
    name: str  # namespace.table, as the data map names it
    path: str  # its location

    @property
    def spark(self) -> SparkSession:
        return self.lake.spark

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    @property
    def quoted(self) -> str:
        """delta.`/path`, as Spark SQL names a Delta table by its location."""
        return self.lake.quoted(self.name)

    @property
    def identifier(self) -> str:
        return self.quoted

    def location(self) -> str:
        return self.path

    def append_stream(self, stream: DataStreamWriter) -> StreamingQuery:
        """Start `stream` (its trigger and checkpoint set) appending to the table at its location:
        Delta's sink records each micro-batch's id in the commit (txn action), so a restart from the
        checkpoint never appends a batch twice."""
        return stream.format("delta").outputMode("append").start(self.path)

    def _log(self) -> Any:
        """Delta's DeltaLog of the table (cached by Delta per location). The session is made the
        calling JVM thread's active one first: Delta's own threads (a v2 checkpoint's sidecars are
        read by its pool) take the caller's, and a Py4J thread has none."""
        jclass(self.spark, "org.apache.spark.sql.SparkSession").setActiveSession(self.spark._jsparkSession)
        return jclass(self.spark, "org.apache.spark.sql.delta.DeltaLog").forTable(self.spark._jsparkSession,
                                                                                  self.path)

    def _snapshot(self) -> Any:
        """The log replayed to its newest version (DeltaLog.update, its default arguments)."""
        log = self._log()
        return _with_defaults(log, "update")

    def exists(self) -> bool:
        """Whether the location holds a Delta log. Metadata only."""
        return bool(self._log().tableExists())

    # Metadata

    def properties(self) -> dict[str, str]:
        """The table's configuration (`delta.*` properties and the owner's own). Metadata only."""
        conf = self._snapshot().metadata().configuration()
        return {str(k): str(conf.apply(k)) for k in _scala_keys(conf)}

    def write_mode(self, operation: str) -> str:
        """`merge-on-read` where deletion vectors are on (a DELETE, UPDATE or MERGE masks rows), else
        `copy-on-write` (the files holding changed rows are rewritten)."""
        enabled = self.properties().get("delta.enableDeletionVectors", "false").lower() == "true"
        return "merge-on-read" if enabled else "copy-on-write"

    def refusal(self) -> str | None:
        """Why the engine cannot erase from this table and prove it (None: it can). Metadata only."""
        if not self.exists():
            return f"table {self.name}: no Delta table at {self.path}"
        properties = self.properties()
        if properties.get("delta.appendOnly", "false").lower() == "true":
            return (f"table {self.name}: delta.appendOnly is true, so Delta refuses every delete and update "
                    "(unset it to erase from the table)")
        if formats := properties.get("delta.universalFormat.enabledFormats"):
            return (f"table {self.name}: delta.universalFormat.enabledFormats is {formats}: the other format's "
                    "metadata written beside the log keeps column statistics the purge does not clean")
        return None

    def _mapped(self) -> StructType | None:
        """The table's schema with its fields' column-mapping metadata, where it maps columns (None:
        Parquet columns carry the table's names). Metadata only."""
        metadata = self._snapshot().metadata()
        mode = metadata.configuration().get(MAPPING_MODE)
        if mode.isEmpty() or str(mode.get()) == "none":
            return None
        return StructType.fromJson(json.loads(str(metadata.schemaString())))

    def read_raw(self, paths: list[str], schema: StructType) -> DataFrame:
        """The columns of `schema` (a pruned table schema, table names) read straight from Parquet files,
        deleted rows included: by their physical names where the table maps columns (a renamed column
        keeps its file name), brought back to the table's names."""
        mapped = self._mapped()
        if mapped is None:
            return read_columns_from_files(self.spark, paths, schema)
        physical = cast(StructType, _physical(schema, mapped))
        rows = read_columns_from_files(self.spark, paths, physical)
        return rows.select(*[F.col(f"`{p.name}`").cast(f.dataType).alias(f.name)  # struct casts rename fields
                             for p, f in zip(physical.fields, schema.fields, strict=True)])

    def _stats_path(self, column: str) -> str:
        """A key column's path in the log's statistics (`minValues.<path>`): physical names where the
        table maps columns."""
        mapped = self._mapped()
        if mapped is None:
            return column_path(column)
        names, node = [], cast(DataType, mapped)
        for part in column_path(column).split("."):
            field = next(f for f in cast(StructType, node).fields if f.name.lower() == part.lower())
            names.append(field.metadata.get(PHYSICAL_NAME, field.name))
            node = field.dataType
        return ".".join(names)

    def history(self) -> list[Snapshot]:
        """Every version the log still holds, oldest first. Metadata only (DESCRIBE HISTORY), read once
        per state of the log: a commit never changes, so the JSON commits the log holds (names and
        times: one listing) key the answer, and a commit added or removed reads it again."""
        commits = tuple(sorted((p, t) for p, t in self._log_paths()
                               if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1])) and m.group(2) == "json"))
        if (known := _recalled(_histories, commits)) is not None:
            return known
        rows = self.spark.sql(f"DESCRIBE HISTORY {self.quoted}").select(
            "version", "timestamp", "operation", "isBlindAppend", "operationMetrics", "userMetadata").collect()
        found = sorted((_version(r) for r in rows), key=lambda s: s.snapshot_id)
        if commits:
            _remember(_histories, commits, found)
        return found

    def current_snapshot(self) -> Snapshot | None:
        """The newest version and its commit's record: the log brought up to date (a listing), then
        that version's commit read once per process (DESCRIBE HISTORY; a version's record never
        changes). Metadata only."""
        if not self.exists():
            return None
        snapshot = self._snapshot()
        key = (str(snapshot.metadata().id()), self.path, int(snapshot.version()))
        if (known := _recalled(_newest, key)) is not None:
            return known
        rows = self.spark.sql(f"DESCRIBE HISTORY {self.quoted} LIMIT 1").select(
            "version", "timestamp", "operation", "isBlindAppend", "operationMetrics", "userMetadata").collect()
        newest = _version(rows[0]) if rows else None
        if newest is not None:  # by its own version: another writer may have committed after the listing
            _remember(_newest, (key[0], key[1], newest.snapshot_id), newest)
        return newest

    def current_snapshot_id(self) -> int | None:
        """The newest version's number (None: no table), without its commit's record (`current_snapshot`
        reads that through DESCRIBE HISTORY: 2 s the first time in a process). Metadata only: the log
        brought up to date."""
        return int(self._snapshot().version()) if self.exists() else None

    def refs(self) -> list[Ref]:
        """Delta has no branches or tags: none."""
        return []

    # Rows

    def read_at(self, snapshot_id: int | None) -> DataFrame:
        """The table as of a version (the current one when None), for any consumer. A version that may
        hold deletion vectors is read over its file list (`DeltaLog.createDataFrame` over its `add`
        actions, listed in the driver's JVM: metadata only): Delta pins a scan of a version to its
        files only when its own planner runs, which a write into another format's table (a share, a
        derived Iceberg table) skips, and it refuses an unpinned scan of such a version."""
        snapshot = self._snapshot_at(snapshot_id)
        vectors = getattr(jclass(self.spark, "org.apache.spark.sql.delta.commands.DeletionVectorUtils$"), "MODULE$")
        if not vectors.deletionVectorsReadable(snapshot.protocol(), snapshot.metadata()):
            return self._scan(snapshot_id)
        return self._pinned(snapshot, self._adds(snapshot)[0])

    def _scan(self, snapshot_id: int | None) -> DataFrame:
        """Delta's own scan of a version: its planner skips files by statistics and answers a count from
        the log, where no write into another format's table consumes it."""
        reader = self.spark.read.format("delta")
        if snapshot_id is not None:
            reader = reader.option("versionAsOf", str(snapshot_id))
        return reader.load(self.path)

    def read_appends(self, after_id: int, until_id: int) -> DataFrame:
        """The rows of the files that commits after `after_id` up to `until_id` added and that are still
        live at `until_id` (deletion vectors applied): the log's `add` actions of those versions, then
        a read of those files only."""
        added = self._files_added_between(after_id, until_id)
        return self.read_files(until_id, added)

    def read_changes(self, after_id: int | None, until_id: int) -> DataFrame:
        """The table's changes after version `after_id` (None: from its start) up to `until_id`: its
        columns and `_change_type` (insert, delete, update_preimage, update_postimage). From Delta's
        change data feed where the table records one (`delta.enableChangeDataFeed`: the versions'
        `_change_data` files and added files only); otherwise the two versions' rows are compared
        (both read whole, one shuffle)."""
        if self.properties().get("delta.enableChangeDataFeed", "false").lower() != "true":
            return changes_by_difference(None if after_id is None else self.read_at(after_id), self.read_at(until_id))
        feed = (self.spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", str(0 if after_id is None else after_id + 1))
                .option("endingVersion", str(until_id)).load(self.path))
        return feed.drop("_commit_version", "_commit_timestamp")

    def read_files(self, snapshot_id: int | None, paths: set[str] | None) -> DataFrame:
        """The rows of the files at `paths` (None: all) as of a version, deletion vectors applied. Only
        those files are opened: they are read as Delta's own DELETE reads its candidate files
        (`DeltaLog.createDataFrame` over their `add` actions), where a filter on the file's path would
        leave Delta's scan reading every file of the version."""
        if paths is None:
            return self.read_at(snapshot_id)
        snapshot = self._snapshot_at(snapshot_id)
        files = self._add_files(snapshot, paths)
        return self._pinned(snapshot, files)

    def _pinned(self, snapshot: Any, files: Any) -> DataFrame:
        """The rows of `files` (a Java list of AddFile) as of `snapshot`, read as Delta's own DELETE reads
        its candidate files (`DeltaLog.createDataFrame`: deletion vectors applied, only those opened)."""
        return DataFrame(_with_defaults(self._log(), "createDataFrame", snapshot, _seq(self.spark, files)),
                         self.spark)

    def _add_files(self, snapshot: Any, paths: set[str] | frozenset[str]) -> Any:
        """The `add` actions (a Java list of AddFile) of the files at `paths` live in `snapshot`, picked
        from the version's file list (`_adds`) by absolute path: no statistic reaches Python."""
        adds, listed = self._adds(snapshot)
        wanted = {same_file(p) for p in paths}
        picked = [i for i, (path, _, _, _) in enumerate(listed) if same_file(path) in wanted]
        return compiled(self.spark, "DeltaStats").pick(adds, _list(self.spark, picked))

    def live_rows(self, snapshot_id: int | None) -> int:
        """Rows a reader sees at a version: the sum of its files' counts in the log (records less those
        a deletion vector masks), as Delta's own metadata-only count answers, when every file has
        one (metadata only); else a count."""
        if snapshot_id is None:
            return 0
        counts = [rows for _, _, rows, _ in self._files(snapshot_id)]
        return sum(cast(list[int], counts)) if None not in counts else self._scan(snapshot_id).count()

    def rows_after_commit(self, snapshot_id: int | None, rows_before: int) -> int:
        """Rows a reader sees after a commit, given the rows before it: from the commit's own metrics
        when it only removed rows, else a count."""
        if snapshot_id is None:
            return self._scan(None).count()
        commit = next((s for s in self.history() if s.snapshot_id == snapshot_id), None)
        if commit is not None and commit.stats.rows_removed is not None and not commit.stats.rows_added \
                and commit.operation in ("delete", "overwrite"):
            return rows_before - commit.stats.rows_removed
        return self.live_rows(snapshot_id)

    # The line of commits

    def own_commit_since(self, after_id: int | None, appends: bool = False) -> Snapshot | None:
        """This Spark application's newest commit after `after_id` that is not an append (`appends`:
        or is one), found by the userMetadata `mark_commits` sets. Metadata only."""
        app_id = self.spark.sparkContext.applicationId
        for snap in reversed(self.history()):
            if after_id is not None and snap.snapshot_id <= after_id:
                break
            if snap.stats.app_id == app_id and (appends or snap.operation != "append"):
                return snap
        return None

    def commits_since(self, after_id: int, until_id: int) -> list[Commit] | None:
        """Commits after `after_id` up to `until_id` included, oldest first; None when the log no longer
        holds them all, or `until_id` is not after `after_id` (a RESTORE makes a new version: it is a
        commit like any other). Metadata only."""
        if after_id == until_id:
            return []
        versions = {s.snapshot_id: s for s in self.history()}
        wanted = range(after_id + 1, until_id + 1)
        if until_id < after_id or any(v not in versions for v in wanted):
            return None
        return [Commit(v, cast(str, versions[v].operation), {}) for v in wanted]

    def commits_between(self, after_id: int | None, before_id: int) -> list[Commit] | None:
        """Commits after `after_id` and before `before_id`, oldest first (None: not all in the log)."""
        start = -1 if after_id is None else after_id
        found = self.commits_since(start, before_id) if start < before_id else None
        return None if found is None else found[:-1]

    def descends_from(self, snapshot_id: int) -> bool:
        """Whether the current version is `snapshot_id` or later (a Delta log is one line of versions;
        a RESTORE is a later version too, and resurrection checks what it added)."""
        current = self.current_snapshot()
        return current is not None and current.snapshot_id >= snapshot_id

    def own_line_since(self, after_id: int) -> bool:
        """Whether no writer but this application changed rows after version `after_id`: every commit
        since is this application's erase or a row-preserving one. Metadata only."""
        current = self.current_snapshot()
        if current is None:
            return False
        app_id = self.spark.sparkContext.applicationId
        versions = {s.snapshot_id: s for s in self.history()}
        later = [versions.get(v) for v in range(after_id + 1, current.snapshot_id + 1)]
        return all(s is not None and (s.operation == "replace" or (s.operation in ("overwrite", "delete")
                                                                     and s.stats.app_id == app_id))
                   for s in later)

    # Files

    def live_files(self, snapshot_id: int | None = None) -> list[tuple[str, int, int | None]]:
        """(path, size, rows a reader sees) of each data file live at a version (default the newest):
        the log's replay, read in Spark, its statistics reduced to row counts there (None where a
        file has none). Metadata only; one Spark job per version (a version never changes: the list
        is kept for the next caller)."""
        return [(path, size, rows) for path, size, rows, _ in self._files(snapshot_id)]

    def files_not_within(self, column: str, prefix: str) -> list[str]:
        """Data files of the current version whose statistics do not prove each value of `column` null
        or a string starting with `prefix`, plus every Parquet file on storage the version does not
        reference. A string statistic cut to 32 characters still bounds its values (a cut minimum is
        a prefix of the minimum, a cut maximum is raised past the maximum), and every string between
        two that start with `prefix` starts with it, so bounds that both start with it prove the file.
        The log's file list in Spark and one listing; only paths reach the driver."""
        files = DataFrame(self._snapshot_at(None).allFiles().toDF(), self.spark)
        path = self._stats_path(column)
        low, high = (F.get_json_object("stats", f"$.{which}.{path}") for which in ("minValues", "maxValues"))
        nulls = F.get_json_object("stats", f"$.nullCount.{path}").cast("long")
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first string past every one with the prefix
        stored = F.get_json_object("stats", "$.numRecords").cast("long")  # deleted rows too: still in the file
        proven = (nulls == stored) | (low.startswith(prefix) & high.startswith(prefix) & (high < F.lit(after)))
        root = self._root()
        listed = [(_absolute(root, r.path), bool(r.proven))
                  for r in files.select("path", F.coalesce(proven, F.lit(False)).alias("proven")).collect()]
        known = {same_file(p) for p, _ in listed}
        unreferenced = [p for p in self.data_files_on_storage() if same_file(p) not in known]
        return [p for p, ok in listed if not ok] + unreferenced

    def files_at(self, snapshot_id: int) -> list[str]:
        """Every data file live at a version (see live_files). Metadata only."""
        return [path for path, _, _ in self.live_files(snapshot_id)]

    def file_sizes(self) -> DataFrame:
        """(dsr_path, dsr_rows, dsr_bytes) of each current data file: its absolute path spelled as
        `same_file` does, rows a reader sees (None without statistics), bytes. The log's file list, in
        Spark (as `_absolute` resolves a relative, URL-encoded path)."""
        files = DataFrame(self._snapshot().allFiles().toDF(), self.spark)
        return files.select(_absolute_path(self._root()).alias("dsr_path"), _rows(files).alias("dsr_rows"),
                            F.col("size").alias("dsr_bytes"))

    def row_masks(self) -> int:
        """Live files carrying a deletion vector (each masks rows the file still holds). Metadata only."""
        return sum(masked for _, _, _, masked in self._files(None))

    def _snapshot_at(self, snapshot_id: int | None) -> Any:
        log = self._log()
        return _with_defaults(log, "update") if snapshot_id is None else _with_defaults(
            log, "getSnapshotAt", snapshot_id)

    def _files(self, snapshot_id: int | None) -> list[tuple[str, int, int | None, bool]]:
        """(path, size, rows, masked by a deletion vector) of each live file at a version (see
        live_files and _adds)."""
        return self._adds(self._snapshot_at(snapshot_id))[1]

    def _adds(self, snapshot: Any) -> tuple[Any, list[tuple[str, int, int | None, bool]]]:
        """The `add` actions (a Java list of AddFile) of the files live in `snapshot` and, for each,
        (absolute path, size, rows a reader sees or None, masked by a deletion vector), listed once
        per table and version. A log whose checkpoint and later commits hold up to
        `_REPLAY_MAX_BYTES` is replayed in the driver's JVM (DeltaLogText.liveFiles: those files read,
        no Spark job; Delta's replay job cost 0.7-1.3 s per version of a small table here), a larger
        one by Delta's own replay in Spark (`allFiles`). Only paths, sizes, counts and flags reach
        Python (DeltaStats.files), never a statistic's values."""
        key = (str(snapshot.metadata().id()), self.path, int(snapshot.version()))
        if (known := _recalled(_listed, key)) is not None:
            return known
        adds = compiled(self.spark, "DeltaLogText").liveFiles(self._log(), snapshot, _REPLAY_MAX_BYTES,
                                                              self.spark._jsc.hadoopConfiguration())
        if adds is None:
            adds = snapshot.allFiles().collectAsList()
        root = self._root()
        listed = [(_absolute(root, path), int(size), rows, bool(masked)) for path, size, rows, _, masked
                  in json.loads(compiled(self.spark, "DeltaStats").files(adds, _list(self.spark, []),
                                                                         _list(self.spark, [])))]
        _remember(_listed, key, (adds, listed))
        return adds, listed

    def _root(self) -> str:
        return str(self._log().dataPath().toString()).rstrip("/")

    def files_for_keys(self, snapshot_id: int | None, keys: list[tuple[str, DataFrame, KeyValues | None]] | None
                       ) -> list[tuple[str, int, int | None, bool]]:
        """`live_files`, each with whether it may hold one of `keys`' values (key column, the range of
        the batch's values of it as one row `min`, `max`, and the values in the driver's JVM when held
        there; None: every file may): its statistics say so in one of the columns (min <= value <=
        max; a file without statistics for a column may hold any). Decided in the driver's JVM over
        the version's `add` actions (DeltaStats.java): value by value where a column's values are
        held there, else against their range (a file kept when its bounds overlap it: a superset of
        the files whose bounds hold a value; a set of a million ids lands in every file's range
        anyway), read into the JVM (a small job, none for a range held there). Only paths, sizes,
        counts and the flag reach Python. It narrows a table clustered by the key (`dsr optimize`: Z-order or
        liquid clustering)."""
        if not keys:
            return [(path, size, rows, True) for path, size, rows in self.live_files(snapshot_id)]
        snapshot = self._snapshot_at(snapshot_id)
        # The plan, the rewrite and the check ask at the same version with the same values: one listing.
        # The entry holds the values' DataFrames, so no other object can take their ids meanwhile.
        key = (str(snapshot.metadata().id()), self.path, int(snapshot.version()),
               tuple((column, id(values)) for column, values, _ in keys))
        if (entry := _recalled(_listed_for_keys, key)) is not None:
            return entry[0]
        # Values held in the driver's JVM are compared one by one; a set too large to hold there (a
        # million ids) by its range, a Row of its minimum and maximum read into the JVM.
        wanted = [kv.java_list if kv is not None else span._jdf.collectAsList().get(0) for _, span, kv in keys]
        listed = json.loads(compiled(self.spark, "DeltaStats").files(
            self._adds(snapshot)[0], _list(self.spark, [self._stats_path(c) for c, _, _ in keys]),
            _list(self.spark, wanted)))
        root = self._root()
        found = [(_absolute(root, path), int(size), rows, bool(may)) for path, size, rows, may, _ in listed]
        _remember(_listed_for_keys, key, (found, keys))
        return found

    def rewritable(self) -> bool:
        """Whether the engine's own rewrite (`overwrite_files`) keeps what the table tracks: not where
        it records a change data feed (Delta's DELETE copies the deleted rows to `_change_data`, which
        downstream readers apply) or row tracking (row ids survive Delta's rewrite, not ours): Spark's
        MERGE erases there. Metadata only."""
        properties = self.properties()
        return not any(properties.get(p, "false").lower() == "true"
                       for p in ("delta.enableChangeDataFeed", "delta.enableRowTracking"))

    def sorted_by_order(self) -> bool:
        """False: a Delta table declares no sort order; a rewrite's tasks take files as Delta's reader
        packs them (a clustered table's next OPTIMIZE restores its layout)."""
        return False

    def overwrite_files(self, files: Candidates, rows: DataFrame, *, redacting: bool = False,
                        branch: str | None = None, commit_if: Callable[[], bool] | None = None) -> bool:
        """Replace the candidate `files` (live at their version) by `rows` in one commit of Delta's own
        transaction, as Delta's copy-on-write DELETE (`redacting`: UPDATE) commits its rewrite, but for
        exactly these files: `rows` written by Delta's writer (`writeFiles`: the table's partitioning,
        column mapping, statistics and constraints), the old files removed with their deletion
        vectors. The commit records an empty predicate: no value reaches the log. Delta validates it
        from the files' version on: a commit that meanwhile removed one of these files (a DELETE,
        UPDATE, MERGE, deletion vector, compaction or overwrite of them) fails it, and the caller
        retries from the new version (the new files are deleted). No read predicate is recorded, so
        an append to another partition passes; open-source Delta checks every transaction as
        Serializable, and on an unpartitioned table fails it for any append meanwhile, as it fails its
        own DELETE: the retry keeps the appended rows (and erases them where they hold a requested
        key). `commit_if`: asked once the rows are written;
        False deletes them and commits nothing. Returns whether it committed. Cost: one read and one
        write of the rows; the old files' `add` actions are picked from the log's file list in Spark.
        """
        if branch is not None:
            raise ValueError(f"table {self.name}: Delta tables have no branches")
        spark = self.spark
        snapshot = self._snapshot_at(files.snapshot_id)
        option = jclass(spark, "scala.Option")
        txn = self._log().startTransaction(option.empty(), option.apply(snapshot))
        old = self._add_files(snapshot, set(files.paths()))
        added = _java_list(spark, txn.writeFiles(rows._jdf))
        root = self._root()
        new_paths = [_absolute(root, str(a.path())) for a in added]
        try:
            if commit_if is not None and not commit_if():
                _delete(spark, new_paths)
                return False
            now = int(time.time() * 1000)
            removes = [a.removeWithTimestamp(now, True) for a in old]
            operations = "org.apache.spark.sql.delta.DeltaOperations"
            operation = (jclass(spark, f"{operations}$Update")(option.empty()) if redacting
                         else jclass(spark, f"{operations}$Delete")(_seq(spark, [])))
            txn.registerSQLMetrics(spark._jsparkSession, _metrics(spark, list(old), added, redacting))
            txn.commit(_seq(spark, removes + added), operation)
            return True
        except Exception:
            _delete(spark, new_paths)
            raise

    def statements_in_mode(self, mode: str) -> AbstractContextManager[None]:
        """DELETE, UPDATE and MERGE in the block `copy-on-write`: they rewrite the files holding the
        changed rows instead of masking them with deletion vectors (Delta's
        `<command>.deletionVectors.persistent`), where the purge would rewrite those files minutes
        later anyway (REORG ... APPLY (PURGE)): the work is done once. Any other `mode`: the table's
        own choice. Session-wide while a block runs (threads erasing other tables share it)."""
        return _copy_on_write(self.spark) if mode == "copy-on-write" else nullcontext()

    def cluster_by_key(self, key: str, target_file_size_bytes: int) -> tuple[int, int, int]:
        """Cluster the table by `key` with OPTIMIZE: by its clustering columns where it uses liquid
        clustering (`CLUSTER BY`), else Z-ordered by the key; the key's statistics collected first
        where the table would not (beyond `delta.dataSkippingNumIndexedCols`). Returns (data files
        before, after, bytes rewritten). Reads and rewrites the whole table (a Z-order: a shuffle)."""
        spark, column = self.spark, column_ref(key)
        detail = spark.sql(f"DESCRIBE DETAIL {self.quoted}").select("clusteringColumns", "numFiles").first()
        files_before = int(detail.numFiles or 0) if detail else 0
        properties = self.properties()
        top = key.split(".")[0]
        indexed = int(properties.get("delta.dataSkippingNumIndexedCols", "32"))
        columns = self._scan(None).columns
        if "delta.dataSkippingStatsColumns" not in properties and (top not in columns
                                                                   or columns.index(top) >= indexed):
            spark.sql(f"ALTER TABLE {self.quoted} SET TBLPROPERTIES ('delta.dataSkippingStatsColumns' = '{top}')")
        clustered = detail is not None and bool(detail.clusteringColumns)
        before = spark.conf.get(_MAX_FILE_SIZE, None)
        spark.conf.set(_MAX_FILE_SIZE, str(int(target_file_size_bytes)))
        try:
            spark.sql(f"OPTIMIZE {self.quoted}" + ("" if clustered else f" ZORDER BY ({column})"))
        finally:
            spark.conf.unset(_MAX_FILE_SIZE) if before is None else spark.conf.set(_MAX_FILE_SIZE, before)
        after = self.current_snapshot()
        rewritten = after.stats.bytes_removed if after is not None and after.operation == "replace" else 0
        return files_before, len(self.live_files()), rewritten

    def _log_paths(self) -> list[tuple[str, int]]:
        """(path, modified ms) of every file under `_delta_log`."""
        return listing(self.spark, self.path.rstrip("/") + "/_delta_log")

    def _actions(self, files: list[str], kinds: tuple[str, ...]) -> list[tuple[int, str, str, bool, int | None]]:
        """(index in `files`, kind, path as the log spells it, carries a deletion vector, numRecords)
        of every action of `kinds` in `files` (log files: JSON, or Parquet checkpoints), read in the driver's JVM
        (DeltaLogText.java): only paths, flags and counts reach Python."""
        if not files:
            return []
        answer = compiled(self.spark, "DeltaLogText").actions(
            _list(self.spark, files), _list(self.spark, list(kinds)), self.spark._jsc.hadoopConfiguration())
        return [(int(i), str(k), str(p), bool(v), None if r is None else int(r))
                for i, k, p, v, r in json.loads(answer)]

    def _commit_actions(self, kinds: tuple[str, ...], versions: range | None = None) -> set[str]:
        """The paths the log's JSON commits name in actions of `kinds` (add, remove, cdc), of
        `versions` (default all the log holds): a listing and the commits read."""
        root = self.path.rstrip("/")
        commits = [p for p, _ in self._log_paths() if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1]))
                   and m.group(2) == "json" and (versions is None or int(m.group(1)) in versions)]
        return {_absolute(root, path) for _, _, path, _, _ in self._actions(commits, kinds)}

    def added_versions(self, paths: list[str]) -> list[int | None]:
        """For each of `paths` (live files), the newest version whose commit added it, from the JSON
        commits the log holds; a file none of them adds came with the log's checkpoint: the oldest
        version the log holds (it was added then or before). A listing and the commits read."""
        root = self.path.rstrip("/")
        commits = sorted((int(m.group(1)), p) for p, _ in self._log_paths()
                         if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1])) and m.group(2) == "json")
        history = self.history()
        oldest = history[0].snapshot_id if history else None
        added: dict[str, int] = {}
        for index, _, path, _, _ in self._actions([p for _, p in commits], ("add",)):
            added[same_file(_absolute(root, path))] = commits[index][0]  # in version order: the newest wins
        return [added.get(same_file(p), oldest) for p in paths]

    def commit_files(self, snapshot_id: int) -> CommitFiles:
        """What version `snapshot_id`'s commit changed, from its JSON commit: the files it removed
        (rewritten), the files it added, and those it gave a deletion vector (removed and added again
        under the same path, with one). The commit read in the driver's JVM: only paths, the vector
        flags and row counts reach Python (a statistic's values never do)."""
        root = self._root()  # as the file lists spell paths (candidates are compared with these)
        actions = self._actions([f"{root}/_delta_log/{snapshot_id:020d}.json"], ("add", "remove"))
        added = {_absolute(root, path): (vector, rows) for _, kind, path, vector, rows in actions if kind == "add"}
        removed = {_absolute(root, path) for _, kind, path, _, _ in actions if kind == "remove"}
        new = frozenset(added) - removed
        counted = [rows for p in new if (rows := added[p][1]) is not None]
        return CommitFiles(snapshot_id - 1 if snapshot_id else None, frozenset(removed - set(added)), new,
                           sum(counted) if len(counted) == len(new) else None,
                           frozenset(p for p in removed & set(added) if added[p][0]))

    def _files_added_between(self, after_id: int, until_id: int) -> set[str]:
        return self._commit_actions(("add",), range(after_id + 1, until_id + 1))

    def retained_files(self) -> tuple[list[str], set[str]]:
        """(paths of every data file a version the log can still reach references and storage still
        holds, the current version's among them). The log's commits and the current file list: metadata
        and one listing."""
        current = {p for p, _, _ in self.live_files()}
        named = {same_file(p): p for p in [*self._commit_actions(("add", "remove")), *current]}  # one spelling each
        on_storage = {same_file(p) for p in self.data_files_on_storage()}
        return sorted(p for key, p in named.items() if key in on_storage), current

    def data_files_on_storage(self) -> list[str]:
        """Every Parquet file under the location but the log's own (data files, referenced or not, and
        the change data feed's `_change_data` files): one listing."""
        return [p for p, _ in listing(self.spark, self.path) if p.endswith(".parquet") and "/_delta_log/" not in p]

    def metadata_files(self) -> list[str]:
        """Every file of `_delta_log` (JSON commits, `.crc` files, checkpoints and their sidecars,
        `_last_checkpoint`): what the proof scans for identifiers as text. One listing."""
        return [p for p, _ in self._log_paths() if not p.rsplit("/", 1)[-1].startswith(".")]

    def history_is_live(self) -> bool:
        """Whether history and storage hold exactly the current files and no row is masked by a
        deletion vector: a scan of live data then reads what a scan of either would."""
        paths, current = self.retained_files()
        return not self.row_masks() and only_current(current, paths, self.data_files_on_storage())

    # Purge

    def compact_deletes(self, target_file_size_bytes: int) -> RewriteResult:
        """Rows masked by deletion vectors made to leave the files: REORG TABLE … APPLY (PURGE) rewrites
        the files carrying deletion vectors (only those). Nothing to do without deletion vectors. A
        command that reports success proves nothing: the proof reads the files."""
        if not self.row_masks():
            return RewriteResult(0, 0, 0, 0)
        before = self.current_snapshot()
        self.spark.sql(f"REORG TABLE {self.quoted} APPLY (PURGE)")
        after = self.current_snapshot()
        if after is None or before is None or after.snapshot_id == before.snapshot_id:
            return RewriteResult(0, 0, 0, 0)
        return RewriteResult(after.stats.files_removed, after.stats.files_added, after.stats.bytes_removed,
                             after.stats.files_removed)

    def scrub_metadata(self) -> int:
        """Nothing before the expiry: the log's values go with the expiry's log cleanup (it must follow
        every commit of the purge)."""
        return 0

    def expire_snapshots_before_current(self) -> ExpireResult:
        """Every version before the current one made unreachable, with what only they held:

        1. a commit that changes only a table property (`dsr.purged`), so the newest version's own
           JSON names no file statistic;
        2. the data files no live file list holds any more, and the `_change_data` files, that the
           log's commits name, deleted from storage (time travel to those versions ends here);
        3. a checkpoint of the new version, then every log file before it deleted: JSON commits,
           `.crc` files, older checkpoints, and the sidecars of older v2 checkpoints (their file
           lists carry statistics). Delta reads the table from the checkpoint on.
        Cost: one small commit, the log's JSON read as text, a checkpoint (the live file list
        written once), deletes. A concurrent writer whose read version is older than the
        checkpoint finds its conflict check's log gone: its commit fails and it retries."""
        spark = self.spark
        spark.sql(f"ALTER TABLE {self.quoted} SET TBLPROPERTIES ('dsr.purged' = '{int(time.time() * 1000)}')")
        log = self._log()
        snapshot = _with_defaults(log, "update")
        version = int(snapshot.version())
        live = {same_file(p) for p, _, _ in self.live_files()}
        named = self._commit_actions(("add", "remove", "cdc"), range(0, version + 1))
        stale = [p for p in named if same_file(p) not in live]
        deleted = _delete(spark, stale)
        started_ms = time.time() * 1000
        log.checkpoint()
        logged = self._log_paths()
        before = [p for p, _ in logged if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1])) and int(m.group(1)) < version]
        _delete(spark, before + self._unreferenced_sidecars(logged, version, started_ms))
        # The log Delta cached for this table names files that are gone; other tables' stay cached.
        jclass(spark, "org.apache.spark.sql.delta.DeltaLog").invalidateCache(
            spark._jsparkSession, jclass(spark, "org.apache.hadoop.fs.Path")(self.path))
        commits = len({m.group(1) for p in before if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1]))
                       and m.group(2) == "json"})
        return ExpireResult(commits, deleted)

    def _unreferenced_sidecars(self, logged: list[tuple[str, int]], version: int, before_ms: float) -> list[str]:
        """Files of `_delta_log/_sidecars/` (a v2 checkpoint's parts: `add` actions with their
        statistics) that no top-level checkpoint of `version` references and that were written before
        `before_ms` (a concurrent checkpoint's are younger): older checkpoints' sidecars. `logged`:
        the log's listing. The checkpoint's `sidecar` actions are read in the driver's JVM, JSON or
        Parquet (file names only)."""
        sidecars = [(p, modified) for p, modified in logged if "/_sidecars/" in p]
        if not sidecars:
            return []
        tops = [p for p, _ in logged if (m := _LOG_FILE.match(p.rsplit("/", 1)[-1])) and int(m.group(1)) == version
                and m.group(2).startswith("checkpoint")]
        referenced = {path.rsplit("/", 1)[-1] for _, _, path, _, _ in self._actions(tops, ("sidecar",))}
        return [p for p, modified in sidecars if modified < before_ms and p.rsplit("/", 1)[-1] not in referenced]

    def remove_orphan_files(self, min_age_minutes: float) -> int:
        """Files under the location that no version the log can reach names, older than the window
        (which protects writers still committing), deleted: data files, `_change_data` files, and
        deletion vectors once no live file carries one (they hold row positions, never values).
        VACUUM decides the same, but lists storage with a Spark job of thousands of tasks (a minute
        for a tiny table on two cores): here, one listing and the log's JSON read as text. Returns
        the files deleted."""
        cutoff = (time.time() - max(min_age_minutes, 0) * 60) * 1000
        root = self.path.rstrip("/")
        live = self.live_files()
        named = {same_file(p) for p, _, _ in live} | {same_file(p) for p in self._commit_actions(
            ("add", "remove", "cdc"))}
        vectors_live = self.row_masks() > 0
        orphans = [p for p, modified in listing(self.spark, root) if modified < cutoff
                   and "/_delta_log/" not in p and not p.rsplit("/", 1)[-1].startswith((".", "_"))
                   and same_file(p) not in named and (not p.endswith(".bin") or not vectors_live)]
        return _delete(self.spark, orphans)


_PERSISTENT_VECTORS = [f"spark.databricks.delta.{command}.deletionVectors.persistent"
                       for command in ("delete", "update", "merge")]
_rewriting = threading.Lock()
_rewriters: list[tuple[Any, dict[str, str | None]]] = []  # (session, confs before) while blocks run


@contextmanager
def _copy_on_write(spark: SparkSession) -> Iterator[None]:
    """The session's DML statements without persistent deletion vectors while any block is inside;
    the session's own values back when the last one leaves."""
    with _rewriting:
        if not _rewriters:
            before = {key: spark.conf.get(key, None) for key in _PERSISTENT_VECTORS}
            for key in _PERSISTENT_VECTORS:
                spark.conf.set(key, "false")
        else:
            before = _rewriters[0][1]
        _rewriters.append((spark, before))
    try:
        yield
    finally:
        with _rewriting:
            _rewriters.pop()
            if not _rewriters:
                for key, value in before.items():
                    spark.conf.unset(key) if value is None else spark.conf.set(key, value)


# Live file lists by (table id, location, version): a version's list never changes.
_listed: dict[tuple[str, str, int], tuple[Any, list[tuple[str, int, int | None, bool]]]] = {}
# The largest log (checkpoint and the commits since, bytes) replayed in the driver's JVM: its AddFiles
# (a few hundred bytes each with statistics) stay well inside a 1 GB driver.
_REPLAY_MAX_BYTES = 16 * 1024 * 1024
# The same with each file's "may hold one of these values" (files_for_keys), by the values' objects.
_listed_for_keys: dict[tuple, tuple[list[tuple[str, int, int | None, bool]], list[tuple[str, DataFrame, Any]]]] = {}
# A table's history (DESCRIBE HISTORY) by the JSON commits its log holds (paths and times).
_histories: dict[tuple[tuple[str, int], ...], list[Snapshot]] = {}
# The newest version's commit record (current_snapshot) by (table id, location, version).
_newest: dict[tuple[str, str, int], Snapshot] = {}
_listed_lock = threading.Lock()
T = TypeVar("T")
_LISTED_MAX = 32


def _recalled(cache: dict[Any, T], key: Any) -> T | None:
    """What one of the memos above holds for `key` (None: nothing)."""
    with _listed_lock:
        return cache.get(key)


def _remember(cache: dict[Any, T], key: Any, value: T) -> None:
    """Keep `value` in one of the memos above, its oldest entries dropped past _LISTED_MAX."""
    with _listed_lock:
        cache[key] = value
        while len(cache) > _LISTED_MAX:
            del cache[next(iter(cache))]


def _rows(files: DataFrame) -> Column:
    """A log file list's rows a reader sees per file: its statistics' count less its deletion vector's."""
    records = F.get_json_object("stats", "$.numRecords").cast("long")
    deleted = F.coalesce(F.col("deletionVector.cardinality"), F.lit(0)) \
        if "deletionVector" in files.columns else F.lit(0)
    return records - deleted


def _physical(wanted: DataType, table: DataType) -> DataType:
    """`wanted` (a pruned piece of the table's schema `table`) with each field named as the files name
    it (column mapping's physical name), nested fields included."""
    if isinstance(wanted, StructType) and isinstance(table, StructType):
        fields = []
        for f in wanted.fields:
            mapped = next(t for t in table.fields if t.name.lower() == f.name.lower())
            fields.append(StructField(mapped.metadata.get(PHYSICAL_NAME, mapped.name),
                                      _physical(f.dataType, mapped.dataType), f.nullable))
        return StructType(fields)
    if isinstance(wanted, ArrayType) and isinstance(table, ArrayType):
        return ArrayType(_physical(wanted.elementType, table.elementType), wanted.containsNull)
    if isinstance(wanted, MapType) and isinstance(table, MapType):
        return MapType(_physical(wanted.keyType, table.keyType), _physical(wanted.valueType, table.valueType),
                       wanted.valueContainsNull)
    return wanted


def _absolute(root: str, path: str) -> str:
    """A log action's path (relative to the table, URL-encoded, or absolute) as an absolute one."""
    from urllib.parse import unquote

    return path if re.match(r"^[a-z][a-z0-9+.-]*:", path) else f"{root}/{unquote(path)}"


def _absolute_path(root: str) -> Column:
    """A log file list's `path` as `_absolute` resolves it, spelled as `same_file` does (in Spark)."""
    path = F.when(F.col("path").rlike("^[a-z][a-z0-9+.-]*:"), F.col("path")).otherwise(
        F.concat(F.lit(root + "/"), F.url_decode("path")))
    return F.regexp_replace(path, "^file:/+", "/")


def _metrics(spark: SparkSession, old: list[Any], added: list[Any], redacting: bool) -> Any:
    """The operation metrics Delta's DELETE (UPDATE) records, of a rewrite that replaced the `old`
    AddFiles by the `added` ones (a Scala Map of SQLMetrics): files and bytes, and a deletion's rows
    deleted and copied, from the files' own row counts (DESCRIBE HISTORY shows them; a commit's
    rows removed spare `rows_after_commit` a count)."""
    def records(files: list[Any]) -> int | None:
        counts = [f.numLogicalRecords() for f in files]
        return None if any(c.isEmpty() for c in counts) else sum(int(c.get()) for c in counts)

    values = {"numRemovedFiles": len(old), "numAddedFiles": len(added),
              "numRemovedBytes": sum(int(f.size()) for f in old), "numAddedBytes": sum(int(f.size()) for f in added)}
    before, after = records(old), records(added)
    if not redacting and before is not None and after is not None:
        values |= {"numDeletedRows": before - after, "numCopiedRows": after}
    elif not redacting:  # Delta's DELETE reads a 0 here as rows it could not count
        values |= {"numDeletedRows": 0, "numCopiedRows": 0}
    metrics = getattr(jclass(spark, "scala.collection.immutable.Map$"), "MODULE$").empty()
    create = jclass(spark, "org.apache.spark.sql.execution.metric.SQLMetrics").createMetric
    for name, value in values.items():
        metric = create(spark._jsc.sc(), name)
        metric.set(value)
        metrics = metrics.updated(name, metric)
    return metrics


def _java_list(spark: SparkSession, seq: Any) -> list[Any]:
    """A Scala Seq's items, as Python's handles on them."""
    return list(jclass(spark, "scala.collection.JavaConverters").seqAsJavaList(seq))


def _list(spark: SparkSession, items: list[Any]) -> Any:
    """A java.util.List of Python strings or Java objects."""
    java = jclass(spark, "java.util.ArrayList")()
    for item in items:
        java.add(item)
    return java


def _seq(spark: SparkSession, items: Any) -> Any:
    """A Scala Seq of a Java list, or of a Python list of Java objects."""
    if isinstance(items, list):
        items = _list(spark, items)
    return jclass(spark, "scala.collection.JavaConverters").asScalaBuffer(items).toSeq()


def _delete(spark: SparkSession, paths: list[str]) -> int:
    """Delete `paths` through Hadoop's file system (their checksum files go with them); returns how
    many existed."""
    deleted = 0
    conf = spark._jsc.hadoopConfiguration()
    for location in paths:
        path = jclass(spark, "org.apache.hadoop.fs.Path")(location)
        if path.getFileSystem(conf).delete(path, False):
            deleted += 1
    return deleted


def _with_defaults(target: Any, method: str, *given: Any) -> Any:
    """`target.method(*given, <the rest at their Scala defaults>)`: Delta's Scala methods take defaults
    that differ between releases, which Py4J cannot fill in; the overload with the most parameters
    whose missing ones all have defaults is called, each from `method$default$N`."""
    arity = _default_arity(target.getClass(), method, len(given))
    rest = [getattr(target, f"{method}$default${i}")() for i in range(len(given) + 1, arity + 1)]
    return getattr(target, method)(*given, *rest)


_ARITIES: dict[tuple[str, str, int], int] = {}


def _default_arity(cls: Any, method: str, given: int) -> int:
    """The arity `_with_defaults` calls, found once per class and method, from the class's methods'
    signatures read as one text (a Py4J round trip per method cost 1.3 s of a `dsr` process)."""
    key = (str(cls.getName()), method, given)
    if key not in _ARITIES:
        # "Array(public … a.b.C.name(int,scala.Option), …)": erased types, no space within a parameter list
        signatures = str(JavaClass("scala.runtime.ScalaRunTime", cls._gateway_client).stringOf(cls.getMethods()))
        methods = [(name, 0 if not params else params.count(",") + 1)
                   for name, params in re.findall(r"\.([\w$]+)\(([^)]*)\)", signatures)]
        names = {name for name, _ in methods}
        arities = sorted({n for name, n in methods if name == method}, reverse=True)
        _ARITIES[key] = next(n for n in arities if n >= given
                             and all(f"{method}$default${i}" in names for i in range(given + 1, n + 1)))
    return _ARITIES[key]


def _scala_keys(scala_map: Any) -> list[Any]:
    keys, out = scala_map.keys().iterator(), []
    while keys.hasNext():
        out.append(keys.next())
    return out
