"""The notebook's workload on each supported Spark line: `dsr run` against the physical limit, and
with every optional helper off, each a whole process, in one session of measurements.

Usage: python bench/lines.py [--events 10000000] [--erase 100] [--access 1000] [--rounds 2]
                             [--line 4.1=.venv/bin/python --line 3.5=.venv-spark3.5/bin/python]
                             [--variants dsr,dsr_plain_paths,physical_limit]

For each round and each line in turn (lines alternated, so drift in the machine's speed reaches
both), that line's Python builds the demo's Iceberg events table afresh for each variant, from one
seed, then times the variant as a process of its own (interpreter, JVM start-up, a cold JIT:
what a user waits for):

- `dsr`: `dsr run` (the requests submitted beforehand, not timed), content collateral check on;
- `dsr_plain_paths`: the same with `spark.lakehouse_dsr.helpers: "off"` in `spark.conf`: every
  helper's plain-Spark path (deployment/versions.md), the cost of a helper that fails to compile;
- `physical_limit`: what the bytes that must move cost on that line (lakehouse_dsr.bench's
  `side_plain`: a scan of the key column, a read of the exported people's rows, a rewrite of
  every file), the yardstick of issue 26.

Writes bench/results/lines-<events>.json (lines-<events>-<variants>.json for some variants only; and a
chart, .png): every round's seconds and Spark counters, the medians,
and the ratios: each line's `dsr` to its physical limit (target: at most 1.3), `dsr` on 4.1 to
`dsr` on 3.5 (target: at most 1.05), and each line's plain paths to its `dsr`.
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
from datetime import UTC, datetime
from pathlib import Path

VARIANTS = ("dsr", "dsr_plain_paths", "physical_limit")
TARGET, LINE_TARGET = 1.3, 1.05


def one_line(events: int, users: int, erase: int, access: int, work: Path, variants: tuple[str, ...] = VARIANTS
             ) -> dict:
    """Each of `variants` once on the Spark line of this Python: {variant: the side's result}."""
    import pyspark

    from lakehouse_dsr import synth
    from lakehouse_dsr.bench import SEED, events_only_settings, side_b_process, side_plain_process
    from lakehouse_dsr.lake.bridge import HELPERS_CONF
    from lakehouse_dsr.lake.spark import attach, build_session
    from lakehouse_dsr.ledger.ledger import Ledger

    picks = random.Random(SEED).sample(range(users), erase + access)
    deletes, exports = [synth.user_id(SEED, i) for i in picks[:erase]], [synth.user_id(SEED, i) for i in picks[erase:]]
    spark = None
    out = {"pyspark": pyspark.__version__}
    for variant in variants:
        folder = work / variant
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        conf = {HELPERS_CONF: "off"} if variant == "dsr_plain_paths" else {}
        settings = events_only_settings(folder, variant.replace("_", ""), spark={"conf": conf},
                                        export={"directory": str(folder / "exports")},
                                        purge={"orphan_min_age_minutes": 0})
        spark = spark or build_session(settings)
        attach(spark, settings)
        synth.generate(spark, settings, users=users, events=events, seed=SEED)
        for table in Ledger(settings).tables():
            spark.sql(f"DROP TABLE IF EXISTS {settings.table(table)} PURGE")
        side = side_plain_process if variant == "physical_limit" else side_b_process
        out[variant] = side(spark, settings, deletes, exports, folder)
        shutil.rmtree(folder / "wh", ignore_errors=True)
    return out


def chart(medians: dict[str, dict[str, float]], variants: tuple[str, ...], path: Path, events: int) -> None:
    """Each line's median seconds per variant, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(medians)
    for i, (line, m) in enumerate(medians.items()):
        ax.bar([x + i * width for x in range(len(variants))], [m[v] for v in variants], width, label=f"Spark {line}")
    ax.set_xticks([x + width * (len(medians) - 1) / 2 for x in range(len(variants))], list(variants))
    ax.set_ylabel("seconds, a whole process (median)")
    ax.set_title(f"{events:,} events: dsr run per Spark line")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--erase", type=int, default=100)
    parser.add_argument("--access", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--line", action="append", metavar="LINE=PYTHON",
                        help="a Spark line and the Python that has it (default: 4.1 and 3.5 of this repository)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="some of: " + ", ".join(VARIANTS))
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--one-line", action="store_true", help=argparse.SUPPRESS)  # a line's own process
    args = parser.parse_args()
    users = max(args.erase + args.access, args.events // 100)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dsr-lines-"))
    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    if args.one_line:
        print(json.dumps(one_line(args.events, users, args.erase, args.access, work, variants)))
        return
    lines = dict(s.split("=", 1) for s in args.line or ["4.1=.venv/bin/python", "3.5=.venv-spark3.5/bin/python"])
    rounds: dict[str, list[dict]] = {line: [] for line in lines}
    for round_ in range(args.rounds):
        for line, python in (lines.items() if round_ % 2 == 0 else reversed(lines.items())):
            print(f"round {round_ + 1}/{args.rounds}: Spark {line}", file=sys.stderr, flush=True)
            done = subprocess.run([python, __file__, "--one-line", "--events", str(args.events), "--erase",
                                   str(args.erase), "--access", str(args.access), "--variants", ",".join(variants),
                                   "--workdir", str(work / line)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"Spark {line} exited {done.returncode}:\n{done.stderr[-3000:]}")
            rounds[line].append(json.loads(done.stdout.strip().splitlines()[-1]))
    medians = {line: {v: statistics.median(r[v]["full_cycle_s"] for r in runs) for v in variants}
               for line, runs in rounds.items()}
    ratios = {f"{line}_dsr_vs_physical_limit": round(m["dsr"] / m["physical_limit"], 3)
              for line, m in medians.items() if {"dsr", "physical_limit"} <= set(m)}
    ratios.update({f"{line}_plain_paths_vs_dsr": round(m["dsr_plain_paths"] / m["dsr"], 3)
                   for line, m in medians.items() if {"dsr", "dsr_plain_paths"} <= set(m)})
    if {"4.1", "3.5"} <= set(medians) and "dsr" in variants:
        ratios["dsr_4.1_vs_3.5"] = round(medians["4.1"]["dsr"] / medians["3.5"]["dsr"], 3)
    met = {k: v <= (LINE_TARGET if k == "dsr_4.1_vs_3.5" else TARGET) for k, v in ratios.items()
           if k.endswith("physical_limit") or k == "dsr_4.1_vs_3.5"}
    result = {"events": args.events, "users": users, "erase": args.erase, "access": args.access,
              "rounds": args.rounds, "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "medians_s": medians, "ratios": ratios, "targets_met": met, "runs": rounds}
    suffix = "" if variants == VARIANTS else "-" + "-".join(variants)
    out = Path("bench/results") / f"lines-{args.events}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    chart(medians, variants, out.with_suffix(".png"), args.events)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"medians_s": medians, "ratios": ratios, "targets_met": met}, indent=2))


if __name__ == "__main__":
    main()
