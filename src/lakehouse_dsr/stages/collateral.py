"""Collateral check: an erasure may change the requested subjects' rows and nothing else.

Every row gets two hashes of all its columns (xxhash64 and murmur3, each column followed by its
null flag, so a NULL cannot pass for a shifted value). A set of rows is summarised by its count,
the exact sum of the first hashes and the XOR of the second: a fingerprint that ignores row order
and file layout (a rewrite does not change it) and adds up across parts.

Before the erase commit, the plan's own scan (erase.plan, one read of the pre-erase snapshot)
also fingerprints the rows NOT belonging to requested subjects (and, for redacting tables, what
the requested rows must become). After it, one scan of the erase snapshot fingerprints the same.
Rows other writers appended in between are fingerprinted from their own commits (incremental
reads) and added to the expectation, so a concurrent append never passes for damage. Cost: the
plan's scan reads every column instead of the key alone, plus one full scan of the erase snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from ..config import Settings
from ..lake import iceberg

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


def _has_map(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, ArrayType):
        return _has_map(data_type.elementType)
    if isinstance(data_type, StructType):
        return any(_has_map(f.dataType) for f in data_type.fields)
    return False


def _hash_inputs(df: DataFrame, nulled: frozenset[str]) -> list[Column]:
    inputs = []
    for f in df.schema.fields:
        col = F.lit(None).cast(f.dataType) if f.name in nulled else F.col(f"`{f.name}`")
        if _has_map(f.dataType):  # Spark cannot hash maps
            col = F.to_json(F.struct(col))
        inputs += [col, col.isNull()]
    return inputs


def row_hashes(df: DataFrame, prefix: str, nulled: frozenset[str] = frozenset()) -> list[Column]:
    """The two per-row hashes, as columns `<prefix>h1` and `<prefix>h2` (`nulled` columns as NULL)."""
    inputs = _hash_inputs(df, nulled)
    return [F.xxhash64(*inputs).cast("decimal(20,0)").alias(f"{prefix}h1"), F.hash(*inputs).alias(f"{prefix}h2")]


def aggregates(prefix: str, where: Column) -> list[Column]:
    """Fingerprint aggregates (`<prefix>rows`, `<prefix>sum`, `<prefix>xor`) over the rows where `where` holds."""
    return [F.sum(F.when(where, 1).otherwise(0)).alias(f"{prefix}rows"),
            F.sum(F.when(where, F.col(f"{prefix}h1"))).alias(f"{prefix}sum"),
            F.bit_xor(F.when(where, F.col(f"{prefix}h2"))).alias(f"{prefix}xor")]


def group_aggregates(nulled: frozenset[str] | None) -> list[Column]:
    """Per-group fingerprint parts over columns made by `row_hashes` ("o_" always, "r_" when
    `nulled` is given for a redacting table): summed and XORed again by `from_groups`."""
    prefixes = ["o_", *(["r_"] if nulled else [])]
    return [agg for p in prefixes for agg in (F.sum(f"{p}h1").alias(f"{p}sum"), F.bit_xor(f"{p}h2").alias(f"{p}xor"))]


def part(group, prefix: str) -> Fingerprint:
    """The fingerprint of one collected group (`count` and `group_aggregates` with `prefix`)."""
    return Fingerprint(int(group["count"]), int(group[f"{prefix}sum"] or 0), int(group[f"{prefix}xor"] or 0))


def pick(row, prefix: str) -> Fingerprint:
    return Fingerprint(int(row[f"{prefix}rows"] or 0), int(row[f"{prefix}sum"] or 0), int(row[f"{prefix}xor"] or 0))


def split(rows: DataFrame, key: str, hits: DataFrame, nulled: frozenset[str]) -> tuple[Fingerprint, Fingerprint]:
    """(rows not requested, requested rows as the erasure must leave them) for `rows`. One scan.

    `hits` holds the distinct requested key values (column `key_value`); requested rows become nothing
    (`nulled` empty: delete) or themselves with `nulled` columns set to NULL (redact).
    """
    marked = _mark(rows, key, hits)
    hashed = marked.select(_HIT, *row_hashes(marked.drop(_HIT), "o_"),
                           *(row_hashes(marked.drop(_HIT), "r_", nulled) if nulled else []))
    other = F.col(_HIT).isNull()
    totals = hashed.agg(*aggregates("o_", other), *(aggregates("r_", ~other) if nulled else [])).first()
    return pick(totals, "o_"), pick(totals, "r_") if nulled else Fingerprint()


def _mark(rows: DataFrame, key: str, hits: DataFrame) -> DataFrame:
    """`rows` plus a `dsr_hit` column: true where the key is a requested value, NULL elsewhere."""
    flags = hits.select(F.col("key_value").alias("dsr_hit_key"), F.lit(True).alias(_HIT))
    return (rows.join(F.broadcast(flags), rows[f"`{key}`"] == flags.dsr_hit_key, "left").drop("dsr_hit_key"))


@dataclass
class CollateralResult:
    ok: bool
    conclusive: bool = True
    detail: str | None = None


def check(spark: SparkSession, settings: Settings, table: str, key: str, hits: DataFrame, nulled: frozenset[str],
          snapshot_before: int | None, erase_snapshot: int, other_before: Fingerprint,
          requested_after: Fingerprint) -> tuple[CollateralResult, DataFrame | None]:
    """Compare the erase snapshot with what the plan's snapshot allows (see the module doc); also
    returns the erase snapshot's key values (`by_value`) when it was read, for the live verification.

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
                                                 key, hits, nulled)
            expected = expected + added_other
            late_redacted.append(added_requested)
        parent = commit.snapshot_id
    values = by_value(iceberg.read_at(spark, settings, table, erase_snapshot), key)
    flags = hits.select(F.col("key_value").alias("dsr_value"), F.lit(True).alias(_HIT))
    kept = values.join(F.broadcast(flags), "dsr_value", "left").where(F.col(_HIT).isNull())
    after = pick(kept.agg(F.sum("count").alias("o_rows"), F.sum("o_sum").alias("o_sum"),
                          F.bit_xor("o_xor").alias("o_xor")).first(), "o_")
    candidates = [expected + requested_after]
    for extra in late_redacted if nulled else []:
        candidates.append(candidates[-1] + extra)
    if after in candidates:
        return CollateralResult(True), values
    return CollateralResult(False, True, f"rows not requested changed: expected {candidates[0].describe()}, "
                                         f"found {after.describe()} at snapshot {erase_snapshot}"), values


def by_value(rows: DataFrame, key: str) -> DataFrame:
    """(dsr_value, count, o_sum, o_xor): `rows` grouped by key value, with each group's fingerprint
    parts; the live verification of the same snapshot reads its values from here. Kept (local
    checkpoint): one small row per distinct key value."""
    return (rows.select(F.col(f"`{key}`").alias("dsr_value"), *row_hashes(rows, "o_"))
            .groupBy("dsr_value").agg(F.count(F.lit(1)).alias("count"), *group_aggregates(None))
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
