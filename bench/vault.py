"""Cost of the vault: pseudonymizing, shredding and exporting through it, against the plain ways.

Usage: python bench/vault.py [--events 1000000 10000000] [--users 10000] [--erase 100] [--access 1000]
                             [--repeats 3]

For each size, on a fresh demo lake:
- pseudonymize: `pseudonymize_table` of demo.events (the key only; and with event_details encrypted
  too) against a plain `CREATE TABLE ... AS SELECT` copy, alternating, each into a new table. The
  first pseudonymization creates every subject's vault entry; later ones find them.
- erase: `erase` random users per round, each by a whole `dsr run` in this process, alternating a
  data map holding only demo.events (plain erase: MERGE, purge rewrite, verification scans) and one
  holding only its pseudonymized copy (shred: the vault's entries deleted and purged, verified).
  Reported: erase + purge + verify seconds of that table from the run report, and the whole run.
- access: `access` users' packages, plain table against the pseudonymized copy read through the
  vault (re-identified and decrypted), alternating; the export stage's seconds.
Medians and ratios go to bench/results/vault.json, a chart to vault.png.
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

from lakehouse_dsr import synth
from lakehouse_dsr.config import settings_from_dict
from lakehouse_dsr.datamap.model import demo_datamap
from lakehouse_dsr.lake.spark import build_session
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.vault.pseudonymize import pseudonymize_table

COPY = "demo_vault.events"


def _settings(work: Path, tables: dict) -> object:
    datamap = demo_datamap(derived=False, vault=True).model_dump(mode="json", by_alias=True, exclude_none=True)
    datamap["tables"] = {t: datamap["tables"][t] for t in tables}
    return settings_from_dict({"catalog": {"properties": {"type": "hadoop", "warehouse": str(work / "wh")}},
                               "secret_key_file": str(work / "key"), "datamap": datamap,
                               "export": {"directory": str(work / "exports")}})


def _table_seconds(entry: dict) -> float:
    return round(entry["erase"]["seconds"] + entry.get("purge", {}).get("seconds", 0)
                 + entry["verification"]["seconds"], 3)


def one_size(spark, work: Path, events: int, a) -> dict:
    plain, shredded = _settings(work, ["demo.events"]), _settings(work, [COPY])
    synth.generate(spark, plain, a.users, events, 42)
    copies: list[dict] = []
    kinds = ("pseudonymize", "ctas", "pseudonymize_encrypt")
    for r in range(a.repeats):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            target = f"demo_vault.events_{kind}_{r}"
            start = time.perf_counter()
            if kind == "ctas":
                spark.sql(f"CREATE TABLE {plain.table(target)} USING iceberg AS SELECT * FROM "
                          f"{plain.table('demo.events')}")
            else:
                pseudonymize_table(spark, plain, "demo.events", target, "user_id",
                                   encrypt=["event_details"] if kind.endswith("encrypt") else [])
            copies.append({"kind": kind, "round": r, "seconds": round(time.perf_counter() - start, 3)})
            print(json.dumps(copies[-1]), flush=True)
            spark.sql(f"DROP TABLE {plain.table(target)} PURGE")
    spark.sql(f"DROP TABLE IF EXISTS {plain.table(COPY)} PURGE")
    pseudonymize_table(spark, plain, "demo.events", COPY, "user_id", encrypt=["event_details"])

    rng = random.Random(events)
    people = rng.sample(range(a.users), a.erase * 2 * a.repeats + a.access)
    erasures: list[dict] = []
    for r in range(a.repeats):
        for kind in (("shred", "erase") if r % 2 == 0 else ("erase", "shred")):
            settings = shredded if kind == "shred" else plain
            batch = [people.pop() for _ in range(a.erase)]
            Ledger(settings).submit([RequestInput(synth.user_id(42, i), "erase") for i in batch])
            start = time.perf_counter()
            report = run(spark, settings)
            whole = time.perf_counter() - start
            assert {x.status for x in report.requests} == {"completed"}, [x.reason for x in report.requests]
            table = COPY if kind == "shred" else "demo.events"
            entry = report.tables[table]
            erasures.append({"kind": kind, "round": r, "table_s": _table_seconds(entry), "run_s": round(whole, 3),
                             "rows_rewritten": entry["erase"]["rows_changed"],
                             "bytes_rewritten": entry["erase"]["bytes_rewritten"] + entry["purge"]["bytes_rewritten"],
                             "stages": report.seconds})
            print(json.dumps(erasures[-1]), flush=True)
    exports: list[dict] = []
    subjects = [synth.user_id(42, i) for i in people[:a.access]]
    for r in range(a.repeats):
        for kind in (("vault", "plain") if r % 2 == 0 else ("plain", "vault")):
            settings = shredded if kind == "vault" else plain
            Ledger(settings).submit([RequestInput(s, "access") for s in subjects])
            report = run(spark, settings)
            assert {x.status for x in report.requests} == {"completed"}
            exports.append({"kind": kind, "round": r, "export_s": report.seconds["export"],
                            "rows": report.export["rows"]})
            print(json.dumps(exports[-1]), flush=True)

    def median(rows: list[dict], kind: str, field: str) -> float:
        return round(statistics.median(x[field] for x in rows if x["kind"] == kind), 3)

    ctas = median(copies, "ctas", "seconds")
    return {
        "events": events, "copies": copies, "erasures": erasures, "exports": exports,
        "pseudonymize_s": median(copies, "pseudonymize", "seconds"), "ctas_s": ctas,
        "pseudonymize_encrypt_s": median(copies, "pseudonymize_encrypt", "seconds"),
        "pseudonymize_vs_ctas": round(median(copies, "pseudonymize", "seconds") / ctas, 3),
        "pseudonymize_encrypt_vs_ctas": round(median(copies, "pseudonymize_encrypt", "seconds") / ctas, 3),
        "shred_table_s": median(erasures, "shred", "table_s"), "erase_table_s": median(erasures, "erase", "table_s"),
        "shred_run_s": median(erasures, "shred", "run_s"), "erase_run_s": median(erasures, "erase", "run_s"),
        "export_vault_s": median(exports, "vault", "export_s"), "export_plain_s": median(exports, "plain", "export_s"),
        "export_vault_vs_plain": round(median(exports, "vault", "export_s") / median(exports, "plain", "export_s"), 3),
    }


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("erase + purge + verify of the table", "shred_table_s", "erase_table_s", "shred", "plain erase"),
              ("copy of demo.events", "pseudonymize_s", "ctas_s", "pseudonymize", "CTAS"),
              (f"export of {result['access']} subjects", "export_vault_s", "export_plain_s", "through the vault",
               "plain")]
    for ax, (title, ours, other, ours_label, other_label) in zip(axes, panels, strict=True):
        x = range(len(sizes))
        ax.bar([i - 0.2 for i in x], [s[ours] for s in sizes], 0.4, label=ours_label, color="tab:blue")
        ax.bar([i + 0.2 for i in x], [s[other] for s in sizes], 0.4, label=other_label, color="tab:grey")
        ax.set_xticks(list(x), [f"{s['events'] / 1e6:g}M events" for s in sizes])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("seconds (median)")
        ax.legend(fontsize=8)
    fig.suptitle(f"the vault: {result['erase']} erasures per run, medians of {result['repeats']}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    args.add_argument("--users", type=int, default=10_000)
    args.add_argument("--erase", type=int, default=100)
    args.add_argument("--access", type=int, default=1000)
    args.add_argument("--repeats", type=int, default=3)
    a = args.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsr-vault-"))  # one lake, regenerated per size; the vault stays
    spark = build_session(_settings(work, ["demo.events"]))
    sizes = [one_size(spark, work, events, a) for events in a.events]
    result = {"generated_at": datetime.now(UTC).isoformat(timespec="seconds"), "users": a.users, "erase": a.erase,
              "access": a.access, "repeats": a.repeats, "sizes": sizes}
    if len(sizes) > 1:
        result["shred_growth"] = round(sizes[-1]["shred_table_s"] / sizes[0]["shred_table_s"], 3)
        result["erase_growth"] = round(sizes[-1]["erase_table_s"] / sizes[0]["erase_table_s"], 3)
    out = Path("bench/results/vault.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    chart(result, out.with_suffix(".png"))
    for s in sizes:
        print(json.dumps({k: v for k, v in s.items() if k not in ("copies", "erasures", "exports")}))
    print(json.dumps({k: v for k, v in result.items() if k.endswith("growth")}), f"wrote {out}")


if __name__ == "__main__":
    main()
