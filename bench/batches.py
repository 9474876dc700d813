"""Daily erasure batches: the immediate purge against the deadline-aware batched purge.

Usage: python bench/batches.py [--events 10000000] [--days 30] [--per-day 100] [--max-delay-days 7]
Each policy gets the same freshly built workload (events table only, merge-on-read, users =
events / 100). Every simulated day submits `per-day` new erase requests received that day and
runs `dsr run` with that day as today; after the last day the runs continue, without new
requests, until nothing waits for a purge. Reports total seconds, bytes rewritten, purges, and
whether any request was completed later than its due date minus the safety margin.
Writes bench/results/batches-<events>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from lakehouse_dsr import synth
from lakehouse_dsr.bench import events_only_settings
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

DAY0 = date(2026, 1, 5)


def simulate(spark, settings, users: int, events: int, days: int, per_day: int) -> dict:
    synth.generate(spark, settings, users=users, events=events, seed=1)
    picks = random.Random(1).sample(range(users), days * per_day)
    ledger = Ledger(settings)
    totals = {"seconds": 0.0, "bytes_rewritten": 0, "data_files_rewritten": 0, "purges": 0, "runs": 0,
              "max_waiting": 0, "completed": 0, "late": 0, "stage_seconds": {}}
    completed_on: dict[str, date] = {}
    today, day = DAY0, 0
    while True:
        if day < days:
            received = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
            ledger.submit([RequestInput(synth.user_id(1, i), "erase", "gdpr", received)
                           for i in picks[day * per_day:(day + 1) * per_day]])
        start = time.perf_counter()
        report = run(spark, settings, today=today)
        totals["seconds"] += time.perf_counter() - start
        totals["runs"] += 1
        for stage, seconds in report.seconds.items():
            totals["stage_seconds"][stage] = round(totals["stage_seconds"].get(stage, 0.0) + seconds, 3)
        for t in report.tables.values():
            for part in ("erase", "purge"):
                totals["bytes_rewritten"] += t[part].get("bytes_rewritten", 0)
                totals["data_files_rewritten"] += t[part].get("data_files_rewritten", 0)
        totals["purges"] += bool(report.purge_schedule.get("purged"))
        totals["max_waiting"] = max(totals["max_waiting"], report.purge_schedule.get("waiting", 0))
        completed_on.update({r.request_id: today for r in report.completed})
        waiting = report.purge_schedule.get("next_purge_by")
        day += 1
        if day >= days and not waiting:
            break
        # Days without a run change nothing: after the last batch, jump to the next purge deadline.
        today = today + timedelta(days=1) if day < days else date.fromisoformat(waiting)
    margin = timedelta(days=settings.purge.safety_margin_days)
    for status in ledger.statuses(today):
        if status.request_type == "erase":
            done = completed_on.get(status.request_id)
            totals["completed"] += done is not None
            totals["late"] += done is None or done > date.fromisoformat(status.due_date) - margin
    totals["seconds"] = round(totals["seconds"], 1)
    return totals


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--days", type=int, default=30)
    args.add_argument("--per-day", type=int, default=100)
    args.add_argument("--max-delay-days", type=int, default=7)
    args.add_argument("--margin-days", type=int, default=3)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-batches-"))
    a = args.parse_args()
    work = Path(a.workdir)
    users = max(a.events // 100, a.days * a.per_day)
    results = {}
    for policy in ("immediate", "batched"):
        shutil.rmtree(work / policy, ignore_errors=True)
        settings = events_only_settings(work, policy, purge={
            "policy": policy, "max_delay_days": a.max_delay_days, "safety_margin_days": a.margin_days})
        spark = build_session(settings)
        results[policy] = simulate(spark, settings, users, a.events, a.days, a.per_day)
        print(policy, json.dumps(results[policy]), flush=True)
        shutil.rmtree(work / policy, ignore_errors=True)
    imm, bat = results["immediate"], results["batched"]
    out = {
        "events": a.events, "days": a.days, "per_day": a.per_day, "max_delay_days": a.max_delay_days,
        "safety_margin_days": a.margin_days, "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "immediate": imm, "batched": bat,
        "ratios": {"seconds": round(imm["seconds"] / bat["seconds"], 2),
                   "bytes_rewritten": round(imm["bytes_rewritten"] / max(1, bat["bytes_rewritten"]), 2)},
    }
    out_file = Path(__file__).parent / "results" / f"batches-{a.events}.json"
    out_file.write_text(json.dumps(out, indent=2))
    print(json.dumps(out["ratios"]), "->", out_file)


if __name__ == "__main__":
    main()
