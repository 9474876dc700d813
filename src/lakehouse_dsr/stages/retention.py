"""Retention as code: the data map's `expire:` rules enforced with the purge and proof of erasure.

A rule is past for a row when the row's clock (a date or timestamp column) is before the rule's
cutoff, the run's date less the rule's period, at 00:00 UTC (`ExpiryRule.cutoff`). Per table: one
commit per rule with something past (`DELETE ... WHERE clock < cutoff`, or `UPDATE ... SET c = NULL`
for the rows past whose listed columns are not all NULL yet), deletes first so no row is redacted
and then deleted; then the purge of erasure (stages/purge.py: files with deletes rewritten,
snapshots before the clean one expired, orphans removed), then the proof: no row past any rule in
live data (a count with the rule's predicate), in the files retained snapshots reference, or in
any file under the table's location.

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
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, TimestampNTZType

from ..config import Settings
from ..datamap.model import ExpiryRule, column_ref
from ..exceptions import DataMapError
from ..inventory.check import field_at, schema_of
from ..lake import iceberg
from ..ledger.holds import ActiveHolds
from ..ledger.journal import Step
from ..ledger.ledger import Ledger
from . import purge, resurrection, verify
from .retention_models import RetentionPass, RetentionStatus, RuleExpiry, RuleStatus, TableExpiry, TableStatus


@dataclass(frozen=True)
class _Rule:
    """A rule with its SQL predicate for one table and day."""

    rule: ExpiryRule
    cutoff: date
    past: str  # rows past the rule (redact: and not redacted yet)

    @classmethod
    def of(cls, rule: ExpiryRule, clock_type: DataType, today: date) -> _Rule:
        cutoff = rule.cutoff(today)
        literal = (f"DATE '{cutoff.isoformat()}'" if isinstance(clock_type, DateType)
                   else f"TIMESTAMP_NTZ '{cutoff.isoformat()} 00:00:00'" if isinstance(clock_type, TimestampNTZType)
                   else f"TIMESTAMP '{cutoff.isoformat()} 00:00:00Z'")  # an instant: independent of the session zone
        past = f"{column_ref(rule.clock)} < {literal}"
        if rule.redact:
            past += " AND (" + " OR ".join(f"{column_ref(c)} IS NOT NULL" for c in rule.redact) + ")"
        return cls(rule, cutoff, past)

    @property
    def statement(self) -> str:
        """The DML for table `{t}`: one commit."""
        if self.rule.delete:
            return f"DELETE FROM {{t}} WHERE {self.past}"
        return "UPDATE {t} SET " + ", ".join(f"{column_ref(c)} = NULL" for c in self.rule.redact) + \
            f" WHERE {self.past}"


def selected(settings: Settings, tables: list[str] | None) -> dict[str, list[ExpiryRule]]:
    """The tables with rules, `tables` only when given (DataMapError naming one that has none)."""
    expiring = settings.datamap.expiring
    unknown = [t for t in tables or [] if t not in expiring]
    if unknown:
        raise DataMapError(f"--table: {', '.join(unknown)} has no 'expire' rules in the data map "
                           f"(tables with rules: {', '.join(sorted(expiring)) or 'none'})")
    return {t: rules for t, rules in expiring.items() if not tables or t in tables}


def _rules(spark: SparkSession, settings: Settings, table: str, rules: list[ExpiryRule], today: date
           ) -> list[_Rule]:
    """The table's rules with their predicates, deletes first (the data-map check has typed the clocks)."""
    schema = spark.table(settings.table(table)).schema
    built = [_Rule.of(r, field_at(schema, r.clock).dataType, today) for r in rules]
    return sorted(built, key=lambda r: not r.rule.delete)


