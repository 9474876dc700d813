"""The `dsr` command: exit codes and messages of the real console script, and the happy path."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import SEED, snapshot_ids, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.cli import app
from lakehouse_dsr.exceptions import DsrError, LedgerError
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput

DSR = Path(sys.executable).parent / "dsr"
TABLES = ["demo.users", "demo.events", "demo.newsletter", "demo.orders", "dsr.requests", "dsr.audit"]


def dsr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(DSR), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture
def configured(spark, new_lakehouse, tmp_path, request):
    """A tiny demo lake (Iceberg, or with `indirect` parametrization "delta", its events in Delta: each
    Delta table adds seconds to a run) with one erase request, and its dsr.yaml."""
    delta = ["demo.events"] if getattr(request, "param", "iceberg") == "delta" else None
    settings = new_lakehouse(users=20, events=100, delta=delta)
    Ledger(settings).submit([RequestInput(synth.user_id(SEED, 0), "erase")])
    return settings, write_config(settings, tmp_path / "dsr.yaml")


@pytest.mark.slow  # 15 s: every bad input is a whole CLI invocation
def test_bad_input_exits_2_and_changes_nothing(spark, configured, tmp_path):
    settings, config = configured
    before = snapshot_ids(spark, settings, TABLES)
    (tmp_path / "wrong.csv").write_text("user,kind\nu1,erase\n")
    (tmp_path / "types.csv").write_text("subject_id,type\nu1,erase\nu2,forget\n")
    (tmp_path / "broken.yaml").write_text("catalog: [unclosed\n")
    missing = write_config(settings, tmp_path / "missing.yaml",
                           datamap={"tables": {"demo.events": {"key": "user_id"}, "demo.gone": {"key": "user_id"}}})
    own = {k: v for k, v in yaml.safe_load(config.read_text()).items() if k != "datamap"}  # no `datamap:` section
    (tmp_path / "unmapped.yaml").write_text(yaml.safe_dump(own))
    no_map = "unmapped.yaml has no datamap: section: name the tables that hold personal data there"
    cases = [
        (["-c", str(config), "submit", "--file", "wrong.csv"], "header must be subject_id,type"),
        (["-c", str(config), "submit", "--file", "types.csv"], "line 3: unknown request type 'forget'"),
        (["-c", str(config), "submit", "--file", "absent.csv"], "does not exist"),
        (["-c", str(config), "submit", "--subject", "u1", "--type", "forget"], "unknown request type"),
        (["-c", str(config), "submit", "--subject", "u1", "--type", "erase", "--regulation", "lgpd"],
         "unknown regulation"),
        (["-c", str(config), "submit", "--subject", " ", "--type", "erase"], "subject id is empty"),
        (["-c", str(config), "submit", "--type", "erase"], "--subject and --type are required"),
        (["-c", "broken.yaml", "status"], "not valid YAML"),
        (["-c", str(missing), "run"], "table demo.gone cannot be read"),
        (["-c", "unmapped.yaml", "run"], no_map),  # never the demo's tables instead
        (["-c", "unmapped.yaml", "verify"], no_map),
        (["-c", "unmapped.yaml", "expire", "--dry-run"], no_map),
        (["-c", "unmapped.yaml", "hold", "add", "--table", "demo.events", "--reason", "audit"], no_map),
    ]
    for args, message in cases:
        result = dsr(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert snapshot_ids(spark, settings, TABLES) == before
    ledger_only = dsr("-c", "unmapped.yaml", "status", "--json", cwd=tmp_path)  # the ledger needs no data map
    assert ledger_only.returncode == 0 and len(json.loads(ledger_only.stdout)) == 1, ledger_only.stderr


# On Delta a run of the same lake takes twice as long: make test-slow
@pytest.mark.parametrize("configured", ["iceberg", pytest.param("delta", marks=pytest.mark.slow)], indirect=True)
def test_happy_path_in_process(spark, configured, tmp_path):
    settings, config = configured
    runner = CliRunner()
    invoke = lambda *a: runner.invoke(app, ["-c", str(config), *a], catch_exceptions=False)  # noqa: E731
    subject = synth.user_id(SEED, 1)
    (tmp_path / "r.csv").write_text(f"subject_id,type,regulation,received_at\n{subject},erase,gdpr,2025-01-31\n"
                                    f"{synth.user_id(SEED, 2)},access,ccpa,2025-01-31\n")
    result = invoke("submit", "--file", str(tmp_path / "r.csv"))
    assert result.exit_code == 0 and "2 request(s) submitted, 0 duplicate(s)" in result.output
    assert "1 duplicate(s)" in invoke("submit", "--subject", subject, "--type", "erase").output

    rows = json.loads(invoke("status", "--json").output)
    jan31 = next(r for r in rows if r["received"].startswith("2025-01-31") and r["request_type"] == "erase")
    assert jan31["due_date"] == "2025-02-28" and jan31["status"] == "received"
    extended = invoke("extend", jan31["request_id"], "--reason", "many systems")
    assert extended.exit_code == 0 and "due 2025-04-30" in extended.output

    report_file = tmp_path / "run.json"
    result = invoke("run", "--report", str(report_file), "--format", "csv", "--export-dir", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    report = json.loads(report_file.read_text())
    assert report["summary"]["completed"] == 3 and report["not_processed"] == {}
    assert report["export"]["format"] == "csv" and report["export"]["packages"] == 1
    assert len(list((tmp_path / "out").rglob("*.csv.zip"))) == 1
    assert subject not in report_file.read_text() and subject not in result.output
    bad_format = runner.invoke(app, ["-c", str(config), "run", "--format", "xml"])
    assert isinstance(bad_format.exception, DsrError) and "unknown export format 'xml'" in str(bad_format.exception)

    versions = snapshot_ids(spark, settings, ["demo.events"])["demo.events"]  # pyiceberg's or delta-rs's
    optimized = invoke("optimize", "--table", "demo.events", "--target-file-size-mb", "1")
    assert optimized.exit_code == 0 and "clustered by subject key" in optimized.output
    assert len(snapshot_ids(spark, settings, ["demo.events"])["demo.events"]) > len(versions)  # it rewrote the table

    verified = invoke("verify")
    assert verified.exit_code == 0 and "2 of 2 completed request(s) verified erased" in verified.output
    unknown = runner.invoke(app, ["-c", str(config), "verify", "req-nope"])
    assert isinstance(unknown.exception, LedgerError) and "req-nope" in str(unknown.exception)


@pytest.mark.slow  # 32 s: the whole demo in its own process
def test_demo_command(tmp_path):
    result = dsr("demo", "--users", "60", "--events", "600", "--erase", "8", "--access", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 under a legal hold" in result.stdout
    report = json.loads((tmp_path / "reports" / "demo-run.json").read_text())
    # one more erase request, of a subject under the demo's legal hold: left held with the hold's reason
    assert report["summary"] == {**report["summary"], "requests": 11, "completed": 10, "failed": 0, "held": 1}
    (held,) = [r for r in report["requests"] if r["status"] == "held"]
    assert "litigation hold (demo)" in held["reason"]
    # the demo's events keep 25 months (`expire:`): older events leave, proven like an erasure
    (rule,) = report["retention"]["tables"]["demo.events"]["rules"]
    assert rule["rows_past"] > 0 and rule["rows_left"] == 0 and report["retention"]["passed"]
    assert len(list((tmp_path / "exports").rglob("req-*.json"))) == 2
    assert (tmp_path / "dsr-secret.key").stat().st_mode & 0o077 == 0
    # the pseudonymized copy: shredded beside the plain erase, no row of it rewritten
    shredded = report["tables"]["demo_vault.events"]
    assert shredded["erase"]["action"] == "shred" and shredded["erase"]["rows_changed"] == 0
    assert shredded["verification"]["passed"] and shredded["verification"]["details"]["table_snapshot_unchanged"]
    assert "demo_vault.events: shredded" in result.stdout
    assert (tmp_path / "dsr-vault.key").stat().st_mode & 0o077 == 0


def test_status_shows_what_waits_for_the_batched_purge(spark, configured, tmp_path):
    settings, _ = configured
    config = write_config(settings, tmp_path / "batched.yaml",
                          purge={"policy": "batched", "max_delay_days": 5, "safety_margin_days": 3})
    runner = CliRunner()
    invoke = lambda *a: runner.invoke(app, ["-c", str(config), *a], catch_exceptions=False)  # noqa: E731
    ran = invoke("run")
    assert ran.exit_code == 0 and "1 request(s) logically erased, waiting for the batched purge" in ran.output
    purge_by = (datetime.now(UTC).date() + timedelta(days=5)).isoformat()
    (row,) = json.loads(invoke("status", "--json").output)
    assert row["status"] == "erased" and row["purge_by"] == purge_by and row["completed"] is None
    shown = invoke("status").output
    assert f"waiting for the physical purge: 1 request(s), the first due by {purge_by}" in shown
