"""Purge cost follows the files that hold the erased people: 1M -> 10M -> 30M events, clustered or not.

Usage: python bench/clustered.py [--events 1000000,10000000,30000000] [--unclustered 1000000,10000000]
       [--erase 10] [--file-mb 16] [--keep-others]
Per size and layout, as whole `dsr` processes with Spark's default 1 GB driver: `dsr generate`
(users = events / 100, as in the notebook); for the clustered layout `dsr optimize --table
demo.events --target-file-size-mb 16` (files of a fixed size, so 10 people touch at most 10 files
whatever the table's size); `dsr submit --file` of `erase` random users; `dsr run --report`. The
data map holds the events table only, so the run's purge is the events table's. From the report:
the purge stage's seconds and Spark I/O, the data files and bytes the erase and purge rewrote;
from the table: its data files and bytes. Writes bench/results/clustered.json and clustered.png.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from lakehouse_dsr.bench import dsr_process

SEED = 42  # `dsr generate`'s default seed: user ids are synth.user_id(SEED, i)


def config(work: Path, file_mb: int) -> Path:
    path = work / "dsr.yaml"
    path.write_text(yaml.safe_dump({
        "catalog": {"name": "lakehouse", "properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "dsr-secret.key"),
        "export": {"directory": str(work / "exports")},
        # The purge writes files of the clustered size, so later erasures keep touching few bytes.
        "purge": {"orphan_min_age_minutes": 0, "target_file_size_mb": file_mb},
        "datamap": {"subject": "user_id", "identifiers": {}, "tables": {"demo.events": {"key": "user_id"}}},
    }))
    return path


def table_size(cfg: Path) -> tuple[int, int]:
    """(data files, bytes) of the events table's current files, read with pyiceberg (no JVM)."""
    from lakehouse_dsr.config import load_settings
    from lakehouse_dsr.lake.catalog import open_catalog

    table = open_catalog(load_settings(cfg)).load_table("demo.events")
    files = table.inspect.files().to_pylist()
    return len(files), sum(f["file_size_in_bytes"] for f in files)


def point(events: int, clustered: bool, erase: int, file_mb: int, work: Path) -> dict:
    from lakehouse_dsr import synth

    cfg = config(work, file_mb)
    users = max(1, events // 100)
    out = {"events": events, "layout": "clustered" if clustered else "unsorted",
           "generate_s": dsr_process(cfg, "generate", "--users", str(users), "--events", str(events))}
    if clustered:
        out["optimize_s"] = dsr_process(cfg, "optimize", "--table", "demo.events",
                                        "--target-file-size-mb", str(file_mb))
    out["files"], out["bytes"] = table_size(cfg)
    requests = work / "requests.csv"
    subjects = random.Random(events).sample(range(users), erase)
    requests.write_text("subject_id,type\n" + "".join(f"{synth.user_id(SEED, i)},erase\n" for i in subjects))
    dsr_process(cfg, "submit", "--file", str(requests))
    report = work / "report.json"
    out["run_s"] = dsr_process(cfg, "run", "--report", str(report))
    r = json.loads(report.read_text())
    table = r["tables"]["demo.events"]
    out["stages_s"] = r["seconds"]
    out["purge_s"] = r["seconds"].get("purge", 0.0)
    out["purge_cost"] = r["cost"].get("purge", {})
    out["erase_files_rewritten"] = table["erase"].get("data_files_rewritten", 0)
    out["purge_files_rewritten"] = table["purge"].get("data_files_rewritten", 0)
    out["purge_bytes_rewritten"] = table["purge"].get("bytes_rewritten", 0)
    out["completed"] = sum(1 for q in r["requests"] if q["status"] == "completed")
    return out


def chart(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (secs, written) = plt.subplots(1, 2, figsize=(11, 4))
    for layout, style in (("clustered", "o-"), ("unsorted", "s--")):
        mine = sorted((p for p in points if p["layout"] == layout), key=lambda p: p["events"])
        if not mine:
            continue
        x = [p["events"] / 1e6 for p in mine]
        secs.plot(x, [p["purge_s"] for p in mine], style, label=f"purge, {layout}")
        written.plot(x, [p["purge_bytes_rewritten"] / 1e6 for p in mine], style, label=f"rewritten, {layout}")
        written.plot(x, [p["bytes"] / 1e6 for p in mine], ":", color="grey",
                     label="table size" if layout == "clustered" else None)
    secs.set_xlabel("events (millions)")
    secs.set_ylabel("seconds")
    secs.set_title("purge stage of `dsr run` (10 erased people)")
    written.set_xlabel("events (millions)")
    written.set_ylabel("MB")
    written.set_title("bytes the purge rewrote")
    for ax in (secs, written):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", default="1000000,10000000,30000000")
    args.add_argument("--unclustered", default="1000000,10000000")
    args.add_argument("--erase", type=int, default=10)
    args.add_argument("--file-mb", type=int, default=16, help="clustered file size (dsr optimize)")
    args.add_argument("--keep-others", action="store_true", help="keep the saved points not measured now")
    args.add_argument("--workdir", default=tempfile.mkdtemp(prefix="dsr-bench-clustered-"))
    a = args.parse_args()
    runs = [(int(n), True) for n in a.events.split(",") if n] + [(int(n), False) for n in a.unclustered.split(",") if n]
    points = []
    for events, clustered in runs:
        work = Path(a.workdir) / f"{events}-{'clustered' if clustered else 'unsorted'}"
        work.mkdir(parents=True, exist_ok=True)
        points.append(point(events, clustered, a.erase, a.file_mb, work))
        print(json.dumps(points[-1]), flush=True)
        shutil.rmtree(work / "wh")  # 30M events take GBs
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    if a.keep_others and (results / "clustered.json").exists():  # re-measured points replace their old ones
        measured = {(p["events"], p["layout"]) for p in points}
        points = [p for p in json.loads((results / "clustered.json").read_text())["points"]
                  if (p["events"], p["layout"]) not in measured] + points
    (results / "clustered.json").write_text(json.dumps({
        "erase": a.erase, "file_mb": a.file_mb, "driver_memory": "Spark default (1g)",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "points": points}, indent=1))
    chart(points, results / "clustered.png")


if __name__ == "__main__":
    main()
