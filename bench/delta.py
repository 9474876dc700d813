"""A batch erased from a Delta table: `dsr submit` + `dsr run` against the seeds' own recipes, each a
whole process on an identical copy of the same table.

Usage: python bench/delta.py [--rows 1000000] [--erase 10000] [--rounds 3] [--workdir DIR] [--absent]
       python bench/delta.py chart bench/results/delta-<rows>-<erase>.json   (redraws its chart)

The table: `--rows` distinct string ids (seed 003's shape: an id and a few payload columns), written
once as Delta with deletion vectors and copied for every variant and round. `--erase` of its ids are
erased (with `--absent`, as many ids the table does not hold: nothing matches). The variants, alternated in each round:

- `seed002_merge`: seed 002's `DELETE ... WHERE EXISTS` with the broadcast threshold raised, in its
  open-source Delta form (Delta refuses the subquery): `MERGE ... WHEN MATCHED THEN DELETE` against
  the key table, deletion vectors off (the files are rewritten), then `VACUUM ... RETAIN 0 HOURS`;
- `seed003_dv`: seed 003's MERGE with a broadcast lookup, deletion vectors on, `REORG TABLE ...
  APPLY (PURGE)`, then VACUUM;
- `seed003_cow`: the same MERGE with deletion vectors off, then VACUUM;
- `dsr`: `dsr submit --file` of the ids, then `dsr run`, which also proves the erasure (live,
  history, storage, log) and removes the log files that still hold the ids. Between them, outside
  the `dsr` total, `dsr plan --json` forecasts the run: its seconds (`dsr_plan`) and its estimate
  (`dsr_plan_estimate`) against the run's (`dsr_run`), reported as `plan_vs_run` and
  `estimate_vs_run` (medians).

The recipes neither prove nor clean the log: their VACUUM leaves every JSON commit, whose statistics
still hold erased ids. Writes bench/results/delta-<rows>-<erase>[-absent].json: each round's seconds and the
medians, with each variant's ratio to the fastest recipe, and each process's peak memory (Python and
the driver's JVM) in the last round; and beside it a chart of the medians (`.png`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse_dsr.bench import measured_process

RECIPES = ("seed002_merge", "seed003_dv", "seed003_cow")


def _session(work: Path):
    """The engine's own session (the same jars and settings as `dsr run`), its catalog under `work`."""
    from lakehouse_dsr.config import settings_from_dict
    from lakehouse_dsr.lake.spark import build_session

    return build_session(settings_from_dict({"catalog": {"properties": {"type": "hadoop",
                                                                          "warehouse": str(work / "wh")}}}))


def make_table(path: Path, rows: int) -> None:
    """`rows` distinct string ids with three payload columns, as Delta with deletion vectors on."""
    spark = _session(path.parent)
    (spark.range(rows).selectExpr("concat('id-', lpad(cast(id as string), 10, '0')) AS id",
                                  "id % 1000 AS campaign", "cast(id * 7 % 100000 as double) AS spend",
                                  "concat('segment-', cast(id % 37 as string)) AS segment")
     .repartition(max(1, rows // 250_000)).write.format("delta")
     .option("delta.enableDeletionVectors", "true").save(str(path)))


def recipe(kind: str, table: str, keys: str) -> None:
    """One recipe, in this process (run as its own process by `main`)."""
    spark = _session(Path(table).parent)
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", str(1 << 30))  # seed 002: larger broadcasts
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    dv = "true" if kind == "seed003_dv" else "false"
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = '{dv}')")
    spark.read.parquet(keys).createOrReplaceTempView("erase_keys")
    spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT /*+ BROADCAST(erase_keys) */ id FROM erase_keys) s "
              "ON t.id = s.id WHEN MATCHED THEN DELETE")
    if kind == "seed003_dv":
        spark.sql(f"REORG TABLE delta.`{table}` APPLY (PURGE)")
    spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")


