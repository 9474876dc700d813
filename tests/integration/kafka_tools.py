"""The tests' own Kafka client (confluent-kafka, not the engine's code): topics, records, and an
independent consumer that reads a topic from its earliest offset."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int = 1, **config: str) -> None:
    """A topic with `config` (dots written as underscores: retention_ms=...)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, 1, config={k.replace("_", "."): str(v) for k, v in config.items()})
    admin.create_topics([topic])[name].result(30)


def alter_topic(bootstrap: str, name: str, **config: str) -> None:
    """Set `config` on a topic (incrementally: the others stay)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k.replace("_", "."), str(v), incremental_operation=AlterConfigOpType.SET)
               for k, v in config.items()]
    resource = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(30)


def produce(bootstrap: str, topic: str, records: list[tuple[str | None, dict | None]]) -> None:
    """(key, JSON value; None: a tombstone) records, in order, acknowledged by the broker."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=None if key is None else key.encode(),
                         value=None if value is None else json.dumps(value).encode())
    assert producer.flush(30) == 0


def consume_all(bootstrap: str, topic: str, partitions: int = 1) -> list[tuple[str | None, dict | None]]:
    """Every record the topic holds now, from the earliest offset to the end of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        records, deadline = [], time.monotonic() + 60
        positions = {p: low for p, (low, _) in ends.items()}
        while any(positions[p] < high for p, (_, high) in ends.items()):
            assert time.monotonic() < deadline, "the topic could not be read to its end"
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            positions[message.partition()] = message.offset() + 1
            key, value = message.key(), message.value()
            records.append((key.decode() if key is not None else None,
                            json.loads(value) if value is not None else None))
        return records
    finally:
        consumer.close()


def wait_for(condition, what: str, timeout: float = 90.0) -> None:
    """Poll `condition()` until true (the broker's retention and compaction run in the background)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)
