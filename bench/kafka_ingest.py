"""Kafka -> table with suppression (`dsr ingest --source kafka://...`) against a plain Kafka -> table
stream, on the same broker and the same records, each a whole process.

Usage: python bench/kafka_ingest.py [--events 1000000] [--erased 100000] [--rounds 3] [--partitions 2]

A local broker (lake/broker.py) holds one topic of `events` JSON records (the demo's events), of
which `erased` come from as many people who asked to be erased (their keyed hashes in the ledger, as
`dsr run` leaves them). Each round, alternating which goes first, times:

- `dsr`: `dsr ingest --source kafka://HOST:PORT/TOPIC --table ... --checkpoint ... --once`: the
  records parsed with the table's schema, every row's key hashed and matched against the suppression
  list, the rest appended to an Iceberg table (exactly once through the checkpoint);
- `plain`: the same read as seed 004's bronze table (`readStream.format("kafka")`, `from_json` with
  the table's schema) written straight to an Iceberg table, availableNow, in a Python process that
  builds its session as `dsr` does (the same jars and class archive).

Each into a new, empty table with a new checkpoint. Writes bench/results/kafka-ingest-<events>.json
(every round, medians, the ratio dsr/plain: target at most 1.2) and a chart (.png).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

TARGET = 1.2
TOPIC = "events"

PLAIN = """
import sys, time
from pyspark.sql import functions as F
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.lake.spark import build_session
settings = load_settings(sys.argv[1])
spark = build_session(settings)
target = settings.table(sys.argv[3])
schema = spark.table(target).schema
records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", sys.argv[2])
           .option("subscribe", "events").option("startingOffsets", "earliest").load())
rows = records.select(F.from_json(F.col("value").cast("string"), schema).alias("v")).select("v.*")
rows.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", sys.argv[4]) \\
    .trigger(availableNow=True).toTable(target).awaitTermination()
spark.stop()
"""


def fill_topic(spark, bootstrap: str, events: int, erased: int, partitions: int) -> list[str]:
    """The topic's records: `events` demo events, `erased` of them by as many people erased (the last
    ones); produced in Spark (its Kafka sink), so no record passes through this process. Returns the
    erased people's ids."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import functions as F

    from lakehouse_dsr import synth

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(60)
    kept = synth.events_df(spark, 0, events - erased, max(1, (events - erased) // 10), 7)
    erased_rows = synth.events_df(spark, 0, erased, 1, 8).withColumn(
        "user_id", F.concat(F.lit("erased-"), F.monotonically_increasing_id().cast("string")))
    records = kept.unionByName(erased_rows).select(
        F.col("user_id").cast("binary").alias("key"),
        F.to_json(F.struct(*[F.col(c) for c in kept.columns])).cast("binary").alias("value"))
    records.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", TOPIC).save()
    return [r.user_id for r in erased_rows.select("user_id").collect()]


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=1_000_000)
    args.add_argument("--erased", type=int, default=100_000)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--partitions", type=int, default=2)
    a = args.parse_args()

    from lakehouse_dsr.bench import _config_file, _python_process, dsr_process, events_only_settings
    from lakehouse_dsr.keys import key_id, keyed_hash
    from lakehouse_dsr.lake.broker import LocalBroker
    from lakehouse_dsr.lake.spark import attach, build_session
    from lakehouse_dsr.ledger.ledger import Ledger
    from lakehouse_dsr.ledger.requests import RequestInput

    work = Path(tempfile.mkdtemp(prefix="dsr-kafka-bench-"))
    rounds: list[dict] = []
    with LocalBroker(parent=work) as broker:
        settings = events_only_settings(work, "kafka")
        spark = build_session(settings)
        attach(spark, settings)
        erased = fill_topic(spark, broker.bootstrap, a.events, a.erased, a.partitions)
        ledger = Ledger(settings)
        made = ledger.submit([RequestInput(person, "erase") for person in erased])
        ledger.record_keys([(rid, "user_id", keyed_hash(ledger.key, person), key_id(ledger.key))
                            for rid, person in zip(made.created, erased, strict=True)])
        from lakehouse_dsr import synth

        schema = synth.events_df(spark, 0, 1, 1, 1).schema
        for r in range(a.rounds):
            for side in ("dsr", "plain"):
                spark.createDataFrame([], schema).writeTo(settings.table(f"demo.in_{side}_{r}")).create()
        spark.stop()
        config = _config_file(settings, work / "dsr.yaml")
        for r in range(a.rounds):
            for side in (("dsr", "plain") if r % 2 == 0 else ("plain", "dsr")):
                table, checkpoint = f"demo.in_{side}_{r}", str(work / f"ckpt-{side}-{r}")
                if side == "dsr":
                    seconds = dsr_process(config, "ingest", "--source", f"kafka://{broker.bootstrap}/{TOPIC}",
                                          "--table", table, "--checkpoint", checkpoint, "--once", "--key", "user_id")
                else:
                    seconds, _ = _python_process("the plain stream", "-c", PLAIN, str(config), broker.bootstrap,
                                                 table, checkpoint)
                rounds.append({"round": r, "side": side, "seconds": round(seconds, 3)})
                print(json.dumps(rounds[-1]), flush=True)
        spark = build_session(settings)
        written = {r["side"] + str(r["round"]): spark.table(settings.table(f"demo.in_{r['side']}_{r['round']}")).count()
                   for r in rounds}
        spark.stop()
    assert all(n == a.events - a.erased for k, n in written.items() if k.startswith("dsr")), written
    assert all(n == a.events for k, n in written.items() if k.startswith("plain")), written
    median = {side: round(statistics.median(r["seconds"] for r in rounds if r["side"] == side), 3)
              for side in ("dsr", "plain")}
    result = {"generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "events": a.events,
              "erased_events": a.erased, "partitions": a.partitions, "rounds": rounds, "medians_s": median,
              "rows_written": written, "dsr_vs_plain": round(median["dsr"] / median["plain"], 3), "target": TARGET,
              "python": sys.version.split()[0]}
    out = Path("bench/results") / f"kafka-ingest-{a.events}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rounds", "rows_written")}))
    print(f"wrote {out}")


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    sides = ["dsr", "plain"]
    ax.bar(["dsr ingest (suppression)", "plain Kafka -> Iceberg"], [result["medians_s"][s] for s in sides],
           color=["tab:blue", "tab:grey"])
    for r in result["rounds"]:
        ax.plot(sides.index(r["side"]), r["seconds"], "k.", alpha=0.6)
    ax.set_ylabel("seconds (whole process)")
    ax.set_title(f"{result['events']:,} Kafka records, {result['erased_events']:,} of erased people: "
                 f"{result['dsr_vs_plain']:.2f}x (target {result['target']}x)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
