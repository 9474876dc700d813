"""California DROP at a broker's size: a list of 1,000,000 hashed emails and one of 100,000 NDZ
composites (first name, last name, date of birth, ZIP) matched against an identity table of
10,000,000 people, as whole `dsr` processes, against the physical limit in the same run.

Usage: python bench/drop.py [--rows 10000000] [--hashes 1000000] [--ndz 100000] [--matching 0.5] [--repeats 3]

One identity table (crm.users: user_id, email, phone, first_name, last_name, birth_date, zip;
Iceberg; one person in fifty has accented names) and one DROP download are generated once: an Email
list of `hashes` work items and an NDZ list of `ndz`, a share `matching` of each the hashes of
people of the table (different people for the two lists), the rest of nobody's. Each round, on a
ledger of its own:
- `dsr drop import` (the control plane: the ZIP checked and filed; no JVM);
- `dsr drop match` (Spark: the emails and the NDZ fields standardized and hashed, joined with the
  items; the outcomes filed: an erase request per person matched, status 5 for the rest);
- the physical limit, in a fresh process too: the same columns read, hashed with Spark's own
  functions (sha2, base64, lower, regexp_replace, date_format: the rule of ASCII names) and joined
  with the lists' CSVs, broadcast, by plain Spark, the pairs counted, nothing filed.
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
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.drop.hashing import list_hash
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
h = lambda text: F.base64(F.unhex(F.sha2(text, 256)))
name = lambda c: h(F.lower(F.regexp_replace(c, "[^0-9A-Za-z]", "")))
zip5 = F.substring(F.regexp_replace(F.regexp_replace("zip", "[^0-9A-Za-z]", ""), "^0+", ""), 1, 5)
users = spark.table(settings.table("crm.users"))
emails = users.select(h(F.lower(F.regexp_replace("email", r"(?U)\\s", ""))).alias("hash"), "user_id")
ndz = users.select(h(F.concat(name(F.col("first_name")), name(F.col("last_name")),
                              h(F.date_format("birth_date", "yyyyMMdd")), h(zip5))).alias("hash"), "user_id")
pairs = None
for csv, hashes in ((sys.argv[2], emails), (sys.argv[3], ndz)):
    items = spark.read.option("header", True).csv(csv)
    found = hashes.join(F.broadcast(items), items["Hash"] == hashes["hash"]).select("ID", "user_id")
    pairs = found if pairs is None else pairs.unionByName(found)
print(pairs.distinct().count())
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
                    "drop": {"email": {"identifier": "email"},
                             "ndz": {"table": "crm.users", "subject_column": "user_id", "first_name": "first_name",
                                     "last_name": "last_name", "dob": "birth_date", "zip": "zip"}}}}))
    return path


def _timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return seconds, done.stdout


def _csv(path: Path, frame: DataFrame) -> Path:
    """`frame` (ID, Hash) as a DROP list file."""
    rows = to_arrow(frame)  # generated benchmark input, not table data
    path.write_text("ID,Hash\n" + "".join(f"{i},{h}\n" for i, h in zip(
        rows.column("ID").to_pylist(), rows.column("Hash").to_pylist(), strict=True)))
    return path


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--rows", type=int, default=10_000_000)
    args.add_argument("--hashes", type=int, default=1_000_000)
    args.add_argument("--ndz", type=int, default=100_000)
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
    accented = c % 50 == 7  # one person in fifty: names the Python rule standardizes
    (spark.range(a.rows, numPartitions=8).select(
        F.concat(F.lit("u"), c.cast("string")).alias("user_id"),
        F.concat(F.lit("person"), c.cast("string"), F.lit("@example.com")).alias("email"),
        F.format_string("+1 (415) %07d", c % 10_000_000).alias("phone"),
        F.concat(F.when(accented, F.lit("José ")).otherwise(F.lit("Ann ")), (c % 997).cast("string")).alias(
            "first_name"),
        F.concat(F.when(accented, F.lit("Müller-")).otherwise(F.lit("O'Lee-")), c.cast("string")).alias("last_name"),
        F.date_add(F.lit("1940-01-01").cast("date"), (c % 25_000).cast("int")).alias("birth_date"),
        F.format_string("%05d", (c % 99_999).cast("int")).alias("zip"))
     .writeTo(settings.table("crm.users")).createOrReplace())
    email_matched, ndz_matched = int(a.hashes * a.matching), int(a.ndz * a.matching)
    step = max(1, a.rows // max(1, email_matched))
    ids = F.format_string("W%011d", F.col("id"))
    emails = spark.range(a.hashes, numPartitions=4).select(
        ids.alias("ID"),
        F.base64(F.unhex(F.sha2(F.when(F.col("id") < email_matched, F.concat(
            F.lit("person"), (F.col("id") * step).cast("string"), F.lit("@example.com"))).otherwise(
            F.concat(F.lit("nobody"), F.col("id").cast("string"), F.lit("@example.org"))), 256))).alias("Hash"))
    # NDZ: people the Email list does not name (every `step`-th plus one), hashed by the engine's own rule
    users = spark.table(settings.table("crm.users"))
    fields = {"first_name": F.col("first_name"), "last_name": F.col("last_name"), "dob": F.col("birth_date"),
              "zip": F.col("zip")}
    types = {f: users.schema[c].dataType for f, c in {"first_name": "first_name", "last_name": "last_name",
                                                      "dob": "birth_date", "zip": "zip"}.items()}
    picked = users.where(F.substring("user_id", 2, 12).cast("long") % (step * 2) == 1).limit(ndz_matched)
    listed = picked.select(list_hash("ndz", fields, types).alias("Hash")).union(
        spark.range(a.ndz - ndz_matched).select(F.base64(F.unhex(F.sha2(F.concat(F.lit("nobody"), F.col(
            "id").cast("string")), 256)))))
    ndz = listed.select(F.format_string("N%011d", F.row_number().over(Window.orderBy("Hash"))).alias("ID"), "Hash")
    download = work / "20261201_4821_DROP.zip"
    csvs = [_csv(work / f"20261201_4821_{kind}.csv", frame) for kind, frame in (("Email", emails), ("NDZ", ndz))]
    with zipfile.ZipFile(download, "w", zipfile.ZIP_DEFLATED) as archive:
        for csv in csvs:
            archive.write(csv, csv.name)
    spark.stop()
    matched = email_matched + ndz_matched

    rounds = []
    for n in range(a.repeats):
        config = _config(work, f"dsr_r{n}")
        imported, _ = _timed([DSR, "-c", str(config), "drop", "import", str(download)])
        matching, out = _timed([DSR, "-c", str(config), "drop", "match"])
        limit, found = _timed([sys.executable, "-c", LIMIT, str(config), *map(str, csvs)])
        assert int(found.strip().splitlines()[-1]) == matched, found
        assert f"{matched} to one person" in out and f"requests: {matched} erase" in out, out
        rounds.append({"import_s": round(imported, 2), "match_s": round(matching, 2), "limit_s": round(limit, 2)})
        print(rounds[-1], flush=True)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    result = {"rows": a.rows, "hashes": a.hashes, "ndz": a.ndz, "matched": matched, "repeats": a.repeats,
              "date": datetime.now(UTC).isoformat(timespec="seconds"), "cores": os.cpu_count(),
              "rounds": rounds, "median": median,
              "ratio_match_vs_limit": round(median["match_s"] / median["limit_s"], 2)}
    out_path = Path(__file__).parent / "results" / f"drop-{a.rows}-{a.hashes}.json"
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