def enforce(spark: SparkSession, settings: Settings, ledger: Ledger, holds: ActiveHolds, today: date, run_id: str,
            dry_run: bool = False, tables: list[str] | None = None, paused: dict[str, str] | None = None
            ) -> RetentionPass:
    """Expire what is past each rule of the selected tables (default: all with rules), purge and
    prove. Call after `check_against_catalog` (a clock it refuses changes nothing). Cost per table:
    one count per rule (a scan of the clock and redacted columns, pruned by partitions and file
    bounds); for each rule with rows past, one DELETE (metadata only when whole files expire) or
    UPDATE (rewrites, or marks, the files holding rows past); then the purge (see purge_table) and
    the proof: one count per rule, and when old files or delete files remain after the purge, one
    scan of those columns in the retained files and one in every file under the location.
    `paused`: other tables to skip -> why (a collateral hold keeps its pre-erase snapshots)."""
    chosen = selected(settings, tables)
    skipped = {t: h.why for t in chosen if (h := holds.table(t)) is not None}
    skipped.update({t: why for t, why in (paused or {}).items() if t in chosen})
    built = {t: _rules(spark, settings, t, rules, today) for t, rules in chosen.items() if t not in skipped}
    skipped.update({t: why for t, rules in built.items()
                    if (why := _held_subjects_past(spark, settings, t, rules, holds)) is not None})
    results = {t: _table(spark, settings, ledger, t, rules, run_id, dry_run)
               for t, rules in built.items() if t not in skipped}
    return RetentionPass(run_id=run_id, dry_run=dry_run, today=today.isoformat(), tables=results, skipped=skipped,
                         subject_holds=sum(1 for h in holds.holds if h.kind == "subject"),
                         passed=all(r.passed for r in results.values()))


def _held_subjects_past(spark: SparkSession, settings: Settings, table: str, rules: list[_Rule], holds: ActiveHolds
                        ) -> str | None:
    """Why `table` must not expire anything while subject holds are active (None: it may). Cost, only
    with a subject hold active: one scan of the subject key columns of the rows past a rule, each
    distinct value hashed once per key the holds were made with."""
    held = [h for h in holds.holds if h.kind == "subject"]
    if not held:
        return None
    subject = settings.datamap.subject
    groups = [g for g in settings.datamap.mapping(table).groups if g.identifier == subject]
    if not groups:
        keys = ", ".join(g.identifier for g in settings.datamap.mapping(table).groups)
        return (f"not expired while a subject is under a legal hold: its keys ({keys}) cannot be matched with a "
                f"held {subject}")
    past = spark.table(settings.table(table)).where(" OR ".join(f"({r.past})" for r in rules))
    hashes = spark.createDataFrame([(h.hold_id, subject, h.subject_hash, h.key_id) for h in held],
                                   "request_id string, key_type string, key_hash string, key_id string")
    found = verify.find_hashed(spark, verify.key_values(past, groups), hashes, holds.keys)
    return "; ".join(h.why for h in held if found.get(h.hold_id)) or None


def _table(spark: SparkSession, settings: Settings, ledger: Ledger, table: str, rules: list[_Rule], run_id: str,
           dry_run: bool) -> TableExpiry:
    name = settings.table(table)
    start = iceberg.current_snapshot(spark, settings, table)
    done: list[RuleExpiry] = []
    for r in rules:
        began = time.perf_counter()
        past = spark.table(name).where(r.past).count()
        fields: dict[str, Any] = {"rule": r.rule.describe(), "cutoff": r.cutoff.isoformat(), "rows_past": past}
        if past and not dry_run:
            before = iceberg.current_snapshot(spark, settings, table)
            # the same predicate again after a conflict: safe to repeat
            iceberg.with_conflict_retries(settings, f"{table}: {r.rule.describe()}",
                                          partial(spark.sql, r.statement.format(t=name)))
            commit = iceberg.own_commit_since(spark, settings, table, before.snapshot_id if before else None)
            if commit is not None:
                counts = commit.counts()
                fields.update(snapshot_id=commit.snapshot_id, data_files_deleted=counts.get("deleted-data-files", 0),
                              data_files_added=counts.get("added-data-files", 0),
                              delete_files_added=counts.get("added-delete-files", 0))
                fields["metadata_only"] = (fields["data_files_deleted"] > 0 and not fields["data_files_added"]
                                           and not fields["delete_files_added"])
        done.append(RuleExpiry(**fields, seconds=round(time.perf_counter() - began, 3)))
    if dry_run:
        return TableExpiry(rules=done, passed=True)
    committed = any(d.snapshot_id is not None for d in done)
    purged = purge.purge_table(spark, settings, table, line_from=start.snapshot_id if start else None) \
        if committed else None
    if purged is not None and start is not None and purged.own_line:
        _keep_checkpoint(spark, settings, ledger, table, start.snapshot_id, run_id)
    left = [spark.table(name).where(r.past).count() for r in rules]
    done = [d.model_copy(update={"rows_left": n}) for d, n in zip(done, left, strict=True)]
    if purged is None:
        return TableExpiry(rules=done, passed=not any(left))
    history, storage, one_scan = _physical(spark, settings, table, rules, sum(left))
    return TableExpiry(rules=done, purge=purged.as_dict(), history=history, storage=storage, one_scan=one_scan,
                       passed=not any(left) and not history and not storage)


