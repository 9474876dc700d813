"""The table-format seam: what the engine knows of a table, whatever its format.

A table is reached through a handle (`Lake.table`, lake/lakehouse.py): `IcebergTable` (lake/iceberg.py)
or `DeltaTable` (lake/delta.py), with the same operations as methods, much as pyiceberg's `Table`
and delta-rs's `DeltaTable` carry theirs; stages speak to `TableHandle` only. A handle's versions,
commits and costs come back as the neutral records below: `Snapshot` is a table version (an Iceberg
snapshot, a Delta version), `CommitStats` what one commit changed. What only one format can do is
a capability the handle declares (`Capabilities`), not a question of which format it is.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from ..config import EraseSettings
from ..exceptions import CommitConflictError
from .bridge import call, jclass

if TYPE_CHECKING:
    from .lakehouse import Lake
    from .skipping import Candidates

T = TypeVar("T")

# Exceptions that mean a concurrent commit invalidated a whole operation (each format retries plain
# appends itself): Iceberg's validation and commit failures, Delta's concurrent-modification family.
_CONFLICTS = ("org.apache.iceberg.exceptions.ValidationException",
              "org.apache.iceberg.exceptions.CommitFailedException",
              "io.delta.exceptions.Concurrent", "org.apache.spark.sql.delta.Concurrent",
              "io.delta.exceptions.MetadataChangedException", "io.delta.exceptions.ProtocolChangedException",
              "DELTA_CONCURRENT_")


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` says another writer's commit invalidated the operation (safe to run again)."""
    return any(name in str(exc) for name in _CONFLICTS)


@dataclass(frozen=True)
class CommitStats:
    """What one commit changed, in either format's terms: data files added and removed (rewritten),
    the bytes removed, rows added and removed where the format records them (None: not said),
    delete files or deletion vectors added, and the Spark application that made it (None: not
    recorded, or another engine)."""

    files_added: int = 0
    files_removed: int = 0
    bytes_removed: int = 0
    rows_added: int | None = None
    rows_removed: int | None = None
    delete_files_added: int = 0
    app_id: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """One version of a table: an Iceberg snapshot, or a Delta version (its number is the id and the
    sequence number; its parent the version before). `summary`: Iceberg's snapshot summary ({} for
    Delta); `stats`: the commit's changes in neutral terms; `operation`: append | overwrite | delete |
    replace (a commit that moves rows without changing them: compaction, a purge's rewrite, a
    metadata change)."""

    snapshot_id: int
    committed_ms: int
    summary: dict[str, str]
    parent_id: int | None = None
    operation: str | None = None
    sequence_number: int | None = None  # the commit's data sequence number (0 in Iceberg format v1)
    stats: CommitStats = field(default_factory=CommitStats)

    def counts(self) -> dict[str, int]:
        """The summary's numeric entries (`total-records`, `added-position-deletes`, ...)."""
        return {k: int(v) for k, v in self.summary.items() if v.lstrip("-").isdigit()}


@dataclass(frozen=True)
class Capabilities:
    """What a handle can do beyond the protocol every format offers.

    `file_rewrite`: replace named data files by rows the engine wrote, in one validated commit
    (Iceberg's overwrite with the staged rewrite; Delta's own transaction): the `rewrite_files`
    strategy (`FileRewriting`). `driver_files`: read and rewrite small tables in the driver, and write
    position deletes (Iceberg format v2): the in-driver rewrite, `delete_positions` and folded plans
    (`DriverRewriting`).
    `statement_modes`: Spark's DELETE, UPDATE and MERGE can be told to rewrite files instead of
    masking rows (`TableHandle.statements_in_mode`; Delta: else the table's own choice; Iceberg's
    follow the table's properties). `subquery_dml`: DELETE/UPDATE with an EXISTS subquery
    (open-source Delta refuses it: MERGE).
    `refs`: branches and tags. `commit_files`: the files one commit added, removed and attached
    deletes to are known (`TableHandle.commit_files`), for the content collateral check (else counts
    are checked)."""

    file_rewrite: bool
    driver_files: bool
    statement_modes: bool
    subquery_dml: bool
    refs: bool
    commit_files: bool


@dataclass(frozen=True)
class Ref:
    name: str
    kind: str  # BRANCH | TAG
    snapshot_id: int


@dataclass(frozen=True)
class CommitFiles:
    """The data files one commit changed, from its own manifests."""

    parent_id: int | None
    removed: frozenset[str]  # data files it removed (copy-on-write: rewritten)
    added: frozenset[str]  # data files it added
    added_rows: int | None  # their rows (the snapshot's summary; None when it does not say)
    deleted_from: frozenset[str]  # data files its new delete files or deletion vectors apply to


