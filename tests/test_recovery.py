"""Runs that recover from their own failures: a write cut short leaves torn files beside a table,
and a full disk stops a run; neither blocks the next run, and nothing of an erased person stays on
storage. Checked with pyarrow over every file on storage and the independent readers (pyiceberg,
delta-rs)."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import dsr_in_process, live_rows, make_settings, write_config
from lakehouse_dsr.exceptions import disk_full, first_line
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

ERASED = "u0"


def _lake(spark, root: Path, table_format: str, rows: int, width: int, window: float):
    """A lake under `root` with one table `app.events` (user_id, payload of `width` hex characters)
    in `table_format`, written as four files."""
    settings = make_settings(root, delta={"warehouse": str(root / "delta")},
                             purge={"orphan_min_age_minutes": window},
                             export={"directory": str(root / "exports")},
                             datamap={"subject": "user_id", "tables": {"app.events": {"key": "user_id",
                                                                                     "format": table_format}}})
    attach(spark, settings)
    hashes = ", ".join(f"sha2(concat(cast(id as string), ':{k}'), 512)" for k in range(max(1, width // 128)))
    events = spark.range(rows).selectExpr("concat('u', cast(id % 50 as string)) AS user_id",
                                          f"concat({hashes}) AS payload")  # distinct hex: compresses little
    Lake.of(spark, settings).create_table("app.events", events.repartition(4), {})
    return settings


def _data_files(settings, table: str) -> list[Path]:
    located = settings.delta_tables().get(table)
    root = Path(located) if located else Path(settings.catalog.local_warehouse()) / Path(*table.split("."))
    return sorted(p for p in root.rglob("*.parquet") if "_delta_log" not in p.parts and "metadata" not in p.parts)


def _holding(files: list[Path], value: str) -> list[str]:
    """The files pyarrow reads `value` from, and those it cannot read at all."""
    found = []
    for f in files:
        try:
            found += [f"{f.name} holds it"] if value in set(pq.read_table(f).column("user_id").to_pylist()) else []
        except Exception:
            found.append(f"{f.name} unreadable")
    return found


def test_a_full_disk_is_recognised_through_the_exceptions_it_caused():
    """ENOSPC from Python, or Java's text in an error raised from it, makes a one-line reason."""
    def raised_from(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except BaseException as exc:
                raise RuntimeError("An error occurred while calling o123.sql.") from exc
        except RuntimeError as outer:
            return outer

    java = raised_from(Exception("java.io.IOException: No space left on device\n\tat java.io..."))
    python = raised_from(OSError(errno.ENOSPC, "No space left on device", "/lake/wh/x.parquet"))
    for exc in (java, python):
        assert disk_full(exc) and first_line(exc) == "the disk is full (No space left on device)"
    assert not disk_full(raised_from(OSError(errno.EACCES, "Permission denied")))
    assert first_line(raised_from(ValueError("bad"))) == "An error occurred while calling o123.sql."


@pytest.mark.slow  # make test stays under 10 minutes
@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_torn_file_a_cut_write_left_keeps_requests_open_until_the_purge_removes_it(spark, tmp_path, table_format):
    """A file no version references and no reader can take (half of a data file that holds the
    person) neither fails the run nor passes its proof: the request stays open, saying why; once the
    file is older than the orphan window the next run's purge removes it and completes the request."""
    settings = _lake(spark, tmp_path, table_format, rows=2000, width=128, window=60)
    holder = next(f for f in _data_files(settings, "app.events") if _holding([f], ERASED))
    torn = holder.with_name("part-99999-torn.parquet")
    torn.write_bytes(holder.read_bytes()[: holder.stat().st_size // 2])  # pages with the person, no footer
    kept = live_rows(settings, "app.events").num_rows - 40  # u0 holds 40 of the 2,000 rows
    (request,) = Ledger(settings).submit([RequestInput(ERASED, "erase")]).created

    report = run(spark, settings)
    assert [r.request_id for r in report.failed] == [request] and "cannot be read as Parquet" in report.failed[0].reason
    assert report.tables["app.events"]["verification"]["details"]["unreadable_files"] == 1
    assert live_rows(settings, "app.events").num_rows == kept and torn.exists()  # erased; too young to remove

    old = time.time() - 2 * 3600
    os.utime(torn, (old, old))
    report = run(spark, settings)
    assert [r.request_id for r in report.completed] == [request], report.failed
    assert not torn.exists()
    assert _holding(_data_files(settings, "app.events"), ERASED) == []
    assert live_rows(settings, "app.events").num_rows == kept


@pytest.fixture
def small_volume(tmp_path):
    """A 24 MB tmpfs mounted under `tmp_path` (mounting needs root: skipped where it is refused)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(volume)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield volume
    subprocess.run(["umount", "-l", str(volume)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_disk_that_fills_up_mid_erasure_stops_the_run_cleanly_and_the_next_run_completes(
        spark, small_volume, monkeypatch, capsys, table_format):
    """The lake on a small volume, filled but for 1 MB before a run that must rewrite 8 MB: the run
    exits non-zero saying the disk is full (no traceback), the table is whole, the requests open;
    with the space back the next run completes them and no file on the volume holds the person."""
    settings = _lake(spark, small_volume, table_format, rows=20_000, width=512, window=0)
    config = write_config(settings, small_volume.parent / "dsr.yaml")
    before = live_rows(settings, "app.events").num_rows
    created = Ledger(settings).submit([RequestInput(f"u{i}", "erase") for i in range(5)]).created
    filler = small_volume / "filler"
    free = os.statvfs(small_volume).f_bavail * os.statvfs(small_volume).f_frsize
    filler.write_bytes(b"\0" * (free - (1 << 20)))

    code, out = dsr_in_process(monkeypatch, capsys, "-c", str(config), "run")
    assert code != 0 and "disk is full" in out and "Traceback" not in out, out
    assert f"{small_volume}/wh " in out  # where: the warehouse on the full volume, with its free space
    assert live_rows(settings, "app.events").num_rows == before
    assert all(s.status != "completed" for s in Ledger(settings).statuses())

    filler.unlink()
    code, out = dsr_in_process(monkeypatch, capsys, "-c", str(config), "run")
    assert code == 0, out
    assert sorted(s.request_id for s in Ledger(settings).statuses() if s.status == "completed") == sorted(created)
    assert live_rows(settings, "app.events").num_rows == before - 5 * 400
    everything = [f for f in small_volume.rglob("*") if f.is_file()]
    assert not [f for f in everything if f.stat().st_size == 0 and f.suffix == ".parquet"]  # no torn file left
    assert _holding(_data_files(settings, "app.events"), "u1") == []
