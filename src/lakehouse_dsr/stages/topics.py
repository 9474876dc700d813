"""Topics: an erasure is not complete while a Kafka topic still holds the person's records.

For each erase batch, every topic of the data map (`topics:`) is settled by its own configuration,
read from the broker (lake/kafka.py):
- **compacted** (`cleanup.policy` has `compact`): a tombstone is produced for the record key of every
  latest record (per partition and key) whose value names a subject of the batch; compaction then
  removes every record of those keys. Older records of a key whose latest record names someone else
  are left to compaction (a tombstone there would delete the other person's record);
- **deleting** (`delete`): nothing can be removed early; `retention.ms` after the subject's last
  record there, the broker deletes it.
Then the topic is read again from its earliest offset and each request's subject is looked for by
keyed hash (as a table is verified): none found proves the topic. Records still there keep the
request open, until a later run finds them gone, with a reason naming the topic, its settings and the
moment they are guaranteed gone (`TopicConfig.gone_by`) compared with the request's due date, or
that nothing in the topic's configuration ever removes them. Where the data map accepts the topic's
retention (`accept_retention:`), the request completes and its evidence says what stays and until when.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..datamap import TopicMapping
from ..lake.kafka import Cluster, TopicConfig
from .verify import key_values, matched


@dataclass(frozen=True)
class Found:
    """A subject's records left in a topic: how many, and when the last was written."""

    records: int
    last_written: datetime


@dataclass
class TopicSettlement:
    """What a run did to a topic and what reading it back found, per request (no identifiers)."""

    topic: str
    config: TopicConfig
    accepted: str | None  # the data map's accept_retention
    records_read: int = 0  # records the proof read (earliest to latest offset)
    tombstones: int = 0  # record keys tombstoned by this run
    tombstoned_at: datetime | None = None
    settled_at: datetime | None = None  # when the run read the topic's latest records (compacted topics)
    tombstones_by_request: dict[str, int] = field(default_factory=dict)
    found: dict[str, Found] = field(default_factory=dict)  # request id -> its subject's records left
    seconds: float = 0.0

    def singles_out(self, request_id: str) -> bool:
        """Whether the request's part differs from a request with nothing in the topic."""
        return request_id in self.found or request_id in self.tombstones_by_request

    def gone_by(self, request_id: str) -> datetime | None:
        # On a compacted topic every record of the subject is superseded by then: by our tombstone, or
        # (a key now another's) by that key's later record, written before the run read it.
        found = self.found[request_id]
        return self.config.gone_by(found.last_written, self.tombstoned_at if request_id in self.tombstones_by_request
                                   else self.settled_at)

    def reason(self, request_id: str, due: date | None) -> str | None:
        """Why the topic keeps `request_id` open, or None: nothing of its subject left, or what is left
        is accepted (`accept_retention`)."""
        if request_id not in self.found or self.accepted:
            return None
        found, by = self.found[request_id], self.gone_by(request_id)
        what = f"topic {self.topic} ({self.config.describe()}) still holds {found.records} record(s) of the subject"
        if by is None:
            return f"{what}, and nothing in its configuration removes them"
        when = f"guaranteed gone by {by.isoformat(timespec='seconds')}"
        if due is not None and by.date() > due:
            return f"{what}, {when}: after the request's due date {due.isoformat()}"
        return f"{what}, {when}; a run after that proves them gone"

    def evidence(self, request_id: str) -> dict:
        """The topic's part of a request's evidence: what was done, what the earliest-offset read found."""
        found = self.found.get(request_id)
        by = self.gone_by(request_id) if found else None
        entry = {"cleanup_policy": self.config.policy, "retention_ms": self.config.retention_ms,
                 "action": "tombstone" if self.config.compacted else "retention",
                 "tombstones": self.tombstones_by_request.get(request_id, 0),
                 "records_left": found.records if found else 0, "records_read": self.records_read,
                 "passed": found is None,
                 "gone_by": by.isoformat(timespec="seconds") if by else None,
                 "method": "keyed hash (HMAC-SHA256) of each record's key field, compared with the request's stored "
                           "hashes, in every record from the earliest offset of each partition"}
        if self.accepted and found:
            entry["accepted"] = self.accepted
        return entry

    def as_dict(self) -> dict:
        """The run report's entry: counts and settings only."""
        return {"cleanup_policy": self.config.policy, "retention_ms": self.config.retention_ms,
                "max_compaction_lag_ms": self.config.max_compaction_lag_ms, "partitions": self.config.partitions,
                "records_read": self.records_read, "tombstones": self.tombstones,
                "requests_found": len(self.found), "records_left": sum(f.records for f in self.found.values()),
                "accepted": self.accepted, "seconds": round(self.seconds, 3)}


