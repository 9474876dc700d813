"""The lake as the engine sees it: one Iceberg catalog and the data map's Delta tables, reached
through one SparkSession; `lake.table(name)` is the table's handle, whichever its format."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameWriterV2, SparkSession

from ..config import CatalogSettings, EraseSettings, delta_quoted
from ..datamap import sql_literal
from ..exceptions import DataMapError, first_line
from .bridge import jclass
from .delta import DeltaTable, mark_commits
from .iceberg import IcebergTable
from .spark import require_classic
from .table import CommitRetries, TableHandle, with_conflict_retries

T = TypeVar("T")


class LakeSettings(Protocol):
    """The sections of the settings a Lake is made from (`Settings` has them)."""

    @property
    def catalog(self) -> CatalogSettings: ...

    @property
    def erase(self) -> EraseSettings: ...

    def delta_tables(self) -> dict[str, str]: ...

    def delta_named(self) -> list[str]: ...

    def table(self, name: str) -> str: ...


_COPY_ON_WRITE = {"format-version": "2", "write.delete.mode": "copy-on-write", "write.update.mode": "copy-on-write",
                  "write.merge.mode": "copy-on-write"}


@dataclass(frozen=True)
class Lake:
    """The lake as the engine sees it: one Iceberg catalog and the Delta tables of the data map,
    reached through one SparkSession.

    ```python
    lake = Lake(spark, "lakehouse")  # or Lake.of(spark, settings)
    events = lake.table("demo.events")
    events.current_snapshot(), events.refs()
    ```

    `catalog` is the catalog's settings (or just its name; the session must have it registered, e.g.
    by `lakehouse_dsr.attach`); `retries` govern operations retried after a commit conflict; `delta`
    maps the Delta tables' names to their locations (Settings.delta_tables): every other name is a
    table of the catalog. Immutable, and safe to share between threads that share the session.
    """

    spark: SparkSession
    catalog: CatalogSettings
    retries: CommitRetries
    delta: Mapping[str, str] = field(default_factory=dict)

    def __init__(self, spark: SparkSession, catalog: CatalogSettings | str | None = None,
                 retries: CommitRetries | None = None, delta: Mapping[str, str] | None = None) -> None:
        object.__setattr__(self, "spark", spark)
        if catalog is None:
            catalog = CatalogSettings()
        elif isinstance(catalog, str):  # validated: the name is spelled into procedure calls
            catalog = CatalogSettings(name=catalog)
        object.__setattr__(self, "catalog", catalog)
        object.__setattr__(self, "retries", retries or CommitRetries())
        object.__setattr__(self, "delta", MappingProxyType(dict(delta or {})))
        if self.delta:
            mark_commits(spark)

    @classmethod
    def of(cls, spark: SparkSession, settings: LakeSettings) -> Lake:
        """The lake of `settings` (its catalog, Delta tables and erase retries) on `spark`. A Delta
        table the data map names in a metastore (`delta.catalog`) is found at the location the
        metastore records (DESCRIBE DETAIL: metadata only); DataMapError when it has no such table,
        SparkConnectError when `spark` is a Spark Connect session."""
        require_classic(spark)
        named = {name: _metastore_location(spark, settings.table(name), name) for name in settings.delta_named()}
        return cls(spark, settings.catalog, CommitRetries.of(settings.erase), {**settings.delta_tables(), **named})

    @property
    def catalog_name(self) -> str:
        return self.catalog.name

    def table(self, name: str) -> TableHandle:
        """The handle of table `name` (`namespace.table`). Nothing is loaded until an operation runs."""
        if name in self.delta:
            return DeltaTable(self, name, self.delta[name])
        return IcebergTable(self, name)

    def iceberg(self, name: str) -> IcebergTable:
        """The handle of an Iceberg table of the catalog (the engine's own tables: shares, the vault)."""
        return IcebergTable(self, name)

    def replace_own_table(self, name: str, rows: DataFrame) -> None:
        """Create, or replace, one of the engine's own tables (a share) from `rows` in one commit: an
        Iceberg table of the catalog (its namespace created first) whose deletes, updates and merges
        rewrite files, so rows taken out leave no delete file behind. The old content stays in its
        history until a purge. Writes `rows` once."""
        self._iceberg_writer(name, rows, _COPY_ON_WRITE).createOrReplace()

    def create_table(self, name: str, rows: DataFrame, properties: Mapping[str, str]) -> None:
        """Create table `name` from `rows` in one commit with `properties`: a Delta table where the lake
        maps `name` to a location (CREATE TABLE ... AS SELECT over a temporary view: no value of `rows`
        in SQL text or in Delta's log), else an Iceberg table (format v2) of the catalog, its namespace
        created first. Writes `rows` once; fails if the table exists."""
        if name in self.delta:
            view = f"dsr_new_{uuid.uuid4().hex}"
            rows.createOrReplaceTempView(view)
            pairs = ", ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in properties.items())
            try:
                self.spark.sql(f"CREATE TABLE {self.quoted(name)} USING delta "
                               f"{f'TBLPROPERTIES ({pairs}) ' if pairs else ''}AS SELECT * FROM {view}")
            finally:
                self.spark.catalog.dropTempView(view)
            return
        self._iceberg_writer(name, rows, {"format-version": "2", **properties}).create()

    def _iceberg_writer(self, name: str, rows: DataFrame, properties: Mapping[str, str]) -> DataFrameWriterV2:
        """A writer of `rows` into Iceberg table `name` of the catalog with `properties`, its namespace
        created first."""
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {self.quoted_namespace(name.split('.')[0])}")
        writer = rows.writeTo(self.catalog.quoted(name)).using("iceberg")
        for prop, value in properties.items():
            writer = writer.tableProperty(prop, value)
        return writer

    def quoted(self, name: str) -> str:
        """Fully qualified, quoted name of a table given as `namespace.table`, for SQL text."""
        return delta_quoted(self.delta[name]) if name in self.delta else self.catalog.quoted(name)

    def quoted_namespace(self, namespace: str) -> str:
        """Fully qualified, quoted name of a namespace of this catalog, for SQL text."""
        return self.catalog.quoted(namespace)

    def with_conflict_retries(self, what: str, operation: Callable[[], T]) -> tuple[T, int]:
        """`with_conflict_retries` with this lake's retries."""
        return with_conflict_retries(self.retries, what, operation)

    def _actions(self):
        return jclass(self.spark, "org.apache.iceberg.spark.actions.SparkActions").get(self.spark._jsparkSession)


def _metastore_location(spark: SparkSession, quoted: str, name: str) -> str:
    """Where the metastore's Delta table `quoted` lives (DataMapError when it has none such)."""
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {quoted}").select("format", "location").first()
    except AnalysisException as exc:
        raise DataMapError(f"table {name}: no table {quoted} in the metastore ({first_line(exc)})") from None
    if detail is None or detail.format != "delta":
        raise DataMapError(f"table {name}: {quoted} is not a Delta table (format: delta says it is)")
    return str(detail.location)
