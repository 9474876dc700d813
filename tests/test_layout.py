"""Clustering by subject key: optimize, write order for later appends, sorted purge rewrites."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
import pytest

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.exceptions import DataMapError
from lakehouse_dsr.lake import layout
from lakehouse_dsr.lake.lakehouse import Lake
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run


def _files(spark, settings, table) -> list[tuple[str, str, str]]:
    bounds = "readable_metrics.user_id.lower_bound lo, readable_metrics.user_id.upper_bound hi"
    rows = spark.sql(f"SELECT file_path, {bounds} FROM {settings.table(table)}.files "
                     "WHERE content = 0 ORDER BY lo").collect()
    return [(r.file_path, r.lo, r.hi) for r in rows]


def _sorted_file(path: str) -> bool:
    values = pq.read_table(path.removeprefix("file:"), columns=["user_id"]).column(0).to_pylist()
    return values == sorted(values)


def test_optimize_clusters_by_key_and_keeps_rows(spark, new_lakehouse):
    settings = new_lakehouse(users=40, events=3000)
    events = settings.table("demo.events")
    before = Counter(tuple(r) for r in spark.table(events).collect())
    result = layout.optimize(Lake.of(spark, settings).table("demo.events"), settings.datamap,
                             target_file_size_bytes=20_000)
    assert result.key == "user_id" and result.files_before == 2 and result.bytes_rewritten > 0
    assert Counter(tuple(r) for r in spark.table(events).collect()) == before
    files = _files(spark, settings, "demo.events")
    assert len(files) == result.files_after > 1
    assert all(_sorted_file(path) for path, _, _ in files)
    assert all(prev[2] <= nxt[1] for prev, nxt in zip(files, files[1:], strict=False))  # ranges do not overlap
    props = dict(spark.sql(f"SHOW TBLPROPERTIES {events}").collect())
    assert props["write.parquet.bloom-filter-enabled.column.user_id"] == "true"

    # The write order makes later appends arrive sorted too.
    spark.table(events).limit(200).orderBy("event_id").writeTo(events).append()
    snapshot = spark.sql(f"SELECT snapshot_id FROM {events}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    added = spark.sql(f"SELECT data_file.file_path FROM {events}.entries "
                      f"WHERE snapshot_id = {snapshot} AND status = 1").collect()
    assert added and all(_sorted_file(r.file_path) for r in added)


def test_an_erasure_keeps_a_clustered_table_sorted(spark, new_lakehouse):
    settings = new_lakehouse(users=40, events=3000)
    # declares the sort order
    layout.optimize(Lake.of(spark, settings).table("demo.events"), settings.datamap, target_file_size_bytes=16_000)
    Ledger(settings).submit([RequestInput(synth.user_id(SEED, i), "erase") for i in range(3)])
    report = run(spark, settings)
    erased = report.tables["demo.events"]["erase"]  # the files holding the people, rewritten in the erase
    assert erased["strategy"] == "rewrite_files" and erased["data_files_rewritten"] >= 1
    rewritten = [p for p, _, _ in _files(spark, settings, "demo.events")]
    assert len(rewritten) > 1 and all(_sorted_file(p) for p in rewritten)
    # Dangling delete files are gone too, so history and storage are exactly the live files.
    assert spark.sql(f"SELECT count(*) n FROM {settings.table('demo.events')}.delete_files").first().n == 0
    assert report.tables["demo.events"]["verification"]["one_scan"]


def test_optimize_unmapped_table_needs_a_key(spark, new_lakehouse):
    settings = new_lakehouse(users=5, events=10)
    with pytest.raises(DataMapError, match="not in the data map"):
        layout.optimize(Lake.of(spark, settings).table("demo.other"), settings.datamap)