def _physical(spark: SparkSession, settings: Settings, table: str, rules: list[_Rule], live: int
              ) -> tuple[int, int, bool]:
    """(rows past a rule in the retained files, in every file under the location, one scan): read
    straight from the Parquet files (deleted rows included), unless the purge left exactly the live
    files and no delete file, where the live count stands for both."""
    if iceberg.history_is_live(spark, settings, table):
        return live, live, True
    schema = spark.table(settings.table(table)).schema
    columns = schema_of({c: field_at(schema, c).dataType for r in rules for c in [r.rule.clock, *r.rule.redact]})
    past = F.expr(" OR ".join(f"({r.past})" for r in rules))

    def count(rows: DataFrame) -> int:
        return rows.where(past).count()

    paths, _ = iceberg.retained_files(spark, settings, table)
    location = iceberg.table_location(spark, settings, table)
    history = count(iceberg.read_columns_from_files(spark, paths, columns)) if paths else 0
    return history, count(iceberg.read_columns_from_files(spark, location, columns, recursive=True)), False


def _keep_checkpoint(spark: SparkSession, settings: Settings, ledger: Ledger, table: str, start_id: int,
                     run_id: str) -> None:
    """The resurrection check's checkpoint, moved past retention's own commits: the purge's expiry
    removed the checked snapshot, and without this the next run would read the whole table again.
    Only when the table was checked at the snapshot retention started from; the checked sequence
    number stays, so files retention rewrote are read again (they hold only checked rows)."""
    checked = resurrection.checkpoints(ledger.journal.steps()).get(table)
    current = iceberg.current_snapshot(spark, settings, table)
    if checked is not None and checked.snapshot_id == start_id and current is not None:
        ledger.journal.record([Step(run_id, table, resurrection.CHECKED, current.snapshot_id,
                                    {"sequence": checked.sequence})])


def status(spark: SparkSession, settings: Settings, holds: ActiveHolds, today: date,
           tables: list[str] | None = None) -> RetentionStatus:
    """Per table and rule: the oldest row, the rows past it, when more rows pass it and what clears
    them. Cost: one aggregate scan of the clock and redacted columns per table; snapshots from metadata."""
    out = {}
    for table, rules in selected(settings, tables).items():
        built = _rules(spark, settings, table, rules, today)
        aggregates = []
        for i, r in enumerate(built):
            clock = F.col(column_ref(r.rule.clock))
            # rendered by Spark in the session's zone (UTC), days included: no zone conversion in Python
            aggregates += [F.min(clock).cast("string").alias(f"oldest{i}"),
                           F.count_if(F.expr(r.past)).alias(f"past{i}"),
                           F.min(F.to_date(F.when(~F.expr(r.past) | F.expr(r.past).isNull(), clock))).alias(f"next{i}")]
        row = spark.table(settings.table(table)).agg(*aggregates).first()
        assert row is not None  # an aggregate without grouping: one row
        hold = holds.table(table)
        snapshots = iceberg.history(spark, settings, table)
        oldest_ms = min((s.committed_ms for s in snapshots), default=None)
        statuses = []
        for i, r in enumerate(built):
            nxt = row[f"next{i}"]
            past = int(row[f"past{i}"])
            statuses.append(RuleStatus(
                rule=r.rule.describe(), cutoff=r.cutoff.isoformat(), oldest=row[f"oldest{i}"], rows_past=past,
                next_crossing=r.rule.crossing(nxt).isoformat() if nxt is not None else None,
                cleared_by=(hold.why if hold else "the next dsr run (or dsr expire)") if past else "nothing past"))
        out[table] = TableStatus(
            rules=statuses, held=hold.why if hold else None, snapshots=len(snapshots),
            oldest_snapshot_at=datetime.fromtimestamp(oldest_ms / 1000, UTC).isoformat()
            if oldest_ms is not None else None)
    return RetentionStatus(today=today.isoformat(), tables=out,
                           subject_holds=sum(1 for h in holds.holds if h.kind == "subject"),
                           kept_longer=settings.datamap.kept_longer_than_sources())
