"""The README's library example runs as written: a notebook user who copies it gets a completed,
verified erasure (the example once imported modules that did not exist)."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from helpers import SEED, make_settings, write_config
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
    report, proof = scope["report"], scope["dsr"].verify_completed(spark, scope["settings"])
    assert [r.status for r in report.requests] == ["completed"]
    assert proof == {report.requests[0].request_id: []}
    assert spark.table(settings.table("demo.events")).where(F.col("user_id") == subject).count() == 0


def test_the_public_api_resolves_and_is_documented():
    import lakehouse_dsr
    import lakehouse_dsr.runner  # noqa: F401  (a submodule imported first must not shadow an export)

    assert {"run", "Ledger", "RequestInput", "load_settings", "attach", "verify_completed", "suppress",
            "pseudonymize"} <= set(lakehouse_dsr.__all__)
    for name in lakehouse_dsr.__all__:
        value = getattr(lakehouse_dsr, name)
        assert not isinstance(value, types.ModuleType), f"lakehouse_dsr.{name} is a submodule's name"
        assert value.__doc__ and value.__doc__.strip(), f"lakehouse_dsr.{name} has no docstring"
        assert name in dir(lakehouse_dsr)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        lakehouse_dsr.nothing  # noqa: B018
