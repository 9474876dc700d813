"""Cost of propagation and of streaming suppression, on the demo lake with its silver and gold layers.

Usage: python bench/propagate.py [--events 10000000] [--users 10000] [--erase 100] [--repeats 3]
                                 [--stream-rows 1000000] [--suppressed 100000]

Propagation: each round submits `erase` random users and runs a whole `dsr run` in this process
(erase, propagate, purge, verify; tables side by side as configured), then times a plain full
recomputation of daily_by_type (its sql, overwriting the table). Reported: the propagation stage
(silver + gold) against the erase of the bronze events table (both from the run report). Then,
alone on the machine: `erase` more users leave events (one MERGE), and daily_by_type is brought
in line by `propagate.refresh` (the affected groups) and, on the same state, by a full
recomputation; reported: their ratio.

Streaming: `suppressed` erase requests with their keyed hashes are put in the ledger; then the same
`stream-rows` JSON events are streamed (availableNow, Iceberg sink, fresh checkpoint and table each
time) with and without `suppress_stream`, alternating. Medians and ratios go to
bench/results/propagate-<events>.json, a chart to propagate-<events>.png.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import functions as F

from lakehouse_dsr import synth
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.datamap.model import DAILY_BY_TYPE, demo_datamap
from lakehouse_dsr.ingest.stream import ingest
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.keys import key_id, keyed_hash
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import matching, propagate


def propagation(spark, settings, a, rounds: list[dict]) -> None:
    rng = random.Random(1)
    ledger = Ledger(settings)
    for _ in range(a.repeats):
        ledger.submit([RequestInput(synth.user_id(42, i), "erase") for i in rng.sample(range(a.users), a.erase)])
        report = run(spark, settings)
        assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
        start = time.perf_counter()
        full = spark.sql(DAILY_BY_TYPE.replace("demo.events", settings.table("demo.events")))
        full.writeTo(settings.table("demo_gold.daily_by_type")).overwrite(F.lit(True))
        full_seconds = time.perf_counter() - start
        tables = report.tables
        rounds.append({
            "events_erase_s": tables["demo.events"]["erase"]["seconds"],
            "propagate_s": report.seconds["propagate"],
            "daily_by_type_in_run_s": tables["demo_gold.daily_by_type"]["erase"]["seconds"],
            "daily_by_type_groups": tables["demo_gold.daily_by_type"]["erase"]["rows_matched"],
            "daily_by_type_full_s": round(full_seconds, 3),
            "per_table_s": {t: v["erase"].get("seconds") for t, v in tables.items() if v.get("erase")},
            "run_seconds": report.seconds,
        })
        print(json.dumps(rounds[-1]), flush=True)


def isolated(spark, settings, a, rounds: list[dict]) -> None:
    """The affected groups' update of daily_by_type against its full recomputation, each alone."""
    lake = Lake.of(spark, settings)
    rng = random.Random(2)
    key_types = check_against_catalog(spark, settings.datamap, settings.table)
    events = settings.table("demo.events")
    for _ in range(a.repeats):
        picked = [synth.user_id(42, i) for i in rng.sample(range(a.users), a.erase)]
        keys = spark.createDataFrame([(f"r{i}", "user_id", u) for i, u in enumerate(picked)],
                                     "request_id string, key_type string, key_value string")
        table_keys = matching.key_sets(settings.datamap, keys, key_types, ["demo.events"])["demo.events"]
        before = lake.table("demo.events").current_snapshot().snapshot_id
        keys.createOrReplaceTempView("bench_erased")
        spark.sql(f"MERGE INTO {events} t USING bench_erased s ON t.user_id = s.key_value WHEN MATCHED THEN DELETE")
        start = time.perf_counter()
        done = propagate.refresh(Lake.of(spark, settings), settings.datamap, "demo_gold.daily_by_type",
                                 {"demo.events": propagate.Upstream(before, table_keys, "delete")})
        groups_s = time.perf_counter() - start
        start = time.perf_counter()
        spark.sql(DAILY_BY_TYPE.replace("demo.events", events)).writeTo(
            settings.table("demo_gold.daily_by_type")).overwrite(F.lit(True))
        full_s = time.perf_counter() - start
        assert done.error is None, done.error
        rounds.append({"strategy": done.plan.strategy, "groups": done.plan.rows_matched,
                       "groups_s": round(groups_s, 3), "full_s": round(full_s, 3)})
        print(json.dumps(rounds[-1]), flush=True)


