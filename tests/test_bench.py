"""The benchmark harness runs end to end at tiny scale (timings themselves are measured by `make bench`)."""

import json
import statistics

import pytest

from helpers import make_settings
from lakehouse_dsr.bench import run_bench
from lakehouse_dsr.lake.spark import attach


@pytest.mark.slow  # a whole bench round on tiny data (~40 s): make test-slow
def test_bench_writes_results_and_charts(spark, tmp_path):
    settings = make_settings(tmp_path)
    attach(spark, settings)
    results = tmp_path / "results"
    out = run_bench(spark, settings, events=3000, users=100, erase=5, access=10, results_dir=results,
                    work_dir=tmp_path / "work", repeats=2)
    assert json.loads((results / "3000.json").read_text()) == out
    assert (results / "3000.png").stat().st_size > 0 and (results / "scaling.png").stat().st_size > 0
    a, b = out["side_a_notebook"], out["side_b_dsr_events"]
    assert set(a["seconds"]) == {"erase", "expire", "export", "sort_rewrite", "export_after_sort"}
    assert a["export_files"] >= 10 and a["data_files_rewritten"] >= 1
    assert b["verified"] and b["completed"] == 15 and b["failed"] == 0 and b["export_files"] == 10
    assert out["side_b_dsr_all_tables"]["verified"] and out["side_b_dsr_all_tables"]["completed"] == 15
    assert b["rows_matched"] > 0 and out["ratios"]["full_cycle"] > 0
    batched = out["side_b_dsr_events_batched"]
    assert batched["awaiting_purge"] == 5 and batched["completed"] == 10 and not batched["verified_physically"]
    assert "purge" not in batched["seconds"] and b["events_purge_s"] > 0
    assert a["cost"]["export"]["bytes_read"] > 0 and b["cost"]["erase"]["bytes_written"] > 0
    assert len(b["rounds"]) == 2
    plain = out["plain_rewrite"]  # the physical limit: key scan, export read, rewrite of every file
    assert set(plain["seconds"]) == {"key_scan", "export_read", "plain_rewrite"}
    assert plain["cost"]["key_scan"]["rows_read"] == plain["cost"]["export_read"]["rows_read"] == 3000
    assert plain["full_cycle_s"] == out["physical_limit_s"] > 0
    assert plain["data_files_rewritten"] >= b["data_files_rewritten"] >= 1
    assert out["ratios"]["events_vs_physical_limit"] == round(b["full_cycle_s"] / plain["full_cycle_s"], 2)
    assert b["full_cycle_s"] == round(statistics.median(r["full_cycle_s"] for r in b["rounds"]), 3)
    assert set(out["targets_met"]) == {"full_cycle", "full_cycle_batched", "export_vs_unsorted", "logical_erase_s",
                                       "verify_s", "purge_vs_plain_rewrite", "events_vs_physical_limit",
                                       "process_vs_physical_limit"}
    # The same two as whole processes of their own: `dsr run`, and the limit's parts in a fresh interpreter and JVM.
    process, limit = out["side_b_dsr_process"], out["plain_rewrite_process"]
    assert process["verified"] and process["completed"] == 15 and len(process["rounds"]) == 2
    assert process["cost"]["erase"]["rows_read"] > 0 and set(limit["seconds"]) == set(plain["seconds"])
    assert limit["cost"]["key_scan"]["rows_read"] == 3000
    assert process["full_cycle_s"] > sum(process["seconds"].values())  # start-up and exit are in the process's time
    assert limit["full_cycle_s"] > limit["parts_s"] > 0
    assert out["ratios"]["process_vs_physical_limit"] == round(process["full_cycle_s"] / limit["full_cycle_s"], 2)
