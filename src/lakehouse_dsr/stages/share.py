"""Shares (`shares:` in the data map): tables that leave the company, created and refreshed by
`dsr run`, never holding a subject who opted out of sale/sharing or was erased.

One pass per run, after the erasure:
1. Consent: each open opt_out / opt_in request becomes its subject's consent state (ledger/consent.py:
   keyed hashes only; the newest request of a subject wins).
2. Per share, the rows of the subjects to take out now (opted out, erased in this run, or opted in:
   their rows come back whole) leave in one DELETE commit. Then the share is refreshed: created from
   its SQL over the source's current snapshot; or the rows the source's append commits added since
   the last refresh (Iceberg's incremental read) and the opted-in subjects' rows are appended in one
   commit; or, when that would not be exact (the source had other commits than appends and rewrites
   since, its last refreshed snapshot expired in a purge, the SQL changed or is not row by row, or the
   share was written by someone else), the share is recomputed whole in one replace commit. Rows of
   opted-out subjects never go in. Table properties of the share record the source snapshot it reflects.
3. When the run has requests to prove, the share's history is purged (stages/purge.py: old snapshots
   expired, their files and orphans deleted) and verified (stages/verify.py): no opted-out or erased
   subject's key in the live data, in the files of any retained snapshot, in any file on storage or
   under a branch or tag. An opt_out completes only then; an erase request also needs it.

Keys are matched by keyed hash in Spark: each distinct key value is hashed under every key of the
ring that made a stored hash (lake/hmac.py), so hashes made before a key rotation keep matching.
Subject ids never enter SQL text and never reach the driver.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import PurgeSettings
from ..datamap import DataMap
from ..datamap import shares as share_sql
from ..datamap.lineage import Query
from ..exceptions import first_line
from ..keys import keyed_hash
from ..lake import indriver
from ..lake.hmac import join_on_key, with_keyring_hashes
from ..lake.lakehouse import Lake
from ..lake.table import Snapshot, TableHandle
from ..ledger import consent
from ..ledger.ledger import Ledger, Outcome
from ..progress import Progress
from . import purge, verify

SOURCE_SNAPSHOT = "dsr.share.source-snapshot-id"  # the source snapshot the share reflects ("none": empty)
SHARE_SNAPSHOT = "dsr.share.snapshot-id"  # the share's snapshot when it was recorded: later commits void it
SQL_DIGEST = "dsr.share.sql-sha256"  # a changed sql means a full refresh
# Copy-on-write: a DELETE rewrites the files holding the rows, so the purge leaves no file with them.
METHOD = ("keyed hash (HMAC-SHA256) of every key value, compared with the hashes of every opted-out and "
          "erased subject, in the live snapshot, the files of every retained snapshot, every file on storage "
          "(unreferenced ones included), branches and tags")


@dataclass
class ShareRefresh:
    """What a run did to one share (no identifiers; request ids only in `removed` / `added`)."""

    share: str
    mode: str = "unchanged"  # created | incremental | full | unchanged | held (source on hold: not refreshed)
    reason: str | None = None  # why recomputed whole, or not refreshed
    source_snapshot: int | None = None
    snapshot_id: int | None = None
    rows_added: int = 0
    rows_removed: int = 0
    data_files_added: int = 0
    data_files_rewritten: int = 0
    bytes_rewritten: int = 0
    removed: dict[str, int] = field(default_factory=dict)  # request id -> its subject's rows taken out
    added: dict[str, int] = field(default_factory=dict)  # opt_in request id -> its subject's rows put back
    purge: purge.TablePurge | None = None
    verification: verify.TableVerification | None = None
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        for per_request in ("removed", "added"):
            d.pop(per_request)
        d["purge"] = self.purge.as_dict() if self.purge else {}
        d["verification"] = self.verification.as_dict() if self.verification else {}
        return d


@dataclass
class _Subjects:
    """The keyed hashes a run matches share rows against, as small DataFrames (request_id, key_type,
    key_hash, key_id): `excluded` (every opted-out subject, and the subjects of this run's erase
    requests) and `returning` (this run's opt-ins), with the keys that made them."""

    excluded: DataFrame
    returning: DataFrame
    any_excluded: bool
    any_returning: bool
    keys: verify.HashKeys

    @property
    def leaving(self) -> DataFrame:
        """Whose rows leave a share before its refresh: the excluded and the returning (put back whole)."""
        return self.excluded.unionByName(self.returning)


def process(lake: Lake, datamap: DataMap, purge_settings: PurgeSettings, ledger: Ledger, requests: Mapping[str, dict],
            outcomes: list[Outcome], erase_ids: set[str], held: set[str], progress: Progress, run_id: str
            ) -> tuple[list[Outcome], dict[str, ShareRefresh]]:
    """Record the consent `requests` ask for (open opt_out/opt_in ledger rows by request id), bring every
    share up to date without the excluded subjects, and prove it; returns the outcomes (`outcomes`
    with the share evidence added to those of `erase_ids`, which fail when a share still holds their
    subject, plus one per consent request) and what was done per share.

    Cost per share: one DELETE and one append (or one replace) commit; when there are requests to
    prove, one scan of the share's key column for the rows to take out, the purge and the verification
    (scans of the key column in live data, history and storage). An incremental refresh reads only the
    source's appended files; a full one the source's current snapshot. `purge_settings`: how a
    share is purged (purge.purge_table).
    """
    spark = lake.spark
    overridden = consent.record(ledger, [
        consent.ConsentChange(rid, r["subject_id"], r["request_type"] == "opt_out", r["received_at"])
        for rid, r in requests.items()])
    erasing = sorted(o.request_id for o in outcomes if o.request_id in erase_ids)
    results: dict[str, ShareRefresh] = {}
    if datamap.shares:
        returning = {rid: r["subject_id"] for rid, r in requests.items()
                     if r["request_type"] == "opt_in" and rid not in overridden}
        subjects = _subjects(spark, datamap, ledger, erasing, returning)
        prove = bool(requests or erasing)
        catalog = lake.catalog_name
        progress.stage("shares", len(datamap.shares))
        for name, share in datamap.shares.items():
            progress.step(name)
            shared = share_sql.query(spark, datamap, name, catalog)
            results[name] = _maintain(lake, datamap, purge_settings, ledger.settings.key_file(), name, shared, subjects,
                                      prove, share.source in held)
        progress.done()
    return _outcomes(requests, overridden, outcomes, set(erasing), results, run_id), results


def _subjects(spark: SparkSession, datamap: DataMap, ledger: Ledger, erasing: list[str],
              returning: dict[str, str]) -> _Subjects:
    """The run's `_Subjects`. Cost: one read of the opted-out consent rows and one of the erase
    requests' stored hashes; one HMAC per opt-in in the driver (its id is in the open request)."""
    subject = datamap.subject
    out = [(r["request_id"], subject, r["subject_hash"], r["key_id"]) for r in consent.opted_out(ledger)]
    erased = [(h["request_id"], subject, h["key_hash"], h["key_id"]) for h in ledger.key_hashes(erasing)
              if h["key_type"] == subject]
    ring = ledger.keyring
    back = [(rid, subject, keyed_hash(ring.active, sid), ring.active_id) for rid, sid in sorted(returning.items())]
    excluded = indriver.local_rows(spark, out + erased, verify.HASHES)
    stored = indriver.local_rows(spark, out + erased + back, verify.HASHES)
    return _Subjects(excluded, indriver.local_rows(spark, back, verify.HASHES), bool(out or erased), bool(back),
                     verify.keys_for(ledger.settings.key_file(), stored, ring))


def _named(spark: SparkSession, rows: DataFrame, key: str, hashes: DataFrame, subjects: _Subjects) -> DataFrame:
    """(dsr_value, request_id, count): each distinct `key` value of `rows` whose keyed hash is one of
    `hashes`, with the request that named it and its number of rows; kept (local checkpoint: a later
    commit to the table `rows` reads cannot change it; one small row per subject found). Cost: one
    aggregation of `rows` by `key`, one HMAC per distinct value and key in use."""
    grouped = rows.groupBy(F.col(f"`{key}`").alias("dsr_value")).count().where(F.col("dsr_value").isNotNull())
    hashed = with_keyring_hashes(spark, grouped, "dsr_value", subjects.keys.keys)
    return (join_on_key(hashed, hashes.select("request_id", "key_hash", "key_id"))
            .select("dsr_value", "request_id", "count").localCheckpoint(eager=True))


def _per_request(named: DataFrame) -> dict[str, int]:
    return {r.request_id: int(r.rows) for r in named.groupBy("request_id").agg(F.sum("count").alias("rows")).collect()}


def _rows_of(rows: DataFrame, key: str, named: DataFrame, how: str) -> DataFrame:
    """`rows` whose `key` is a value of `named` (how="left_semi"), or all others ("left_anti"): a
    broadcast join, no shuffle."""
    return rows.join(F.broadcast(named.select("dsr_value").distinct()), F.col(f"`{key}`") == F.col("dsr_value"), how)


def _without(spark: SparkSession, rows: DataFrame, key: str, hashes: DataFrame | None, subjects: _Subjects
             ) -> DataFrame:
    """`rows` without those of the subjects `hashes` name (all of them when None)."""
    return rows if hashes is None else _rows_of(rows, key, _named(spark, rows, key, hashes, subjects), "left_anti")


def _maintain(lake: Lake, datamap: DataMap, purge_settings: PurgeSettings, key_file: Path, name: str,
              shared: Query, subjects: _Subjects, prove: bool, source_held: bool) -> ShareRefresh:
    """Take out, refresh, purge and verify one share (see the module docstring); an error is recorded
    in the result, and the requests it concerns stay open with it."""
    spark = lake.spark
    start = time.perf_counter()
    result = ShareRefresh(name)
    share = datamap.shares[name]
    table = lake.quoted(name)
    try:
        exists = spark.catalog.tableExists(table)
        source = lake.table(share.source).current_snapshot()
        result.source_snapshot = source.snapshot_id if source else None
        whole = share_sql.over(spark, shared, lake.table(share.source).read_at(result.source_snapshot))
        if source_held:
            result.mode, result.reason = "held", f"its source {share.source} is on hold (dsr release)"
        elif exists:  # decided before the take-out, which is a commit of ours
            result.reason = _full_refresh_reason(lake, datamap, name, whole, result.source_snapshot)
            result.mode = "full" if result.reason else "incremental"
        else:
            result.mode = "created"
        if exists and prove and (subjects.any_excluded or subjects.any_returning):
            _take_out(lake, datamap, name, subjects, result)
        if not source_held:
            _refresh(lake, datamap, name, shared, whole, subjects, result)
        if prove or result.rows_removed:
            began = time.perf_counter()
            result.purge = purge.purge_table(lake, datamap, purge_settings, name)
            result.purge.seconds = round(time.perf_counter() - began, 3)
        if prove and subjects.any_excluded:
            began = time.perf_counter()
            key_type = spark.table(table).schema[share.key].dataType
            result.verification = verify.verify_table(lake, key_file, name, share.groups,
                                                      {share.key: key_type}, subjects.excluded, subjects.keys)
            result.verification.seconds = round(time.perf_counter() - began, 3)
            result.verification.details["method"] = METHOD
        current = lake.table(name).current_snapshot()
        result.snapshot_id = current.snapshot_id if current else None
        if not source_held:
            _record(lake, datamap, name, result)
    except Exception as exc:  # the share's requests stay open with the reason; the next run starts over
        result.error = first_line(exc, with_type=True)
    result.seconds = round(time.perf_counter() - start, 3)
    return result


def _take_out(lake: Lake, datamap: DataMap, name: str, subjects: _Subjects, result: ShareRefresh) -> None:
    """One DELETE of the share's rows of excluded and returning subjects (a copy-on-write commit that
    rewrites only the files holding them); none when the share holds none of them."""
    spark = lake.spark
    key = datamap.shares[name].key
    named = _named(spark, spark.table(lake.quoted(name)), key, subjects.leaving, subjects)
    result.removed = _per_request(named)
    if not result.removed:
        return
    view = f"dsr_share_{uuid.uuid4().hex[:12]}"
    handle = lake.table(name)
    before = handle.current_snapshot()
    named.select("dsr_value").distinct().createOrReplaceTempView(view)
    try:  # the values travel as a view; the SQL text holds names only
        lake.with_conflict_retries(f"share {name}: taking rows out", lambda: spark.sql(
            f"DELETE FROM {lake.quoted(name)} WHERE `{key}` IN (SELECT dsr_value FROM {view})"))
    finally:
        spark.catalog.dropTempView(view)
    stats = _own(handle, before).stats
    # copy-on-write: the files holding the rows went (rows removed), rewritten without them (rows added)
    result.rows_removed = (stats.rows_removed or 0) - (stats.rows_added or 0)
    result.data_files_rewritten = stats.files_removed
    result.bytes_rewritten = stats.bytes_removed


def _refresh(lake: Lake, datamap: DataMap, name: str, shared: Query, whole: DataFrame,
             subjects: _Subjects, result: ShareRefresh) -> None:
    """Create the share, recompute it whole, or append what is new (`result.mode`), leaving out the
    excluded subjects; `whole`: the share's rows computed from the source at `result.source_snapshot`."""
    spark = lake.spark
    share = datamap.shares[name]
    at = result.source_snapshot
    back = _named(spark, whole, share.key, subjects.returning, subjects) if subjects.any_returning else None
    if back is not None:
        result.added = _per_request(back)
    excluded = subjects.excluded if subjects.any_excluded else None
    if result.mode != "incremental":
        rows = _without(spark, whole, share.key, excluded, subjects)
        before = lake.table(name).current_snapshot() if spark.catalog.tableExists(lake.quoted(name)) else None
        lake.replace_own_table(name, rows)
        _count_added(lake.table(name), before, result)
        return
    parts = []
    previous = _previous_source(lake.table(name))
    if previous != at:
        # incremental: both snapshots are known (_full_refresh_reason), or both None and equal
        appended = share_sql.over(spark, shared, lake.table(share.source).read_appends(
                                                                      cast(int, previous), cast(int, at)))
        leaving = subjects.leaving if subjects.any_excluded or subjects.any_returning else None
        parts.append(_without(spark, appended, share.key, leaving, subjects))
    if back is not None and result.added:  # the returning subjects' rows, whole
        parts.append(_without(spark, _rows_of(whole, share.key, back, "left_semi"), share.key, excluded, subjects))
    if not parts:
        result.mode = "unchanged"
        return
    rows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    if rows.isEmpty():  # no commit for nothing
        result.mode = "unchanged"
        return
    before = lake.table(name).current_snapshot()
    rows.writeTo(lake.quoted(name)).append()
    _count_added(lake.table(name), before, result)


def _own(table: TableHandle, before: Snapshot | None) -> Snapshot:
    """Our commit since `before` (an append too), not merely the newest: a concurrent writer's may be."""
    return cast(Snapshot, table.own_commit_since(before.snapshot_id if before else None, appends=True))


def _count_added(table: TableHandle, before: Snapshot | None, result: ShareRefresh) -> None:
    stats = _own(table, before).stats
    result.rows_added = stats.rows_added or 0
    result.data_files_added = stats.files_added


def _digest(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def _previous_source(table: TableHandle) -> int | None:
    value = table.properties().get(SOURCE_SNAPSHOT, "none")
    return None if value == "none" else int(value)


def _full_refresh_reason(lake: Lake, datamap: DataMap, name: str, whole: DataFrame, at: int | None
                         ) -> str | None:
    """Why appending what the source's appends added since the last refresh would not give the exact
    share (None: it would). Metadata and plan inspection only."""
    share = datamap.shares[name]
    props = lake.table(name).properties()
    if SQL_DIGEST not in props:
        return "no refresh recorded"
    if props[SQL_DIGEST] != _digest(share.sql):
        return "its sql changed"
    current = lake.table(name).current_snapshot()
    if props.get(SHARE_SNAPSHOT) != str(current.snapshot_id if current else None):
        return "the share changed after its last refresh (an interrupted run, or another writer)"
    row_wise = share_sql.full_refresh_reason(whole)
    if row_wise:
        return row_wise
    previous = _previous_source(lake.table(name))
    if previous is None or at is None:
        return None if previous == at else "the source had no snapshot at the last refresh, or has none now"
    commits = lake.table(share.source).commits_since(previous, at)
    if commits is None:
        return (f"source snapshot {previous}, the last one refreshed from, is no longer in its history "
                "(expired by a purge, or rolled back)")
    other = sorted({c.operation for c in commits} - {"append", "replace"})
    return f"the source had {', '.join(other)} commits since the last refresh" if other else None


def _record(lake: Lake, datamap: DataMap, name: str, result: ShareRefresh) -> None:
    """Record in the share's properties the source snapshot it now reflects, its own snapshot (a later
    commit by anyone voids the record) and its sql's digest. A metadata commit: no new snapshot."""
    props = {SOURCE_SNAPSHOT: "none" if result.source_snapshot is None else str(result.source_snapshot),
             SHARE_SNAPSHOT: str(result.snapshot_id), SQL_DIGEST: _digest(datamap.shares[name].sql)}
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())  # digits, hex and names only
    lake.spark.sql(f"ALTER TABLE {lake.quoted(name)} SET TBLPROPERTIES ({pairs})")


def _entry(result: ShareRefresh, request_id: str, action: str) -> dict:
    """A share's part of a request's evidence (the shape of an erased table's entry)."""
    rows = result.added if action == "include" else result.removed
    entry = {"action": action, "rows": rows.get(request_id, 0), "snapshot_id": result.snapshot_id,
             "refresh": result.mode,
             **purge.evidence(result.purge, result.data_files_rewritten, result.bytes_rewritten)}
    if result.verification is not None:  # no collateral check: a share is ours to recompute
        entry.update(result.verification.evidence(request_id, collateral=False))
    return entry


def _reasons(result: ShareRefresh, request_id: str) -> list[str]:
    if result.error:
        return [f"share {result.share}: {result.error}"]
    return result.verification.failing.get(request_id, []) if result.verification else []


def _with_shares(outcome: Outcome, results: dict[str, ShareRefresh]) -> Outcome:
    """An erase request's outcome with its share evidence added: failed when a share still holds its
    subject (a new Outcome: the erase stage's is left as it was)."""
    reasons = [r for result in results.values() for r in _reasons(result, outcome.request_id)]
    tables = {**outcome.evidence.get("tables", {}),
              **{n: _entry(r, outcome.request_id, "delete") for n, r in results.items()}}
    evidence = {**outcome.evidence, "tables": tables}
    if not reasons:
        return replace(outcome, evidence=evidence)
    return replace(outcome, status="failed", purge_by=None, evidence=evidence,
                   reason="; ".join([*([outcome.reason] if outcome.reason else []), *reasons]))


def _outcomes(requests: Mapping[str, dict], overridden: dict[str, str], outcomes: list[Outcome], erasing: set[str],
              results: dict[str, ShareRefresh], run_id: str) -> list[Outcome]:
    """`outcomes` with each erase request's share evidence (failed when a share still holds its
    subject), then one outcome per consent request: an opt_out completes when every share is proven
    without its subject, an opt_in when every share was refreshed; a request a newer one of the same
    subject overrode in this batch completes saying so."""
    verified_at = datetime.now(UTC).isoformat()
    done = [_with_shares(o, results) if o.request_id in erasing else o for o in outcomes]
    for rid, r in sorted(requests.items()):
        evidence: dict = {"run_id": run_id, "verified_at": verified_at}
        if rid in overridden:
            done.append(Outcome(rid, "completed", None, {**evidence, "overridden_by": overridden[rid]}))
            continue
        action = "exclude" if r["request_type"] == "opt_out" else "include"
        reasons = [reason for result in results.values() for reason in _reasons(result, rid)]
        if action == "include":
            reasons += [f"share {n}: not refreshed ({x.reason})" for n, x in results.items() if x.mode == "held"]
        evidence["tables"] = {n: _entry(x, rid, action) for n, x in results.items()}
        evidence["rows"] = sum(e["rows"] for e in evidence["tables"].values())
        done.append(Outcome(rid, "failed" if reasons else "completed", "; ".join(reasons) or None, evidence))
    return done
