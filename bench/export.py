"""Access export: the notebook's join + partitionBy against `access.export`, before and after clustering.

Usage: python bench/export.py [--events 1000000] [--subjects 1000] [--repeats 3]
Users = events / 100 (the notebook's 100k users for 10M events). Writes bench/results/export-<events>.json.
The notebook exports only events; `dsr events-only` uses a data map with only that table (same work),
`dsr all tables` is the real package (users, events, newsletter, orders).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from lakehouse_dsr import synth
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.datamap import demo_datamap
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.lake import layout
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.stages import access


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=1_000_000)
    args.add_argument("--subjects", type=int, default=1000)
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-export-"))
    a = args.parse_args()
    work = Path(a.workdir)
    users = max(1, a.events // 100)

    settings = settings_from_dict({"catalog": {"properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
                                   "datamap": demo_datamap()})
    spark = build_session(settings)
    synth.generate(spark, settings, users=users, events=a.events, seed=1)
    subjects = [synth.user_id(1, i) for i in random.Random(1).sample(range(users), a.subjects)]
    requests = spark.createDataFrame([(f"req-{i:05d}", s, "gdpr") for i, s in enumerate(subjects)],
                                     "request_id string, subject_id string, regulation string")
    # The notebook keeps requests in a table and joins it with events.
    requests.selectExpr("subject_id AS user_id").writeTo(settings.table("demo.gdpr_requests")).createOrReplace()
    events_only = settings.model_copy(deep=True)
    events_only.datamap.tables = {"demo.events": events_only.datamap.tables["demo.events"]}
    events_only.datamap.identifiers = {}
    key_types = check_against_catalog(spark, settings.datamap, settings.table)

    def notebook(out: Path) -> int:
        spark.sql(f"SELECT e.* FROM {settings.table('demo.events')} e JOIN {settings.table('demo.gdpr_requests')} r "
                  "ON e.user_id = r.user_id").write.mode("overwrite").partitionBy("user_id").parquet(str(out))
        return sum(1 for _ in out.rglob("*.parquet"))

    def dsr(which, out: Path) -> int:
        result = access.export(Lake.of(spark, which), which.datamap, requests, out, "json", key_types)
        return len(result.packages)

    variants = {
        "notebook partitionBy": notebook,
        "dsr events-only": lambda out: dsr(events_only, out),
        "dsr all tables": lambda out: dsr(settings, out),
    }
    results: dict[str, dict] = {}
    for layout_name in ("unsorted", "clustered"):
        if layout_name == "clustered":
            start = time.perf_counter()
            optimized = layout.optimize(Lake.of(spark, settings).table("demo.events"), settings.datamap)
            results["optimize events"] = {"seconds": round(time.perf_counter() - start, 2),
                                          "files_before": optimized.files_before, "files_after": optimized.files_after}
            print("optimize", results["optimize events"], flush=True)
        for trial in range(a.repeats):
            for name, run in variants.items():
                out = work / "out" / f"{layout_name}-{name.replace(' ', '_')}-{trial}"
                start = time.perf_counter()
                files = run(out)
                seconds = round(time.perf_counter() - start, 2)
                entry = results.setdefault(f"{layout_name}: {name}", {"runs_s": [], "files": files})
                entry["runs_s"].append(seconds)
                print(f"{layout_name} trial {trial + 1} {name}: {seconds}s, {files} files", flush=True)
                shutil.rmtree(out)
    for entry in results.values():
        if "runs_s" in entry:
            entry["median_s"] = statistics.median(entry["runs_s"])
    out = {"events": a.events, "users": users, "subjects": a.subjects, "cpus": os.cpu_count(), "results": results}
    path = Path(__file__).parent / "results" / f"export-{a.events}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
