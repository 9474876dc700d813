"""Collateral check: an erasure may change the requested subjects' rows and nothing else.

Every row gets two hashes of all its columns (xxhash64 and murmur3, each column followed by its
null flag, so a NULL cannot pass for a shifted value). A set of rows is summarised by its count,
the exact sum of the first hashes and the XOR of the second: a fingerprint that ignores row order
and file layout (a rewrite does not change it) and adds up across parts.

Before the erase commit, the plan's own scan (erase.plan, one read of the pre-erase snapshot)
also fingerprints the rows NOT belonging to requested subjects (and, for redacting tables, what
the requested rows must become: each key group's columns NULL where its own key was requested, the
other person's columns in a shared row as they were). After it, one scan of the erase snapshot fingerprints the same.
Rows other writers appended in between are fingerprinted from their own commits (incremental
reads) and added to the expectation, so a concurrent append never passes for damage. Cost: the
plan's scan reads every column instead of the key alone, plus one full scan of the erase snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StructField, StructType

from ..config import Settings
from ..datamap import KeyGroup, column_ref
from ..lake import iceberg
from . import matching
from .matching import Redaction, TableKeys

_HIT = "dsr_hit"


@dataclass(frozen=True)
class Fingerprint:
    rows: int = 0
    hash_sum: int = 0
    hash_xor: int = 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, self.hash_sum + other.hash_sum, self.hash_xor ^ other.hash_xor)

    def describe(self) -> str:
        return f"{self.rows} rows, hash {self.hash_sum & (2**64 - 1):016x}/{self.hash_xor & (2**32 - 1):08x}"


def erased_value(f: StructField, redactions: dict[str, list[Redaction]]) -> Column:
    """Column `f` as the erasure must leave it (`matching.redactions`; a struct path changes one field
    inside the struct)."""
    col = F.col(f"`{f.name}`")
    for path, changes in redactions.items():
        head, _, rest = path.partition(".")
        if head != f.name:
            continue
        value = col if not rest else F.col(column_ref(path))
        for change in changes:
            value = change(value)
        col = value if not rest else col.withField(rest, value)
    return col


def row_hashes(schema: StructType, prefix: str, redactions: dict[str, list[Redaction]] | None = None
               ) -> list[Column]:
    """The two per-row hashes over the columns of `schema` (the table's: columns a join added are
    left out), as `<prefix>h1` and `<prefix>h2`, of each row as `redactions` leave it."""
    inputs = []
    for f in schema.fields:
        col = erased_value(f, redactions or {})
        if iceberg.type_holds(f.dataType, MapType):  # Spark cannot hash maps
            col = F.to_json(F.struct(col))
        inputs += [col, col.isNull()]
    return [F.xxhash64(*inputs).cast("decimal(20,0)").alias(f"{prefix}h1"), F.hash(*inputs).alias(f"{prefix}h2")]


def aggregates(prefix: str, where: Column) -> list[Column]:
    """Fingerprint aggregates (`<prefix>rows`, `<prefix>sum`, `<prefix>xor`) over the rows where `where` holds."""
    return [F.sum(F.when(where, 1).otherwise(0)).alias(f"{prefix}rows"),
            F.sum(F.when(where, F.col(f"{prefix}h1"))).alias(f"{prefix}sum"),
            F.bit_xor(F.when(where, F.col(f"{prefix}h2"))).alias(f"{prefix}xor")]


def group_aggregates(redacting: bool) -> list[Column]:
    """Per-group fingerprint parts over columns made by `row_hashes` ("o_" always, "r_" for a
    redacting table): summed and XORed again by `part`."""
    prefixes = ["o_", *(["r_"] if redacting else [])]
    return [agg for p in prefixes for agg in (F.sum(f"{p}h1").alias(f"{p}sum"), F.bit_xor(f"{p}h2").alias(f"{p}xor"))]


def part(group, prefix: str) -> Fingerprint:
    """The fingerprint of one collected group (`count` and `group_aggregates` with `prefix`)."""
    return Fingerprint(int(group["count"]), int(group[f"{prefix}sum"] or 0), int(group[f"{prefix}xor"] or 0))


def pick(row, prefix: str) -> Fingerprint:
    return Fingerprint(int(row[f"{prefix}rows"] or 0), int(row[f"{prefix}sum"] or 0), int(row[f"{prefix}xor"] or 0))


def split(rows: DataFrame, table_keys: TableKeys) -> tuple[Fingerprint, Fingerprint]:
    """(rows not requested, requested rows as the erasure must leave them) for `rows`. One scan.

    Requested rows become nothing (a deleting table) or themselves with each hit key group's
    redacted columns set to NULL (a redacting table).
    """
    redactions = matching.redactions(table_keys)
    marked = matching.mark(rows, table_keys)
    hashed = marked.select(matching.any_hit(table_keys).alias(_HIT), *row_hashes(rows.schema, "o_"),
                           *(row_hashes(rows.schema, "r_", redactions) if redactions else []))
    requested = F.col(_HIT)
    totals = hashed.agg(*aggregates("o_", ~requested), *(aggregates("r_", requested) if redactions else [])).first()
    return pick(totals, "o_"), pick(totals, "r_") if redactions else Fingerprint()


@dataclass
class CollateralResult:
    ok: bool
    conclusive: bool = True
    detail: str | None = None


def check(spark: SparkSession, settings: Settings, table: str, table_keys: TableKeys,
          snapshot_before: int | None, erase_snapshot: int, other_before: Fingerprint,
          requested_after: Fingerprint) -> tuple[CollateralResult, DataFrame | None]:
    """Compare the erase snapshot with what the plan's snapshot allows (see the module doc); also
    returns the erase snapshot's key values (`by_keys`) when it was read, for the live verification.

    Redacting tables: requested rows become NULL-keyed rows, indistinguishable from other rows, so
    they are expected among them; with concurrent appends of requested rows the erase may have
    seen some of those commits, so every prefix of them is a valid expectation.
    """
    between = iceberg.commits_between(spark, settings, table, snapshot_before, erase_snapshot)
    if between is None or any(c.operation not in ("append", "replace") for c in between):
        ops = sorted({c.operation for c in between or []} - {"append", "replace"})
        return CollateralResult(False, False, "cannot prove: the table changed by other than appends while it was "
                                f"erased ({', '.join(ops) or 'history rewritten'}); nothing purged, retried next run"
                                ), None
    expected, late_redacted = other_before, []
    parent = snapshot_before
    for commit in between:
        if commit.operation == "append":
            added_other, added_requested = split(iceberg.read_appended(spark, settings, table, commit, parent),
                                                 table_keys)
            expected = expected + added_other
            late_redacted.append(added_requested)
        parent = commit.snapshot_id
    values = by_keys(iceberg.read_at(spark, settings, table, erase_snapshot), table_keys.groups)
    kept = matching.mark(values, table_keys, [F.col(key_column(i)) for i in range(len(table_keys.groups))]) \
        .where(~matching.any_hit(table_keys))
    after = pick(kept.agg(F.sum("count").alias("o_rows"), F.sum("o_sum").alias("o_sum"),
                          F.bit_xor("o_xor").alias("o_xor")).first(), "o_")
    candidates = [expected + requested_after]
    for extra in late_redacted if settings.datamap.mapping(table).action == "redact" else []:
        candidates.append(candidates[-1] + extra)
    if after in candidates:
        return CollateralResult(True), values
    return CollateralResult(False, True, f"rows not requested changed: expected {candidates[0].describe()}, "
                                         f"found {after.describe()} at snapshot {erase_snapshot}"), values


def key_column(index: int) -> str:
    """The column of `by_keys` holding key group `index`'s values."""
    return f"dsr_k{index}"