@dataclass(frozen=True)
class RewriteResult:
    data_files_rewritten: int
    data_files_added: int
    bytes_rewritten: int
    delete_files_removed: int
    # Iceberg: position delete files left dangling (they hold paths and positions, no values), where
    # Iceberg cannot rewrite them (IcebergTable.compact_deletes)
    dangling_deletes_kept: bool = False


@dataclass(frozen=True)
class ExpireResult:
    snapshots_expired: int
    files_deleted: int  # data and delete files (manifests and manifest lists not counted)


@dataclass(frozen=True)
class Commit:
    snapshot_id: int
    operation: str
    summary: dict[str, str]


@dataclass(frozen=True)
class CommitRetries:
    """How an operation a concurrent writer's commit invalidated is retried: at most `retries` more
    attempts, with exponential backoff from `backoff_seconds` (`erase.commit_retries`,
    `erase.retry_backoff_seconds`)."""

    retries: int = 4
    backoff_seconds: float = 1.0

    @classmethod
    def of(cls, erase: EraseSettings) -> CommitRetries:
        return cls(erase.commit_retries, erase.retry_backoff_seconds)



class TableHandle(Protocol):
    """The operations stages use, implemented once per format (IcebergTable, DeltaTable)."""

    @property
    def lake(self) -> Lake: ...

    @property
    def name(self) -> str: ...

    @property
    def spark(self) -> SparkSession: ...

    @property
    def quoted(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def location(self) -> str: ...

    def exists(self) -> bool: ...

    def append_stream(self, stream: DataStreamWriter) -> StreamingQuery: ...

    def refusal(self) -> str | None: ...

    def properties(self) -> dict[str, str]: ...

    def write_mode(self, operation: str) -> str: ...

    def current_snapshot(self) -> Snapshot | None: ...

    def current_snapshot_id(self) -> int | None: ...

    def history(self) -> list[Snapshot]: ...

    def read_at(self, snapshot_id: int | None) -> DataFrame: ...

    def read_appends(self, after_id: int, until_id: int) -> DataFrame: ...

    def read_changes(self, after_id: int | None, until_id: int) -> DataFrame: ...

    def live_rows(self, snapshot_id: int | None) -> int: ...

    def rows_after_commit(self, snapshot_id: int | None, rows_before: int) -> int: ...

    def own_commit_since(self, after_id: int | None, appends: bool = False) -> Snapshot | None: ...

    def commit_files(self, snapshot_id: int) -> CommitFiles: ...

    def commits_between(self, after_id: int | None, before_id: int) -> list[Commit] | None: ...

    def commits_since(self, after_id: int, until_id: int) -> list[Commit] | None: ...

    def descends_from(self, snapshot_id: int) -> bool: ...

    def own_line_since(self, after_id: int) -> bool: ...

    def refs(self) -> list[Ref]: ...

    def retained_files(self) -> tuple[list[str], set[str]]: ...

    def files_at(self, snapshot_id: int) -> list[str]: ...

    def files_not_within(self, column: str, prefix: str) -> list[str]: ...

    def read_raw(self, paths: list[str], schema: StructType) -> DataFrame: ...

    def file_sizes(self) -> DataFrame: ...

    def history_is_live(self) -> bool: ...

    def row_masks(self) -> int: ...

    def metadata_files(self) -> list[str]: ...

    def data_files_on_storage(self) -> list[str]: ...

    def compact_deletes(self, target_file_size_bytes: int) -> RewriteResult: ...

    def scrub_metadata(self) -> int: ...

    def expire_snapshots_before_current(self) -> ExpireResult: ...

    def remove_orphan_files(self, min_age_minutes: float) -> int: ...

    def cluster_by_key(self, key: str, target_file_size_bytes: int) -> tuple[int, int, int]: ...

    def statements_in_mode(self, mode: str) -> AbstractContextManager[None]: ...


class FileRewriting(TableHandle, Protocol):
    """A handle whose `capabilities.file_rewrite` holds: it replaces named data files by rows the
    engine wrote, in one validated commit (IcebergTable, DeltaTable)."""

    def rewritable(self) -> bool: ...

    def sorted_by_order(self) -> bool: ...

    def overwrite_files(self, files: Candidates, rows: DataFrame, *, redacting: bool = False,
                        branch: str | None = None, commit_if: Callable[[], bool] | None = None) -> bool: ...


class DriverRewriting(FileRewriting, Protocol):
    """A handle whose `capabilities.driver_files` holds: files written in the driver replace named
    data files, or position deletes are attached to them, in one validated commit (IcebergTable)."""

    def format_version(self) -> int: ...

    def replace_files(self, jtable: Any, old_files: Any, new_files: Any, read_snapshot_id: int,
                      conflict_filter: Any) -> None: ...

    def add_position_deletes(self, jtable: Any, delete_files: Any, data_locations: list[str], read_snapshot_id: int,
                             conflict_filter: Any) -> None: ...


class RefKeeping(DriverRewriting, Protocol):
    """A handle whose `capabilities.refs` holds: branches and tags that pin snapshots, made, moved and
    dropped, and files rewritten on a branch (IcebergTable)."""

    def drop_ref(self, ref: Ref) -> None: ...

    def create_branch(self, name: str, snapshot_id: int) -> None: ...

    def move_tag(self, tag: str, snapshot_id: int, drop_branch: str) -> None: ...


CHANGE_TYPE = "_change_type"  # read_changes' column: insert, delete (Delta's feed adds update_preimage/_postimage)


def changes_by_difference(before: DataFrame | None, after: DataFrame) -> DataFrame:
    """The rows of `after` not in `before` (insert) and of `before` not in `after` (delete), duplicates
    counted: a change feed computed from two versions' rows. Cost: both read whole, one shuffle."""
    if before is None:
        return after.withColumn(CHANGE_TYPE, F.lit("insert"))
    return (after.exceptAll(before).withColumn(CHANGE_TYPE, F.lit("insert"))
            .unionByName(before.exceptAll(after).withColumn(CHANGE_TYPE, F.lit("delete"))))


def listing(spark: SparkSession, location: str) -> list[tuple[str, int]]:
    """(path, modified ms) of every file below a location: one recursive listing of storage."""
    path = jclass(spark, "org.apache.hadoop.fs.Path")(location)
    return call(spark, "listFiles", path.getFileSystem(spark._jsc.hadoopConfiguration()), path)


def unreadable_parquet(spark: SparkSession, paths: list[str]) -> tuple[list[str], list[str]]:
    """(those of `paths` no reader can take as Parquet: torn by a write cut short, or failing their
    checksum; those gone since they were listed). Reads 12 bytes of each file (Bridge.java)."""
    if not paths:
        return [], []
    path = jclass(spark, "org.apache.hadoop.fs.Path")(paths[0])
    found = call(spark, "unreadableParquet", path.getFileSystem(spark._jsc.hadoopConfiguration()), paths)
    return found["torn"], found["gone"]


def parquet_files_under(spark: SparkSession, location: str) -> list[str]:
    """Every Parquet file below a location, referenced or not: one recursive listing of storage."""
    return [path for path, _ in listing(spark, location) if path.endswith(".parquet")]


def same_file(path: str) -> str:
    """One spelling per local file (`file:/x`, `file:///x` and `/x` name the same file)."""
    return re.sub(r"^file:/+", "/", path)


def only_current(current: Iterable[str], retained: Iterable[str], stored: Iterable[str]) -> bool:
    """Whether history (the files `retained` versions reference) and storage (the data files
    `stored` under the location) hold exactly the `current` version's files, however each spells a
    path: a scan of live data then reads the same rows a scan of either would."""
    files = {same_file(p) for p in current}
    return {same_file(p) for p in retained} == files and {same_file(p) for p in stored} == files


def type_holds(data_type: DataType, *kinds: type[DataType]) -> bool:
    """`data_type` is, or nests at any depth, one of `kinds` (e.g. MapType)."""
    if isinstance(data_type, kinds):
        return True
    if isinstance(data_type, ArrayType):
        return type_holds(data_type.elementType, *kinds)
    if isinstance(data_type, MapType):
        return type_holds(data_type.keyType, *kinds) or type_holds(data_type.valueType, *kinds)
    return isinstance(data_type, StructType) and any(type_holds(f.dataType, *kinds) for f in data_type.fields)


def read_columns_from_files(spark: SparkSession, paths: list[str] | str, schema: StructType, recursive: bool = False
                            ) -> DataFrame:
    """Read columns (`schema`: a pruned table schema, nested fields included) straight from Parquet
    files, bypassing Iceberg (so deleted rows are seen).

    Files without a column (delete files) yield NULLs. Reads only those columns' pages.
    """
    reader = spark.read.schema(schema)
    if recursive:
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.parquet")
    return reader.parquet(*([paths] if isinstance(paths, str) else paths))


def with_conflict_retries(retries: CommitRetries, what: str, operation: Callable[[], T]) -> tuple[T, int]:
    """Run `operation`, again after a commit conflict with another writer (exponential backoff with
    jitter, at most `retries.retries` more times); returns (its result, attempts made).

    Only for operations that are safe to repeat: each attempt reads the table afresh. Raises
    CommitConflictError when the retries are exhausted; other errors are not retried.
    """
    attempt = 1
    while True:
        try:
            return operation(), attempt
        except Exception as exc:
            if not is_conflict(exc):
                raise
            if attempt > retries.retries:
                raise CommitConflictError(
                    f"{what} conflicted with concurrent writers {attempt} times (erase.commit_retries = "
                    f"{retries.retries}); nothing was committed, the next run retries") from None
            time.sleep(retries.backoff_seconds * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
            attempt += 1
