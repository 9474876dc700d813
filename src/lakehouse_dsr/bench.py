"""`dsr bench`: the notebook's own steps (side A) against `dsr run` (side B), on identical data.

Both sides get the same workload, rebuilt deterministically from one seed with the notebook's
batched appends, in their own namespaces; side A's events table is copy-on-write like the
notebook's. Side A runs the notebook's statements as written: DELETE ... WHERE EXISTS against a
gdpr_requests table, expire_snapshots, the join + partitionBy export, then its optimized path (sort
rewrite, export again). Side B submits the same requests to the ledger and runs `dsr run` with
verification. Results: bench/results/<events>.json and PNG charts.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession

from . import iceberg, synth
from .config import Settings
from .datamap import DataMap
from .ledger import Ledger, RequestInput
from .progress import Progress, Silent
from .run import run

SEED = 1


def _side(settings: Settings, side: str, tables: list[str] | None) -> Settings:
    """Settings whose demo namespace, data map and ledger live in the side's own namespaces."""
    ns = f"bench_{side}"
    s = settings.model_copy(deep=True)
    s.demo_namespace, s.ledger_namespace = ns, f"{ns}_ledger"
    raw = s.datamap.model_dump()
    rename = lambda name: f"{ns}.{name.split('.', 1)[1]}"  # noqa: E731
    raw["tables"] = {rename(t): m for t, m in raw["tables"].items() if tables is None or t in tables}
    raw["identifiers"] = {k: {**v, "table": rename(v["table"])} for k, v in raw["identifiers"].items()
                          if tables is None or v["table"] in tables}
    s.datamap = DataMap.model_validate(raw)
    return s


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return round(time.perf_counter() - start, 3), value


def _files_under(path: Path) -> int:
    return sum(1 for _ in path.rglob("*.parquet"))


def side_a(spark: SparkSession, settings: Settings, deletes: list[str], exports: list[str], work: Path) -> dict:
    """The notebook's steps, as it writes them (events only, copy-on-write)."""
    ns = settings.demo_namespace
    events, requests = settings.table(f"{ns}.events"), settings.table(f"{ns}.gdpr_requests")
    spark.sql(f"ALTER TABLE {events} SET TBLPROPERTIES ('write.delete.mode'='copy-on-write', "
              "'write.update.mode'='copy-on-write', 'write.merge.mode'='copy-on-write')")
    rows = [(u, "delete") for u in deletes] + [(u, "export") for u in exports]
    spark.createDataFrame(rows, "user_id string, request_type string").writeTo(requests).createOrReplace()
    stages: dict[str, float] = {}
    stages["erase"], _ = _timed(lambda: spark.sql(
        f"DELETE FROM {events} AS t WHERE EXISTS (SELECT user_id FROM {requests} "
        "WHERE request_type = 'delete' AND t.user_id = user_id)"))
    summary = iceberg.current_snapshot(spark, settings, f"{ns}.events").summary
    cutoff = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    stages["expire"], _ = _timed(lambda: spark.sql(
        f"CALL `{settings.catalog.name}`.system.expire_snapshots('{ns}.events', TIMESTAMP '{cutoff}', 1)").collect())

    def export(out: Path) -> int:
        spark.sql(f"SELECT e.* FROM {events} e JOIN {requests} r ON r.request_type = 'export' "
                  "AND e.user_id = r.user_id").write.mode("overwrite").partitionBy("user_id").parquet(str(out))
        return _files_under(out)

    stages["export"], files = _timed(lambda: export(work / "a-export-unsorted"))
    # The notebook passes no options; on its 650 MB table that sorted everything. Our synthetic rows
    # are smaller and Iceberg skips groups under the 512 MB target, so 'rewrite-all' keeps the effect.
    stages["sort_rewrite"], _ = _timed(lambda: spark.sql(
        f"CALL `{settings.catalog.name}`.system.rewrite_data_files(table => '{ns}.events', strategy => 'sort', "
        "sort_order => 'user_id ASC', options => map('rewrite-all', 'true'))").collect())
    stages["export_after_sort"], files_sorted = _timed(lambda: export(work / "a-export-sorted"))
    return {
        "seconds": stages,
        "full_cycle_s": round(stages["erase"] + stages["expire"] + stages["export"], 3),
        "bytes_rewritten": int(summary.get("removed-files-size", 0)),
        "data_files_rewritten": int(summary.get("deleted-data-files", 0)),
        "export_files": files,
        "export_files_after_sort": files_sorted,
        "verified": False,
    }


