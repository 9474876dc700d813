"""What the stages of one run share, and how their time and I/O are counted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from ..config import Settings
from ..evidence.report import RunReport
from ..inventory.check import KeyTypes
from ..lake import frames, indriver
from ..lake.lakehouse import Lake
from ..lake.metrics import IoCost, StageMeter, beside
from ..ledger.ledger import Ledger
from ..progress import Progress
from ..stages import identity
from ..vault import vault
from .work import RequestRows

T = TypeVar("T")


@contextmanager
def timed(report: RunReport, stage: str, spark: SparkSession | None = None, beside_the_run: str | None = None
          ) -> Iterator[None]:
    """Add the block's seconds, and with Spark its I/O (rows, bytes read/written, shuffled), to the stage's
    totals. `beside_the_run`: the block runs on a thread beside the run's other stages, doing this
    (with Spark): its jobs are described so (lake/metrics.py's `beside`), and only their I/O is counted."""
    with beside(spark, beside_the_run) if spark is not None and beside_the_run else nullcontext() as jobs:
        meter = StageMeter(spark, jobs) if spark is not None else None
        mark = meter.mark() if meter else None
        start = time.perf_counter()
        try:
            yield
        finally:
            report.seconds[stage] = round(report.seconds.get(stage, 0.0) + time.perf_counter() - start, 3)
            if meter and mark is not None:
                report.cost[stage] = IoCost(**report.cost.get(stage, {})).add(meter.since(mark)).as_dict()


def each_table(parallel_tables: int, progress: Progress, stage: str, tables: list[str], work: Callable[[str], T]
               ) -> dict[str, T]:
    """`work(table)` for every table, `parallel_tables` (`run.parallel_tables`) at a time on threads
    sharing the session: tables are independent, so their small Spark jobs, commits and procedure calls
    overlap instead of queueing (Spark schedules concurrent jobs side by side). Results in the order of
    `tables`."""
    if not tables:
        return {}
    progress.stage(stage, len(tables))
    done: dict[str, T] = {}
    with ThreadPoolExecutor(min(parallel_tables, len(tables)), thread_name_prefix="dsr-table") as pool:
        futures = {pool.submit(work, table): table for table in tables}
        for future in as_completed(futures):
            progress.step(futures[future])
            done[futures[future]] = future.result()
    progress.done()
    return {table: done[table] for table in tables}


@dataclass(frozen=True)
class Context:
    """One run's session, settings, lake (lake/iceberg.py), ledger, the catalog's key types (checked
    before anything changed), the vault's keys when a table is pseudonymized, the report whose meters count each
    stage, and the progress display."""

    spark: SparkSession
    settings: Settings
    ledger: Ledger
    key_types: KeyTypes
    report: RunReport
    progress: Progress
    vault_keys: vault.Keys | None
    requests: RequestRows  # the run's access and erase requests, by id
    rows: pa.Table | None = None  # `requests` as batch_rows gives them, built once for the resolution and key sets
    _resolved: list[DataFrame] = field(default_factory=list, compare=False, repr=False)
    _subsets: dict[frozenset[str], DataFrame] = field(default_factory=dict, compare=False, repr=False)

    @property
    def run_id(self) -> str:
        return self.report.run_id

    @cached_property
    def lake(self) -> Lake:
        """The run's lake: its catalog on its session, with the erase retries."""
        return Lake.of(self.spark, self.settings)

    @cached_property
    def vault_table(self) -> vault.VaultTable:
        """The vault's table in the run's lake (read by the export and the shred stages)."""
        return vault.VaultTable(self.lake, vault.table_name(self.settings))

    def timed(self, stage: str, beside_the_run: str | None = None) -> AbstractContextManager[None]:
        """`timed` for this run's report, with Spark's I/O."""
        return timed(self.report, stage, self.spark, beside_the_run)

    def each_table(self, stage: str, tables: list[str], work: Callable[[str], T]) -> dict[str, T]:
        return each_table(self.settings.run.parallel_tables, self.progress, stage, tables, work)

    def identifiers(self, request_ids: list[str]) -> DataFrame:
        """(request_id, key_type, key_value) of these requests (stages/identity.py). Every request of the
        run is resolved once (`resolved`: by the run while it checks the catalog, or by the first call),
        so the export and the erasure share one Spark job (on a small lake, each job's fixed cost is
        what a run waits for); later calls select from it."""
        if not self._resolved:
            self._resolved.append(resolved(self.spark, self.settings, self.report, self.batch_rows()))
        keys, wanted = self._resolved[0], frozenset(request_ids)
        if wanted == set(self.requests):
            return keys
        # The kept rows' subset, kept too (a join here would add a stage to every job that reads them),
        # once per subset: the erasure and the export each ask for theirs more than once.
        if wanted not in self._subsets:
            self._subsets[wanted] = indriver.kept_where(keys, "request_id", sorted(wanted)) if indriver.is_local(
                keys) else keys.join(frames.rows_frame(self.spark, pa.table({"request_id": sorted(wanted)}), 0),
                                     "request_id", "left_semi")
        return self._subsets[wanted]

    def batch(self, requests: RequestRows) -> DataFrame:
        return batch(self.spark, batch_rows(requests), self.settings.erase.in_driver_max_requests)

    def batch_rows(self, request_ids: list[str] | None = None) -> pa.Table:
        """`batch_rows` of the run's requests (`rows`, built once), or of those of `request_ids` (sorted,
        as the rows are)."""
        rows = self.rows if self.rows is not None else batch_rows(self.requests)
        if request_ids is None:
            return rows
        wanted = pa.array(request_ids, pa.string())
        if rows.column("request_id").combine_chunks().equals(wanted):  # all of them (a million: 0.1 s, a filter 0.5)
            return rows
        return rows.filter(pc.is_in(rows.column("request_id"), wanted))


def batch_rows(requests: RequestRows) -> pa.Table:
    """(request_id, subject_id, regulation) of a batch as Arrow, by request id, taken from the ledger's
    read of its requests. Cost: a sort in Arrow."""
    return requests.table.select(["request_id", "subject_id", "regulation"]).sort_by("request_id").cast(
        pa.schema([("request_id", pa.string()), ("subject_id", pa.string()), ("regulation", pa.string())]))


def batch(spark: SparkSession, rows: pa.Table, in_driver_max: int) -> DataFrame:
    """A batch's `batch_rows` as a DataFrame held in the driver's JVM, or, beyond `in_driver_max`
    requests, as Arrow batches Spark reads (lake/frames.py): identifiers travel as data, never as
    SQL text."""
    return frames.rows_frame(spark, rows, in_driver_max)


def resolved(spark: SparkSession, settings: Settings, report: RunReport, rows: pa.Table) -> DataFrame:
    """The requests' identifiers (stages/identity.py), what `Context.identifiers` first resolves, for
    a thread that resolves them beside the run's other work: its jobs are described so
    (lake/metrics.py's `beside`) and timed as the `resolve` stage."""
    with timed(report, "resolve", spark, beside_the_run="resolve identifiers"):
        return identity.resolve(Lake.of(spark, settings), settings.datamap,
                                batch(spark, rows, settings.erase.in_driver_max_requests))
