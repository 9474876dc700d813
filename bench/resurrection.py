"""Cost of the resurrection check: what a run reads after an append, against the table's size.

Usage: python bench/resurrection.py [--events 10000000] [--append 1000000] [--erase 100]
A freshly built events table (users = events / 100); a first `dsr run` erases `erase` people
(completed, purged). Then `append` later events of all users are appended (a replay: some name
erased people), and a second `dsr run` with no request open finds and erases those again.
Reports, from Spark's counters, the rows and bytes the second run's check read against the rows
appended and the table's rows, and the whole second run's seconds. Writes
bench/results/resurrection-<events>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
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


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, default=10_000_000)
    args.add_argument("--append", type=int, default=1_000_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-resurrection-"))
    a = args.parse_args()
    work = Path(a.workdir)
    settings = events_only_settings(work, "lake")
    spark = build_session(settings)
    users = a.events // 100
    synth.generate(spark, settings, users=users, events=a.events, seed=1)
    picks = random.Random(1).sample(range(users), a.erase)
    erased = [synth.user_id(1, i) for i in picks]
    Ledger(settings).submit([RequestInput(u, "erase") for u in erased])
    first = run(spark, settings)
    assert {r.status for r in first.requests} == {"completed"}, [r.reason for r in first.requests]

    table = settings.table(f"{settings.demo_namespace}.events")
    # A replay of later events: drawn from all users like the table's own, so about `append * erase /
    # users` of them name people erased by the first run.
    synth.events_df(spark, a.events, a.events + a.append, users, seed=1).writeTo(table).append()
    rows = spark.table(table).count()

    start = time.perf_counter()
    second = run(spark, settings)
    seconds = round(time.perf_counter() - start, 2)
    back_events = second.resurrections.get(f"{settings.demo_namespace}.events", {})
    cost = second.cost.get("resurrection", {})
    result = {
        "events": a.events, "appended": a.append, "table_rows": rows, "erased": a.erase,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "second_run_s": seconds, "seconds": second.seconds, "resurrection": back_events,
        "check_rows_read": cost.get("rows_read"), "check_bytes_read": cost.get("bytes_read"),
        "check_rows_read_vs_appended": round(cost.get("rows_read", 0) / a.append, 3),
        "verified": all(t["verification"]["passed"] for t in second.tables.values()),
    }
    out = Path("bench/results") / f"resurrection-{a.events}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
