"""Seed 004's pipeline at scale: erase people from a Delta bronze events table whose silver table the
company's pipeline keeps from bronze's change data feed, with a gold aggregate over silver, against
the same `dsr run` on bronze alone. Each variant a whole process, on identical copies of the tables.

Usage: python bench/pipeline.py [--events 10000000] [--erase 100] [--rounds 2] [--workdir DIR]

The tables (built once, copied for every run): bronze, the demo's events as Delta with its change
data feed on (users: events / 100); silver, each user's latest event (SCD type 1 on user_id, as
seed 004's apply_changes keeps it), Delta with a change data feed; gold, per event type the users
whose latest event it is and the 90th percentile of those events' times (an aggregate, `sql`,
refresh: full). Variants, alternated each round:

- `pipeline`: the data map maps bronze, silver (`propagation: pipeline`) and gold; the pipeline runs
  beside the run in its own process (it applies bronze's changes to silver every half second:
  deletes as deletes, by MERGE), so the run erases bronze, waits for the pipeline to carry the
  deletes to silver, proves silver, recomputes and proves gold, and purges all three (the change
  feed's `_change_data` files included);
- `bronze_only`: the data map maps bronze alone; no pipeline.

Writes bench/results/pipeline-<events>.json: every round's whole-process seconds and its run
report's stages, the seconds from the run's start until silver and gold were clean, the medians and
the ratio pipeline/bronze_only (target: at most 1.5); and a chart (.png).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

TARGET = 1.5
BRONZE, SILVER, GOLD = "demo.events", "demo_silver.latest", "demo_gold.latest_by_type"
SILVER_SQL = ("SELECT user_id, event_type, event_timestamp FROM (SELECT user_id, event_type, event_timestamp, "
              "row_number() OVER (PARTITION BY user_id ORDER BY event_timestamp DESC, event_id) AS n "
              "FROM {bronze}) WHERE n = 1")
GOLD_SQL = (f"SELECT event_type, count(*) AS users, percentile_approx(unix_timestamp(event_timestamp), 0.9) AS p90_at "
            f"FROM {SILVER} GROUP BY event_type")


def _config(side: Path, key_file: Path, pipeline: bool) -> dict:
    tables = {BRONZE: {"key": "user_id", "format": "delta", "path": str(side / "bronze")}}
    derived = {SILVER: {"from": [BRONZE], "key": "user_id", "propagation": "pipeline", "wait_seconds": 120,
                        "format": "delta", "path": str(side / "silver")},
               GOLD: {"from": [SILVER], "sql": GOLD_SQL, "refresh": "full", "format": "delta",
                      "path": str(side / "gold")}}
    return {"catalog": {"name": "lakehouse", "properties": {"type": "hadoop", "warehouse": str(side / "wh")}},
            "secret_key_file": str(key_file), "purge": {"orphan_min_age_minutes": 0},
            "datamap": {"subject": "user_id", "tables": tables, **({"derived": derived} if pipeline else {})}}


def make_tables(work: Path, events: int, users: int) -> Path:
    """Bronze, silver and gold under `work/source` (each a Delta table with a change data feed)."""
    from lakehouse_dsr import synth
    from lakehouse_dsr.bench import SEED
    from lakehouse_dsr.config import settings_from_dict
    from lakehouse_dsr.lake.spark import build_session

    source = work / "source"
    settings = settings_from_dict({**_config(source, work / "dsr-secret.key", True),
                                   "delta": {"warehouse": str(source)}})
    spark = build_session(settings)
    # the demo's events at bronze's path (the data map's); its users, orders... beside them, unused
    synth.generate(spark, settings, users=users, events=events, seed=SEED, table_format="delta", layers=False)
    feed = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    spark.sql(f"ALTER TABLE delta.`{source / 'bronze'}` SET {feed}")
    silver = spark.sql(SILVER_SQL.format(bronze=f"delta.`{source / 'bronze'}`"))
    silver.write.format("delta").option("delta.enableChangeDataFeed", "true").save(str(source / "silver"))
    spark.sql(GOLD_SQL.replace(SILVER, f"delta.`{source / 'silver'}`")).write.format("delta").save(str(source / "gold"))
    spark.stop()
    return source


def pipeline_main(config: str) -> None:
    """The company's pipeline, in this process until killed: every half second, bronze's changes since
    the version last applied (its change data feed) are applied to silver by MERGE on user_id (a user
    with a deleted event leaves; new events replace a user's row when later)."""
    from pyspark.sql import functions as F

    from lakehouse_dsr.config import load_settings
    from lakehouse_dsr.lake.lakehouse import Lake
    from lakehouse_dsr.lake.spark import build_session
    from lakehouse_dsr.lake.table import CHANGE_TYPE

    settings = load_settings(Path(config))
    spark = build_session(settings)
    bronze = Lake.of(spark, settings).table(BRONZE)
    applied = bronze.current_snapshot_id()
    warm = True  # a pipeline that has run for days: its first MERGE (of nothing) before the run starts
    while True:
        until = bronze.current_snapshot_id()
        if not warm and (until is None or until == applied):
            time.sleep(0.5)
            continue
        changes = (bronze.read_at(until).limit(0).withColumn(CHANGE_TYPE, F.lit("insert")) if warm
                   else bronze.read_changes(applied, until).where(f"{CHANGE_TYPE} IN ('insert', 'delete')"))
        applied = until
        changes.createOrReplaceTempView("bronze_changes")
        spark.sql(f"""MERGE INTO {settings.table(SILVER)} t USING (
              SELECT user_id, max_by(struct(event_type, event_timestamp), event_timestamp) AS latest,
                     max(CASE WHEN {CHANGE_TYPE} = 'delete' THEN 1 ELSE 0 END) = 1 AS deleted
              FROM bronze_changes GROUP BY user_id) s ON t.user_id = s.user_id
            WHEN MATCHED AND s.deleted THEN DELETE
            WHEN MATCHED AND s.latest.event_timestamp > t.event_timestamp THEN
              UPDATE SET event_type = s.latest.event_type, event_timestamp = s.latest.event_timestamp
            WHEN NOT MATCHED AND NOT s.deleted THEN INSERT (user_id, event_type, event_timestamp)
              VALUES (s.user_id, s.latest.event_type, s.latest.event_timestamp)""")
        if warm:
            warm = False
            print("ready", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "pipeline":
        pipeline_main(sys.argv[2])
        return
    from lakehouse_dsr import synth
    from lakehouse_dsr.bench import SEED, dsr_process

    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--rounds", type=int, default=2)
    args.add_argument("--workdir", default=None)
    a = args.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="dsr-bench-pipeline-"))
    users = max(a.erase, a.events // 100)
    source = work / "source"
    if not (source / "gold").exists():
        make_tables(work, a.events, users)
    deletes = [synth.user_id(SEED, i) for i in random.Random(SEED).sample(range(users), a.erase)]
    requests = work / "requests.csv"
    requests.write_text("subject_id,type\n" + "".join(f"{u},erase\n" for u in deletes))
    rounds = []
    for r in range(a.rounds):
        for variant in (("pipeline", "bronze_only") if r % 2 == 0 else ("bronze_only", "pipeline")):
            side = work / f"{variant}-{r}"
            shutil.rmtree(side, ignore_errors=True)
            for table in ("bronze", "silver", "gold"):
                shutil.copytree(source / table, side / table)
            config = side / "dsr.yaml"
            config.write_text(yaml.safe_dump(_config(side, work / "dsr-secret.key", variant == "pipeline")))
            dsr_process(config, "submit", "--file", str(requests))
            beside = None
            if variant == "pipeline":
                beside = subprocess.Popen([sys.executable, __file__, "pipeline", str(config)], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
                assert beside.stdout is not None and beside.stdout.readline().strip() == "ready", "pipeline"
            try:
                seconds = dsr_process(config, "run", "--report", str(side / "report.json"))
            finally:
                if beside is not None:
                    beside.kill()
                    beside.wait()
            report = json.loads((side / "report.json").read_text())
            assert report["summary"]["completed"] == a.erase, [q.get("reason") for q in report["requests"]][:3]
            assert all(t["verification"]["passed"] for t in report["tables"].values()), "dsr run"
            row = {"round": r, "variant": variant, "seconds": round(seconds, 3), "stages": report["seconds"],
                   "clean_after_seconds": report.get("clean_after_seconds", {}),
                   "silver": report["tables"].get(SILVER, {}).get("erase", {}).get("reason")}
            rounds.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(side, ignore_errors=True)
    median = {v: round(statistics.median(x["seconds"] for x in rounds if x["variant"] == v), 3)
              for v in ("pipeline", "bronze_only")}
    clean = {t: round(statistics.median(x["clean_after_seconds"][t] for x in rounds if x["variant"] == "pipeline"), 3)
             for t in (SILVER, GOLD)}
    ratio = round(median["pipeline"] / median["bronze_only"], 3)
    out = {"events": a.events, "users": users, "erase": a.erase, "rounds": rounds, "median_s": median,
           "clean_after_seconds_median": clean, "pipeline_vs_bronze_only": ratio, "target": TARGET,
           "target_met": ratio <= TARGET, "generated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = Path(__file__).parent / "results" / f"pipeline-{a.events}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    chart(out, path.with_suffix(".png"))
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    m, clean = result["median_s"], result["clean_after_seconds_median"]
    ax.bar(["dsr run: bronze only", "dsr run: bronze + pipeline\n(silver, gold)"], [m["bronze_only"], m["pipeline"]],
           color=["tab:grey", "tab:blue"])
    for name, seconds in clean.items():
        ax.hlines(seconds, 0.6, 1.4, colors="k", linestyles="dotted")
        ax.text(1.42, seconds, f"{name.split('.')[0]} clean", fontsize=7, va="center")
    ax.set_ylabel("seconds (whole process)")
    ax.set_title(f"{result['events']:,} events, {result['erase']} erased: {result['pipeline_vs_bronze_only']:.2f}x "
                 f"(target {result['target']}x)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
