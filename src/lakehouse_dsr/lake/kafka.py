"""Kafka topics as stores of personal data: the cluster's handle (`Cluster`), as a table format has one.

A topic keeps every record for its `retention.ms` (deleting topics) or the latest record per key for
ever (compacted topics); either way a person's events stay there after every table is clean. The
handle reads a topic's own configuration from the broker (admin client), reads the whole topic in
Spark (batch, earliest to latest offsets: records never pass through the driver) and produces
tombstones from Spark (null values for given record keys, to the partitions those keys live in).

```python
cluster = Cluster(settings.kafka)
config = cluster.config("clicks")          # cleanup.policy, retention.ms, max.compaction.lag.ms ...
records = cluster.read(spark, "clicks")    # partition, offset, timestamp, key, value
cluster.tombstone(records.where(...).select("partition", "key"), "clicks")
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import KafkaSettings
from ..exceptions import DataMapError, DsrError
from .catalyst import spark4

FOREVER = -1  # retention.ms that never deletes
UNBOUNDED = 2**63 - 1  # max.compaction.lag.ms's default: compaction is not bounded in time
_ADMIN_TIMEOUT_S = 30.0
_V2_READERS_OFF, _PROVIDER = "spark.sql.streaming.disabledV2MicroBatchReaders", \
    "org.apache.spark.sql.kafka010.KafkaSourceProvider"
_URL = re.compile(r"^kafka://(?P<servers>[^/\s,]+(,[^/\s,]+)*)/(?P<topic>[A-Za-z0-9._-]{1,249})\Z")


@dataclass(frozen=True)
class TopicConfig:
    """What a topic's own configuration says about how long a record stays in it."""

    name: str
    partitions: int
    cleanup_policy: frozenset[str]  # {"delete"}, {"compact"} or both
    retention_ms: int  # FOREVER: never deleted by time
    max_compaction_lag_ms: int  # UNBOUNDED: compaction may wait indefinitely
    delete_retention_ms: int  # how long a tombstone itself stays after compaction
    segment_ms: int  # a log segment is closed (so deletable) at most this long after its first record

    @property
    def policy(self) -> str:
        return ",".join(sorted(self.cleanup_policy))

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def deleting(self) -> bool:
        return "delete" in self.cleanup_policy

    def gone_by(self, last_written: datetime, superseded: datetime | None = None) -> datetime | None:
        """The latest moment the topic's own settings guarantee a record written at `last_written` is
        gone: by time retention (deleting topics: Kafka deletes whole segments, so `segment.ms`, which
        closes the record's segment, plus `retention.ms` after it), or by compaction once a later record
        of its key (a tombstone) was written at `superseded` (`max.compaction.lag.ms` after that: Kafka
        rolls the segment for it), whichever comes first; None when neither bounds it (retention.ms -1,
        compaction unbounded). The broker's retention check runs every
        `log.retention.check.interval.ms` (5 minutes by default) on top of this."""
        bounds = []
        if self.deleting and self.retention_ms != FOREVER:
            bounds.append(last_written + timedelta(milliseconds=self.segment_ms + self.retention_ms))
        if self.compacted and superseded is not None and self.max_compaction_lag_ms < UNBOUNDED:
            bounds.append(superseded + timedelta(milliseconds=self.max_compaction_lag_ms))
        return min(bounds) if bounds else None

    def describe(self) -> str:
        """The settings that decide how long records stay, in Kafka's own words."""
        parts = [f"cleanup.policy={self.policy}"]
        if self.deleting:
            parts.append(f"retention.ms={self.retention_ms}" + (" (kept forever)" if self.retention_ms == FOREVER else
                                                                 f" ({_duration(self.retention_ms)})"))
        if self.compacted:
            parts.append("max.compaction.lag.ms " + ("unset (compaction not bounded in time)"
                                                     if self.max_compaction_lag_ms >= UNBOUNDED
                                                     else f"{self.max_compaction_lag_ms}"))
        return ", ".join(parts)


def _duration(ms: int) -> str:
    days, rest = divmod(ms / 1000, 86_400)
    return f"{int(days)} d" if days and not rest else f"{ms / 1000:g} s"


