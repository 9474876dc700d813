"""Small tables erased inside the driver's JVM (lake/indriver.py): the same table as Spark's rewrite
leaves, no Spark job, the table's writer settings kept; what it cannot do exactly goes to Spark.

Tables are read back with pyiceberg and pyarrow, not with the engine's own readers.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import IllegalArgumentException
from pyspark.sql.types import StructType

from helpers import make_settings
from lakehouse_dsr.inventory.check import check_against_catalog
from lakehouse_dsr.keys import Keyring, key_id, keyed_hash
from lakehouse_dsr.lake import indriver, skipping, workers
from lakehouse_dsr.lake.catalog import open_catalog
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.lake.metrics import StageMeter
from lakehouse_dsr.lake.spark import PYTHON_DAEMON, attach
from lakehouse_dsr.stages import collateral, erase, matching, verify

TABLE = "shop.orders"
ERASED = ["u03", "u07"]


def lake(spark, tmp_path, name: str, action: str, in_driver_max_bytes: int | None = None, properties: str = ""):
    """A table of 40 orders by 10 users over three files (partitioned by region), mapped with `action`."""
    entry = {"key": "user_id", "action": action} | ({"redact": ["user_id", "note"]} if action == "redact" else {})
    settings = make_settings(tmp_path / name, datamap={"subject": "user_id", "identifiers": {},
                                                       "tables": {TABLE: entry}},
                             erase={} if in_driver_max_bytes is None else {"in_driver_max_bytes": in_driver_max_bytes})
    attach(spark, settings)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.shop")
    spark.sql(f"CREATE TABLE {settings.table(TABLE)} (order_id BIGINT, user_id STRING, region STRING, note STRING, "
              f"amount INT) USING iceberg PARTITIONED BY (region) TBLPROPERTIES ('format-version'='2', "
              f"'write.parquet.compression-codec'='gzip'{properties})")
    spark.sql(f"INSERT INTO {settings.table(TABLE)} SELECT id, format_string('u%02d', id % 10), "
              "IF(id % 3 = 0, 'eu', IF(id % 3 = 1, 'us', 'apac')), concat('note ', id), CAST(id * 7 AS INT) "
              "FROM range(40)")
    return settings


def table_keys(spark, settings, subjects: list[str]) -> matching.TableKeys:
    keys = spark.createDataFrame([(f"r{i}", "user_id", s) for i, s in enumerate(subjects)],
                                 "request_id string, key_type string, key_value string")
    types = check_against_catalog(spark, settings.datamap, settings.table)
    return matching.key_sets(settings.datamap, keys, types, [TABLE])[TABLE]


def rows(settings) -> list[dict]:
    """The table's rows in file and position order, read with pyiceberg."""
    return open_catalog(settings).load_table(TABLE).scan().to_arrow().sort_by("order_id").to_pylist()


def file_order(settings) -> dict[str, list[int]]:
    """{region: order ids in file order} of the live files (one per region), read with pyarrow."""
    out = {}
    for f in open_catalog(settings).load_table(TABLE).inspect.files().to_pylist():
        assert f["partition"]["region"] not in out
        ids = pq.read_table(f["file_path"].removeprefix("file:"), columns=["order_id"]).column("order_id")
        out[f["partition"]["region"]] = ids.to_pylist()
    return out


def erase_all(spark, settings, keys: matching.TableKeys) -> erase.TableErasure:
    # purging: rewrite the files
    plan = erase.plan(Lake.of(spark, settings), settings.datamap, settings.erase, TABLE, keys, purging=True)
    result = erase.apply(Lake.of(spark, settings), settings.datamap, settings.erase, plan, keys)
    skipping.release()
    return result