def chart(out: dict, path: Path) -> None:
    """The medians side by side: each recipe, `dsr` (submit, then the run's stages; `resolve` runs
    beside them and is not stacked) and, where measured, `dsr plan` with its estimate's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians, ratios = out["median_s"], out["vs_fastest_recipe"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [*RECIPES, "dsr"]
    for i, variant in enumerate(RECIPES):
        ax.bar(i, medians[variant], color="#999999")
    bottom = 0.0
    run_stages = ("erase", "ledger", "purge", "verify")
    parts = {"submit": medians["dsr_submit"], **{s: medians.get(f"dsr_{s}", 0.0) for s in run_stages}}
    parts["run: other"] = max(0.0, medians["dsr"] - sum(parts.values()))
    for label, value in parts.items():
        ax.bar(len(RECIPES), value, bottom=bottom, label=label)
        bottom += value
    if "dsr_plan" in medians:
        names.append("dsr plan")
        ax.bar(len(RECIPES) + 1, medians["dsr_plan"], color="#555555")
        ax.axhline(medians["dsr_plan_estimate"], color="#555555", linestyle=":",
                   label=f"plan's estimate of the run ({out['estimate_vs_run']}x the run)")
    for i, variant in enumerate([*RECIPES, "dsr"]):
        ax.text(i, medians[variant], f"{ratios[variant]}x", ha="center", va="bottom")
    if "dsr_plan" in medians:
        ax.text(len(RECIPES) + 1, medians["dsr_plan"], f"{out['plan_vs_run']}x the run", ha="center", va="bottom")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("seconds (medians)")
    ax.set_title(f"{out['erase']:,} of {out['rows']:,} Delta ids erased: whole processes, x the fastest recipe")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "chart":  # redraw from a result: chart RESULT.json
        result = Path(sys.argv[2])
        chart(json.loads(result.read_text()), result.with_suffix(".png"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "recipe":
        recipe(*sys.argv[2:5])
        return
    args = argparse.ArgumentParser()
    args.add_argument("--rows", type=int, default=1_000_000)
    args.add_argument("--erase", type=int, default=10_000)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-delta-"))
    args.add_argument("--absent", action="store_true", help="erase ids the table does not hold (nothing matches)")
    a = args.parse_args()
    work = Path(a.workdir)
    source = work / "source"
    if not source.exists():
        make_table(source, a.rows)
    step = a.rows // a.erase
    ids = [f"{'absent' if a.absent else 'id'}-{i * step:010d}" for i in range(a.erase)]
    keys = work / "keys.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ids}), keys)
    requests = work / "requests.csv"
    requests.write_text("subject_id,type\n" + "".join(f"{i},erase\n" for i in ids))
    rounds = []
    peak_mb: dict[str, int] = {}  # each process's peak memory (Python and the driver's JVM), last round
    for r in range(a.rounds):
        seconds: dict[str, float] = {}
        for variant in (*RECIPES, "dsr"):
            side = work / f"{variant}-{r}"
            shutil.rmtree(side, ignore_errors=True)
            shutil.copytree(source, side / "table")
            if variant == "dsr":
                config = side / "dsr.yaml"
                config.write_text(yaml.safe_dump({
                    "catalog": {"name": "lakehouse", "properties": {"type": "hadoop", "warehouse": str(side / "wh")}},
                    "secret_key_file": str(side / "dsr-secret.key"), "export": {"directory": str(side / "exports")},
                    "purge": {"orphan_min_age_minutes": 0},
                    "datamap": {"subject": "id", "tables": {"ads.events": {"key": "id", "format": "delta",
                                                                           "path": str(side / "table")}}}}))
                dsr = ("-m", "lakehouse_dsr", "--config", str(config))
                seconds["dsr_submit"], _, submit_peak = measured_process("dsr submit", *dsr, "submit", "--file",
                                                                         str(requests))
                seconds["dsr_plan"], planned, _ = measured_process("dsr plan", *dsr, "plan", "--json")
                seconds["dsr_plan_estimate"] = round(json.loads(planned)["estimated_seconds"], 3)
                seconds["dsr_run"], _, run_peak = measured_process("dsr run", *dsr, "run", "--report",
                                                                   str(side / "report.json"))
                seconds["dsr"] = round(seconds["dsr_submit"] + seconds["dsr_run"], 3)
                peak_mb.update({"submit": round(submit_peak / 2**20), "run": round(run_peak / 2**20)})
                report = json.loads((side / "report.json").read_text())
                assert sum(1 for q in report["requests"] if q["status"] == "completed") == a.erase, "dsr run"
                seconds.update({f"dsr_{stage}": s for stage, s in report["seconds"].items()})
            else:
                seconds[variant], _, peak = measured_process(variant, __file__, "recipe", variant,
                                                             str(side / "table"), str(keys))
                peak_mb[variant] = round(peak / 2**20)
            shutil.rmtree(side, ignore_errors=True)
        rounds.append(seconds)
        print(json.dumps(seconds), flush=True)
    medians = {v: statistics.median(r[v] for r in rounds) for v in rounds[0]}
    fastest = min(medians[v] for v in RECIPES)
    out = {"rows": a.rows, "erase": a.erase, "rounds": rounds, "median_s": medians,
           "vs_fastest_recipe": {v: round(medians[v] / fastest, 3) for v in (*RECIPES, "dsr")},
           "plan_vs_run": round(medians["dsr_plan"] / medians["dsr_run"], 3),
           "estimate_vs_run": round(medians["dsr_plan_estimate"] / medians["dsr_run"], 3),
           "peak_memory_mb": peak_mb,
           "generated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    name = f"delta-{a.rows}-{a.erase}{'-absent' if a.absent else ''}.json"
    (Path(__file__).parent / "results" / name).write_text(json.dumps(out, indent=1))
    chart(out, (Path(__file__).parent / "results" / name).with_suffix(".png"))
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))


if __name__ == "__main__":
    main()
