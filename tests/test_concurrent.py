"""Another Spark application appends events while `dsr run` erases; a reader queries throughout.

No append may be lost; rows of erased subjects that arrive during the run are erased in a later
round or keep the request open with the reason (and the next run erases them); every reader
query sees one whole snapshot.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from pyspark.sql import functions as F

from helpers import SEED
from lakehouse_dsr import synth
from lakehouse_dsr.ledger.ledger import Ledger
from lakehouse_dsr.ledger.requests import RequestInput
from lakehouse_dsr.runner import run

pytestmark = pytest.mark.slow
ERASED = [synth.user_id(SEED, 1), synth.user_id(SEED, 2)]
OTHERS = [synth.user_id(SEED, i) for i in range(10, 30)]  # 20 rows per writer batch
WRITER = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path
    from lakehouse_dsr.config import load_settings
    from lakehouse_dsr.lake.spark import build_session
    config, out, others, erased = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
    settings = load_settings(config)
    spark = build_session(settings)
    stop, batches, erased_rows = out.with_suffix(".stop"), 0, 0
    while not stop.exists() and batches < 200:
        users = others + ([erased[batches % len(erased)]] if batches % 2 else [])
        batch = spark.createDataFrame([(u,) for u in users], "user_id string").selectExpr(
            "uuid() event_id", "user_id", "'concurrent' event_type", "current_timestamp() event_timestamp",
            "cast(null as string) page_url", "cast(null as string) product_id", f"'w{batches}' event_details")
        for attempt in range(5):  # as an ingest job would: Iceberg retried already, try the batch again
            try:
                batch.writeTo(settings.table("demo.events")).append()
                break
            except Exception as exc:
                print("append failed, retrying:", str(exc).splitlines()[0], flush=True)
                time.sleep(1 + attempt)
        else:
            raise SystemExit("append kept failing")
        batches += 1
        erased_rows += len(users) - len(others)
        out.write_text(json.dumps({"batches": batches, "erased_rows": erased_rows}))
        time.sleep(2.0)  # a busy ingest; each batch conflicts with an erase commit in flight
''')


def test_appends_during_a_run_are_kept_late_rows_erased_and_readers_consistent(spark, disk_lakehouse, tmp_path):
    settings, config = disk_lakehouse
    settings = settings.replace(purge={"orphan_min_age_minutes": 60})  # a writer is committing: never treat its
    # new files as orphans
    subject_of = dict(zip(Ledger(settings).submit([RequestInput(s, "erase") for s in ERASED]).created, ERASED,
                          strict=True))
    events = spark.table(settings.table("demo.events"))
    writer_rows = F.col("event_details").startswith("w")
    base_others = events.where(~writer_rows & ~F.col("user_id").isin(*ERASED)).count()

    progress = tmp_path / "writer.json"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), str(config), str(progress), json.dumps(OTHERS),
                               json.dumps(ERASED)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while not progress.exists() and time.time() < deadline and writer.poll() is None:
        time.sleep(2.0)  # a busy ingest; each batch conflicts with an erase commit in flight
    assert progress.exists(), writer.communicate()[0].decode(errors="replace")[-3000:]

    inconsistencies, reads, done = [], [], threading.Event()

    def reader():  # every query must see one whole snapshot: whole writer batches, all untouched rows
        while not done.is_set():
            live = spark.table(settings.table("demo.events")).where(~F.col("user_id").isin(*ERASED))
            counts = live.groupBy(F.when(writer_rows, F.col("event_details")).alias("batch")).count().collect()
            for r in counts:
                if (r.batch is None and r["count"] != base_others) or (r.batch is not None and r["count"] != 20):
                    inconsistencies.append((r.batch, r["count"]))
            reads.append(1)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        report = run(spark, settings)
    finally:
        done.set()
        batches_at_end = json.loads(progress.read_text())["batches"]
        thread.join()
        (tmp_path / "writer.stop").write_text("")
        output = writer.communicate(timeout=120)[0].decode(errors="replace")
    assert writer.returncode == 0, output[-3000:]
    written = json.loads(progress.read_text())

    assert not inconsistencies and len(reads) >= 2
    others_now = events.where(~F.col("user_id").isin(*ERASED))
    assert others_now.where(writer_rows).count() == 20 * written["batches"]  # no append lost
    assert others_now.where(~writer_rows).count() == base_others
    for r in report.requests:  # erased in a later round, or open with the reason
        assert r.status == "completed" or "rows in the current snapshot" in r.reason, r.reason
    erased = report.tables["demo.events"]["erase"]
    # Serializable isolation (Iceberg's default) fails a MERGE whenever an append lands during it:
    # retried with backoff, and when the writer wins every time, a clear error and the requests stay open.
    if erased["error"]:
        assert "conflicted with concurrent writers" in erased["error"]
    else:
        assert erased["collateral"]["ok"] and erased["attempts"] >= erased["rounds"]  # a statement per round at least

    again = run(spark, settings)  # the writer has stopped: whatever arrived late is erased now
    statuses = {r.request_id: r.status for r in Ledger(settings).statuses()}
    assert set(statuses.values()) == {"completed"}, [r.reason for r in again.requests]
    # A request the first run proved is closed: rows of its subject that the writer appended after that
    # proof (its last batches, while the run finished) are a new collection, which a new request erases
    # (the run does not look at closed requests again). Rows that arrived during the run are all gone.
    proven_first = {subject_of[r.request_id] for r in report.requests if r.status == "completed"}
    left = events.where(F.col("user_id").isin(*ERASED)).select("user_id", "event_details").collect()
    assert all(r.user_id in proven_first and (r.event_details or "").startswith("w")
               and int(r.event_details[1:]) >= batches_at_end - 2 for r in left), left
    if left:
        Ledger(settings).submit([RequestInput(s, "erase") for s in {r.user_id for r in left}])
        assert {r.status for r in run(spark, settings).requests} == {"completed"}
    assert events.where(F.col("user_id").isin(*ERASED)).count() == 0
    assert others_now.where(writer_rows).count() == 20 * written["batches"]
