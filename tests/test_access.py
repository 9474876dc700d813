"""Access requests: one package per request, checked against an independent reader (pyiceberg)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import stat
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable
from pyspark.sql import functions as F

from helpers import HOSTILE, NEAR_MISS, SEED, add_subjects, ledger_table, make_settings
from lakehouse_dsr import synth
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import orchestrator, run
from lakehouse_dsr.stages.access import EMPTY_NOTE

TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders"]
KEYS = {"demo.users": "user_id", "demo.events": "user_id", "demo.newsletter": "email", "demo.orders": "user_id"}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("access")
    settings = make_settings(root)
    attach(spark, settings)
    synth.generate(spark, settings, users=40, events=800, seed=SEED, batches=2)
    add_subjects(spark, settings, HOSTILE[:4], "hostile")
    add_subjects(spark, settings, NEAR_MISS, "near")
    subjects = [synth.user_id(SEED, i) for i in range(3)] + HOSTILE[:4] + [synth.user_id(SEED, 999)]
    return {"root": root, "settings": settings, "subjects": subjects}


def _submit_and_run(spark, lake, fmt: str):
    settings = lake["settings"].replace(export={"format": fmt})
    ledger = Ledger(settings)
    created = ledger.submit([RequestInput(s, "access", "gdpr") for s in lake["subjects"]]).created
    report = run(spark, settings)
    return dict(zip(created, lake["subjects"], strict=True)), report, Path(report.export["directory"])


@pytest.fixture(scope="module")
def json_run(spark, lake):
    """The JSON run, and the Python UDFs and worker starts it asked for (none: the JVM writes JSON)."""
    python: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "udf", lambda *a, **k: python.append("udf"))
        patch.setattr(orchestrator, "start_python_workers", lambda spark: python.append("workers"))
        return (*_submit_and_run(spark, lake, "json"), python)


def _independent(lake) -> dict[str, list[dict]]:
    """Every table read with pyiceberg from its metadata file, as lists of dicts."""
    out = {}
    for table in TABLES:
        meta = lake["root"] / "wh" / Path(*table.split(".")) / "metadata"
        version = (meta / "version-hint.text").read_text().strip()
        out[table] = StaticTable.from_metadata(str(meta / f"v{version}.metadata.json")).scan().to_arrow().to_pylist()
    return out


def _norm(value):
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, float):
        return Decimal(str(value))
    return value


def _expected(truth: dict, subject: str) -> dict[str, list[tuple]]:
    emails = {u["email"] for u in truth["demo.users"] if u["user_id"] == subject}
    wanted = {"user_id": {subject}, "email": emails}
    return {t: sorted(tuple(_norm(v) for v in row.values()) for row in truth[t]
                      if row[KEYS[t]] in wanted[KEYS[t]]) for t in TABLES}


def test_one_private_file_per_request_and_manifest(json_run):
    requests, report, out, python = json_run
    assert python == []  # no Python UDF, no Python worker started
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{r}.json" for r in requests] + ["manifest.json"])
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700  # the export root it created too
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in out.iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["requests"]:
        assert hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    assert {e["request_id"] for e in manifest["requests"]} == set(requests)
    assert manifest["tables"]["demo.events"]["purpose"] == "product analytics"
    assert [r.status for r in report.requests] == ["completed"] * len(requests)


def test_packages_equal_an_independent_reader(json_run, lake):
    requests, _, out, _ = json_run
    truth = _independent(lake)
    for request_id, subject in requests.items():
        package = json.loads((out / f"{request_id}.json").read_text(encoding="utf-8"), parse_float=Decimal)
        assert package["request_id"] == request_id and package["regulation"] == "gdpr"
        emails = sorted({u["email"] for u in truth["demo.users"] if u["user_id"] == subject})
        # each identifier type once, in order, with its values sorted (the header is built in Spark)
        assert list(package["subject"].items()) == [("email", emails)] * bool(emails) + [("user_id", [subject])]
        assert datetime.fromisoformat(package["generated_at"]).tzinfo is not None
        expected = _expected(truth, subject)
        for table in TABLES:
            got = sorted(tuple(row.values()) for row in package["tables"][table])
            assert got == expected[table], (subject[:20], table)
        if subject in HOSTILE:  # its own rows, never its near-miss twin's
            assert package["tables"]["demo.events"] and all(
                row["user_id"] == subject for row in package["tables"]["demo.events"])


def test_subject_without_data_gets_a_valid_empty_package(json_run):
    requests, _, out, _ = json_run
    (empty_id,) = [r for r, s in requests.items() if s == synth.user_id(SEED, 999)]
    package = json.loads((out / f"{empty_id}.json").read_text())
    assert package["note"] == EMPTY_NOTE
    assert package["tables"] == {t: [] for t in TABLES}


def test_ledger_keeps_path_and_checksum(spark, json_run, lake):
    requests, _, out, _ = json_run
    evidence = Ledger(lake["settings"]).evidence(list(requests))
    for request_id, e in evidence.items():
        assert Path(e["file"]) == out / f"{request_id}.json"
        assert e["sha256"] == hashlib.sha256(Path(e["file"]).read_bytes()).hexdigest()
    rows = ledger_table(spark, lake["settings"], "dsr.requests").where("request_type = 'access'").collect()
    assert all(r.subject_id is None for r in rows)  # completed: only the keyed hash remains


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_zip_formats_hold_one_member_per_table(spark, lake, fmt):
    requests, report, out = _submit_and_run(spark, lake, fmt)
    assert [r.status for r in report.requests] == ["completed"] * len(requests)
    truth = _independent(lake)
    for request_id, subject in requests.items():
        with zipfile.ZipFile(out / f"{request_id}.{fmt}.zip") as zf:
            assert sorted(zf.namelist()) == sorted(["request.json"] + [f"{t}.{fmt}" for t in TABLES])
            header = json.loads(zf.read("request.json"))
            assert header["request_id"] == request_id and header["subject"]["user_id"] == [subject]
            expected = _expected(truth, subject)
            for table in TABLES:
                data = zf.read(f"{table}.{fmt}")
                if fmt == "parquet":
                    rows = pq.read_table(io.BytesIO(data)).to_pylist()
                    got = sorted(tuple(_norm(v) for v in r.values()) for r in rows)
                    assert got == expected[table], (table, subject[:20])
                else:
                    header, *rows = csv.reader(io.StringIO(data.decode("utf-8")))
                    assert header == list(truth[table][0])
                    as_text = sorted(tuple("" if v is None else str(v) for v in row) for row in expected[table])
                    assert sorted(map(tuple, rows)) == as_text, (table, subject[:20])


def test_one_run_with_access_and_erase_keeps_each_batch_to_its_own_people(spark, new_lakehouse):
    """The run resolves both batches' identifiers in one job (runner Context.identifiers): the erasure
    must get only the erase requests' keys and each package only its own subject's rows."""
    settings = new_lakehouse()
    copy, gone = synth.user_id(SEED, 1), synth.user_id(SEED, 2)
    ledger = Ledger(settings)
    created = ledger.submit([RequestInput(copy, "access", "gdpr"), RequestInput(gone, "erase", "gdpr")]).created
    report = run(spark, settings)
    assert sorted(r.status for r in report.requests) == ["completed", "completed"]
    meta = Path(settings.catalog.properties["warehouse"].removeprefix("file:")) / "demo" / "events" / "metadata"
    version = (meta / "version-hint.text").read_text().strip()
    users = {r["user_id"] for r in StaticTable.from_metadata(str(meta / f"v{version}.metadata.json"))
             .scan(selected_fields=("user_id",)).to_arrow().to_pylist()}
    assert copy in users and gone not in users  # read without Spark
    out = Path(report.export["directory"])
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{created[0]}.json", "manifest.json"])
    package = json.loads((out / f"{created[0]}.json").read_text(encoding="utf-8"))
    assert package["subject"]["user_id"] == [copy]
    assert package["tables"]["demo.events"] and all(r["user_id"] == copy for r in package["tables"]["demo.events"])


def test_the_package_writer_loads_without_spark_pydantic_or_pyarrow():
    """Each Python worker that writes packages unpickles the writer: its module must not pull in
    what the export's driver side needs (about half a second a worker on this machine)."""
    code = ("import sys, lakehouse_dsr.stages.packages; "
            "print(sorted(m for m in ('pyspark', 'pydantic', 'pyarrow', 'yaml') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
