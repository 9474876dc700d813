"""Rows naming two people, surrogate keys reached through a linked identifier, and nested keys, on a
small retail-shaped lakehouse built here; every check after `dsr run` reads with pyiceberg and pyarrow."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from pyiceberg.table import StaticTable
from typer.testing import CliRunner

from helpers import make_settings, write_config
from lakehouse_dsr import suppress_for
from lakehouse_dsr.cli import app
from lakehouse_dsr.datamap import DataMap
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.inventory.discover import discover
from lakehouse_dsr.lake import plainfiles
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.plainfiles import adopt
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages.access import MATCHED_KEYS

CUSTOMERS = 12
ERASED, ASKING = [1, 2], 3  # customer numbers: two erasures, one access request
MOR = {"format-version": "2", "write.delete.mode": "merge-on-read", "write.update.mode": "merge-on-read",
       "write.merge.mode": "merge-on-read"}

DATAMAP = {
    "subject": "customer_id",
    "identifiers": {
        "customer_sk": {"table": "retail.customer", "subject_column": "c_customer_id", "column": "c_customer_sk"},
        "email": {"table": "retail.customer", "subject_column": "c_customer_id", "column": "c_email"},
    },
    "tables": {
        "retail.customer": {"key": "c_customer_id"},
        "retail.web_sales": {"action": "redact", "keys": {
            "ws_bill_customer_sk": {"identifier": "customer_sk", "redact": ["ws_bill_customer_sk", "ws_bill_addr_sk"]},
            "ws_ship_customer_sk": {"identifier": "customer_sk", "redact": ["ws_ship_customer_sk", "ws_ship_addr_sk"]},
        }},
        "retail.web_returns": {"identifier": "customer_sk",
                               "keys": {"wr_returning_customer_sk": {}, "wr_refunded_customer_sk": {}}},
        "web.clicks": {"key": "context.user.email", "identifier": "email"},
        "web.sessions": {"key": "visitor.email", "identifier": "email", "action": "redact",
                         "redact": ["visitor.email", "visitor.ip"]},
        "web.messages": {"action": "redact", "identifier": "email", "keys": {
            "sender": {"redact": ["sender"]}, "recipients[]": {"redact": ["recipients[]"]}}},
        "web.invites": {"key": "invitees[]", "identifier": "customer_sk"},
    },
}
TABLES = list(DATAMAP["tables"])


def customer_id(i: int) -> str:
    return f"CUST-{i:04d}"


def sk(i: int) -> int:
    return 1000 + i


def email(i: int) -> str:
    return f"c{i}@shop.example"


def sales_rows() -> list[tuple]:
    """60 sales; customer i bills and j ships, including both erased people in one row, an erased
    person with a bystander, and someone shipping to themself."""
    rows = []
    for n in range(60):
        bill, ship = n % CUSTOMERS, (n * 5 + 3) % CUSTOMERS
        rows.append((n, sk(bill), sk(bill) * 10, sk(ship), sk(ship) * 10 + 1, n % 4 + 1, Decimal(f"{n}.25")))
    rows.append((60, sk(1), 1, sk(2), 2, 1, Decimal("9.99")))  # both erased
    rows.append((61, sk(3), 3, sk(3), 4, 2, Decimal("5.00")))  # the asking person on both sides
    return rows


def card_number(n: int) -> str:
    """A 16-digit number passing the Luhn check, grouped by four."""
    body = [int(d) for d in f"4{n:014d}"]
    total = sum(d if i % 2 else (d * 2 - 9 if d * 2 > 9 else d * 2) for i, d in enumerate(reversed(body)))
    digits = "".join(map(str, body)) + str(-total % 10)
    return " ".join(digits[i:i + 4] for i in range(0, 16, 4))


# Planted for discovery: subject columns under unhelpful names, and plain measures that must not be reported.
PLANTED = {"who": "overlap with customer_sk", "guest_ref": "overlap with customer_id", "contact": "pattern email",
           "seen_from": "pattern ipv4", "origin6": "pattern ipv6", "card": "pattern card number",
           "tel": "pattern phone", "born": "pattern date of birth", "first_name": "name (name)"}


CRASHED = "dsr-0badc0de-"  # a successor published by a run that died before deleting its predecessor


def plant_landing(landing: Path) -> Path:
    """Raw files outside the catalog: JSON clicks (nested key), Parquet orders (BIGINT surrogate), CSV signups,
    and a legacy Parquet folder to adopt. Each format has a file with an erased person and one without."""
    for folder in ("clicks", "orders", "signups", "legacy"):
        (landing / folder).mkdir(parents=True)
    for part, people in (("a", [1, 4, 5]), ("b", [6, 7]), ("c", [2, 3, 8])):
        lines = [json.dumps({"click": f"{part}{n}", "user": {"id": customer_id(i), "agent": "x"}, "page": n})
                 for n, i in enumerate(people * 2)]
        (landing / "clicks" / f"{part}.json").write_text("\n".join(lines) + "\n")
        rows = [{"order": n, "buyer_sk": sk(i), "total": n * 10} for n, i in enumerate(people)]
        pq.write_table(pa.Table.from_pylist(rows), landing / "orders" / f"{part}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), landing / "legacy" / f"{part}.parquet")
        csv = "email,plan,origin\n" + "".join(f"{email(i)},basic,10.0.{i}.{n}\n" for n, i in enumerate(people))
        (landing / "signups" / f"{part}.csv").write_text(csv)
    # What a run killed mid-replacement leaves: the old file and its published successor, and a temporary folder
    crashed = json.dumps({"click": "d0", "user": {"id": customer_id(9), "agent": "x"}, "page": 0}) + "\n"
    (landing / "clicks" / "d.json").write_text(crashed)
    (landing / "clicks" / f"{CRASHED}d.json").write_text(crashed)
    (landing / "clicks" / ".dsr-tmp-0123456789ab").mkdir()
    (landing / "clicks" / ".dsr-tmp-0123456789ab" / "part-0.json").write_text(crashed)
    return landing


def visits_rows() -> list[tuple]:
    return [(n, sk(n % CUSTOMERS), customer_id(n % CUSTOMERS), email(n % CUSTOMERS), f"192.168.{n}.{n * 7 % 255}",
             f"2001:db8::{n:x}", card_number(n), f"+31 6 {n:08d}", date(1950 + n, 1 + n % 12, 1 + n % 28),
             datetime(2024, 5, 1 + n % 28, 12), n % 5 + 1, Decimal(n) * Decimal("1.5"), 1000 + n % 6, f"visit {n}",
             f"Guest{n}")
            for n in range(24)]


@pytest.fixture(scope="module")
def retail(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("retail")
    landing = plant_landing(root / "landing")
    datamap = {**DATAMAP, "tables": {**DATAMAP["tables"], "retail.adopted": {"key": "buyer_sk",
                                                                             "identifier": "customer_sk"}},
               "files": {"landing/clicks": {"path": str(landing / "clicks"), "format": "json", "key": "user.id"},
                         "landing/orders": {"path": str(landing / "orders"), "format": "parquet", "key": "buyer_sk",
                                            "identifier": "customer_sk"},
                         "landing/signups": {"path": str(landing / "signups"), "format": "csv", "key": "email",
                                             "identifier": "email"}}}
    settings = make_settings(root, datamap=datamap)
    attach(spark, settings)
    for ns in ("retail", "web"):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.{ns}")

    def create(table: str, rows: list[tuple], schema: str, properties: dict | None = None) -> None:
        writer = spark.createDataFrame(rows, schema).coalesce(2).writeTo(settings.table(table))
        for k, v in (properties or {"format-version": "2"}).items():
            writer = writer.tableProperty(k, v)
        writer.create()

    create("retail.customer", [(sk(i), customer_id(i), email(i), f"Name {i}") for i in range(CUSTOMERS)],
           "c_customer_sk bigint, c_customer_id string, c_email string, c_name string")
    create("retail.web_sales", sales_rows(),
           "ws_order bigint, ws_bill_customer_sk bigint, ws_bill_addr_sk bigint, ws_ship_customer_sk bigint, "
           "ws_ship_addr_sk bigint, ws_quantity int, ws_price decimal(7,2)", MOR)
    create("retail.web_returns", [(n, sk(n % CUSTOMERS), sk((n + 4) % CUSTOMERS), Decimal(n)) for n in range(24)],
           "wr_order bigint, wr_returning_customer_sk bigint, wr_refunded_customer_sk bigint, wr_amount decimal(7,2)")
    create("web.clicks", [(n, ((email(n % CUSTOMERS), f"agent{n}"),), f"/p/{n}") for n in range(36)],
           "id int, context struct<user: struct<email: string, agent: string>>, page string")
    create("web.sessions", [(n, (email(n % CUSTOMERS), f"10.0.0.{n}", "nl"), n * 3) for n in range(24)],
           "id int, visitor struct<email: string, ip: string, country: string>, seconds int", MOR)
    create("web.messages", [(n, email(n % CUSTOMERS), [email((n + d) % CUSTOMERS) for d in (1, 2, 5)][: n % 4],
                             f"body {n}") for n in range(30)],
           "id int, sender string, recipients array<string>, body string", MOR)
    create("web.invites", [(n, [sk((n + d) % CUSTOMERS) for d in range(n % 3)] if n % 5 else None)
                           for n in range(20)], "id int, invitees array<bigint>")
    create("retail.store_visits", visits_rows(),
           "v_id int, who bigint, guest_ref string, contact string, seen_from string, origin6 string, card string, "
           "tel string, born date, visited_at timestamp, qty int, amount decimal(7,2), cnt bigint, note string, "
           "first_name string")
    adopted = adopt(Lake.of(spark, settings), str(landing / "legacy"), "retail.adopted")
    before = {t: read(settings, t) for t in TABLES}
    landing_before = {p.relative_to(landing): p.read_bytes() for p in landing.rglob("*") if p.is_file()}
    ledger = Ledger(settings)
    erased = ledger.submit([RequestInput(customer_id(i), "erase") for i in ERASED]).created
    asked = ledger.submit([RequestInput(customer_id(ASKING), "access")]).created
    report = run(spark, settings)
    return {"settings": settings, "root": root, "before": before, "report": report, "erased": erased,
            "asked": asked[0], "ledger": ledger, "landing": landing, "landing_before": landing_before,
            "adopted": adopted}


def warehouse(settings) -> Path:
    return Path(settings.catalog.properties["warehouse"].removeprefix("file:"))


def static(settings, table: str) -> StaticTable:
    meta = warehouse(settings) / Path(*table.split(".")) / "metadata"
    version = (meta / "version-hint.text").read_text().strip()
    return StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))


def read(settings, table: str, snapshot_id: int | None = None) -> list[dict]:
    return static(settings, table).scan(snapshot_id=snapshot_id).to_arrow().to_pylist()


def erased_values() -> set:
    return {v for i in ERASED for v in (sk(i), customer_id(i), email(i))}


def leaves(value):
    if isinstance(value, dict | list):
        for v in value.values() if isinstance(value, dict) else value:
            yield from leaves(v)
    else:
        yield value


def test_every_request_completes_with_proof(retail):
    report = retail["report"]
    assert {r.status for r in report.requests} == {"completed"}, [r.reason for r in report.requests]
    sales = report.tables["retail.web_sales"]["erase"]
    # several keys and an array key: the files holding a requested key are rewritten, each group
    # nulled where its own key was requested
    assert sales["strategy"] == "rewrite_files" and sales["key"] == "ws_bill_customer_sk, ws_ship_customer_sk"
    assert report.tables["retail.web_returns"]["erase"]["strategy"] == "rewrite_files"
    assert report.tables["web.invites"]["erase"]["strategy"] == "rewrite_files"  # an array key
    for table in TABLES:
        checks = report.tables[table]["verification"]
        assert checks["passed"] and checks["live"] == checks["history"] == checks["storage"] == 0, table
        assert report.tables[table]["erase"]["collateral"]["ok"], table


def test_shared_rows_keep_the_other_persons_columns(retail):
    before = {r["ws_order"]: r for r in retail["before"]["retail.web_sales"]}
    after = {r["ws_order"]: r for r in read(retail["settings"], "retail.web_sales")}
    assert set(after) == set(before)  # a redacting table keeps every row
    gone = {sk(i) for i in ERASED}
    nulled = Counter()
    for order, old in before.items():
        new = dict(after[order])
        for side in ("bill", "ship"):
            key, addr = f"ws_{side}_customer_sk", f"ws_{side}_addr_sk"
            if old[key] in gone:
                assert new.pop(key) is None and new.pop(addr) is None, (order, side)
                nulled[side] += 1
        assert new == {k: v for k, v in old.items() if k in new}, order  # the rest exactly as it was
    assert nulled["bill"] > 0 and nulled["ship"] > 0
    for side in ("bill", "ship"):
        key = f"ws_{side}_customer_sk"
        grown = sum(r[key] is None for r in after.values()) - sum(r[key] is None for r in before.values())
        assert grown == nulled[side]
    for measure in ("ws_quantity", "ws_price"):
        assert sum(r[measure] for r in after.values()) == sum(r[measure] for r in before.values())
    # the row both erased people shared lost both groups, nothing else
    assert after[60]["ws_bill_customer_sk"] is None and after[60]["ws_ship_customer_sk"] is None
    assert after[60]["ws_price"] == Decimal("9.99")


def test_deleting_tables_lose_rows_naming_an_erased_person_by_any_key(retail):
    settings, gone = retail["settings"], {sk(i) for i in ERASED}
    before, after = retail["before"]["retail.web_returns"], read(settings, "retail.web_returns")
    kept = [r for r in before if r["wr_returning_customer_sk"] not in gone and r["wr_refunded_customer_sk"] not in gone]
    assert sorted(after, key=lambda r: r["wr_order"]) == kept and len(kept) < len(before)
    emails = {email(i) for i in ERASED}
    clicks = read(settings, "web.clicks")
    assert [r for r in retail["before"]["web.clicks"] if r["context"]["user"]["email"] not in emails] == \
        sorted(clicks, key=lambda r: r["id"])


def test_nested_redaction_nulls_only_the_named_fields(retail):
    emails = {email(i) for i in ERASED}
    after = {r["id"]: r for r in read(retail["settings"], "web.sessions")}
    for old in retail["before"]["web.sessions"]:
        new = after[old["id"]]
        if old["visitor"]["email"] in emails:
            assert new["visitor"] == {"email": None, "ip": None, "country": old["visitor"]["country"]}
            assert new["seconds"] == old["seconds"]
        else:
            assert new == old


def test_array_keys_lose_the_erased_element_or_the_row(retail):
    settings, emails, gone = retail["settings"], {email(i) for i in ERASED}, {sk(i) for i in ERASED}
    after = {r["id"]: r for r in read(settings, "web.messages")}
    assert set(after) == {r["id"] for r in retail["before"]["web.messages"]}
    shortened = 0
    for old in retail["before"]["web.messages"]:
        new = after[old["id"]]
        assert new["sender"] == (None if old["sender"] in emails else old["sender"])
        assert new["recipients"] == [r for r in old["recipients"] if r not in emails]  # order kept
        assert new["body"] == old["body"]
        shortened += len(new["recipients"]) < len(old["recipients"])
    assert shortened > 0
    invites = read(settings, "web.invites")
    assert sorted(r["id"] for r in invites) == sorted(
        r["id"] for r in retail["before"]["web.invites"] if not gone & set(r["invitees"] or []))


def test_no_erased_value_in_any_key_column_of_any_snapshot_or_file(retail):
    settings, needles = retail["settings"], erased_values()
    for table in TABLES:
        table_static = static(settings, table)
        snapshots = [s.snapshot_id for s in table_static.metadata.snapshots]
        assert snapshots
        for snapshot_id in snapshots:
            for row in read(settings, table, snapshot_id):
                assert not needles & set(leaves(row)), (table, snapshot_id)
        files = list((warehouse(settings) / Path(*table.split(".")) / "data")
                     .rglob("*.parquet"))
        assert files
        for file in files:
            data = pq.read_table(file).to_pylist()
            for row in data:
                found = needles & set(leaves(row))
                assert not found, (table, file.name)


def test_access_package_holds_each_shared_row_once_and_says_which_keys_matched(retail):
    report = retail["report"]
    package = json.loads((Path(report.export["directory"]) / f"{retail['asked']}.json").read_text())
    sales = package["tables"]["retail.web_sales"]
    me = sk(ASKING)
    expected = [r for r in retail["before"]["retail.web_sales"]
                if me in (r["ws_bill_customer_sk"], r["ws_ship_customer_sk"])]
    assert sorted(r["ws_order"] for r in sales) == sorted(r["ws_order"] for r in expected)
    by_order = {r["ws_order"]: r[MATCHED_KEYS] for r in sales}
    assert by_order[61] == ["ws_bill_customer_sk", "ws_ship_customer_sk"]
    for r in expected:
        wanted = [k for k in ("ws_bill_customer_sk", "ws_ship_customer_sk") if r[k] == me]
        assert by_order[r["ws_order"]] == wanted
    messages = {r["id"]: r[MATCHED_KEYS] for r in package["tables"]["web.messages"]}
    mine = email(ASKING)
    expected = {r["id"]: [k for k, hit in (("sender", r["sender"] == mine), ("recipients[]", mine in r["recipients"]))
                          if hit] for r in retail["before"]["web.messages"]}
    assert messages == {i: keys for i, keys in expected.items() if keys}
    clicks = package["tables"]["web.clicks"]
    assert clicks and all(r["context"]["user"]["email"] == email(ASKING) for r in clicks)
    assert package["tables"]["retail.customer"][0]["c_customer_id"] == customer_id(ASKING)


def test_discover_finds_every_planted_column_and_no_measure(spark, retail):
    settings = retail["settings"]
    findings = discover(spark, settings, sample=200)
    found = {(f.table, f.column): f for f in findings}
    # precision and recall 1: no measure, time or text column, nothing mapped; a name in a table that deletes
    # the person's rows (retail.customer.c_name) and an IP in a deleting landing dataset go with the rows
    assert set(found) == {("retail.store_visits", c) for c in PLANTED}
    for column, evidence in PLANTED.items():
        finding = found[("retail.store_visits", column)]
        assert evidence in finding.evidence and (finding.share or 0) >= (0 if column == "first_name" else 0.5), finding
    who = found[("retail.store_visits", "who")]
    assert who.identifier == "customer_sk" and who.entry == "retail.store_visits: {key: who, identifier: customer_sk}"
    assert found[("retail.store_visits", "first_name")].entry == who.entry  # keyed by the table's likeliest key
    assert found[("retail.store_visits", "contact")].identifier == "email"
    # a mapped redacting table: a second person's id is one more key; data about the person joins the group
    trimmed = settings.model_copy(deep=True)
    trimmed.datamap.tables["retail.web_sales"].keys.pop("ws_ship_customer_sk")
    again = {(f.table, f.column): f for f in discover(spark, trimmed, ["retail"], sample=200)}
    ship = again[("retail.web_sales", "ws_ship_customer_sk")]
    assert "overlap with customer_sk" in ship.evidence and ship.entry == (
        "retail.web_sales: {action: redact, keys: {ws_bill_customer_sk: {identifier: customer_sk, redact: "
        "[ws_bill_customer_sk, ws_bill_addr_sk]}, ws_ship_customer_sk: {identifier: customer_sk, redact: "
        "[ws_ship_customer_sk]}}}")
    assert ("retail.web_sales", "ws_ship_addr_sk") in again and "name (address)" in \
        again[("retail.web_sales", "ws_ship_addr_sk")].evidence


def test_discover_json_lists_findings_and_never_a_value(spark, retail, tmp_path):
    config = write_config(retail["settings"], tmp_path / "dsr.yaml")
    result = CliRunner().invoke(app, ["-c", str(config), "discover", "--namespace", "retail", "--sample", "50",
                                      "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {r["column"] for r in rows} == set(PLANTED)
    assert all({"table", "column", "evidence", "share"} <= set(r) for r in rows)
    assert not {str(v) for v in erased_values()} & set(re.findall(r"[\w.@+-]+", result.output))


def landing_rows(name: str, data: bytes) -> list[dict]:
    if name.endswith(".json"):
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    if name.endswith(".csv"):
        lines = data.decode().splitlines()
        return [dict(zip(lines[0].split(","), line.split(","), strict=True)) for line in lines[1:]]
    return pq.read_table(pa.BufferReader(data)).to_pylist()


def test_plain_files_lose_erased_people_and_only_their_files_are_rewritten(retail):
    report, landing, before = retail["report"], retail["landing"], retail["landing_before"]
    for dataset in ("landing/clicks", "landing/orders", "landing/signups"):
        entry = report.tables[dataset]
        assert entry["verification"]["passed"] and entry["verification"]["storage"] == 0, dataset
        assert entry["erase"]["data_files_rewritten"] == 2  # a.* and c.* hold an erased person, b.* nobody
    needles = erased_values()
    for folder, ext in (("clicks", "json"), ("orders", "parquet"), ("signups", "csv")):
        files = sorted(p for p in (landing / folder).iterdir() if not p.name.startswith("."))
        assert [p.name for p in files if not p.name.startswith("dsr-")] == [f"b.{ext}"]
        untouched = landing / folder / f"b.{ext}"
        assert untouched.read_bytes() == before[untouched.relative_to(landing)]
        rewritten = {p.name.split("-", 2)[2]: p for p in files
                     if p.name.startswith("dsr-") and not p.name.startswith(CRASHED)}
        assert sorted(rewritten) == [f"a.{ext}", f"c.{ext}"]
        for name, path in rewritten.items():
            old = landing_rows(name, before[Path(folder) / name])
            kept = [r for r in old if not needles & set(leaves(r))]
            new = landing_rows(path.name, path.read_bytes())
            assert len(kept) < len(old) and new == kept, (folder, name)  # the others' rows as they were
    assert not list(landing.rglob(".dsr-tmp-*"))
    # the run first finished the crashed replacement: the old file went, its successor stayed as it was
    assert (landing / "clicks" / f"{CRASHED}d.json").read_bytes() == before[Path("clicks") / "d.json"]


def test_access_package_includes_plain_file_rows(retail):
    package = json.loads((Path(retail["report"].export["directory"]) / f"{retail['asked']}.json").read_text())
    assert [r["user"]["id"] for r in package["tables"]["landing/clicks"]] == [customer_id(ASKING)] * 2
    assert [r["buyer_sk"] for r in package["tables"]["landing/orders"]] == [sk(ASKING)]
    assert [r["email"] for r in package["tables"]["landing/signups"]] == [email(ASKING)]


def test_adopted_parquet_gets_the_full_cycle_and_its_rewritten_original_is_purged(retail):
    adopted, legacy = retail["adopted"], retail["landing"] / "legacy"
    assert (adopted.files, adopted.rows, adopted.copied) == (3, 8, False)
    rows = read(retail["settings"], "retail.adopted")
    assert sorted(r["buyer_sk"] for r in rows) == sorted(sk(i) for i in [4, 5, 6, 7, 3, 8])
    assert retail["report"].tables["retail.adopted"]["verification"]["passed"]
    # b.parquet held nobody erased: still the table's file where it was; a and c were rewritten and purged
    assert sorted(p.name for p in legacy.iterdir()) == ["b.parquet"]


def test_bad_files_and_adopt_input_get_one_clear_error_and_change_nothing(spark, retail, tmp_path):
    settings = retail["settings"]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.parquet").write_text("not parquet")
    (tmp_path / "empty").mkdir()
    bad = {**settings.datamap.model_dump(), "files": {
        "gone": {"path": str(tmp_path / "nope"), "format": "json", "key": "k"},
        "empty": {"path": str(tmp_path / "empty"), "format": "csv", "key": "k"},
        "junk": {"path": str(tmp_path / "junk"), "format": "parquet", "key": "k"},
        "landing/clicks": {"path": str(retail["landing"] / "clicks"), "format": "json", "key": "user.mail"},
        "arrays": {"path": str(retail["landing"] / "clicks"), "format": "json", "key": "page[]"}}}
    with pytest.raises(DataMapError) as info:
        check_against_catalog(spark, DataMap.model_validate(bad), settings.table)
    text = str(info.value)
    for expected in (f"files gone: path {tmp_path / 'nope'} does not exist", f"files empty: path {tmp_path / 'empty'} "
                     "holds no files", "files junk: parquet files under", "files landing/clicks column 'user.mail': "
                     "user has no field 'mail' (has: agent, id)", "files arrays: key column 'page[]' has type bigint, "
                     "not an array"):
        assert expected in text, text
    with pytest.raises(ValidationError, match="format"):
        DataMap.model_validate({**bad, "files": {"x": {"path": "/tmp", "format": "xml", "key": "k"}}})
    # SHOW TABLES, not spark.catalog.listTables: Spark 3.5's fails with interpreted expressions
    tables_before = spark.sql(f"SHOW TABLES IN {settings.catalog.name}.retail").collect()
    for args, message in ((("/tmp/x", "retail.customer"), "exists already"),
                          (("/tmp/x", "bad name"), "namespace.table"),
                          (("/tmp/x", "retail.new", "xml"), "unknown format 'xml'"),
                          ((str(tmp_path / "nope"), "retail.new"), "does not exist")):
        with pytest.raises(DataMapError, match=message):
            adopt(Lake.of(spark, settings), *args)
    assert spark.sql(f"SHOW TABLES IN {settings.catalog.name}.retail").collect() == tables_before


def test_a_replacement_cut_short_by_a_crash_is_finished_by_the_next_run(spark, tmp_path):
    """Killed after publishing the new file but before deleting the old one: both are there (never neither);
    recovery removes the old one and any half-written temporary folder, and touches nothing else."""
    folder = tmp_path / "clicks"
    (folder / ".dsr-tmp-0123456789ab").mkdir(parents=True)
    (folder / ".dsr-tmp-0123456789ab" / "part-0.json").write_text('{"k": 1}\n')
    (folder / "a.json.gz").write_bytes(b"old")
    (folder / "dsr-0badc0de-a.json.gz.json").write_text('{"k": 2}\n')  # compressed original, plain rewrite
    (folder / "b.json").write_text('{"k": 3}\n')
    (folder / "dsr-feedf00d-b.json").write_text('{"k": 4}\n')
    (folder / "c.json").write_text('{"k": 5}\n')
    assert plainfiles.recover(spark, str(folder)) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["c.json", "dsr-0badc0de-a.json.gz.json", "dsr-feedf00d-b.json"]
    assert plainfiles.recover(spark, str(folder)) == 0


def test_late_shared_rows_are_suppressed_as_the_data_map_erases_them(spark, retail):
    """Ingest of late sales and messages: each key group of an erased person is nulled, the other person's
    columns stay; rows for a deleting table naming an erased person by any key are dropped."""
    settings = retail["settings"]
    late = spark.createDataFrame(sales_rows()[:12], spark.table(settings.table("retail.web_sales")).schema)
    clean = {r.ws_order: r.asDict() for r in suppress_for(late, "retail.web_sales", settings).collect()}
    gone = {sk(i) for i in ERASED}
    for row in late.collect():
        expected = row.asDict()
        for side in ("bill", "ship"):
            if expected[f"ws_{side}_customer_sk"] in gone:
                expected[f"ws_{side}_customer_sk"] = expected[f"ws_{side}_addr_sk"] = None
        assert clean[row.ws_order] == expected
    assert any(r["ws_bill_customer_sk"] is None for r in clean.values())
    messages = spark.createDataFrame([(1, email(1), [email(2), email(5)], "hi"), (2, email(6), [email(7)], "yo")],
                                     spark.table(settings.table("web.messages")).schema)
    assert [tuple(r) for r in suppress_for(messages, "web.messages", settings).orderBy("id").collect()] == \
        [(1, None, [email(5)], "hi"), (2, email(6), [email(7)], "yo")]
    returns = spark.createDataFrame([(1, sk(5), sk(2), Decimal(1)), (2, sk(5), sk(6), Decimal(2))],
                                    spark.table(settings.table("retail.web_returns")).schema)
    assert [r.wr_order for r in suppress_for(returns, "retail.web_returns", settings).collect()] == [2]
    with pytest.raises(DataMapError, match="neither a table nor a files dataset"):
        suppress_for(returns, "retail.nope", settings)


@pytest.mark.slow  # three more runs (~11 s): make test-slow
def test_a_plain_file_that_brings_an_erased_person_back_is_rewritten_by_the_next_run(spark, retail):
    """Issue 28: a `files:` dataset is checked by the files its last check did not see. A run with no
    request open is due when a file appears (listed without a JVM), reads only the new file and
    rewrites it without the erased person, the other person's line kept."""
    settings, signups = retail["settings"], retail["landing"] / "signups"
    run(spark, settings)  # reads the files the fixture's run rewrote, once; nobody erased in them
    late = signups / "late.csv"
    late.write_text(f"email,plan,origin\n{email(ERASED[0])},basic,10.9.9.9\n{email(7)},pro,10.9.9.8\n")
    try:
        report = run(spark, settings)
        assert report.resurrections == {"landing/signups": {
            "rows": 1, "requests": 1, "files": 1, "commits": [], "files_read": 1, "whole_table": False}}
        assert report.requests == [] and report.tables["landing/signups"]["verification"]["passed"]
        assert not late.exists()
        (rewritten,) = [p for p in signups.iterdir() if p.name.endswith("-late.csv")]
        assert rewritten.read_text().splitlines()[1:] == [f"{email(7)},pro,10.9.9.8"]
        assert run(spark, settings).resurrections == {}  # the file it rewrote is read once more: nobody in it
    finally:  # the module's other tests list this folder
        for path in signups.glob("*late.csv"):
            path.unlink()
        run(spark, settings)
