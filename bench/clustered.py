"""Cost follows the people, not the lake: a clustered events table at 1M -> 10M -> 30M -> 100M events.

Usage: python bench/clustered.py [--events 1000000,10000000,30000000,100000000] [--unclustered 10000000]
       [--erase 10] [--access 10] [--rounds 3] [--file-mb 16] [--keep-others] [--format iceberg|delta]
Per size and layout, as whole `dsr` processes with Spark's default 1 GB driver: `dsr generate`
(users = events / 100, as in the notebook; `--format delta`: Delta tables under the config's
`delta.warehouse`); for the clustered layout `dsr optimize --table demo.events --target-file-size-mb 16`
(files of a fixed size, so 10 people touch at most 10 files whatever the table's size; on Delta
`OPTIMIZE ... ZORDER BY` the key); then `rounds` times: `dsr submit --file` of `erase` + `access` random
users not asked about before, and `dsr run --report`. The data map holds the events table only.
Per round: the run's seconds, each stage's seconds and Spark I/O (rows and bytes read), and the
bytes of the data files holding the requested people before the run (found with pyiceberg or
delta-rs and pyarrow, not by the engine). The summary: median run per size, the ratio of each size to 10M, and
bytes read by plan + erase + collateral check + verification + export (stages export, resolve,
erase, verify) against the bytes of the files holding the people. Writes bench/results/clustered.json
and clustered.png (`--format delta`: clustered-delta.json and clustered-delta.png).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse_dsr.bench import dsr_process

SEED = 42  # `dsr generate`'s default seed: user ids are synth.user_id(SEED, i)


def config(work: Path, file_mb: int, table_format: str) -> Path:
    path = work / "dsr.yaml"
    events = {"key": "user_id"} | ({"format": "delta"} if table_format == "delta" else {})
    path.write_text(yaml.safe_dump({
        "delta": {"warehouse": str(work / "delta")},
        "catalog": {"name": "lakehouse", "properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "dsr-secret.key"),
        "export": {"directory": str(work / "exports")},
        # The purge writes files of the clustered size, so later erasures keep touching few bytes.
        "purge": {"orphan_min_age_minutes": 0, "target_file_size_mb": file_mb},
        "datamap": {"subject": "user_id", "identifiers": {}, "tables": {"demo.events": events}},
    }))
    return path


def live_files(cfg: Path) -> list[tuple[str, int]]:
    """(local path, bytes) of the events table's current data files, read with pyiceberg or delta-rs
    (no JVM)."""
    from lakehouse_dsr.config import load_settings
    from lakehouse_dsr.lake.catalog import open_catalog

    settings = load_settings(cfg)
    root = settings.delta_tables().get("demo.events")
    if root is not None:
        from urllib.parse import unquote

        import pyarrow as pa
        from deltalake import DeltaTable

        adds = pa.table(DeltaTable(root).get_add_actions(flatten=True)).to_pylist()
        return [(f"{root}/{unquote(a['path'])}", a["size_bytes"]) for a in adds]  # the log's paths are URL-encoded
    files = open_catalog(settings).load_table("demo.events").inspect.files().to_pylist()
    return [(f["file_path"].removeprefix("file:"), f["file_size_in_bytes"]) for f in files]


def table_size(cfg: Path) -> tuple[int, int]:
    """(data files, bytes) of the events table's current files."""
    files = live_files(cfg)
    return len(files), sum(size for _, size in files)


