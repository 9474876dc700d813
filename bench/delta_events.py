"""The notebook's workload on a Delta events table: `dsr run` against the physical limit, each a whole
process on an identical copy of the same table.

Usage: python bench/delta_events.py [--events 10000000] [--erase 100] [--access 1000] [--rounds 3]
                                    [--workdir DIR]

The table: the demo's events (`dsr generate --format delta`: appended in batches, so every file
spans the whole key range: not clustered), deletion vectors on, without a change data feed (with one,
the engine erases by Delta's MERGE, which records the deleted rows in it). `--erase` random users are
erased and `--access` others exported (users: events / 100, as the notebook). The variants,
alternated in each round:

- `dsr`: `dsr run` (the requests submitted beforehand, not timed), content collateral check on: the
  erase, the export, the purge (the log's statistics included) and the proof of live data, history,
  storage and log;
- `physical_limit`: what the bytes that must move cost here, in one process: a scan of the key
  column (finding whom the requests name), a read of every column of the exported people's rows
  (each row hashed: Delta fails Spark's no-op sink on a deletion-vector table), and a plain
  rewrite of every file (100 random people touch every file: every row read and written again
  through Delta's writer, into a new table), as the engine's benchmark measures Iceberg's.

Writes bench/results/delta-events-<events>.json: each round's seconds, the medians, and the ratio
of `dsr` to the physical limit (target: at most 1.3).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse_dsr import synth
from lakehouse_dsr.bench import SEED, _python_process, dsr_process

TARGET = 1.3


def _config(side: Path, key_file: Path) -> dict:
    """The dsr.yaml of one side: its own ledger, exports and copy of the events table."""
    return {"catalog": {"name": "lakehouse", "properties": {"type": "hadoop", "warehouse": str(side / "wh")}},
            "secret_key_file": str(key_file), "export": {"directory": str(side / "exports")},
            "purge": {"orphan_min_age_minutes": 0},
            "datamap": {"subject": "user_id", "tables": {"demo.events": {
                "key": "user_id", "format": "delta", "path": str(side / "events")}}}}


def make_table(work: Path, events: int, users: int) -> Path:
    """The demo's events as Delta under `work/source`, without a change data feed."""
    from lakehouse_dsr.config import settings_from_dict
    from lakehouse_dsr.lake.spark import build_session

    source = work / "source"
    settings = settings_from_dict({**_config(source, work / "dsr-secret.key"), "delta": {"warehouse": str(source)}})
    spark = build_session(settings)
    synth.generate(spark, settings, users=users, events=events, seed=SEED, table_format="delta")
    spark.sql(f"ALTER TABLE delta.`{source / 'events'}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')")
    spark.stop()
    return source / "events"


def physical_limit(table: str, exports: str) -> None:
    """The physical limit's three parts, in this process; their seconds as JSON on stdout."""
    import time

    from pyspark.sql import functions as F

    from lakehouse_dsr.config import settings_from_dict
    from lakehouse_dsr.lake.spark import build_session

    spark = build_session(settings_from_dict({}))
    seconds = {}
    events = spark.read.format("delta").load(table)
    start = time.perf_counter()
    # Aggregates, not Spark's no-op sink: Delta 3.3 fails a no-op write of a deletion-vector table's
    # scan ("Cannot work with a non-pinned table snapshot of the TahoeFileIndex").
    events.where("user_id IS NOT NULL").agg(F.count("user_id")).collect()
    seconds["key_scan"] = time.perf_counter() - start
    wanted = spark.createDataFrame([(u,) for u in json.loads(Path(exports).read_text())], "user_id string")
    start = time.perf_counter()
    exported = events.join(F.broadcast(wanted), "user_id")
    exported.agg(F.sum(F.xxhash64(*exported.columns))).collect()
    seconds["export_read"] = time.perf_counter() - start
    start = time.perf_counter()
    # to a new table: Delta refuses to overwrite a table from a read of itself in one query
    spark.read.format("delta").load(table).write.format("delta").save(f"{table}-rewritten")
    seconds["plain_rewrite"] = time.perf_counter() - start
    print(json.dumps({k: round(v, 3) for k, v in seconds.items()}))
    spark.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "physical_limit":
        physical_limit(*sys.argv[2:4])
        return
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--access", type=int, default=1000)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-delta-events-"))
    a = args.parse_args()
    work = Path(a.workdir)
    users = max(a.erase + a.access, a.events // 100)
    source = work / "source" / "events"
    if not source.exists():
        make_table(work, a.events, users)
    picks = random.Random(SEED).sample(range(users), a.erase + a.access)
    deletes = [synth.user_id(SEED, i) for i in picks[:a.erase]]
    exports = [synth.user_id(SEED, i) for i in picks[a.erase:]]
    (work / "exports.json").write_text(json.dumps(exports))
    requests = work / "requests.csv"
    requests.write_text("subject_id,type\n" + "".join(f"{u},erase\n" for u in deletes)
                        + "".join(f"{u},access\n" for u in exports))
    rounds = []
    for r in range(a.rounds):
        seconds: dict[str, float] = {}
        for variant in ("physical_limit", "dsr"):
            side = work / f"{variant}-{r}"
            shutil.rmtree(side, ignore_errors=True)
            shutil.copytree(source, side / "events")
            if variant == "dsr":
                config = side / "dsr.yaml"
                config.write_text(yaml.safe_dump(_config(side, work / "dsr-secret.key")))
                dsr_process(config, "submit", "--file", str(requests))
                seconds["dsr"] = dsr_process(config, "run", "--report", str(side / "report.json"))
                report = json.loads((side / "report.json").read_text())
                assert report["summary"]["completed"] == a.erase + a.access, "dsr run"
                events = report["tables"]["demo.events"]
                assert events["verification"]["passed"] and events["erase"]["collateral"]["ok"], "dsr run"
                seconds.update({f"dsr_{stage}": s for stage, s in report["seconds"].items()})
                seconds["dsr_strategy"] = events["erase"]["strategy"]
            else:
                seconds["physical_limit"], output = _python_process(
                    variant, __file__, "physical_limit", str(side / "events"), str(work / "exports.json"))
                seconds.update({f"limit_{k}": v for k, v in json.loads(output.strip().splitlines()[-1]).items()})
            shutil.rmtree(side, ignore_errors=True)
        rounds.append(seconds)
        print(json.dumps(seconds), flush=True)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if isinstance(rounds[0][k], float)}
    ratio = round(medians["dsr"] / medians["physical_limit"], 3)
    out = {"events": a.events, "users": users, "erase": a.erase, "access": a.access, "rounds": rounds,
           "median_s": medians, "dsr_vs_physical_limit": ratio, "target": TARGET, "target_met": ratio <= TARGET,
           "generated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    (Path(__file__).parent / "results" / f"delta-events-{a.events}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))


if __name__ == "__main__":
    main()
