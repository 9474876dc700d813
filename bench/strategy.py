"""Measure DELETE ... WHERE EXISTS against MERGE (broadcast source) for one batch of erasures.

Usage: python bench/strategy.py [--events 1000000] [--users 10000] [--erase 100] [--repeats 3]
Each trial runs on a fresh clone of the same events table, in both write modes, interleaved so
machine noise hits every variant alike. Prints and writes bench/results/strategy-<events>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from lakehouse_dsr import synth
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.stages import erase, identity, matching


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=1_000_000)
    args.add_argument("--users", type=int, default=10_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--warehouse", default=tempfile.mkdtemp(prefix="dsr-bench-"))
    a = args.parse_args()

    settings = settings_from_dict({"catalog": {"properties": {"type": "hadoop", "warehouse": a.warehouse}},
                                   "datamap": demo_datamap()})
    spark = build_session(settings)
    synth.generate(spark, settings, users=a.users, events=a.events, seed=1)
    subjects = [synth.user_id(1, i) for i in random.Random(1).sample(range(a.users), a.erase)]
    batch = spark.createDataFrame([(f"r{i}", s) for i, s in enumerate(subjects)],
                                  "request_id string, subject_id string")
    keys = identity.resolve(Lake.of(spark, settings), settings.datamap, batch)
    key_types = check_against_catalog(spark, settings.datamap, settings.table)
    key_set = matching.key_sets(settings.datamap, keys, key_types, ["demo.events"])["demo.events"]
    files = spark.sql(f"SELECT count(*) n FROM {settings.table('demo.events')}.files").first().n

    timings: dict[str, list[float]] = {}
    rewritten: dict[str, int] = {}
    for trial in range(a.repeats):
        for mode in ("copy-on-write", "merge-on-read"):
            for strategy in ("delete_where_exists", "merge_broadcast"):
                clone = "demo.events_trial"
                spark.sql(f"DROP TABLE IF EXISTS {settings.table(clone)} PURGE")
                spark.sql(f"CREATE TABLE {settings.table(clone)} USING iceberg TBLPROPERTIES ("
                          f"'format-version'='2', 'write.delete.mode'='{mode}', 'write.merge.mode'='{mode}') "
                          f"AS SELECT * FROM {settings.table('demo.events')}")
                trial_settings = settings.model_copy(deep=True)
                trial_settings.datamap.tables[clone] = trial_settings.datamap.tables["demo.events"]
                stage = (Lake.of(spark, trial_settings), trial_settings.datamap, trial_settings.erase)
                plan = replace(erase.plan(*stage, clone, key_set), strategy=strategy)
                start = time.perf_counter()
                result = erase.apply(*stage, plan, key_set)
                seconds = time.perf_counter() - start - _count_seconds(spark, trial_settings, clone)
                name = f"{mode} {strategy}"
                timings.setdefault(name, []).append(round(seconds, 2))
                rewritten[name] = result.data_files_rewritten
                assert result.rows_after == plan.rows_before - plan.rows_matched
                print(f"trial {trial + 1} {name}: {seconds:.2f}s, rows {plan.rows_matched}, "
                      f"files rewritten {result.data_files_rewritten}/{files}", flush=True)
    summary = {name: {"median_s": statistics.median(t), "runs_s": t, "data_files_rewritten": rewritten[name]}
               for name, t in timings.items()}
    out = {"events": a.events, "users": a.users, "erase": a.erase, "data_files": files,
           "machine": {"cpus": _cpus(), "python": platform.python_version()}, "results": summary}
    path = Path(__file__).parent / "results" / f"strategy-{a.events}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps(summary, indent=2))


def _count_seconds(spark, settings, table) -> float:
    """apply() ends with a row count for the collateral check; subtract it to time the statement alone."""
    start = time.perf_counter()
    spark.table(settings.table(table)).count()
    return time.perf_counter() - start


def _cpus() -> int:
    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
