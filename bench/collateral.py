"""Cost of the content collateral check: `dsr run` with `erase.collateral_check: content` against `count`.

Usage: python bench/collateral.py [--events 10000000] [--erase 100] [--repeats 1]
Each run gets a freshly built events table (the notebook's workload, users = events / 100) and
`erase` erase requests; the immediate policy (erase, purge, verify). Reports per-stage seconds,
the `collateral` stage (the fingerprint scans before and after each erase commit), and the
difference in the full run. Writes bench/results/collateral-<events>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from lakehouse_dsr import synth
from lakehouse_dsr.bench import events_only_settings
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run


def one_run(work: Path, mode: str, events: int, erase: int, round_: int) -> dict:
    name = f"{mode}_{round_}"
    shutil.rmtree(work / name, ignore_errors=True)
    settings = events_only_settings(work, name, erase={"collateral_check": mode})
    spark = build_session(settings)
    users = events // 100
    synth.generate(spark, settings, users=users, events=events, seed=round_)
    picks = random.Random(round_).sample(range(users), erase)
    Ledger(settings).submit([RequestInput(synth.user_id(round_, i), "erase") for i in picks])
    start = time.perf_counter()
    report = run(spark, settings)
    total = round(time.perf_counter() - start, 2)
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    shutil.rmtree(work / name, ignore_errors=True)
    return {"total": total, **report.seconds}


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--repeats", type=int, default=1)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-collateral-"))
    a = args.parse_args()
    rounds: dict[str, list[dict]] = {"count": [], "content": []}
    for r in range(a.repeats):
        for mode in rounds:  # alternate, so drift on this noisy machine hits both sides
            rounds[mode].append(one_run(Path(a.workdir), mode, a.events, a.erase, r))
            print(mode, rounds[mode][-1], flush=True)
    medians = {mode: {k: round(statistics.median(x.get(k, 0.0) for x in runs), 2) for k in runs[0]}
               for mode, runs in rounds.items()}
    out = {
        "events": a.events, "erase": a.erase, "repeats": a.repeats,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "rounds": rounds, "medians": medians,
        "collateral_stage_s": medians["content"].get("collateral", 0.0),
        "run_overhead_s": round(medians["content"]["total"] - medians["count"]["total"], 2),
        "run_ratio": round(medians["content"]["total"] / medians["count"]["total"], 2),
    }
    out_file = Path(__file__).parent / "results" / f"collateral-{a.events}.json"
    out_file.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("collateral_stage_s", "run_overhead_s", "run_ratio")}), "->", out_file)


if __name__ == "__main__":
    main()