@pytest.mark.parametrize("action", ["delete", "redact"])
def test_a_small_table_is_erased_in_the_driver_exactly_as_spark_erases_it(spark, tmp_path, action):
    in_driver, in_spark = lake(spark, tmp_path, "driver", action), lake(spark, tmp_path, "spark", action, 0)
    before, order = rows(in_driver), file_order(in_driver)
    keys = table_keys(spark, in_driver, ERASED)  # the batch's key set: a small Spark job of its own
    meter = StageMeter(spark)
    mark = meter.mark()
    result = erase_all(spark, in_driver, keys)
    cost = meter.since(mark)
    assert cost.stages == 0 and cost.driver_files == 6  # three files planned and rewritten, no Spark job
    assert erase_all(spark, in_spark, table_keys(spark, in_spark, ERASED)).plan.rows_matched == \
        result.plan.rows_matched == 8
    assert result.plan.strategy == "rewrite_files" and result.snapshot_id is not None
    after = rows(in_driver)
    assert after == rows(in_spark)  # what Spark's rewrite leaves, row for row
    if action == "delete":
        assert after == [r for r in before if r["user_id"] not in ERASED]
    else:
        assert after == [r | {"user_id": None, "note": None} if r["user_id"] in ERASED else r for r in before]
    # One new file per old file, in its partition, rows in the old file's order, with the table's codec.
    kept = {r["order_id"] for r in after}
    assert file_order(in_driver) == {region: [i for i in ids if i in kept] for region, ids in order.items()}
    for f in open_catalog(in_driver).load_table(TABLE).inspect.files().to_pylist():
        parquet = pq.ParquetFile(f["file_path"].removeprefix("file:"))
        assert parquet.metadata.row_group(0).column(0).compression == "GZIP"


def test_what_the_driver_cannot_do_exactly_goes_to_spark(spark, tmp_path):
    settings = lake(spark, tmp_path, "mor", "delete", properties=", 'write.delete.mode'='merge-on-read'")
    keys = table_keys(spark, settings, ERASED)
    candidates = keys.current_candidates(Lake.of(spark, settings).table(TABLE))
    assert indriver.refusal(spark, candidates, keys.key_columns(), 8 << 20) is None
    assert "bytes of files" in indriver.refusal(spark, candidates, keys.key_columns(), 100)
    nested = [indriver.KeyColumn("profile.user_id", keys.sets[0].values)]
    assert "nested" in indriver.refusal(spark, candidates, nested, 8 << 20)
    # another writer's delete file: the driver does not apply deletes, so Spark reads that table
    spark.sql(f"DELETE FROM {settings.table(TABLE)} WHERE order_id = 1")
    candidates = keys.current_candidates(Lake.of(spark, settings).table(TABLE))
    assert indriver.refusal(spark, candidates, keys.key_columns(), 8 << 20) == "a file has deletes"
    before = rows(settings)
    meter = StageMeter(spark)
    mark = meter.mark()
    result = erase_all(spark, settings, keys)
    assert meter.since(mark).stages > 0 and result.plan.rows_matched == 8
    assert rows(settings) == [r for r in before if r["user_id"] not in ERASED]


def test_a_partition_derived_from_a_redacted_column_goes_to_spark(spark, tmp_path):
    settings = lake(spark, tmp_path, "part", "redact")
    spark.sql(f"ALTER TABLE {settings.table(TABLE)} ADD PARTITION FIELD bucket(4, note)")
    spark.sql(f"INSERT INTO {settings.table(TABLE)} VALUES (100, 'u03', 'eu', 'late', 1)")
    keys = table_keys(spark, settings, ERASED)
    candidates = keys.current_candidates(Lake.of(spark, settings).table(TABLE))
    assert "partition" in indriver.refusal(spark, candidates, keys.key_columns(), 8 << 20)
    result = erase_all(spark, settings, keys)
    assert result.plan.rows_matched == 9
    assert not [r for r in rows(settings) if r["user_id"] in ERASED or r["note"] == "late"]


