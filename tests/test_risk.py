"""`dsr risk`: k-anonymity and l-diversity of a real Iceberg table, against figures worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import make_settings, write_config
from lakehouse_dsr.exceptions import DataMapError, DsrError
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.vault.risk import assess, plot

# (zip, age, sex, person, diagnosis); classes over (zip, age, sex): 3 rows (u1-u3), 2 rows (u4, u5), 1 row (u6)
PATIENTS = [("10001", 30, "F", "u1", "flu"), ("10001", 30, "F", "u2", "cold"), ("10001", 30, "F", "u3", "flu"),
            ("10002", 40, "M", "u4", "flu"), ("10002", 40, "M", "u5", "flu"), ("10003", 50, "F", "u6", "asthma")]


@pytest.fixture(scope="module")
def clinic(spark, tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("risk"))
    attach(spark, settings)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.namespace('health')}")
    spark.createDataFrame(PATIENTS, "zip string, age int, sex string, person string, diagnosis string") \
        .writeTo(settings.table("health.visits")).create()
    return settings


def test_figures_match_the_hand_count(spark, clinic):
    report = assess(spark, clinic, "health.visits", ["zip", "age", "sex"], k=3, sensitive="diagnosis",
                    subject="person")
    assert (report.rows, report.classes, report.smallest_class) == (6, 3, 1)
    assert not report.k_anonymous
    assert (report.rows_below_k, report.share_rows_below_k) == (3, 0.5)  # the class of 2 and the class of 1
    assert (report.subjects, report.subjects_below_k, report.share_subjects_below_k) == (6, 3, 0.5)
    assert report.class_sizes == {1: 1, 2: 1, 3: 1}
    # diagnoses per class: {flu, cold}, {flu}, {asthma}: l = 1, and 3 of 6 rows sit in one-value classes
    assert (report.l_diversity, report.share_rows_single_value) == (1, 0.5)
    riskiest = {tuple(c.columns): (c.smallest_class, c.rows_below_k) for c in report.riskiest}
    # zip alone, age alone and each pair single out the same 3 rows; sex alone (F 4, M 2) only 2, so it
    # is not among the five riskiest
    assert riskiest == {("zip",): (1, 3), ("age",): (1, 3), ("zip", "age"): (1, 3), ("zip", "sex"): (1, 3),
                        ("age", "sex"): (1, 3)}
    assert assess(spark, clinic, "health.visits", ["sex"], k=2).k_anonymous  # F 4, M 2


def test_report_holds_counts_only(spark, clinic, tmp_path):
    report = assess(spark, clinic, "health.visits", ["zip", "age", "sex"], k=2, sensitive="diagnosis",
                    subject="person")
    text = json.dumps(report.as_dict())
    for value in ("10001", "10003", "u6", "asthma", "flu"):
        assert value not in text
    plot(report, tmp_path / "classes.png")
    assert (tmp_path / "classes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("quasi, k, sensitive, error, message", [
    (["zip", "height"], 3, None, DataMapError, "has no column 'height'"),
    (["zip"], 3, "zip", DataMapError, "also a quasi-identifier"),
    ([], 3, None, DsrError, "at least one quasi-identifier"),
    (["zip"], 1, None, DsrError, "k must be at least 2"),
])
def test_bad_input_is_a_clear_error(spark, clinic, quasi, k, sensitive, error, message):
    with pytest.raises(error, match=message):
        assess(spark, clinic, "health.visits", quasi, k=k, sensitive=sensitive)


@pytest.mark.slow
def test_dsr_risk_command(spark, clinic, tmp_path):
    config = write_config(clinic, tmp_path / "dsr.yaml")
    dsr = str(Path(sys.executable).parent / "dsr")
    out = subprocess.run([dsr, "-c", str(config), "risk", "health.visits", "--quasi", "zip,age,sex", "--k", "3",
                          "--subject", "person", "--json", "--plot", str(tmp_path / "c.png")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert (found["smallest_class"], found["share_rows_below_k"], found["k_anonymous"]) == (1, 0.5, False)
    assert (tmp_path / "c.png").exists()
    bad = subprocess.run([dsr, "-c", str(config), "risk", "health.visits", "--quasi", "zip,nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "has no column 'nope'" in bad.stderr
