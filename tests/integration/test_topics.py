"""Kafka topics as stores of the person: an erase request is settled in every mapped topic, by the
topic's own cleanup policy, and proven by reading the topic back from its earliest offset.

A real broker (Kafka 4.1, KRaft, lake/broker.py); an independent consumer (confluent-kafka, the tests'
own code in kafka_tools.py) confirms what the engine reports; tables are read by pyiceberg / delta-rs.
"""

from __future__ import annotations

import json

import pytest

from helpers import datamap_dict, live_rows, values_of
from lakehouse_dsr.config import KafkaSettings
from lakehouse_dsr.datamap import DataMap
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

from .kafka_tools import alter_topic, consume_all, create_topic, produce, wait_for

FAST_COMPACTION = {"segment_ms": 200, "min_cleanable_dirty_ratio": "0.01", "delete_retention_ms": 200,
                   "min_compaction_lag_ms": 0}


def with_topics(settings, bootstrap: str, **topics: dict):
    """`settings` with the cluster and these topics in the data map."""
    datamap = DataMap.model_validate({**datamap_dict(settings.datamap), "topics": topics})
    return settings.replace(kafka=KafkaSettings(bootstrap_servers=bootstrap), datamap=datamap)


def people(spark, settings, n: int) -> list[str]:
    return [r.user_id for r in spark.table(settings.table("demo.users")).orderBy("user_id").limit(n).collect()]


def naming(records, person: str) -> list:
    """Live records (not tombstones) whose value names `person`."""
    return [(k, v) for k, v in records if v is not None and v.get("user_id") == person]