class Cluster:
    """The Kafka cluster of `kafka:` (bootstrap servers and client properties, as Kafka names them)."""

    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.servers = settings.bootstrap_servers

    @classmethod
    def at(cls, url: str, settings: KafkaSettings | None = None) -> tuple[Cluster, str]:
        """The cluster and topic of `kafka://HOST:PORT[,HOST:PORT...]/TOPIC`, with the client properties
        of `settings` (security, SASL...) beside the URL's servers. DsrError for a malformed URL."""
        match = _URL.match(url)
        if match is None:
            raise DsrError(f"{url!r} is not a Kafka source: write kafka://HOST:PORT/TOPIC "
                           "(several servers: kafka://HOST:PORT,HOST:PORT/TOPIC)")
        servers = match["servers"]
        found = settings.model_copy(update={"bootstrap_servers": servers}) if settings is not None else \
            KafkaSettings(bootstrap_servers=servers)
        return cls(found), match["topic"]

    def _admin(self) -> AdminClient:
        return AdminClient(dict[str, str | int | float | bool](self.settings.admin_properties()))

    def config(self, topic: str) -> TopicConfig:
        """The topic's partitions and retention settings, from the broker. Cost: two admin requests.
        DataMapError when the cluster has no such topic; DsrError when the cluster cannot be reached."""
        try:
            admin = self._admin()
            listed = admin.list_topics(topic, timeout=_ADMIN_TIMEOUT_S).topics.get(topic)
            if listed is None or listed.error is not None:
                raise DataMapError(f"topic {topic} of the data map is not on the Kafka cluster "
                                   f"{self.servers}")
            resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
            entries = admin.describe_configs([resource])[resource].result(timeout=_ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise DsrError(f"Kafka cluster {self.servers}: {exc.args[0]}") from None
        value = lambda name: entries[name].value  # noqa: E731
        policy = frozenset(value("cleanup.policy").replace(" ", "").split(","))
        return TopicConfig(topic, len(listed.partitions), policy, int(value("retention.ms")),
                           int(value("max.compaction.lag.ms")), int(value("delete.retention.ms")),
                           int(value("segment.ms")))

    def check(self, topics: list[str]) -> None:
        """DataMapError naming the first of `topics` the cluster lacks (DsrError: unreachable). Cost:
        one metadata request."""
        try:
            listed = self._admin().list_topics(timeout=_ADMIN_TIMEOUT_S).topics
        except KafkaException as exc:
            raise DsrError(f"Kafka cluster {self.servers}: {exc.args[0]}") from None
        for topic in topics:
            if topic not in listed:
                raise DataMapError(f"topic {topic} of the data map is not on the Kafka cluster "
                                   f"{self.servers}")

    def spark_options(self) -> dict[str, str]:
        """The client properties as Spark's Kafka connector takes them (`kafka.` before each)."""
        return {f"kafka.{name}": value for name, value in self.settings.spark_properties().items()}

    def stream(self, spark: SparkSession, topic: str, starting_offsets: str = "earliest",
               options: dict[str, str] | None = None) -> DataFrame:
        """The topic as a streaming DataFrame of its records (partition, offset, timestamp, key, value),
        read from `starting_offsets` (earliest, latest or Spark's per-partition JSON) on a query's first
        start and from its checkpoint's offsets afterwards; `options`: Spark's Kafka source options
        (maxOffsetsPerTrigger, ...).

        On Spark 4.1 the session's Kafka streams are set to Spark's first (V1) Kafka source: the V2
        source of the connector 4.1.1 (the newest on Maven Central for 4.1) fails a query restarted
        on a micro-batch its checkpoint had planned but not committed (SPARK-55271, a null in its
        progress metrics: fixed after 4.1.1), which is the restart after a crash mid-batch."""
        if spark4(spark):
            spark.conf.set(_V2_READERS_OFF, _PROVIDER)
        return (spark.readStream.format("kafka").options(**self.spark_options()).option("subscribe", topic)
                .option("startingOffsets", starting_offsets).options(**(options or {})).load()
                .select("partition", "offset", "timestamp", "key", "value"))

    def read(self, spark: SparkSession, topic: str) -> DataFrame:
        """(partition, offset, timestamp, key, value) of every record the topic holds now, from the
        earliest offset of each partition to the latest, as a Spark batch read (one task per
        partition; nothing reaches the driver). Cost: the whole topic is read once per action."""
        return (spark.read.format("kafka").options(**self.spark_options())
                .option("subscribe", topic).option("startingOffsets", "earliest").option("endingOffsets", "latest")
                .option("failOnDataLoss", "false")  # retention may remove records while the read plans
                .load().select("partition", "offset", "timestamp", "key", "value"))

    def tombstone(self, records: DataFrame, topic: str) -> None:
        """Produce a tombstone (a null value) for the record key of each row of `records` (partition,
        key), to that partition: compaction then removes every record of the key. Written by Spark's
        Kafka sink, so the keys never reach the driver. Cost: one pass over `records`."""
        (records.select("partition", "key", F.lit(None).cast("binary").alias("value"))
         .write.format("kafka").options(**self.spark_options()).option("topic", topic).save())
