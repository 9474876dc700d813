"""What a stage of work cost: Spark's own per-stage I/O counters, summed over a span of work, plus
what the driver read and wrote itself (lake/indriver.py).

Reads the driver's status store (the data behind the Spark UI, kept even with the UI off), so
the numbers are Spark's: rows and bytes read from files, written to files, and shuffled. The
store keeps the last `spark.ui.retainedStages` stages (default 1000); a span that ran more
reports `truncated`. Small tables read and rewritten in the driver count in the same rows and
bytes (bytes read: the sizes of the files opened), and in `driver_files`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from pyspark.sql import Row, SparkSession

from .bridge import helper

# How the jobs of work run on a thread beside the run's other stages are described (Spark's UI shows it).
BESIDE = "dsr, beside the run: "


@contextmanager
def beside(spark: SparkSession, what: str) -> Iterator[str]:
    """Describe the jobs this thread starts in the block `BESIDE + what` (returned): stage meters of
    other work leave them out, a meter made with `only=` that description counts only them."""
    sc = spark.sparkContext
    description = BESIDE + what
    sc.setLocalProperty("spark.job.description", description)  # this thread's jobs only
    try:
        yield description
    finally:
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]  # None removes it


@dataclass
class IoCost:
    stages: int = 0
    tasks: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    shuffle_bytes: int = 0
    driver_files: int = 0  # files the driver read itself, without a Spark job
    truncated: bool = False

    def add(self, other: IoCost) -> IoCost:
        summed = {k: v + getattr(other, k) for k, v in asdict(self).items() if k != "truncated"}
        return IoCost(**summed, truncated=self.truncated or other.truncated)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Mark:
    stage: int  # the newest stage so far (-1 before the first)
    driver: tuple[int, ...]  # InDriver's counters then


class StageMeter:
    """Marks a point in the application's stage sequence and sums the stages run after it: those of
    the jobs described `only` (`beside`), or without it every stage but those run beside the run.

    Cost: waits for Spark's listener bus to drain, then one JVM call per new stage.
    """

    def __init__(self, spark: SparkSession, only: str | None = None):
        self._spark = spark
        self._sc = spark.sparkContext._jsc.sc()
        self._only = only

    def _stages(self):
        self._sc.listenerBus().waitUntilEmpty()
        store = self._sc.statusStore()
        defaults = [getattr(store, f"stageList$default${i}")() for i in range(2, 6)]
        return store.stageList(None, *defaults).iterator()  # newest stage first

    def _driver(self) -> tuple[int, ...]:
        in_driver = helper(self._spark, "InDriver")  # none: the driver reads and writes no file
        return tuple(json.loads(in_driver.io())) if in_driver is not None else (0, 0, 0, 0, 0)

    def mark(self) -> Mark:
        """This point: the newest stage so far, and the driver's own counters."""
        stages = self._stages()
        return Mark(stages.next().stageId() if stages.hasNext() else -1, self._driver())

    def since(self, mark: Mark) -> IoCost:
        """Summed I/O of every stage attempt newer than `mark` (skipped stages count nothing), and of
        the driver's own reads and writes since."""
        files, rows_read, bytes_read, rows_written, bytes_written = (
            now - then for now, then in zip(self._driver(), mark.driver, strict=True))
        cost = IoCost(rows_read=rows_read, bytes_read=bytes_read, rows_written=rows_written,
                      bytes_written=bytes_written, driver_files=files)
        oldest = None
        stages = self._stages()
        while stages.hasNext():
            stage = stages.next()
            oldest = stage.stageId()
            if oldest <= mark.stage:
                break
            if stage.status().toString() == "SKIPPED" or not self._counts(stage):
                continue
            cost = cost.add(IoCost(
                1, stage.numTasks(), stage.inputRecords(), stage.inputBytes(), stage.outputRecords(),
                stage.outputBytes(), stage.shuffleReadBytes(),
            ))
        cost.truncated = oldest is not None and oldest > mark.stage + 1
        return cost

    def _counts(self, stage) -> bool:
        described = stage.description()
        description = described.get() if described.isDefined() else ""
        return description == self._only if self._only is not None else not description.startswith(BESIDE)


def observed(progress: Mapping, name: str, field: str = "rows") -> int:
    """Field `field` of the metrics a streaming micro-batch observed as `name` (`DataFrame.observe`),
    from its progress (0 where absent): Spark 3.5 gives them as dictionaries, Spark 4 as Rows."""
    found = (progress.get("observedMetrics") or {}).get(name)
    values = found.asDict() if isinstance(found, Row) else found or {}
    return int(values.get(field) or 0)
