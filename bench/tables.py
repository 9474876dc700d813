"""A wide lake: `dsr run` over 10, 100 and 500 mapped tables of 10k rows, against the naive per-table SQL.

Usage: python bench/tables.py [--tables 10,100,500] [--naive-max 100] [--rows 10000] [--erase 10] [--rounds 3]
The lake: `wide.people` (user_id, email; the linked identifier's source) and N tables `wide.tNNN`:
half delete rows keyed by user_id, a quarter redact columns keyed by user_id, a quarter delete rows
keyed by email (reached through the linked identifier). Each round submits `erase` new erase
requests (`dsr submit --file`) and times the whole `dsr run` process (JVM start-up included),
on a data map of the first 10, 50, 100 tables (own ledger namespace per size). The naive side
runs, on a copy of the same tables, what teams hand-write: per table one DELETE (or UPDATE) with
the ids in a subquery, then expire_snapshots; no export, no verification, no ledger (up to
`--naive-max` tables: it costs about a second per table). Targets: 100 tables <= 40 s, 500 <= 150 s.
Writes bench/results/tables.json and bench/results/tables.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse_dsr.bench import dsr_process
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.lake.spark import build_session

TARGETS = {100: 40.0, 500: 150.0}  # tables: whole run, seconds at most
SUBJECTS = 2000  # distinct people per table: each erased subject has about rows / SUBJECTS rows in each


def mapping(i: int) -> tuple[str, dict]:
    """Table i's name and data-map entry: delete by user_id, redact by user_id, or delete by email."""
    name = f"wide.t{i:03d}"
    kind = ("delete", "redact", "delete", "email")[i % 4]
    if kind == "redact":
        return name, {"key": "user_id", "action": "redact", "redact": ["user_id", "note"]}
    if kind == "email":
        return name, {"key": "email", "identifier": "email", "action": "delete"}
    return name, {"key": "user_id", "action": "delete"}


def build(spark, settings, namespace: str, tables: int, rows: int) -> None:
    """people + `tables` tables of `rows` rows each, one append per table."""
    cat = settings.catalog.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS `{cat}`.{namespace}")
    spark.sql(f"CREATE OR REPLACE TABLE `{cat}`.{namespace}.people USING iceberg AS "
              f"SELECT format_string('u%06d', id) AS user_id, format_string('u%06d@example.org', id) AS email "
              f"FROM range({SUBJECTS})")
    for i in range(tables):
        name = mapping(i)[0].split(".", 1)[1]
        key = "email" if mapping(i)[1]["key"] == "email" else "user_id"
        fmt = "u%06d@example.org" if key == "email" else "u%06d"
        spark.sql(f"CREATE OR REPLACE TABLE `{cat}`.{namespace}.{name} USING iceberg "
                  "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
                  "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read') AS "
                  f"SELECT format_string('{fmt}', CAST(pmod(hash(id, {i}), {SUBJECTS}) AS INT)) AS {key}, "
                  f"id AS seq, concat('note ', id) AS note, current_timestamp() AS at FROM range({rows})")


