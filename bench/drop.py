"""California DROP at a broker's size: a list of 1,000,000 hashed emails matched against an identity
table of 10,000,000 people, as whole `dsr` processes, against the physical limit in the same run.

Usage: python bench/drop.py [--rows 10000000] [--hashes 1000000] [--matching 0.5] [--repeats 3]

One identity table (crm.users: user_id, email, phone; Iceberg) and one DROP download (an Email list
of `hashes` work items, a share `matching` of them hashes of the table's emails, the rest of nobody's)
are generated once. Each round, on a ledger of its own:
- `dsr drop import` (the control plane: the ZIP checked and filed; no JVM);
- `dsr drop match` (Spark: the emails standardized and hashed, joined with the items; the outcomes
  filed: an erase request per person matched, status 5 for the rest);
- the physical limit, in a fresh process too: the same bytes read and joined by plain Spark (the
  email column hashed with sha2/base64, the list's CSV read, an inner join, a count), nothing filed.
Reports medians, the ratio match / limit, and writes bench/results/drop-<rows>-<hashes>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pyspark.sql import functions as F

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.lake.frames import to_arrow
from lakehouse_dsr.lake.spark import build_session

DSR = str(Path(sys.executable).parent / "dsr")
LIMIT = """
import sys, time
from pyspark.sql import functions as F
from lakehouse_dsr.config import load_settings
from lakehouse_dsr.lake.spark import build_session
settings = load_settings(sys.argv[1])
spark = build_session(settings)
emails = spark.table(settings.table("crm.users")).select(
    F.base64(F.unhex(F.sha2(F.lower(F.regexp_replace("email", r"(?U)\\s", "")), 256))).alias("hash"), "user_id")
items = spark.read.option("header", True).csv(sys.argv[2])
print(items.join(emails, items["Hash"] == emails["hash"]).select("ID", "user_id").distinct().count())
"""


def _config(work: Path, ledger: str) -> Path:
    path = work / f"{ledger}.yaml"
    path.write_text(yaml.safe_dump({
        "spark": {"master": "local[2]"},
        "catalog": {"properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
        "secret_key_file": str(work / "key"), "ledger_namespace": ledger,
        "datamap": {"subject": "user_id",
                    "identifiers": {"email": {"table": "crm.users", "subject_column": "user_id", "column": "email"}},
                    "tables": {"crm.users": {"key": "user_id"}},
                    "drop": {"email": {"identifier": "email"}}}}))
    return path


def _timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return seconds, done.stdout


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--rows", type=int, default=10_000_000)
    args.add_argument("--hashes", type=int, default=1_000_000)
    args.add_argument("--matching", type=float, default=0.5)
    args.add_argument("--repeats", type=int, default=3)
    args.add_argument("--workdir", type=Path, default=None)
    a = args.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="dsr-drop-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = settings_from_dict(yaml.safe_load(_config(work, "setup").read_text()), base=work)
    spark = build_session(settings)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.namespace('crm')}")
    c = F.col("id")
    (spark.range(a.rows, numPartitions=8).select(
        F.concat(F.lit("u"), c.cast("string")).alias("user_id"),
        F.concat(F.lit("person"), c.cast("string"), F.lit("@example.com")).alias("email"),
        F.format_string("+1 (415) %07d", c % 10_000_000).alias("phone"))
     .writeTo(settings.table("crm.users")).createOrReplace())
    matched = int(a.hashes * a.matching)
    step = max(1, a.rows // max(1, matched))
    ids = F.format_string("W%011d", F.col("id"))
    listed = spark.range(a.hashes, numPartitions=4).select(
        ids.alias("ID"),
        F.base64(F.unhex(F.sha2(F.when(F.col("id") < matched, F.concat(
            F.lit("person"), (F.col("id") * step).cast("string"), F.lit("@example.com"))).otherwise(
            F.concat(F.lit("nobody"), F.col("id").cast("string"), F.lit("@example.org"))), 256))).alias("Hash"))
    rows = to_arrow(listed)  # generated benchmark input, not table data
    csv = work / "20261201_4821_Email.csv"
    csv.write_text("ID,Hash\n" + "".join(f"{i},{h}\n" for i, h in zip(
        rows.column("ID").to_pylist(), rows.column("Hash").to_pylist(), strict=True)))
    download = work / "20261201_4821_DROP.zip"
    with zipfile.ZipFile(download, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(csv, csv.name)
    spark.stop()

    rounds = []
    for n in range(a.repeats):
        config = _config(work, f"dsr_r{n}")
        imported, _ = _timed([DSR, "-c", str(config), "drop", "import", str(download)])
        matching, out = _timed([DSR, "-c", str(config), "drop", "match"])
        limit, found = _timed([sys.executable, "-c", LIMIT, str(config), str(csv)])
        assert int(found.strip().splitlines()[-1]) == matched, found
        assert f"{matched} to one person" in out and f"requests: {matched} erase" in out, out
        rounds.append({"import_s": round(imported, 2), "match_s": round(matching, 2), "limit_s": round(limit, 2)})
        print(rounds[-1], flush=True)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {"rows": a.rows, "hashes": a.hashes, "matched": matched, "repeats": a.repeats,
              "date": datetime.now(UTC).isoformat(timespec="seconds"), "cores": os.cpu_count(),
              "rounds": rounds, "median": median,
              "ratio_match_vs_limit": round(median["match_s"] / median["limit_s"], 2)}
    out_path = Path(__file__).parent / "results" / f"drop-{a.rows}-{a.hashes}.json"
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
