"""The README's library example runs as written: a notebook user who copies it gets a completed,
verified erasure (the example once imported modules that did not exist)."""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.sql import functions as F

from conftest import SEED, make_settings, write_config
from lakehouse_dsr import synth
from lakehouse_dsr.lake.spark import attach

README = Path(__file__).parent.parent / "README.md"


def library_example() -> str:
    section = README.read_text().split("## From a notebook or a Spark job", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_library_example_runs_as_written(spark, tmp_path, monkeypatch):
    settings = make_settings(tmp_path)
    attach(spark, settings)
    synth.generate(spark, settings, users=20, events=200, seed=SEED, batches=1)
    write_config(settings, tmp_path / "dsr.yaml")
    monkeypatch.chdir(tmp_path)  # the example reads "dsr.yaml" from where it runs
    subject = synth.user_id(SEED, 3)
    scope = {"spark": spark, "subject_id": subject}
    exec(compile(library_example(), "README.md", "exec"), scope)
    report, proof = scope["report"], scope["verify_completed"](spark, scope["settings"])
    assert [r.status for r in report.requests] == ["completed"]
    assert proof == {report.requests[0].request_id: []}
    assert spark.table(settings.table("demo.events")).where(F.col("user_id") == subject).count() == 0