def test_a_compacted_topic_is_tombstoned_and_proven(spark, new_lakehouse, kafka_broker):
    base = new_lakehouse()
    gone, stays, other = people(spark, base, 3)
    bootstrap = kafka_broker.bootstrap
    # Compaction held back for the first run (an hour's segments), so its proof must find the records.
    create_topic(bootstrap, "profiles", cleanup_policy="compact", segment_ms=3_600_000,
                 max_compaction_lag_ms=7_200_000, min_cleanable_dirty_ratio="0.01")
    produce(bootstrap, "profiles", [
        (f"acct-{gone}", {"user_id": gone, "plan": "free"}),
        (f"acct-{gone}", {"user_id": gone, "plan": "paid"}),      # the latest of its key: tombstoned
        ("acct-shared", {"user_id": gone, "plan": "family"}),     # an older record of a key now someone else's
        ("acct-shared", {"user_id": other, "plan": "family"}),    # ... that key's latest: never tombstoned
        (f"acct-{stays}", {"user_id": stays, "plan": "free"}),
    ])
    settings = with_topics(base, bootstrap, profiles={"key": "user_id"})
    Ledger(settings).submit([RequestInput(gone, "erase")])

    first = run(spark, settings)
    [outcome] = first.requests
    assert outcome.status == "failed"
    assert "topic profiles (cleanup.policy=compact, max.compaction.lag.ms 7200000) still holds 3 record(s)" \
        in outcome.reason and "guaranteed gone by" in outcome.reason
    assert first.topics["profiles"]["tombstones"] == 1 and first.topics["profiles"]["records_left"] == 3
    proof = outcome.evidence["topics"]["profiles"]
    assert (proof["action"], proof["tombstones"], proof["records_left"], proof["passed"]) == ("tombstone", 1, 3, False)
    assert gone not in json.dumps(first.as_dict())  # the report holds counts, never the person
    records = consume_all(bootstrap, "profiles")
    assert records[-1] == (f"acct-{gone}", None)  # the engine's tombstone, read by the tests' own consumer
    assert sum(1 for _, v in records if v is None) == 1  # one key only: not acct-shared, not the others
    assert not values_of(live_rows(settings, "demo.events")) & {gone}  # the tables were erased meanwhile

    alter_topic(bootstrap, "profiles", **FAST_COMPACTION)
    produce(bootstrap, "profiles", [("acct-roll", {"user_id": "nobody", "plan": "free"})])  # rolls the segment
    wait_for(lambda: not naming(consume_all(bootstrap, "profiles"), gone), "compaction of the tombstoned key")
    left = consume_all(bootstrap, "profiles")
    assert naming(left, stays) and naming(left, other)  # the other people's latest records stay

    second = run(spark, settings)
    [done] = second.requests
    assert done.status == "completed", done.reason
    proof = done.evidence["topics"]["profiles"]
    assert proof["passed"] and proof["records_left"] == 0 and proof["records_read"] == len(left)


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_deleting_topic_keeps_the_request_open_until_its_retention_has_passed(spark, new_lakehouse, kafka_broker,
                                                                                  fmt):
    base = new_lakehouse(delta=["demo.events"] if fmt == "delta" else None)
    gone, stays = people(spark, base, 2)
    bootstrap = kafka_broker.bootstrap
    clicks, views, audit = (f"{name}-{fmt}" for name in ("clicks", "views", "audit"))  # the broker is shared
    create_topic(bootstrap, clicks, retention_ms=-1)                        # kept forever
    create_topic(bootstrap, views, retention_ms=400 * 86_400_000)           # 400 days: past any due date
    create_topic(bootstrap, audit, retention_ms=-1)                         # kept under an accepted reason
    for topic in (clicks, views, audit):
        produce(bootstrap, topic, [(None, {"user_id": p, "page": "/"}) for p in (gone, stays, gone)])
    settings = with_topics(base, bootstrap, **{clicks: {"key": "user_id"}, views: {"identifier": "user_id"},
                        audit: {"key": "user_id", "accept_retention": "fraud audit trail, Art. 17(3)(e)"}})
    Ledger(settings).submit([RequestInput(gone, "erase")])

    first = run(spark, settings)
    [outcome] = first.requests
    assert outcome.status == "failed"
    assert (f"topic {clicks} (cleanup.policy=delete, retention.ms=-1 (kept forever)) still holds 2 record(s) of the "
            "subject, and nothing in its configuration removes them") in outcome.reason
    assert f"topic {views} (cleanup.policy=delete, retention.ms=34560000000 (400 d)) still holds 2 record(s)" \
        in outcome.reason and "after the request's due date" in outcome.reason
    assert audit not in outcome.reason  # accepted: reported, not keeping the request open
    kept = outcome.evidence["topics"][audit]
    assert (kept["records_left"], kept["passed"], kept["gone_by"]) == (2, False, None)
    assert kept["accepted"] == "fraud audit trail, Art. 17(3)(e)"
    assert not values_of(live_rows(settings, "demo.events")) & {gone}  # the tables are erased in that run
    assert len(naming(consume_all(bootstrap, clicks), gone)) == 2  # nothing removed from a deleting topic

    for topic in (clicks, views):  # now a retention short enough, and the window passes
        alter_topic(bootstrap, topic, retention_ms=1000, segment_ms=200)
        produce(bootstrap, topic, [(None, {"user_id": "nobody", "page": "/"})])  # rolls the segment
    wait_for(lambda: not any(naming(consume_all(bootstrap, t), gone) for t in (clicks, views)),
             "the retention window to pass")

    second = run(spark, settings)
    [done] = second.requests
    assert done.status == "completed", done.reason
    assert done.evidence["topics"][clicks]["passed"] and done.evidence["topics"][views]["passed"]
    assert done.evidence["topics"][audit]["accepted"]


def test_a_topic_missing_from_the_cluster_fails_the_run_clearly(spark, new_lakehouse, kafka_broker):
    base = new_lakehouse()
    gone = spark.table(base.table("demo.events")).select("user_id").orderBy("user_id").first().user_id
    settings = with_topics(base, kafka_broker.bootstrap, nowhere={"key": "user_id"})
    ledger = Ledger(settings)
    [request_id] = ledger.submit([RequestInput(gone, "erase")]).created
    with pytest.raises(Exception, match="topic nowhere of the data map is not on the Kafka cluster"):
        run(spark, settings)
    assert ledger.request(request_id).status != "completed"
    assert gone in values_of(live_rows(settings, "demo.events"))  # refused before anything was erased