def test_the_collateral_check_of_a_small_rewrite_runs_in_the_driver_and_catches_damage(spark, tmp_path):
    for action in ("delete", "redact"):
        settings = lake(spark, tmp_path, f"check-{action}", action)
        requested, wider = table_keys(spark, settings, ERASED), table_keys(spark, settings, [*ERASED, "u05"])
        for keys, ok in ((requested, True), (wider, False)):  # `wider`: the erase takes a bystander too
            plan = erase.plan(Lake.of(spark, settings), settings.datamap, settings.erase, TABLE, keys, purging=True)
            result = erase.apply(Lake.of(spark, settings), settings.datamap, settings.erase, plan, keys)
            meter = StageMeter(spark)
            mark = meter.mark()
            verdict = collateral.check(Lake.of(spark, settings), settings.datamap, settings.erase, TABLE, requested,
                                       plan.snapshot_before, result.snapshot_id)
            cost = meter.since(mark)
            assert cost.stages == 0 and cost.driver_files > 0  # fingerprinted in the driver
            assert verdict.ok is ok and verdict.conclusive, (action, verdict)
            if not ok:
                assert "rows not requested changed" in verdict.detail
            skipping.release()


def test_the_driver_check_passes_whatever_the_hashes_add_up_to(spark, tmp_path):
    """Its 64-bit sums wrap around: the replaced rows' two fingerprints, added, must still equal the new files'."""
    settings = lake(spark, tmp_path, "wrap", "redact")
    for subject in ("u01", "u02", "u04", "u06", "u08", "u09"):
        keys = table_keys(spark, settings, [subject])
        plan = erase.plan(Lake.of(spark, settings), settings.datamap, settings.erase, TABLE, keys, purging=True)
        result = erase.apply(Lake.of(spark, settings), settings.datamap, settings.erase, plan, keys)
        verdict = collateral.check(Lake.of(spark, settings), settings.datamap, settings.erase, TABLE, keys,
                                   plan.snapshot_before, result.snapshot_id)
        assert verdict.ok, (subject, verdict)
        skipping.release()


def test_the_live_check_of_a_small_table_runs_in_the_driver_and_finds_what_spark_finds(spark, tmp_path):
    """Hashes under two keys (a rotation): the old key's hash is matched only under the old key, and
    a person found under both counts once."""
    old, new = b"k" * 32, b"n" * 32
    stored = [("r1", "user_id", keyed_hash(old, "u03"), key_id(old)), ("r1", "user_id", keyed_hash(new, "u03"), None),
              ("r2", "user_id", keyed_hash(new, "u07"), key_id(new)),
              ("r3", "user_id", keyed_hash(new, "u05"), key_id(old))]  # made by a key that is not `old`: no match
    found = {}
    for name, limit in (("driver", None), ("spark", 0)):
        settings = lake(spark, tmp_path, f"live-{name}", "delete", limit)
        hashes = spark.createDataFrame(stored, "request_id string, key_type string, key_hash string, key_id string")
        keys = table_keys(spark, settings, ["u03", "u07", "u05"])
        hash_keys = verify.keys_for(settings.key_file(), hashes, Keyring(new, (old,)))
        meter = StageMeter(spark)
        mark = meter.mark()
        found[name] = verify.live_found(Lake.of(spark, settings), settings.datamap, settings.erase, [TABLE], hashes,
                                        hash_keys, {TABLE: keys}, parallel_tables=settings.run.parallel_tables)
        cost = meter.since(mark)
        # the driver reads the three files itself (Spark only collects the ledger's hashes, once per run)
        assert cost.driver_files == (3 if name == "driver" else 0), cost
        skipping.release()
    assert found["driver"] == found["spark"] == {TABLE: {"r1": 4, "r2": 4}}


def test_when_the_driver_fails_spark_does_the_work(spark, tmp_path, monkeypatch):
    settings = lake(spark, tmp_path, "fails", "delete")
    before = rows(settings)

    def fail(*_args):
        raise Py4JJavaError("boom", spark._jvm.java.lang.UnsupportedOperationException("a type it cannot read"))

    monkeypatch.setattr(indriver, "rewrite", fail)
    keys = table_keys(spark, settings, ERASED)
    meter = StageMeter(spark)
    mark = meter.mark()
    result = erase_all(spark, settings, keys)
    assert meter.since(mark).stages > 0 and result.snapshot_id is not None  # Spark's rewrite
    assert rows(settings) == [r for r in before if r["user_id"] not in ERASED]


