"""Cost of a second key column: the logical erase (plan + one commit) of a sales table keyed by the
billing customer only, against the same table keyed by billing and shipping customer.

Usage: python bench/keys.py [--rows 2000000] [--customers 100000] [--erase 100] [--repeats 3]
Each trial erases `erase` random customers from a fresh copy of one generated table (copy-on-write,
as Iceberg's default), for `redact` (the retail case: each group nulled on its own key) and
`delete`. Reports medians, the ratio two keys / one key, and writes bench/results/keys-<rows>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import functions as F

from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.stages import erase, identity, matching

ONE = {"ws_bill_customer_sk": {"redact": ["ws_bill_customer_sk", "ws_bill_addr_sk"]}}
TWO = {**ONE, "ws_ship_customer_sk": {"redact": ["ws_ship_customer_sk", "ws_ship_addr_sk"]}}


def _mapping(keys: dict, action: str) -> dict:
    """One key in the `key:` form (a plain MERGE on key equality), two in the `keys:` form."""
    if len(keys) == 1:
        (column, spec), = keys.items()
        return {"key": column, "action": action, **({"redact": spec["redact"]} if action == "redact" else {})}
    return {"keys": {k: ({} if action == "delete" else v) for k, v in keys.items()}, "action": action}


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--rows", type=int, default=2_000_000)
    args.add_argument("--customers", type=int, default=100_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--repeats", type=int, default=3)
    a = args.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsr-keys-"))
    base = {"catalog": {"properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
            "secret_key_file": str(work / "key")}
    settings = settings_from_dict({**base, "datamap": {"subject": "customer_sk", "tables": {
        "sales.web_sales": {"keys": ONE, "action": "redact"}}}})
    spark = build_session(settings)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.namespace('sales')}")
    c = F.col("id")
    (spark.range(a.rows, numPartitions=4).select(
        c.alias("ws_order"), (F.xxhash64(c, F.lit(1)) % a.customers).cast("bigint").alias("ws_bill_customer_sk"),
        (c % 50000).alias("ws_bill_addr_sk"),
        (F.xxhash64(c, F.lit(2)) % a.customers).cast("bigint").alias("ws_ship_customer_sk"),
        (c % 40000).alias("ws_ship_addr_sk"), (c % 7 + 1).cast("int").alias("ws_quantity"),
        (c % 1000 / 10).cast("decimal(7,2)").alias("ws_price"))
     .writeTo(settings.table("sales.source")).tableProperty("format-version", "2").create())
    picked = random.Random(1).sample(range(a.customers), a.erase)
    batch = spark.createDataFrame([(f"r{i}", str(s), "gdpr") for i, s in enumerate(picked)],
                                  "request_id string, subject_id string, regulation string")
    timings: dict[str, list[float]] = {}
    matched: dict[str, int] = {}
    for trial in range(a.repeats):
        for action in ("redact", "delete"):
            for label, keys in (("one key", ONE), ("two keys", TWO)):
                trial_settings = settings_from_dict({**base, "datamap": {"subject": "customer_sk", "tables": {
                    "sales.web_sales": _mapping(keys, action)}}})
                spark.sql(f"DROP TABLE IF EXISTS {settings.table('sales.web_sales')} PURGE")
                spark.sql(f"CREATE TABLE {settings.table('sales.web_sales')} USING iceberg "
                          f"TBLPROPERTIES ('format-version'='2') AS SELECT * FROM {settings.table('sales.source')}")
                types = check_against_catalog(spark, trial_settings.datamap, trial_settings.table)
                stage = (Lake.of(spark, trial_settings), trial_settings.datamap, trial_settings.erase)
                keyset = matching.key_sets(trial_settings.datamap, identity.resolve(*stage[:2], batch), types,
                                           ["sales.web_sales"])["sales.web_sales"]
                start = time.perf_counter()
                plan = erase.plan(*stage, "sales.web_sales", keyset)
                erase.apply(*stage, plan, keyset)
                seconds = round(time.perf_counter() - start, 2)
                name = f"{action}, {label}"
                timings.setdefault(name, []).append(seconds)
                matched[name] = plan.rows_matched
                print(f"trial {trial + 1} {name} ({plan.strategy}): {seconds:.2f} s, {plan.rows_matched} rows",
                      flush=True)
    medians = {n: statistics.median(t) for n, t in timings.items()}
    ratios = {action: round(medians[f"{action}, two keys"] / medians[f"{action}, one key"], 2)
              for action in ("redact", "delete")}
    out = {"rows": a.rows, "customers": a.customers, "erase": a.erase, "repeats": a.repeats,
           "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "seconds": {n: {"median": medians[n], "rounds": t, "rows_matched": matched[n]} for n, t in timings.items()},
           "ratio_two_keys_to_one": ratios, "target_met": all(r <= 1.3 for r in ratios.values())}
    path = Path(__file__).parent / "results" / f"keys-{a.rows}.json"
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps(out["ratio_two_keys_to_one"]), "->", path)


if __name__ == "__main__":
    main()
