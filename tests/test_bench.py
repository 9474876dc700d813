"""The benchmark harness runs end to end at tiny scale (timings themselves are measured by `make bench`)."""

import json

from conftest import make_settings
from lakehouse_dsr.bench import run_bench
from lakehouse_dsr.spark import attach


def test_bench_writes_results_and_charts(spark, tmp_path):
    settings = make_settings(tmp_path)
    attach(spark, settings)
    results = tmp_path / "results"
    out = run_bench(spark, settings, events=3000, users=100, erase=5, access=10, results_dir=results,
                    work_dir=tmp_path / "work")
    assert json.loads((results / "3000.json").read_text()) == out
    assert (results / "3000.png").stat().st_size > 0 and (results / "scaling.png").stat().st_size > 0
    a, b = out["side_a_notebook"], out["side_b_dsr_events"]
    assert set(a["seconds"]) == {"erase", "expire", "export", "sort_rewrite", "export_after_sort"}
    assert a["export_files"] >= 10 and a["data_files_rewritten"] >= 1
    assert b["verified"] and b["completed"] == 15 and b["failed"] == 0 and b["export_files"] == 10
    assert out["side_b_dsr_all_tables"]["verified"] and out["side_b_dsr_all_tables"]["completed"] == 15
    assert b["rows_matched"] > 0 and out["ratios"]["full_cycle"] > 0