def test_small_driver_data_becomes_a_local_relation_without_a_python_worker_or_a_file_left(spark, tmp_path):
    rows = [("r1", "ann@example.com", b"\x00\xffpad", 7, None), ("r2", None, b"", 2**40, "x")]
    schema = "request_id string, subject_id string, pad binary, n bigint, note string"
    temp = sorted(Path(spark.sparkContext._temp_dir).iterdir())
    df = indriver.local_rows(spark, rows, schema)
    assert indriver.is_local(df)  # rows in the plan itself: no RDD, so no Python worker evaluates them
    assert sorted(Path(spark.sparkContext._temp_dir).iterdir()) == temp  # the rows' file is gone
    meter = StageMeter(spark)
    mark = meter.mark()
    assert sorted(tuple(r) for r in df.collect()) == [
        ("r1", "ann@example.com", bytearray(b"\x00\xffpad"), 7, None), ("r2", None, bytearray(b""), 2**40, "x")]
    assert [r.request_id for r in df.where("subject_id IS NOT NULL").select("request_id").collect()] == ["r1"]
    assert meter.since(mark).stages == 0  # filtered and projected in the driver
    # a StructType works as the schema too, and the relations join as any other
    other = indriver.local_rows(spark, [("r2",)], StructType.fromJson({"type": "struct", "fields": [
        {"name": "request_id", "type": "string", "nullable": True, "metadata": {}}]}))
    assert [r.n for r in df.join(other, "request_id").collect()] == [2**40]
    assert indriver.local_rows(spark, [], schema).collect() == []


def test_kept_rows_are_distinct_and_their_subsets_are_taken_in_the_driver(spark):
    schema = "request_id string, key_type string, key_value string"
    rows = [("r1", "user_id", "u1"), ("r2", "user_id", "u2"), ("r1", "user_id", "u1"), ("r3", "email", None),
            (None, "user_id", "u9")]
    meter = StageMeter(spark)
    mark = meter.mark()
    kept = indriver.kept(indriver.local_rows(spark, rows, schema))
    assert indriver.is_local(kept)
    assert sorted(kept.collect(), key=str) == sorted({tuple(r) for r in rows}, key=str)  # the duplicate dropped
    subset = indriver.kept_where(kept, "request_id", ["r1", "r3", "r404"])
    assert indriver.is_local(subset)
    assert sorted(tuple(r) for r in subset.collect()) == [("r1", "user_id", "u1"), ("r3", "email", None)]
    assert indriver.kept_where(kept, "request_id", []).collect() == []
    assert meter.since(mark).stages == 0  # all of it in the driver's JVM
    # rows that are not held in the driver would take a job: refused, not collected
    with pytest.raises(IllegalArgumentException, match="not a local relation"):
        indriver.kept_where(spark.range(3).selectExpr("CAST(id AS STRING) AS request_id"), "request_id", ["1"])


def test_the_python_workers_start_in_the_background_and_no_stage_meter_counts_them(spark, monkeypatch):
    sc = spark.sparkContext
    jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
    meter = StageMeter(spark)
    mark = meter.mark()
    starting = threading.Thread(target=workers._start, args=(spark,))  # what start_python_workers starts
    starting.start()
    starting.join()
    module = sc.getConf().get(PYTHON_DAEMON, "pyspark.daemon").encode()  # ours on local masters
    daemons = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == jvm
               and module in (p / "cmdline").read_bytes()]
    assert daemons  # the daemon the export's package writer asks for is up
    assert meter.since(mark).stages == 0  # no work of a run
    # what the meters leave out is that job alone
    sc.parallelize([0], 1).map(int).collect()
    assert meter.since(mark).stages == 1
    # start_python_workers runs _start in a thread of its own, once per context
    started: list = []
    monkeypatch.setattr(workers, "_started", weakref.WeakSet())
    monkeypatch.setattr(workers, "_start", started.append)
    workers.start_python_workers(spark)
    workers.start_python_workers(spark)  # the second call starts nothing
    for thread in threading.enumerate():
        if thread.name == "dsr-python-workers":
            thread.join(10)
    assert started == [spark]


def _parent(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
