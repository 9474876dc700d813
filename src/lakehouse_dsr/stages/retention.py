"""Retention as code: the data map's `expire:` rules enforced with the purge and proof of erasure.

A rule is past for a row when the row's clock (a date or timestamp column) is before the rule's
cutoff, the run's date less the rule's period, at 00:00 UTC (`ExpiryRule.cutoff`). A clock of the
subject (`clock: {table, column}`) is the latest value of that column among the subject's rows in
another keyed table, joined on the key both hold: an IN subquery in the statements (a MERGE with
the subjects past the cutoff where the format's DML refuses a subquery: open-source Delta), a left join
(`framed`) in the report's aggregates; NULL (or no row) there: never past. Per table: one
commit per rule with something past (`DELETE ... WHERE clock < cutoff`, or `UPDATE ... SET c = NULL`
for the rows past whose listed columns are not all NULL yet), deletes first so no row is redacted
and then deleted; then the purge of erasure (stages/purge.py: files with deletes rewritten,
snapshots before the clean one expired, orphans removed), then the proof: no row past any rule in
live data (a count with the rule's predicate), in the files retained snapshots reference, or in
any file under the table's location.

Branches and tags (issue 28): each ref's snapshot is read with the rules' predicates; a ref pinning
no row past a rule is left alone. Those pinning some are settled by `purge.pinned_refs`, as erasure
settles refs pinning erased rows (stages/refs.py, with `_PastRows` for what no ref may keep):
`block` expires nothing in the table and names the refs (the pass fails, as an erase request stays
open); `drop` drops such tags; `rewrite` re-points them to a cleaned copy of their snapshot; under
both a branch is expired in place (its files holding rows past rewritten, copy-on-write), never
dropped. The purge then expires the old snapshots, and the proof reads every retained file.

The cutoff is a literal in the SQL text (a date, never an identifier). On a table partitioned by
the clock (`days(ts)`, `months(ts)` ...) a cutoff on a partition boundary makes Iceberg drop whole
data files from metadata (its DELETE needs no rewrite when every row of a file matches): cost
follows what expires. Tables under a legal hold are skipped and reported. While a subject is under
a legal hold, a table whose rows past a rule hold that subject (their subject-key values hashed and
matched with the holds' keyed hashes) is skipped whole and reported, as is a table no key of which
is the subject identifier (a held person cannot be told apart there): nothing a hold keeps expires.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from functools import partial
from typing import Any, cast

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, TimestampNTZType

from ..config import PurgeSettings
from ..datamap.model import DataMap, ExpiryRule, column_ref
from ..exceptions import DataMapError
from ..inventory.check import field_at, schema_of
from ..lake import indriver, skipping
from ..lake.lakehouse import Lake
from ..lake.table import Ref, Snapshot, TableHandle, same_file
from ..ledger.holds import ActiveHolds
from ..ledger.journal import Step
from ..ledger.ledger import Ledger
from . import collateral, purge, refs, resurrection, verify
from .retention_models import (
    RefExpiry,
    RefOutcome,
    RetentionPass,
    RetentionStatus,
    RuleExpiry,
    RuleStatus,
    SnapshotHolding,
    TableExpiry,
    TableStatus,
)


@dataclass(frozen=True)
class _Rule:
    """A rule with its SQL predicates for one table and day."""

    rule: ExpiryRule
    cutoff: date
    past: str  # rows past the rule (redact: and not redacted yet), over the table or files with its columns
    clock: str  # the row's clock over `framed` rows
    framed_past: str  # `past` over `framed` rows (no subquery: usable in aggregates)
    subjects: str | None = None  # clock of the subject: SELECT dsr_subject, dsr_clock (one row per subject)
    key: str | None = None  # ... and the table's key column it joins on
    gone: str | None = None  # ... and its subjects past the cutoff: SELECT dsr_subject

    @classmethod
    def of(cls, rule: ExpiryRule, clock_type: DataType, today: date, index: int = 0,
           subject_keys: tuple[str, str] | None = None, clock_table: str | None = None) -> _Rule:
        """`subject_keys` (the table's key column, the clock table's) and `clock_table` (qualified):
        for a clock of the subject."""
        cutoff = rule.cutoff(today)
        literal = (f"DATE '{cutoff.isoformat()}'" if isinstance(clock_type, DateType)
                   else f"TIMESTAMP_NTZ '{cutoff.isoformat()} 00:00:00'" if isinstance(clock_type, TimestampNTZType)
                   else f"TIMESTAMP '{cutoff.isoformat()} 00:00:00Z'")  # an instant: independent of the session zone
        redacted = f" AND {_not_redacted(rule)}" if rule.redact else ""
        of = rule.subject_clock
        if of is None:
            clock = column_ref(cast(str, rule.clock))
            return cls(rule, cutoff, f"{clock} < {literal}{redacted}", clock, f"{clock} < {literal}{redacted}")
        assert subject_keys is not None and clock_table is not None
        key, their_key = (column_ref(k) for k in subject_keys)
        column = column_ref(of.column)
        # a subject's clock: their latest value, none when one of their rows has none (never past)
        subjects = (f"SELECT {their_key} AS dsr_subject, CASE WHEN count({column}) = count(*) THEN max({column}) END "
                    f"AS dsr_clock FROM {clock_table} WHERE {their_key} IS NOT NULL GROUP BY {their_key}")
        clock = f"`dsr_clock{index}`"
        gone = f"SELECT dsr_subject FROM ({subjects}) WHERE dsr_clock < {literal}"
        return cls(rule, cutoff, f"{key} IN ({gone}){redacted}", clock, f"{clock} < {literal}{redacted}", subjects,
                   subject_keys[0], gone)

    def statement(self, subquery_dml: bool = True) -> str:
        """The DML for table `{t}`: one commit. A clock of the subject is an IN subquery, or where the
        format's DELETE and UPDATE refuse one (`subquery_dml` false: open-source Delta), a MERGE of the
        table with its subjects past the cutoff (one row per subject: no target row matched twice)."""
        if self.subjects is not None and not subquery_dml:
            assert self.key is not None
            redacted = f" AND {_not_redacted(self.rule)}" if self.rule.redact else ""
            action = "DELETE" if self.rule.delete else "UPDATE SET " + ", ".join(
                f"{column_ref(c)} = NULL" for c in self.rule.redact)
            return (f"MERGE INTO {{t}} AS dsr_target USING ({self.gone}) AS dsr_past "
                    f"ON dsr_target.{column_ref(self.key)} = dsr_past.dsr_subject WHEN MATCHED{redacted} THEN {action}")
        if self.rule.delete:
            return f"DELETE FROM {{t}} WHERE {self.past}"
        return "UPDATE {t} SET " + ", ".join(f"{column_ref(c)} = NULL" for c in self.rule.redact) + \
            f" WHERE {self.past}"

    @property
    def columns(self) -> list[str]:
        """The table's columns the rule reads: its clock (or the key a clock of the subject joins on)
        and its redacted columns."""
        return [self.key or cast(str, self.rule.clock), *self.rule.redact]


def _not_redacted(rule: ExpiryRule) -> str:
    """Rows a redact rule has yet to redact: one of its columns is not NULL."""
    return "(" + " OR ".join(f"{column_ref(c)} IS NOT NULL" for c in rule.redact) + ")"


def framed(spark: SparkSession, rows: DataFrame, rules: list[_Rule]) -> DataFrame:
    """`rows` (the table's, or read from its files) with each clock of the subject joined on as
    `dsr_clock<i>` (a left join with one row per subject: no row added or lost), so every rule's
    `framed_past` and `clock` are plain expressions. The join runs in Spark: no key value reaches
    the driver or the SQL text."""
    for i, r in enumerate(rules):
        if r.subjects is not None and r.key is not None:
            subjects = spark.sql(r.subjects).select(F.col("dsr_subject").alias(f"dsr_subject{i}"),
                                                    F.col("dsr_clock").alias(f"dsr_clock{i}"))
            rows = rows.join(subjects, F.col(column_ref(r.key)) == F.col(f"dsr_subject{i}"), "left")
    return rows


@dataclass
class _PastRows:
    """Rows past a table's rules as no branch or tag may keep them (refs.Unwanted): a snapshot pins
    some when a rule's predicate (on the clock of the row, or of the subject as it is now) matches
    one of its rows. Counts are kept per snapshot id, so the purge's check of a ref this pass has
    counted reads nothing again."""

    rules: list[_Rule]
    counts: dict[int, int] = field(default_factory=dict)

    def rows_past(self, table: TableHandle, snapshot_id: int) -> int:
        """Rows of the snapshot past a rule. Cost: one scan of the rules' columns of the snapshot (once)."""
        if snapshot_id not in self.counts:
            self.counts[snapshot_id] = table.read_at(snapshot_id).where(
                " OR ".join(f"({r.past})" for r in self.rules)).count()
        return self.counts[snapshot_id]

    def pinned(self, table: TableHandle, datamap: DataMap, snapshot_id: int) -> refs.Cleaning | None:
        handle, spark = table, table.spark
        if not self.rows_past(handle, snapshot_id):
            return None
        groups = tuple(datamap.mapping(table.name).groups)
        past = F.expr(" OR ".join(f"({r.framed_past})" for r in self.rules))
        # No key value to prune on: every data file of the snapshot is a candidate (the ref's rows are read).
        return refs.Cleaning(
            candidates=lambda sid: skipping.plan(handle, sid, groups, tuple(None for _ in groups)),
            unwanted=lambda rows: framed(spark, rows, self.rules).where(past),
            cleaned=lambda content: expired(spark, content, self.rules))


def expired(spark: SparkSession, content: DataFrame, rules: list[_Rule]) -> DataFrame:
    """`content` (a table's rows) as the rules leave them: rows past a delete rule removed, the
    columns of a redact rule NULL in rows past it (struct fields inside their struct), every other
    value as it was; the table's columns only. What the rules' statements commit on main, as rows
    for a copy-on-write rewrite of a branch's files (refs.rewrite_on_branch)."""
    rows = framed(spark, content, rules)
    redactions: dict[str, list[Callable[[Column], Column]]] = {}
    for r in rules:  # deletes first, as on main
        past = F.coalesce(F.expr(r.framed_past), F.lit(False))
        if r.rule.delete:
            rows = rows.where(~past)
        for column in r.rule.redact:
            redactions.setdefault(column, []).append(partial(_null_where, past))
    return rows.select(*[collateral.erased_value(f, redactions).alias(f.name) for f in content.schema.fields])


def _null_where(past: Column, value: Column) -> Column:
    return F.when(past, F.lit(None)).otherwise(value)


def selected(datamap: DataMap, tables: list[str] | None) -> dict[str, list[ExpiryRule]]:
    """The tables with rules, `tables` only when given (DataMapError naming one that has none)."""
    expiring = datamap.expiring
    unknown = [t for t in tables or [] if t not in expiring]
    if unknown:
        raise DataMapError(f"--table: {', '.join(unknown)} has no 'expire' rules in the data map "
                           f"(tables with rules: {', '.join(sorted(expiring)) or 'none'})")
    return {t: rules for t, rules in expiring.items() if not tables or t in tables}


def _rules(lake: Lake, datamap: DataMap, table: str, rules: list[ExpiryRule], today: date
           ) -> list[_Rule]:
    """The table's rules with their predicates, deletes first (the data-map check has typed the clocks)."""
    spark = lake.spark
    ordered = sorted(rules, key=lambda r: not r.delete)  # indexes of `framed` columns follow this order
    schema = spark.table(lake.quoted(table)).schema
    built = []
    for i, r in enumerate(ordered):
        of = r.subject_clock
        if of is None:
            built.append(_Rule.of(r, field_at(schema, cast(str, r.clock)).dataType, today))
        else:
            clock_type = field_at(spark.table(lake.quoted(of.table)).schema, of.column).dataType
            built.append(_Rule.of(r, clock_type, today, i, datamap.subject_clock_keys(table, of),
                                  lake.quoted(of.table)))
    return built


def enforce(lake: Lake, datamap: DataMap, purge_settings: PurgeSettings, ledger: Ledger, holds: ActiveHolds,
            today: date, run_id: str, dry_run: bool = False, tables: list[str] | None = None,
            paused: dict[str, str] | None = None) -> RetentionPass:
    """Expire what is past each rule of the selected tables (default: all with rules), purge and
    prove. Call after `check_against_catalog` (a clock it refuses changes nothing). Cost per table:
    one count per rule (a scan of the clock and redacted columns, pruned by partitions and file
    bounds), and one per snapshot a branch or tag points at (none without refs); for each rule with
    rows past, one DELETE (metadata only when whole files expire) or UPDATE (rewrites, or marks, the
    files holding rows past); for each ref pinning rows past (not under block), a read and a write of
    its files holding them (a dropped tag: one metadata commit); then the purge (see purge_table) and
    the proof: one count per rule and per rewritten ref, and when old files or delete files remain
    after the purge, one scan of those columns in the retained files and one in every file under the
    location.
    `paused`: other tables to skip -> why (a collateral hold keeps its pre-erase snapshots)."""
    chosen = selected(datamap, tables)
    skipped = {t: h.why for t in chosen if (h := holds.table(t)) is not None}
    skipped.update({t: why for t, why in (paused or {}).items() if t in chosen})
    built = {t: _rules(lake, datamap, t, rules, today) for t, rules in chosen.items() if t not in skipped}
    skipped.update({t: why for t, rules in built.items()
                    if (why := _held_subjects_past(lake, datamap, t, rules, holds)) is not None})
    results = {t: _table(lake, datamap, purge_settings, ledger, t, rules, run_id, dry_run)
               for t, rules in built.items() if t not in skipped}
    return RetentionPass(run_id=run_id, dry_run=dry_run, today=today.isoformat(), tables=results, skipped=skipped,
                         subject_holds=sum(1 for h in holds.holds if h.kind == "subject"),
                         passed=all(r.passed for r in results.values()))


def _held_subjects_past(lake: Lake, datamap: DataMap, table: str, rules: list[_Rule], holds: ActiveHolds
                        ) -> str | None:
    """Why `table` must not expire anything while subject holds are active (None: it may). Cost, only
    with a subject hold active: one scan of the subject key columns of the rows past a rule (of the
    current snapshot and of each branch's and tag's), each distinct value hashed once per key the
    holds were made with."""
    spark = lake.spark
    handle = lake.table(table)
    held = [h for h in holds.holds if h.kind == "subject"]
    if not held:
        return None
    subject = datamap.subject
    groups = [g for g in datamap.mapping(table).groups if g.identifier == subject]
    if not groups:
        keys = ", ".join(g.identifier for g in datamap.mapping(table).groups)
        return (f"not expired while a subject is under a legal hold: its keys ({keys}) cannot be matched with a "
                f"held {subject}")
    where = " OR ".join(f"({r.past})" for r in rules)
    # main's rows past a rule, and each branch's and tag's: a ref cleaned of them would lose a held person's
    snapshots = sorted({ref.snapshot_id for ref in handle.refs()})
    values = verify.key_values(spark.table(lake.quoted(table)).where(where), groups)
    for snapshot_id in snapshots:
        values = values.unionByName(verify.key_values(
            handle.read_at(snapshot_id).where(where), groups))
    hashes = indriver.local_rows(spark, [(h.hold_id, subject, h.subject_hash, h.key_id) for h in held],
                                 verify.HASHES)
    found = verify.find_hashed(spark, values, hashes, holds.keys)
    return "; ".join(h.why for h in held if found.get(h.hold_id)) or None


def _table(lake: Lake, datamap: DataMap, purge_settings: PurgeSettings, ledger: Ledger, table: str,
           rules: list[_Rule], run_id: str, dry_run: bool) -> TableExpiry:
    spark = lake.spark
    handle = lake.table(table)
    name = lake.quoted(table)
    start = handle.current_snapshot()
    unwanted = _PastRows(rules)
    # Each branch and tag, by the rows past a rule its snapshot holds (a temporary branch an interrupted
    # tag rewrite left is not counted: the purge removes it).
    pinning = {ref: unwanted.rows_past(handle, ref.snapshot_id)
               for ref in handle.refs() if not ref.name.startswith(refs.TEMPORARY)}
    if purge_settings.pinned_refs == "block" and any(pinning.values()):
        return _blocked(spark, name, rules, pinning, dry_run)
    done: list[RuleExpiry] = []
    for r in rules:
        began = time.perf_counter()
        past = spark.table(name).where(r.past).count()
        fields: dict[str, Any] = {"rule": r.rule.describe(), "cutoff": r.cutoff.isoformat(), "rows_past": past}
        if past and not dry_run:
            before = handle.current_snapshot()
            # the same predicate again after a conflict: safe to repeat
            statement = r.statement(handle.capabilities.subquery_dml).format(t=name)
            lake.with_conflict_retries(f"{table}: {r.rule.describe()}", partial(spark.sql, statement))
            commit = handle.own_commit_since(before.snapshot_id if before else None)
            if commit is not None:
                fields.update(snapshot_id=commit.snapshot_id, data_files_deleted=commit.stats.files_removed,
                              data_files_added=commit.stats.files_added,
                              delete_files_added=commit.stats.delete_files_added)
                fields["metadata_only"] = (fields["data_files_deleted"] > 0 and not fields["data_files_added"]
                                           and not fields["delete_files_added"])
        done.append(RuleExpiry(**fields, seconds=round(time.perf_counter() - began, 3)))
    if dry_run:
        return TableExpiry(rules=done, refs={refs.label(ref): RefExpiry(
            rows_past=n, outcome=_would(purge_settings, ref, n), snapshot_id=ref.snapshot_id)
            for ref, n in pinning.items()}, passed=True)
    committed = any(d.snapshot_id is not None for d in done)
    # A ref pinning rows past a rule is cleaned by the purge even when main had none left to expire.
    purged = purge.purge_table(lake, datamap, purge_settings, table,
                               line_from=start.snapshot_id if start else None,
                               erased=unwanted) if committed or any(pinning.values()) else None
    if purged is not None and start is not None and purged.own_line:
        _keep_checkpoint(handle, ledger, start.snapshot_id, run_id)
    left = _rows_past(spark, name, rules)
    done = [d.model_copy(update={"rows_left": n}) for d, n in zip(done, left, strict=True)]
    settled = _settled(lake, table, unwanted, pinning, purged)
    refs_clean = all(not e.rows_left and (e.outcome != "kept" or not e.rows_past) for e in settled.values())
    if purged is None:
        return TableExpiry(rules=done, refs=settled, passed=not any(left) and refs_clean)
    history, storage, one_scan = _physical(handle, rules, sum(left))
    return TableExpiry(rules=done, refs=settled, purge=purged.as_dict(), history=history, storage=storage,
                       one_scan=one_scan, passed=not any(left) and not history and not storage and refs_clean)


def _rows_past(spark: SparkSession, name: str, rules: list[_Rule]) -> list[int]:
    """Live rows past each rule: one aggregate scan for all of them (a count per rule was a scan each)."""
    counts = [F.count_if(F.expr(r.framed_past)).alias(f"past{i}") for i, r in enumerate(rules)]
    row = framed(spark, spark.table(name), rules).agg(*counts).first()
    assert row is not None  # an aggregate without grouping: one row
    return [int(row[f"past{i}"]) for i in range(len(rules))]


def _blocked(spark: SparkSession, name: str, rules: list[_Rule], pinning: dict[Ref, int], dry_run: bool
             ) -> TableExpiry:
    """`pinned_refs: block` and refs pinning rows past a rule: nothing is committed (expiring main
    alone would leave those rows in the refs' files, and the proof failing); the refs are named and
    the pass fails, as an erase request stays open under block. Cost: one aggregate scan."""
    counts = _rows_past(spark, name, rules)
    holding = ", ".join(f"{refs.label(ref)} ({n} row(s))" for ref, n in pinning.items() if n)
    why = (f"not expired: {holding} pin rows past a rule and purge.pinned_refs is block (drop or rewrite cleans "
           f"them: a tag is dropped or re-pointed to a cleaned copy, a branch is expired in place)")
    return TableExpiry(
        rules=[RuleExpiry(rule=r.rule.describe(), cutoff=r.cutoff.isoformat(), rows_past=n,
                          rows_left=None if dry_run else n) for r, n in zip(rules, counts, strict=True)],
        refs={refs.label(ref): RefExpiry(rows_past=n, outcome="blocked" if n else "clean", snapshot_id=ref.snapshot_id)
              for ref, n in pinning.items()},
        blocked=why, passed=dry_run)


def _would(purge_settings: PurgeSettings, ref: Ref, rows_past: int) -> RefOutcome:
    """What a pass under the current `pinned_refs` does with a ref pinning `rows_past` rows (not block)."""
    if not rows_past:
        return "clean"
    return "dropped" if ref.kind == "TAG" and purge_settings.pinned_refs == "drop" else "rewritten"


def _settled(lake: Lake, table: str, unwanted: _PastRows, pinning: dict[Ref, int],
             purged: purge.TablePurge | None) -> dict[str, RefExpiry]:
    """Each ref counted before the pass, by what the purge did with it (refs.settle), and the rows past
    a rule its snapshot holds afterwards when it was rewritten (the proof; one count each)."""
    done: dict[str, RefOutcome] = {}
    if purged is not None:
        settled: list[tuple[RefOutcome, list[str]]] = [("kept", purged.refs_kept), ("clean", purged.refs_clean),
                                                        ("dropped", purged.refs_dropped),
                                                        ("rewritten", purged.refs_rewritten)]
        for outcome, labels in settled:
            done.update(dict.fromkeys(labels, outcome))
    now = {refs.label(ref): ref for ref in lake.table(table).refs()}
    out = {}
    for ref, n in pinning.items():
        label = refs.label(ref)
        outcome = done.get(label, "kept" if n else "clean")
        if outcome == "kept" and not n:
            outcome = "clean"  # counted clean before the pass (the purge keeps refs unchecked under block)
        after = now.get(label)
        left = (unwanted.rows_past(lake.table(table), after.snapshot_id)
                if after is not None and outcome == "rewritten" else None)
        out[label] = RefExpiry(rows_past=n, outcome=outcome, snapshot_id=after.snapshot_id if after else None,
                               rows_left=left)
    return out


def _physical(table: TableHandle, rules: list[_Rule], live: int) -> tuple[int, int, bool]:
    """(rows past a rule in the retained files, in every data file on storage, one scan): read
    straight from the Parquet files (deleted rows included), unless the purge left exactly the live
    files and no delete file, where the live count stands for both."""
    spark = table.spark
    if table.history_is_live():
        return live, live, True
    schema = spark.table(table.quoted).schema
    columns = schema_of({c: field_at(schema, c).dataType for r in rules for c in r.columns})
    past = F.expr(" OR ".join(f"({r.past})" for r in rules))

    def count(rows: DataFrame) -> int:
        return rows.where(past).count()

    paths, _ = table.retained_files()
    stored = table.data_files_on_storage()
    history = count(table.read_raw(paths, columns)) if paths else 0
    return history, count(table.read_raw(stored, columns)) if stored else 0, False


def _keep_checkpoint(table: TableHandle, ledger: Ledger, start_id: int, run_id: str) -> None:
    """The resurrection check's checkpoint, moved past retention's own commits: the purge's expiry
    removed the checked snapshot, and without this the next run would read the whole table again.
    Only when the table was checked at the snapshot retention started from; the checked sequence
    number stays, so files retention rewrote are read again (they hold only checked rows)."""
    checked = resurrection.checkpoints(ledger.journal.steps()).get(table.name)
    current = table.current_snapshot()
    if checked is not None and checked.snapshot_id == start_id and current is not None:
        ledger.journal.record([Step(run_id, table.name, resurrection.CHECKED, current.snapshot_id,
                                    {"sequence": checked.sequence})])


def status(lake: Lake, datamap: DataMap, holds: ActiveHolds, today: date,
           tables: list[str] | None = None) -> RetentionStatus:
    """Per table and rule: the oldest row, the rows and bytes past it, the oldest retained snapshot
    still holding rows past it, when more rows pass it and what clears them. Cost per table: one
    aggregate scan of the clock (or subject key) and redacted columns of live data, grouped by data
    file and joined with the data files' sizes (metadata); unless the table's history is its live
    files alone (as a purge leaves it), one scan of those columns in every file retained snapshots
    reference, read raw (deleted rows included), and the manifests of retained snapshots, oldest
    first, until each rule's oldest is found."""
    out = {}
    for table, rules in selected(datamap, tables).items():
        built = _rules(lake, datamap, table, rules, today)
        live = _live_status(lake, table, built)
        holding = _oldest_holding(lake, table, built, [past for _, past, _, _ in live])
        hold = holds.table(table)
        snapshots = lake.table(table).history()
        oldest_ms = min((s.committed_ms for s in snapshots), default=None)
        statuses = []
        for r, (oldest, past, nxt, size), held in zip(built, live, holding, strict=True):
            statuses.append(RuleStatus(
                rule=r.rule.describe(), cutoff=r.cutoff.isoformat(), oldest=oldest, rows_past=past,
                bytes_past_estimate=size, oldest_snapshot_holding=held,
                next_crossing=r.rule.crossing(nxt).isoformat() if nxt is not None else None,
                cleared_by=(hold.why if hold else "the next dsr run (or dsr expire)") if past else "nothing past"))
        out[table] = TableStatus(
            rules=statuses, held=hold.why if hold else None, snapshots=len(snapshots),
            oldest_snapshot_at=_at(oldest_ms) if oldest_ms is not None else None)
    return RetentionStatus(today=today.isoformat(), tables=out,
                           subject_holds=sum(1 for h in holds.holds if h.kind == "subject"),
                           kept_longer=datamap.kept_longer_than_sources())


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _live_status(lake: Lake, table: str, rules: list[_Rule]
                 ) -> list[tuple[str | None, int, date | None, int]]:
    """Per rule (oldest clock as text, rows past, first clock day not past, bytes past): one scan of
    live data grouped by data file, joined with the data files' sizes and row counts (metadata).
    Bytes past: each data file's size times its share of rows past (rows past / rows in the file,
    deleted rows included): exact for a file wholly past, an estimate for one straddling the rule."""
    spark = lake.spark
    name = lake.quoted(table)
    file = F.regexp_replace(F.input_file_name(), "^file:/+", "/")  # one spelling, as same_file's
    rows = framed(spark, spark.table(name).select(file.alias("dsr_file"), "*"), rules)
    per_file = []
    for i, r in enumerate(rules):
        clock, past = F.expr(r.clock), F.expr(r.framed_past)
        per_file += [F.min(clock).alias(f"oldest{i}"), F.count_if(past).alias(f"past{i}"),
                     F.min(F.to_date(F.when(~past | past.isNull(), clock))).alias(f"next{i}")]
    files = lake.table(table).file_sizes()
    grouped = rows.groupBy("dsr_file").agg(*per_file).join(files, F.col("dsr_file") == F.col("dsr_path"), "left")
    totals = []
    for i in range(len(rules)):
        share = F.when(F.col("dsr_rows") > 0, F.col("dsr_bytes") * F.col(f"past{i}") / F.col("dsr_rows"))
        # rendered by Spark in the session's zone (UTC), days included: no zone conversion in Python
        totals += [F.min(f"oldest{i}").cast("string").alias(f"oldest{i}"),
                   F.coalesce(F.sum(f"past{i}"), F.lit(0)).alias(f"past{i}"), F.min(f"next{i}").alias(f"next{i}"),
                   F.coalesce(F.round(F.sum(share)), F.lit(0)).cast("long").alias(f"bytes{i}")]
    row = grouped.agg(*totals).first()
    assert row is not None  # an aggregate without grouping: one row
    return [(row[f"oldest{i}"], int(row[f"past{i}"]), row[f"next{i}"], int(row[f"bytes{i}"]))
            for i in range(len(rules))]


def _oldest_holding(lake: Lake, table: str, rules: list[_Rule], live_past: list[int]
                    ) -> list[SnapshotHolding | None]:
    """Per rule, the oldest retained snapshot referencing a data file that holds a row past the rule
    (read raw: a row deleted only by a delete file is still held), with the refs pointing at it;
    None: no retained snapshot holds one. When history is the live files alone and no delete file
    (as a purge leaves it), the live count answers: the current snapshot holds them, or none does."""
    spark = lake.spark
    handle = lake.table(table)
    current = handle.current_snapshot()
    refs = [*handle.refs(),
            *([Ref("main", "BRANCH", current.snapshot_id)] if current is not None else [])]
    snapshots = sorted(handle.history(), key=lambda s: (s.committed_ms, s.snapshot_id))

    def holding(snapshot: Snapshot) -> SnapshotHolding:
        return SnapshotHolding(snapshot_id=snapshot.snapshot_id, committed_at=_at(snapshot.committed_ms),
                               refs=sorted(r.name for r in refs if r.snapshot_id == snapshot.snapshot_id))

    if not snapshots:
        return [None for _ in rules]
    if handle.history_is_live():
        return [holding(current) if past and current is not None else None for past in live_past]
    paths, _ = handle.retained_files()
    paths = [p for p in paths if p.endswith(".parquet")]  # data and position-delete files (the latter: no column)
    if not paths:
        return [None for _ in rules]
    schema = spark.table(lake.quoted(table)).schema
    columns = schema_of({c: field_at(schema, c).dataType for r in rules for c in r.columns})
    raw = handle.read_raw(paths, columns).select(
        F.input_file_name().alias("dsr_file"), *[F.col(f"`{c}`") for c in columns.fieldNames()])
    counts = [F.count_if(F.expr(r.framed_past)).alias(f"past{i}") for i, r in enumerate(rules)]
    found = framed(spark, raw, rules).groupBy("dsr_file").agg(*counts) \
        .where(" OR ".join(f"past{i} > 0" for i in range(len(rules)))).collect()  # file paths and counts only
    held = [{same_file(f.dsr_file) for f in found if f[f"past{i}"]} for i in range(len(rules))]
    oldest: list[SnapshotHolding | None] = [None for _ in rules]
    for snapshot in snapshots:
        if all(o is not None or not h for o, h in zip(oldest, held, strict=True)):
            break
        files = {same_file(p) for p in handle.files_at(snapshot.snapshot_id)}
        oldest = [o if o is not None or not (h & files) else holding(snapshot)
                  for o, h in zip(oldest, held, strict=True)]
    return oldest