def config(work: Path, tables: int) -> Path:
    path = work / f"dsr-{tables}.yaml"
    path.write_text(yaml.safe_dump({
        "catalog": {"name": "wide", "properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "dsr-secret.key"),
        "ledger_namespace": f"ledger{tables}",
        "export": {"directory": str(work / "exports")},
        "datamap": {"subject": "user_id",
                    "identifiers": {"email": {"table": "wide.people", "subject_column": "user_id", "column": "email"}},
                    "tables": dict(mapping(i) for i in range(tables))},
    }))
    return path


def naive(spark, settings, tables: int, ids: list[str]) -> float:
    """Per table: one DELETE / UPDATE with the ids in a subquery, then expire_snapshots (the notebook's way)."""
    cat = settings.catalog.name
    spark.createDataFrame([(u,) for u in ids], "user_id string").createOrReplaceTempView("naive_requests")
    start = time.perf_counter()
    for i in range(tables):
        name, m = mapping(i)
        table = f"`{cat}`.naive.{name.split('.', 1)[1]}"
        if m["key"] == "email":
            ids_of = f"SELECT email FROM `{cat}`.naive.people WHERE user_id IN (SELECT user_id FROM naive_requests)"
            spark.sql(f"DELETE FROM {table} WHERE email IN ({ids_of})")
        elif m["action"] == "redact":
            spark.sql(f"UPDATE {table} SET user_id = NULL, note = NULL "
                      "WHERE user_id IN (SELECT user_id FROM naive_requests)")
        else:
            spark.sql(f"DELETE FROM {table} WHERE user_id IN (SELECT user_id FROM naive_requests)")
        cutoff = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        spark.sql(f"CALL `{cat}`.system.expire_snapshots('naive.{name.split('.', 1)[1]}', "
                  f"TIMESTAMP '{cutoff}', 1)").collect()
    return round(time.perf_counter() - start, 3)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--tables", default="10,100,500")
    args.add_argument("--naive-max", type=int, default=100)
    args.add_argument("--rows", type=int, default=10_000)
    args.add_argument("--erase", type=int, default=10)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-tables-"))
    a = args.parse_args()
    sizes = [int(n) for n in a.tables.split(",")]
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    configs = {n: config(work, n) for n in sizes}
    settings = load_settings(configs[max(sizes)])
    spark = build_session(settings)
    naive_sizes = [n for n in sizes if n <= a.naive_max]
    build(spark, settings, "wide", max(sizes), a.rows)
    if naive_sizes:
        build(spark, settings, "naive", max(naive_sizes), a.rows)
    spark.stop()  # the dsr processes get the machine to themselves

    results: dict[int, dict] = {}
    subject = iter(range(0, SUBJECTS, 7))  # every round erases people no earlier round erased
    rounds: dict[int, list[dict]] = {n: [] for n in sizes}
    naive_ids: dict[int, list[str]] = {}
    for round_ in range(a.rounds):
        for n in sizes:
            ids = [f"u{next(subject):06d}" for _ in range(a.erase)]
            requests = work / "requests.csv"
            with requests.open("w", newline="") as fh:
                csv.writer(fh).writerows([("subject_id", "type"), *((u, "erase") for u in ids)])
            submit = dsr_process(configs[n], "submit", "--file", str(requests))
            run_s = dsr_process(configs[n], "run", "--report", str(work / f"run-{n}-{round_}.json"))
            report = json.loads((work / f"run-{n}-{round_}.json").read_text())
            assert report["summary"]["completed"] == a.erase, report["summary"]
            rounds[n].append({"run_s": run_s, "submit_s": submit, "stages": report["seconds"]})
            naive_ids.setdefault(n, ids)
            print(f"round {round_ + 1}: {n} tables, dsr run {run_s} s", flush=True)
    spark = build_session(settings)
    naive_s = {n: naive(spark, settings, n, naive_ids[n]) for n in naive_sizes}  # once: it changes the tables
    spark.stop()
    for n in sizes:
        med = statistics.median(r["run_s"] for r in rounds[n])
        results[n] = {"dsr_run_s": round(med, 3), "per_table_s": round(med / n, 3), "naive_s": naive_s.get(n),
                      "ratio_vs_naive": round(naive_s[n] / med, 2) if n in naive_s else None,
                      "target_s": TARGETS.get(n), "rounds": rounds[n]}
    out = {"rows_per_table": a.rows, "erase": a.erase, "rounds": a.rounds,
           "generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "tables": results,
           "targets": TARGETS,
           "targets_met": {n: results[n]["dsr_run_s"] <= s for n, s in TARGETS.items() if n in results}}
    out_dir = Path(__file__).parent / "results"
    (out_dir / "tables.json").write_text(json.dumps(out, indent=2))
    chart(out, out_dir / "tables.png")
    print(json.dumps({n: {k: v for k, v in r.items() if k != "rounds"} for n, r in results.items()}, indent=2))


def chart(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(n) for n in out["tables"])
    runs = [out["tables"][n]["dsr_run_s"] if n in out["tables"] else out["tables"][str(n)]["dsr_run_s"]
            for n in sizes]
    naive = [(n, out["tables"].get(n, out["tables"].get(str(n)))["naive_s"]) for n in sizes]
    naive = [(n, s) for n, s in naive if s is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, runs, "o-", label="dsr run (whole process: erase, purge, verify, ledger)")
    ax.plot([n for n, _ in naive], [s for _, s in naive], "s--", label="per-table DELETE/UPDATE + expire (no proof)")
    ax.plot(list(TARGETS), list(TARGETS.values()), "x", color="grey", label="targets")
    ax.set_xlabel("mapped tables (10k rows each)")
    ax.set_ylabel("seconds")
    ax.set_title(f"{out['erase']} erase requests over a wide lake")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