def side_b(spark: SparkSession, settings: Settings, deletes: list[str], exports: list[str], work: Path) -> dict:
    """`dsr run` on the same requests, verification included."""
    settings.export.directory = work / "b-exports"
    Ledger(spark, settings).submit([RequestInput(u, "erase") for u in deletes]
                                   + [RequestInput(u, "access") for u in exports])
    seconds, report = _timed(lambda: run(spark, settings))
    tables = report.tables.values()
    return {
        "seconds": dict(report.seconds),
        "full_cycle_s": seconds,
        "bytes_rewritten": sum(t["erase"]["bytes_rewritten"] + t["purge"].get("bytes_rewritten", 0) for t in tables),
        "data_files_rewritten": sum(t["erase"]["data_files_rewritten"] + t["purge"].get("data_files_rewritten", 0)
                                    for t in tables),
        "rows_matched": sum(t["erase"]["rows_matched"] for t in tables),
        "export_files": report.export.get("packages", 0),
        "verified": all(t["verification"]["passed"] for t in tables),
        "completed": len(report.completed),
        "failed": len(report.failed),
    }


def run_bench(
    spark: SparkSession, settings: Settings, events: int, users: int, erase: int = 100, access: int = 1000,
    results_dir: Path = Path("bench/results"), work_dir: Path | None = None, progress: Progress | None = None,
) -> dict:
    """Build both sides, run them one after the other, write <results_dir>/<events>.json and charts."""
    progress = progress or Silent()
    work = work_dir or Path(settings.export.directory).parent / "bench-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    picks = random.Random(SEED).sample(range(users), min(users, erase + access))
    deletes = [synth.user_id(SEED, i) for i in picks[:erase]]
    exports = [synth.user_id(SEED, i) for i in picks[erase:]]
    sides = {"a": _side(settings, "a", None), "b": _side(settings, "b", ["demo.events"]),
             "b_all": _side(settings, "b_all", None)}
    results: dict = {}
    for name, side_settings in sides.items():
        progress.stage(f"side {name}", 2)
        progress.step("build workload")
        synth.generate(spark, side_settings, users=users, events=events, seed=SEED)
        progress.step("notebook steps" if name == "a" else "dsr run")
        runner = side_a if name == "a" else side_b
        results[name] = runner(spark, side_settings, deletes, exports, work)
        progress.done()
    a, b = results["a"], results["b"]
    out = {
        "events": events, "users": users, "erase": erase, "access": access,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "side_a_notebook": a, "side_b_dsr_events": b, "side_b_dsr_all_tables": results["b_all"],
        "ratios": {
            "full_cycle": round(a["full_cycle_s"] / b["full_cycle_s"], 2),
            "export_vs_unsorted": round(a["seconds"]["export"] / b["seconds"]["export"], 2),
            "logical_erase_s": b["seconds"]["erase"],
        },
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{events}.json").write_text(json.dumps(out, indent=2))
    charts(results_dir)
    shutil.rmtree(work, ignore_errors=True)
    return out


def charts(results_dir: Path) -> list[Path]:
    """Stage times side by side for each scale, and full-cycle time over scales."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted((json.loads(p.read_text()) for p in results_dir.glob("[0-9]*.json")), key=lambda r: r["events"])
    written = []
    for r in runs:
        a, b = r["side_a_notebook"]["seconds"], r["side_b_dsr_events"]["seconds"]
        stages = list(dict.fromkeys([*a, *b]))
        fig, ax = plt.subplots(figsize=(9, 4))
        x = range(len(stages))
        ax.bar([i - 0.2 for i in x], [a.get(s, 0) for s in stages], 0.4, label="notebook (side A)")
        ax.bar([i + 0.2 for i in x], [b.get(s, 0) for s in stages], 0.4, label="dsr run (side B)")
        ax.set_xticks(list(x), stages, rotation=20)
        ax.set_ylabel("seconds")
        ax.set_title(f"{r['events']:,} events, {r['erase']} erasures, {r['access']} exports")
        ax.legend()
        fig.tight_layout()
        path = results_dir / f"{r['events']}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    if runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        events = [r["events"] for r in runs]
        ax.plot(events, [r["side_a_notebook"]["full_cycle_s"] for r in runs], "o-", label="notebook (side A)")
        ax.plot(events, [r["side_b_dsr_events"]["full_cycle_s"] for r in runs], "o-", label="dsr run (side B)")
        ax.set_xlabel("events")
        ax.set_ylabel("full cycle, seconds")
        ax.set_title("full cycle (erase + purge/expire + export [+ verify])")
        ax.legend()
        fig.tight_layout()
        path = results_dir / "scaling.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