def _fields(records: DataFrame, topic: TopicMapping, carry: list[str]) -> DataFrame:
    """(dsr_field, carry...): each record's key field, read from its JSON value by the field's path
    (validated names: no value enters the plan); NULL for a tombstone or a value without the field."""
    return records.select(F.get_json_object(F.col("value").cast("string"), "$." + topic.field).alias("dsr_field"),
                          *carry)


def _named(fields: DataFrame, topic: TopicMapping, hashes: DataFrame, keys: dict[str, bytes], carry: list[str]
           ) -> DataFrame:
    """(request_id, carry...) of each record of `fields` (`_fields`) whose key field hashes to one of
    `hashes` (request_id, key_type, key_hash[, key_id]): one HMAC per record and key in use."""
    values = key_values(fields, [topic.group], [F.col("dsr_field")], carry)
    return matched(values, hashes, keys).select("request_id", *carry)


def _read(spark: SparkSession, cluster: Cluster, name: str, topic: TopicMapping, compacted: bool) -> DataFrame:
    """(dsr_field, timestamp, and where `compacted` partition, key, offset) of every record the topic
    holds now, read once and kept in Spark (local checkpoint) for the counts and matches that follow:
    an observed count would be lost where Spark prunes a plan whose join finds nothing."""
    carry = ["timestamp", *(["partition", "key", "offset"] if compacted else [])]
    return _fields(cluster.read(spark, name), topic, carry).localCheckpoint()


def _latest(records: DataFrame) -> DataFrame:
    """The latest record of each record key per partition: the one compaction keeps."""
    last = records.groupBy("partition", "key").agg(F.max("offset").alias("dsr_last"))
    return records.join(last, ["partition", "key"]).where(F.col("offset") == F.col("dsr_last")).drop("dsr_last")


def settle(spark: SparkSession, cluster: Cluster, name: str, topic: TopicMapping, hashes: DataFrame,
           keys: dict[str, bytes]) -> TopicSettlement:
    """Settle topic `name` for the requests of `hashes` (the ledger's stored hashes, verify.stored_hashes;
    `keys`: the keys that made them) and prove it. Cost: two admin requests; the topic is read once
    (each record's key field and time, and on a compacted topic its partition, key and offset, kept
    in Spark), and a compacted topic that took tombstones is read again, whole, for the proof; the
    matches found (the batch's people) are counted in Spark, one row per request reaching the driver."""
    started = time.perf_counter()
    config = cluster.config(name)
    result = TopicSettlement(name, config, topic.accept_retention)
    fields = _read(spark, cluster, name, topic, config.compacted)
    if config.compacted:
        result.settled_at = datetime.now(UTC)
        doomed = _named(_latest(fields), topic, hashes, keys, ["partition", "key"]).localCheckpoint()
        per_request = {r.request_id: int(r.n) for r in doomed.groupBy("request_id").agg(
            F.countDistinct("partition", "key").alias("n")).collect()}
        if per_request:
            result.tombstoned_at = datetime.now(UTC)
            cluster.tombstone(doomed.select("partition", "key").distinct(), name)
            result.tombstones_by_request = per_request
            result.tombstones = doomed.select("partition", "key").distinct().count()
            fields = _read(spark, cluster, name, topic, False)  # the proof: the topic as the tombstones left it
    result.records_read = fields.count()
    left = _named(fields, topic, hashes, keys, ["timestamp"]).groupBy("request_id").agg(
        F.count(F.lit(1)).alias("n"), F.unix_micros(F.max("timestamp")).alias("last"))
    result.found = {r.request_id: Found(int(r.n), datetime.fromtimestamp(r.last / 1e6, UTC)) for r in left.collect()}
    result.seconds = time.perf_counter() - started
    return result