def by_keys(rows: DataFrame, groups: Sequence[KeyGroup]) -> DataFrame:
    """(dsr_k0, dsr_k1, ..., count, o_sum, o_xor): `rows` grouped by their key columns' values, with
    each group's fingerprint parts; the live verification of the same snapshot reads its values from
    here (verify.grouped_at_commit). Kept (local checkpoint): one small row per distinct combination of keys."""
    keys = [F.col(column_ref(g.column)).alias(key_column(i)) for i, g in enumerate(groups)]
    return (rows.select(*keys, *row_hashes(rows.schema, "o_"))
            .groupBy(*[key_column(i) for i in range(len(keys))])
            .agg(F.count(F.lit(1)).alias("count"), *group_aggregates(False))
            .localCheckpoint())


def check_counts(spark: SparkSession, settings: Settings, table: str, snapshot_before: int | None,
                 erase_snapshot: int, expected_rows: int, rows_after: int) -> CollateralResult:
    """The cheap check (`erase.collateral_check: count`): rows after the commit, from its metadata.

    Counts cannot tell which writer added a row, so other commits in between make it inconclusive.
    """
    if iceberg.commits_between(spark, settings, table, snapshot_before, erase_snapshot) != []:
        return CollateralResult(False, False, "cannot prove by counts: other writers committed while it was "
                                              "erased; nothing purged, retried next run")
    if rows_after != expected_rows:
        return CollateralResult(False, True, f"{rows_after} rows after the erase commit, expected {expected_rows}")
    return CollateralResult(True)