def holding_bytes(cfg: Path, subjects: list[str]) -> tuple[int, int]:
    """(data files, bytes) of the events table's live files holding any of `subjects`: each file's
    user_id column read with pyarrow, one file at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = pa.array(subjects)
    files = n = 0
    for path, size in live_files(cfg):
        ids = pq.read_table(path, columns=["user_id"]).column("user_id")
        if pc.any(pc.is_in(ids, value_set=wanted)).as_py():
            files, n = files + 1, n + size
    return files, n


SCANS = ("export", "resolve", "erase", "verify")  # plan, erase commit, collateral check, verification, export


def point(events: int, clustered: bool, erase: int, access: int, rounds: int, file_mb: int, work: Path,
          table_format: str) -> dict:
    from lakehouse_dsr import synth

    cfg = config(work, file_mb, table_format)
    users = max(1, events // 100)
    built = work / "lake.json"  # a lake kept by --keep-lakes: later rounds erase people not asked about yet
    if built.exists():
        out = json.loads(built.read_text())
    else:
        out = {"events": events, "layout": "clustered" if clustered else "unsorted",
               "generate_s": dsr_process(cfg, "generate", "--users", str(users), "--events", str(events),
                                          "--format", table_format)}
        if clustered:
            out["optimize_s"] = dsr_process(cfg, "optimize", "--table", "demo.events",
                                            "--target-file-size-mb", str(file_mb))
        built.write_text(json.dumps(out))
    out["files"], out["bytes"] = table_size(cfg)
    asked = work / "asked.json"  # people of earlier rounds on a kept lake
    earlier = set(json.loads(asked.read_text())) if asked.exists() else set()
    people = [i for i in random.Random(events + len(earlier)).sample(range(users), (erase + access) * rounds + len(
        earlier)) if i not in earlier][:(erase + access) * rounds]
    asked.write_text(json.dumps(sorted(earlier | set(people))))
    out["rounds"] = []
    for r in range(rounds):
        chosen = [synth.user_id(SEED, i) for i in people[r * (erase + access):(r + 1) * (erase + access)]]
        requests = work / "requests.csv"
        requests.write_text("subject_id,type\n" + "".join(f"{u},erase\n" for u in chosen[:erase])
                            + "".join(f"{u},access\n" for u in chosen[erase:]))
        files, held = holding_bytes(cfg, chosen)
        dsr_process(cfg, "submit", "--file", str(requests))
        report = work / "report.json"
        run_s = dsr_process(cfg, "run", "--report", str(report))
        rep = json.loads(report.read_text())
        table = rep["tables"]["demo.events"]
        read = sum(rep["cost"].get(stage, {}).get("bytes_read", 0) for stage in SCANS)
        out["rounds"].append({
            "run_s": run_s, "stages_s": rep["seconds"], "cost": rep["cost"],
            "holding_files": files, "holding_bytes": held, "scanned_bytes": read,
            "scanned_vs_holding": round(read / held, 2) if held else None,
            "erase": {k: table["erase"].get(k) for k in ("strategy", "skipping", "data_files_rewritten",
                                                          "bytes_rewritten", "rows_matched")},
            "purge_files_rewritten": table["purge"].get("data_files_rewritten", 0),
            "completed": sum(1 for q in rep["requests"] if q["status"] == "completed"),
        })
    out["run_s"] = statistics.median(r["run_s"] for r in out["rounds"])
    out["scanned_vs_holding"] = statistics.median(r["scanned_vs_holding"] or 0 for r in out["rounds"])
    out["stages_s"] = {stage: statistics.median(r["stages_s"].get(stage, 0.0) for r in out["rounds"])
                       for stage in sorted({s for r in out["rounds"] for s in r["stages_s"]})}
    out["bytes_read"] = {stage: statistics.median(r["cost"].get(stage, {}).get("bytes_read", 0) for r in out["rounds"])
                         for stage in out["stages_s"]}
    return out


def chart(points: list[dict], path: Path, table_format: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = sorted((p for p in points if p["layout"] == "clustered"), key=lambda p: p["events"])
    fig, (secs, read) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{p['events'] / 1e6:g}M" for p in mine]
    stages = sorted({s for p in mine for s in p["stages_s"]})
    bottom = [0.0] * len(mine)
    for stage in stages:
        values = [p["stages_s"].get(stage, 0.0) for p in mine]
        secs.bar(labels, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    secs.plot(labels, [p["run_s"] for p in mine], "ko-", label="whole dsr run")
    secs.set_ylabel("seconds (median)")
    secs.set_title(f"dsr run, clustered {table_format} events, 10 erase + 10 access: seconds per stage")
    secs.legend(fontsize=7)
    x = range(len(mine))
    read.bar([i - 0.2 for i in x], [p["rounds"][0]["holding_bytes"] / 1e6 for p in mine], 0.4,
             label="files holding the 20 people")
    read.bar([i + 0.2 for i in x], [sum(p["bytes_read"].get(s, 0) for s in SCANS) / 1e6 for p in mine], 0.4,
             label="read by plan, erase, check, verify, export")
    read.plot(list(x), [p["bytes"] / 1e6 for p in mine], "k:", label="table size")
    read.set_xticks(list(x), labels)
    read.set_yscale("log")
    read.set_ylabel("MB")
    read.set_title("bytes read against the bytes that hold the people")
    read.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", default="1000000,10000000,30000000,100000000")
    args.add_argument("--unclustered", default="")
    args.add_argument("--erase", type=int, default=10)
    args.add_argument("--access", type=int, default=10)
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--file-mb", type=int, default=16, help="clustered file size (dsr optimize)")
    args.add_argument("--keep-others", action="store_true", help="keep the saved points not measured now")
    args.add_argument("--keep-lakes", action="store_true", help="keep each lake in --workdir for a later run")
    args.add_argument("--format", dest="table_format", choices=("iceberg", "delta"), default="iceberg")
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-clustered-"))
    a = args.parse_args()
    name = "clustered" if a.table_format == "iceberg" else f"clustered-{a.table_format}"
    runs = [(int(n), True) for n in a.events.split(",") if n] + [(int(n), False) for n in a.unclustered.split(",") if n]
    points = []
    for events, clustered in runs:
        work = Path(a.workdir) / f"{events}-{'clustered' if clustered else 'unsorted'}"
        work.mkdir(parents=True, exist_ok=True)
        points.append(point(events, clustered, a.erase, a.access, a.rounds, a.file_mb, work, a.table_format))
        print(json.dumps(points[-1]), flush=True)
        if not a.keep_lakes:
            shutil.rmtree(work, ignore_errors=True)  # 30M events take GBs
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    if a.keep_others and (results / f"{name}.json").exists():  # re-measured points replace their old ones
        measured = {(p["events"], p["layout"]) for p in points}
        points = [p for p in json.loads((results / f"{name}.json").read_text())["points"]
                  if (p["events"], p["layout"]) not in measured] + points
    runs = {p["events"]: p["run_s"] for p in points if p["layout"] == "clustered"}
    (results / f"{name}.json").write_text(json.dumps({
        "format": a.table_format, "erase": a.erase, "access": a.access, "rounds": a.rounds, "file_mb": a.file_mb,
        "driver_memory": "Spark default (1g)",
        "run_vs_10M": {str(n): round(s / runs[10_000_000], 2) for n, s in sorted(runs.items())}
        if 10_000_000 in runs else {},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "points": points}, indent=1))
    chart(points, results / f"{name}.png", a.table_format)


if __name__ == "__main__":
    main()
