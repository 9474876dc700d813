"""Every optional helper compiled in the driver has a plain-Spark path with the same results
(lake/bridge.py's `helper`): taken where the session's `spark.lakehouse_dsr.helpers` is "off", and
where a helper's class fails to compile, with one warning. Each path is compared with the helper's
own output, row for row, on whichever Spark line the suite runs (`make test` runs both)."""

from __future__ import annotations

import hashlib
import json
import logging
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from helpers import conf_kept, live_rows, make_settings, table_keys
from lakehouse_dsr.datamap import KeyGroup
from lakehouse_dsr.keys import private_dir
from lakehouse_dsr.lake import bridge, catalyst, hashsum, indriver, membership
from lakehouse_dsr.lake.bridge import HELPERS_CONF, helper
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.privatefiles import written
from lakehouse_dsr.lake.spark import attach
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run
from lakehouse_dsr.stages import collateral, matching

SECRET = "ann@example.com"
# What only a helper does: a Catalyst Invoke of a helper's object, or a read or write in the driver.
HELPER_ONLY = [(catalyst, "invoke"), (indriver, "plan"), (indriver, "rewrite"), (indriver, "position_deletes"),
               (indriver, "fingerprint"), (indriver, "live_found")]


@contextmanager
def helpers_off(spark) -> Iterator[None]:
    with conf_kept(spark, [HELPERS_CONF]):
        spark.conf.set(HELPERS_CONF, "off")
        yield