def streaming(spark, settings, a, work: Path, rounds: list[dict]) -> None:
    ledger = Ledger(settings)
    key = ledger.key
    made = ledger.submit([RequestInput(f"suppressed-{i}", "erase") for i in range(a.suppressed)])
    ledger.record_keys([(rid, "user_id", keyed_hash(key, f"suppressed-{i}"), key_id(key))
                        for i, rid in enumerate(made.created)])
    landing = work / "landing"
    events = synth.events_df(spark, 0, a.stream_rows, a.users, 7)  # another seed: new events, known users
    events.withColumn("event_timestamp", F.date_format("event_timestamp", "yyyy-MM-dd'T'HH:mm:ss'Z'")) \
        .repartition(8).write.json(str(landing))
    schema = spark.table(settings.table("demo.events")).schema
    for r in range(a.repeats):
        for suppressed in ((True, False) if r % 2 == 0 else (False, True)):
            target = f"demo.stream_{r}_{int(suppressed)}"
            spark.createDataFrame([], schema).writeTo(settings.table(target)).create()
            checkpoint = str(work / f"ckpt-{r}-{int(suppressed)}")
            start = time.perf_counter()
            if suppressed:
                ingest(spark, settings, str(landing), "json", target, checkpoint, once=True, key="user_id")
            else:
                query = (spark.readStream.schema(schema).json(str(landing)).writeStream.format("iceberg")
                         .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                         .toTable(settings.table(target)))
                query.awaitTermination()
            seconds = time.perf_counter() - start
            assert spark.table(settings.table(target)).count() == a.stream_rows
            rounds.append({"suppressed": suppressed, "seconds": round(seconds, 3)})
            print(json.dumps(rounds[-1]), flush=True)


def chart(result: dict, path: Path) -> None:
    """Three pairs of bars (medians): each change's cost beside what it is measured against."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prop, stream = result["propagation"], result["streaming"]
    pairs = [("daily_by_type", "affected groups", prop["daily_by_type_groups_s"], "full recomputation",
              prop["daily_by_type_full_s"]),
             ("dsr run stage", "propagate (silver+gold)", statistics.median(r["propagate_s"] for r in prop["rounds"]),
              "erase demo.events", statistics.median(r["events_erase_s"] for r in prop["rounds"])),
             ("1M streamed rows", "suppress_stream", stream["with_s"], "no suppression", stream["without_s"])]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (title, ours, ours_s, other, other_s) in zip(axes, pairs, strict=True):
        ax.bar([ours, other], [ours_s, other_s], color=["tab:blue", "tab:grey"])
        ax.set_title(f"{title}: {ours_s / other_s:.2f}x")
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{result['events']:,} events, {result['erase']} erasures per round (medians of {result['repeats']})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--users", type=int, default=10_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--stream-rows", type=int, default=1_000_000)
    args.add_argument("--suppressed", type=int, default=100_000)
    a = args.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsr-propagate-"))
    settings = settings_from_dict({"catalog": {"properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
                                   "secret_key_file": str(work / "key"), "datamap": demo_datamap()})
    spark = build_session(settings)
    synth.generate(spark, settings, a.users, a.events, 42)
    prop: list[dict] = []
    propagation(spark, settings, a, prop)
    alone: list[dict] = []
    isolated(spark, settings, a, alone)
    stream: list[dict] = []
    streaming(spark, settings, a, work, stream)

    def median(rows: list[dict], field: str) -> float:
        return round(statistics.median(r[field] for r in rows), 3)

    with_s = statistics.median(r["seconds"] for r in stream if r["suppressed"])
    without_s = statistics.median(r["seconds"] for r in stream if not r["suppressed"])
    result = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "events": a.events, "users": a.users,
        "erase": a.erase, "repeats": a.repeats,
        "propagation": {
            "rounds": prop,
            "propagate_vs_events_erase": round(median(prop, "propagate_s") / median(prop, "events_erase_s"), 3),
            "isolated": alone,
            "daily_by_type_groups_s": median(alone, "groups_s"), "daily_by_type_full_s": median(alone, "full_s"),
            "daily_by_type_groups_vs_full": round(median(alone, "groups_s") / median(alone, "full_s"), 3),
        },
        "streaming": {"rows": a.stream_rows, "suppressed_subjects": a.suppressed, "rounds": stream,
                      "with_s": round(with_s, 3), "without_s": round(without_s, 3),
                      "ratio": round(with_s / without_s, 3)},
    }
    out = Path("bench/results") / f"propagate-{a.events}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result["propagation"].items() if k != "rounds"}),
          json.dumps({k: v for k, v in result["streaming"].items() if k != "rounds"}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
