"""What a stage of work cost: Spark's own per-stage I/O counters, summed over a span of work.

Reads the driver's status store (the data behind the Spark UI, kept even with the UI off), so
the numbers are Spark's: rows and bytes read from files, written to files, and shuffled. The
store keeps the last `spark.ui.retainedStages` stages (default 1000); a span that ran more
reports `truncated`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pyspark.sql import SparkSession


@dataclass
class IoCost:
    stages: int = 0
    tasks: int = 0
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    shuffle_bytes: int = 0
    truncated: bool = False

    def add(self, other: IoCost) -> IoCost:
        summed = {k: v + getattr(other, k) for k, v in asdict(self).items() if k != "truncated"}
        return IoCost(**summed, truncated=self.truncated or other.truncated)

    def as_dict(self) -> dict:
        return asdict(self)


class StageMeter:
    """Marks a point in the application's stage sequence and sums the stages run after it.

    Cost: waits for Spark's listener bus to drain, then one JVM call per new stage.
    """

    def __init__(self, spark: SparkSession):
        self._sc = spark.sparkContext._jsc.sc()

    def _stages(self):
        self._sc.listenerBus().waitUntilEmpty()
        store = self._sc.statusStore()
        defaults = [getattr(store, f"stageList$default${i}")() for i in range(2, 6)]
        return store.stageList(None, *defaults).iterator()  # newest stage first

    def mark(self) -> int:
        """The id of the newest stage so far (-1 before the first)."""
        stages = self._stages()
        return stages.next().stageId() if stages.hasNext() else -1

    def since(self, mark: int) -> IoCost:
        """Summed I/O of every stage attempt newer than `mark` (skipped stages count nothing)."""
        cost, oldest = IoCost(), None
        stages = self._stages()
        while stages.hasNext():
            stage = stages.next()
            oldest = stage.stageId()
            if oldest <= mark:
                break
            if stage.status().toString() == "SKIPPED":
                continue
            cost = cost.add(IoCost(
                1, stage.numTasks(), stage.inputRecords(), stage.inputBytes(), stage.outputRecords(),
                stage.outputBytes(), stage.shuffleReadBytes(),
            ))
        cost.truncated = oldest is not None and oldest > mark + 1
        return cost