def test_the_package_writers_plain_path_writes_the_same_files(spark, tmp_path):
    texts = {"r1.json": f'{{"email": "{SECRET}"}}\n', "r2.json": "ünïcode ✓\n", "r3.json": ""}
    frame = spark.createDataFrame(list(texts.items()) + [("r4.json", None)], "name string, text string")
    found = {}
    for side in ("helper", "plain"):
        folder = private_dir(tmp_path / side)
        with helpers_off(spark) if side == "plain" else conf_kept(spark, []):
            column = written(spark, folder, F.col("name"), F.col("text"))
            plan = frame.select(column)._jdf.queryExecution().toString()
            assert ("private files" in plan) == (side == "helper") and str(folder) not in plan
            found[side] = {r.name: r.sha for r in frame.select("name", column.alias("sha")).collect()}
        files = {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
        assert files == {name: (text.encode(), 0o600) for name, text in texts.items()}  # no temporary file left
    assert found["plain"] == found["helper"] == {
        **{name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}, "r4.json": None}


def test_membership_s_plain_path_marks_the_same_rows_by_a_join(spark):
    rows = spark.createDataFrame([("u1", "a@x", "n1"), ("u2", "b@x", "n2"), ("u3", None, "n3"), (None, "a@x", "n4")],
                                 "user_id string, email string, note string")
    groups = [KeyGroup("user_id", "user_id", redact=("note",)), KeyGroup("email", "email", redact=("email",))]
    keys = table_keys(spark, groups, [("r1", "user_id", "u1"), ("r2", "email", "a@x"), ("r3", "user_id", "u1")])

    def rows_of(df) -> Counter:  # rows holding arrays (the requests naming them), as a multiset
        return Counter(json.dumps(r.asDict(recursive=True), sort_keys=True) for r in df.collect())

    def answers():
        marked = matching.mark(rows, keys, requests=False)
        return (marked._jdf.queryExecution().executedPlan().toString(),
                [rows_of(marked), rows_of(matching.mark(rows, keys)), rows_of(matching.requested_rows(rows, keys)),
                 rows_of(collateral.erased_rows(rows, keys, "delete")),
                 rows_of(collateral.erased_rows(rows, keys, "redact"))])

    plan, helper_rows = answers()
    assert "membership" in plan and "Join" not in plan
    with helpers_off(spark):
        assert not membership.supported(spark, keys.sets[0].requesters.schema["key_value"].dataType)
        plan, plain_rows = answers()
    assert "membership" not in plan and "Join" in plan
    assert plain_rows == helper_rows


def test_a_helper_that_fails_to_compile_is_left_with_one_warning(spark, monkeypatch, tmp_path, caplog):
    """A class that no longer compiles (an API its Spark or Iceberg changed) is tried once per JVM:
    one warning, then its plain path every time."""
    source = bridge._source
    monkeypatch.setattr(bridge, "_source", lambda name: source(name) + ("\nnot java" if name == "PrivateFiles" else ""))
    monkeypatch.setattr(bridge, "_cached", {})  # as in a new JVM
    monkeypatch.setattr(bridge, "_unavailable", {})
    frame = spark.createDataFrame([("a.json", SECRET)], "name string, text string")
    with caplog.at_level(logging.WARNING, logger=bridge.__name__):
        assert helper(spark, "PrivateFiles", tasks=True) is None and helper(spark, "PrivateFiles", tasks=True) is None
        sha = frame.select(written(spark, tmp_path, F.col("name"), F.col("text")).alias("sha")).collect()[0].sha
    warned = [r.getMessage().split(" (")[0] for r in caplog.records]
    assert warned == ["the PrivateFiles helper could not be compiled or loaded"]
    assert sha == hashlib.sha256(SECRET.encode()).hexdigest() and (tmp_path / "a.json").read_text() == SECRET
    assert helper(spark, "HashSum", tasks=True) is not None  # the others still load


def _lake_run(spark, root: Path, table_format: str, monkeypatch, off: bool) -> tuple[dict, Counter]:
    """A tiny table of `table_format` (three files), two erasures and an access request, one run;
    returns what the run decided and left, and the calls of helper-only code it made."""
    settings = make_settings(root, delta={"warehouse": str(root / "delta")}, purge={"orphan_min_age_minutes": 0},
                             datamap={"subject": "user_id", "tables": {"app.visits": {
                                 "key": "user_id", "format": table_format}}})
    attach(spark, settings)
    rows = [(f"u{i % 7}", f"page-{i}", i) for i in range(63)]
    Lake.of(spark, settings).create_table(
        "app.visits", spark.createDataFrame(rows, "user_id string, page string, n int").repartition(3), {})
    ledger = Ledger(settings)
    created = ledger.submit([RequestInput(s, "erase") for s in ("u0", "u3")] + [RequestInput("u1", "access")]).created
    calls: Counter = Counter()
    for module, name in HELPER_ONLY:
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            if off:
                raise AssertionError(f"{_name} called with the helpers off")
            return _real(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)
    with helpers_off(spark) if off else conf_kept(spark, []):
        assert hashsum.available(spark) != off and indriver.available(spark) != off
        report = run(spark, settings)
    monkeypatch.undo()
    access = created[2]
    left = live_rows(settings, "app.visits").select(["user_id", "page", "n"]).to_pylist()
    package = json.loads((Path(settings.export.directory) / report.run_id / f"{access}.json").read_text())
    table = report.tables["app.visits"]
    return {"statuses": [r.status for r in sorted(report.requests, key=lambda r: created.index(r.request_id))],
            "reasons": [r.reason for r in report.requests if r.reason],
            "rows_matched": table["erase"]["rows_matched"], "collateral": table["erase"]["collateral"]["ok"],
            "verified": table["verification"]["passed"],
            "left": Counter(tuple(r.values()) for r in left),
            "package": {t: sorted(rows, key=json.dumps) for t, rows in package["tables"].items()}}, calls


@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_a_run_with_every_helper_off_erases_exports_and_proves_as_with_them(spark, tmp_path, monkeypatch,
                                                                             table_format):
    """The same lake, run with the helpers and without (the plain paths: joins for membership, the
    check's own scans for the fingerprint sums, a Python writer for the packages, Spark's plans
    instead of the driver's reads and rewrites): the same outcome, the same rows left (read by
    pyiceberg or delta-rs), the same package."""
    helped, used = _lake_run(spark, tmp_path / "helped", table_format, monkeypatch, off=False)
    plain, _ = _lake_run(spark, tmp_path / "plain", table_format, monkeypatch, off=True)
    assert used["invoke"] > 0 and (table_format == "delta" or used["rewrite"] + used["plan"] > 0)
    assert helped["statuses"] == ["completed"] * 3 and helped["verified"] and helped["collateral"], helped["reasons"]
    assert helped["rows_matched"] == 18 and not any(u in ("u0", "u3") for u, _, _ in helped["left"])
    assert plain == helped
