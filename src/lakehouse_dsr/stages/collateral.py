"""Collateral check: an erasure may change the requested subjects' rows and nothing else.

Every row gets a hash of all its columns (xxhash64, the columns followed by a mask of which are
NULL, so a NULL cannot pass for a shifted value). A set of rows is summarised by its count and the
exact sum of its hashes: a fingerprint that ignores row order and file layout and adds up across
parts. (A second hash XORed over the rows cost the 10M-row rewrite 1.2 s for protection against
collisions of a 64-bit hash that accidental damage does not need.)

After the erase commit, only what it changed is read: its own manifests say which data files it
removed (copy-on-write rewrites), added, and attached deletes to (merge-on-read). Every other file
is the same immutable file with the same deletes, so its rows are unchanged by construction. A
touched file that data skipping says holds no requested key is damage at once. In files that got
deletes, the rows not requested are counted before and after (key columns only): a data file never
changes, so equal counts mean the same rows. "Before" needs no read of a deletion's files that had
no deletes: their manifests count their rows, and the plan's scan counted the requested ones. The
rewritten files' rows not requested, plus the requested rows as the erasure must leave them
(nothing, or each key group's columns NULL where its own key was requested), must be exactly the
added files' rows not requested (fingerprints). Other writers' commits between the plan and the
erase commit must be appends, else the check is inconclusive and nothing is purged; the commit's
files are read as its parent snapshot held them, so rows appended meanwhile are accounted for
wherever the erase met them.

A small rewrite (lake/indriver.py) is fingerprinted in the driver instead, by the same rules with
a hash of its own (murmur3_128 of every value): both sides are read back from storage, and the
rows are marked by the check's keys, not the rewrite's.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import cast

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StructField, StructType

from ..config import EraseSettings
from ..datamap import DataMap, column_ref
from ..lake import indriver, skipping
from ..lake.batching import collect_union, map_in_threads
from ..lake.hashsum import HashSum, hash_sum
from ..lake.lakehouse import Lake
from ..lake.table import CommitFiles, TableHandle, type_holds
from . import matching
from .matching import Redaction, TableKeys

_HIT, _SIDE, _TABLE = "dsr_hit", "dsr_side", "dsr_table"
_BITS_64 = 2**64 - 1
_MASK_BITS = 63  # the NULL flags one bigint of row_hash holds


@dataclass(frozen=True)
class Fingerprint:
    rows: int = 0
    hash_sum: int = 0
    hash_xor: int = 0  # the driver's fingerprint only (the second half of its murmur3_128); Spark's is 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, self.hash_sum + other.hash_sum, self.hash_xor ^ other.hash_xor)

    def describe(self) -> str:
        return f"{self.rows} rows, hash {self.hash_sum & (2**64 - 1):016x}/{self.hash_xor & (2**64 - 1):016x}"


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


def erased_rows(content: DataFrame, keys: TableKeys, action: str) -> DataFrame:
    """Rows as the erasure leaves them: without the requested rows, or with their groups nulled."""
    marked = matching.mark(content, keys, requests=False)
    if action == "delete":
        return marked.where(~matching.any_hit(keys)).select(*[F.col(f"`{c}`") for c in content.columns])
    redactions = matching.redactions(keys)
    return marked.select(*[erased_value(f, redactions).alias(f.name) for f in content.schema.fields])


def row_hash(schema: StructType, redactions: dict[str, list[Redaction]] | None = None) -> Column:
    """The per-row hash over the columns of `schema` (the table's: columns a join added are left
    out), of each row as `redactions` leave it: the values, then which of them are NULL as a bitmask
    (xxhash64 skips a NULL, so without it a NULL could pass for a shifted value). One bigint per 63
    columns: a flag per column hashed seven more inputs a row on the events table, about 0.25 s per
    10M-row scan."""
    values = []
    for f in schema.fields:
        col = erased_value(f, redactions or {})
        if type_holds(f.dataType, MapType):  # Spark cannot hash maps
            col = F.to_json(F.struct(col))
        values.append(col)
    masks = [reduce(operator.add, (F.when(col.isNull(), F.lit(1 << bit)).otherwise(F.lit(0))
                                   for bit, col in enumerate(values[start:start + _MASK_BITS])))
             for start in range(0, len(values), _MASK_BITS)]
    return F.xxhash64(*values, *[mask.cast("bigint") for mask in masks])


def row_hashes(schema: StructType, prefix: str, redactions: dict[str, list[Redaction]] | None = None
               ) -> list[Column]:
    """`row_hash` as `<prefix>h1`."""
    return [row_hash(schema, redactions).alias(f"{prefix}h1")]


def aggregates(prefix: str, where: Column, source: str | None = None) -> list[Column]:
    """Fingerprint aggregates (`<prefix>rows`, `<prefix>sum_hi`, `<prefix>sum_lo`) over the rows where
    `where` holds, of the hashes `row_hashes` made with prefix `source` (default: `prefix`)."""
    source = source or prefix
    h1 = F.col(f"{source}h1")
    # The exact sum of 64-bit hashes, as two sums of longs that cannot overflow below 2^31 rows: of
    # the high 32 bits (signed) and of the low 32 (unsigned). A decimal sum boxed every row.
    return [F.sum(F.when(where, 1).otherwise(0)).alias(f"{prefix}rows"),
            F.sum(F.when(where, F.shiftright(h1, 32))).alias(f"{prefix}sum_hi"),
            F.sum(F.when(where, h1.bitwiseAND(0xFFFFFFFF))).alias(f"{prefix}sum_lo")]


def pick(row, prefix: str) -> Fingerprint:
    hash_sum = (int(row[f"{prefix}sum_hi"] or 0) << 32) + int(row[f"{prefix}sum_lo"] or 0)
    return Fingerprint(int(row[f"{prefix}rows"] or 0), hash_sum)


@dataclass(frozen=True)
class Split:
    """Fingerprints of a check's two sides: the rows before (`other`: not requested; `redacted`: the
    requested rows as the erasure must leave them) and the rows after that no request names (`found`),
    with how many rows after a request still names (`requested_after`)."""

    other: Fingerprint = Fingerprint()
    redacted: Fingerprint = Fingerprint()
    found: Fingerprint = Fingerprint()
    requested_after: int = 0


def split(rows: DataFrame | None, table_keys: TableKeys, after: DataFrame | None = None) -> Split:
    """The Split of `rows` (before) and `after`: one job over both.

    Requested rows become nothing (a deleting table) or themselves with each hit key group's
    redacted columns set to NULL (a redacting table).
    """
    return _split_many({"": (rows, after, table_keys)}, 1)[""]


def _split_many(parts: dict[str, tuple[DataFrame | None, DataFrame | None, TableKeys]], jobs_at_once: int
                ) -> dict[str, Split]:
    """`split` of several tables' (rows, after, keys) in a few Spark jobs over unions of their hashes."""
    # Aggregates only for the sides some part has: when the rewrite observed the old files, the
    # check reads the new ones alone (each aggregate costs every row it sees).
    with_before = any(rows is not None for rows, _, _ in parts.values())
    with_redacted = any(rows is not None and matching.redactions(keys) for rows, _, keys in parts.values())
    frames = []
    for name, (rows, after, table_keys) in parts.items():
        redactions = matching.redactions(table_keys)
        for side, frame in ((0, rows), (1, after)):
            if frame is None:
                continue
            redacted = (row_hashes(frame.schema, "r_", redactions) if redactions else
                        [F.lit(None).cast("bigint").alias("r_h1")]) if with_redacted else []
            frames.append(matching.mark(frame, table_keys, requests=False).select(
                F.lit(name).alias(_TABLE), F.lit(side).alias(_SIDE), matching.any_hit(table_keys).alias(_HIT),
                *row_hashes(frame.schema, "o_"), *redacted))
    out = {name: Split() for name in parts}
    if not frames:
        return out
    before, requested = F.col(_SIDE) == 0, F.col(_HIT)
    per_table = lambda hashed: hashed.groupBy(_TABLE).agg(  # noqa: E731
        *(aggregates("o_", before & ~requested) if with_before else []),
        *(aggregates("r_", before & requested) if with_redacted else []),
        *aggregates("a_", ~before & ~requested, source="o_"),
        F.sum(F.when(~before & requested, 1).otherwise(0)).alias("requested_after"))
    for totals in collect_union(frames, per_table, jobs_at_once):
        name = totals[_TABLE]
        redacting = bool(matching.redactions(parts[name][2]))
        out[name] = Split(pick(totals, "o_") if with_before else Fingerprint(),
                          pick(totals, "r_") if redacting and with_redacted else Fingerprint(), pick(totals, "a_"),
                          int(totals["requested_after"] or 0))
    return out


@dataclass(frozen=True)
class Observed:
    """What the rows an erase commit rewrote held, fingerprinted by the check's own keys while the
    rewrite read them (lake/hashsum.py, on the same scan): spares the check reading the
    removed files again."""

    files: frozenset[str]  # the files read and replaced
    other: Fingerprint  # their rows not requested
    redacted: Fingerprint  # their requested rows as the erasure must leave them


@dataclass(frozen=True)
class Sums:
    """The fingerprints a check collects while another action reads rows (lake/hashsum.py): of the rows
    no request names (`other`), and of the requested ones (`requested`: as the erasure must leave them
    on a redacting table's "before" side, else counted only)."""

    other: HashSum
    requested: HashSum
    redacted: bool = False

    @property
    def rows(self) -> int:
        return self.other.rows + self.requested.rows

    @staticmethod
    def fingerprint(sums: HashSum) -> Fingerprint:
        return Fingerprint(sums.rows, sums.total)


def observe(rows: DataFrame, table_keys: TableKeys) -> tuple[DataFrame, Sums]:
    """`rows` unchanged, with the fingerprints of `split` added up by Spark while they are read
    (`observed` turns them into an Observed once the action has run). The check marks rows by its
    own keys, in a test of its own (`matching.mark` without request ids: a table lookup, or a join
    for array keys): a statement that matched the wrong rows cannot hide it. Cost over the read:
    that test and one hash per row (two for a redacting table's requested rows)."""
    redactions = matching.redactions(table_keys)
    return _summing(rows, table_keys, row_hash(rows.schema, redactions) if redactions else None)


def _summing(rows: DataFrame, table_keys: TableKeys, requested_hash: Column | None) -> tuple[DataFrame, Sums]:
    """`rows` unchanged, each row marked by `table_keys` and added to a Sums as it is read: its hash
    (`row_hashes`) if no request names it, else `requested_hash` (None: counted only)."""
    spark = rows.sparkSession
    sums = Sums(hash_sum(spark), hash_sum(spark), redacted=requested_hash is not None)
    requested = sums.requested.adding(F.lit(0) if requested_hash is None else requested_hash)
    summed = matching.mark(rows, table_keys, requests=False).where(
        F.when(matching.any_hit(table_keys), requested).otherwise(sums.other.adding(row_hash(rows.schema))))
    return summed.select(*[F.col(f"`{c}`") for c in rows.columns]), sums


def observed(sums: Sums, files: list[str]) -> Observed:
    """What `observe` added up over `files`, once the action that read them has run (a write: each
    task counted once)."""
    return Observed(frozenset(files), Sums.fingerprint(sums.other),
                    Sums.fingerprint(sums.requested) if sums.redacted else Fingerprint())


@dataclass
class CollateralResult:
    ok: bool
    conclusive: bool = True
    detail: str | None = None
    # Files the check read whole at the erase commit (its added files; files it attached deletes to,
    # with those deletes) and found no requested row in: while the table's current snapshot descends
    # from the commit, the live verification need not read them again (runner/proof.py passes them on).
    clean_files: frozenset[str] = frozenset()

    def as_dict(self) -> dict:
        return {"ok": self.ok, "conclusive": self.conclusive, "detail": self.detail,
                "clean_files": len(self.clean_files)}


@dataclass(frozen=True)
class Commit:
    """An erase commit to check: its table, the batch's keys there, the plan's snapshot, the commit,
    what a rewrite observed of the rows it read, and the rows the plan found requested in each file
    it read (`planned`: files absent held none; None when unknown)."""

    table: str
    keys: TableKeys
    snapshot_before: int | None
    snapshot_id: int
    seen: Observed | None = None
    planned: Planned | None = None


@dataclass(frozen=True)
class Planned:
    """What the plan's scan counted: the files it read, and the rows the batch's keys name in each
    (files absent: none)."""

    files: frozenset[str]
    requested: dict[str, int]

    def others(self, before: skipping.Candidates, files: frozenset[str]) -> int | None:
        """The rows no requested key names in `files` as `before` holds them, without a read: their
        rows from metadata less the plan's requested rows. None when a file has deletes (its rows
        are not in metadata) or the plan did not read it."""
        rows = before.rows_of(files) if files <= self.files else None
        return None if rows is None else rows - sum(self.requested.get(f, 0) for f in files)


def check(lake: Lake, datamap: DataMap, erase: EraseSettings, table: str, table_keys: TableKeys,
          snapshot_before: int | None, erase_snapshot: int, seen: Observed | None = None) -> CollateralResult:
    """Prove that the erase commit changed only the requested subjects' rows (see the module doc).

    Only the files the commit changed are read; the others are unchanged by construction, and its
    own manifests say which (commit_files). Cost: for data files that got deletes (merge-on-read),
    their key columns before and after the commit (rows not requested counted on both sides; a
    redacting table also hashes the requested rows before; a deletion's "before" side is not read
    where `check_many`'s commit carries the plan's counts, `Commit.planned`); for data files it rewrote
    (copy-on-write), every column of the old files before and of the new files after, hashed;
    the old files' fingerprints come from `seen` when the rewrite observed exactly those files.
    """
    return check_many(lake, datamap, erase, [Commit(table, table_keys, snapshot_before, erase_snapshot, seen)],
                      parallel_tables=1)[table]


def check_many(lake: Lake, datamap: DataMap, erase: EraseSettings, commits: list[Commit], *, parallel_tables: int
               ) -> dict[str, CollateralResult]:
    """`check` for several tables' erase commits, with the rewritten and added files of all of them
    fingerprinted in a few Spark jobs (lake/batching.py): on a wide lake of small tables, a job per
    table would cost more than the reading. `parallel_tables` (`run.parallel_tables`): commits
    prepared, and fingerprints collected, at once."""
    decided, pending = prepare_many(lake, datamap, erase, commits, parallel_tables=parallel_tables)
    return {**decided, **conclude_many(pending, {}, parallel_tables=parallel_tables)}


@dataclass(frozen=True)
class Pending:
    """A commit whose check is left to fingerprints: what they read (prepare_many)."""

    commit: Commit
    reads: _Reads

    @property
    def after_shareable(self) -> bool:
        """Whether only the commit's new files are left to read (the rewrite observed the old ones):
        another stage's scan of them can carry the check (`observe_after`)."""
        return self.reads.removed is None and self.reads.added is not None

    @property
    def added_files(self) -> frozenset[str]:
        return self.reads.added_files

    @property
    def added_rows(self) -> int | None:
        return self.reads.added_rows

    def observe_after(self) -> tuple[DataFrame, Sums]:
        """The commit's new files' rows (no deletes yet: as the commit holds them), with the check's
        "after" side added up while another stage reads them: one scan serves both. `after_split`
        reads the result once that stage's action has finished. Cost over the read: the check's own
        test of the keys and one hash per row."""
        return _summing(cast(DataFrame, self.reads.added), self.commit.keys, None)


def after_split(sums: Sums, expected_rows: int | None) -> Split | None:
    """The "after" side `Pending.observe_after` added up; None unless it saw each of the new files'
    rows once (`Pending.added_rows`): else the reading stage failed or ran a part twice, and the
    check reads the files itself."""
    if sums.rows != expected_rows:
        return None
    return Split(found=Sums.fingerprint(sums.other), requested_after=sums.requested.rows)


def prepare_many(lake: Lake, datamap: DataMap, erase: EraseSettings, commits: list[Commit], *, parallel_tables: int
                 ) -> tuple[dict[str, CollateralResult], dict[str, Pending]]:
    """Each commit's check as far as metadata and small reads take it: a result already (other
    writers' commits in between, files beyond the keys' reach, rows gone from files that got
    deletes, a small rewrite fingerprinted in the driver), or what its fingerprints must read."""
    results: dict[str, CollateralResult] = {}
    pending: dict[str, Pending] = {}
    prepared_all = map_in_threads(
        lambda commit: _prepare(lake.table(commit.table), datamap.table_mapping(commit.table).action, erase, commit),
        commits, parallel_tables)
    for commit, prepared in zip(commits, prepared_all, strict=True):
        if isinstance(prepared, CollateralResult):
            results[commit.table] = prepared
        else:
            pending[commit.table] = Pending(commit, prepared)
    return results, pending


def conclude_many(pending: dict[str, Pending], after: dict[str, Split], *, parallel_tables: int
                  ) -> dict[str, CollateralResult]:
    """The verdicts of `pending` checks: `after` holds the "after" sides another stage's scan
    observed (`Pending.observe_after`); the rest are fingerprinted here, in a few Spark jobs."""
    results: dict[str, CollateralResult] = {}
    read = {table: p for table, p in pending.items() if table not in after}
    sums = {**_split_many({table: (p.reads.removed, p.reads.added, p.commit.keys) for table, p in read.items()},
                          parallel_tables), **after}
    for table, p in pending.items():
        sides, reads, commit = sums[table], p.reads, p.commit
        expected = (sides.other + sides.redacted if reads.seen is None
                    else reads.seen.other + reads.seen.redacted) + reads.requested_kept
        result = _verdict(commit, expected, sides.found)
        if result.ok:
            result.clean_files = reads.kept_clean | (reads.added_files if not sides.requested_after else frozenset())
        results[table] = result
    return results


def _verdict(commit: Commit, expected: Fingerprint, found: Fingerprint) -> CollateralResult:
    # Sums modulo 2^64: that is all a HashSum (and the driver) keeps; a Spark aggregate's are exact.
    return CollateralResult(True) if _wrapped(found) == _wrapped(expected) else CollateralResult(
        False, True, "rows not requested changed in the files the erase commit rewrote: expected "
                     f"{expected.describe()}, found {found.describe()} at snapshot {commit.snapshot_id}")


def _fingerprinted_in_driver(spark: SparkSession, action: str, erase: EraseSettings, commit: Commit,
                             changed: CommitFiles, before: skipping.Candidates) -> CollateralResult | None:
    """The check of a small rewrite, fingerprinted in the driver (lake/indriver.py): the replaced files
    as the commit's parent held them, the added files as the commit holds them, each read back from
    storage. None when Spark must read them (too large, deletes, nested columns)."""
    keys = commit.keys.key_columns()
    removed = before.subset(spark, set(changed.removed))
    parent_id = changed.parent_id
    if parent_id is None or indriver.refusal(spark, removed, keys, erase.in_driver_max_bytes):
        return None
    delete = action == "delete"
    old = indriver.attempt(f"{commit.table}: the collateral check", lambda: indriver.fingerprint(
        spark, before.jtable, parent_id, changed.removed, keys, delete))
    new = old and indriver.attempt(f"{commit.table}: the collateral check", lambda: indriver.fingerprint(
        spark, before.jtable, commit.snapshot_id, changed.added, keys, delete))
    if old is None or new is None:
        return None
    return _verdict(commit, Fingerprint(*old[0]) + Fingerprint(*old[1]), Fingerprint(*new[0]))


def _wrapped(f: Fingerprint) -> Fingerprint:
    """`f` as 64-bit arithmetic keeps it (its sums wrap around)."""
    return Fingerprint(f.rows, f.hash_sum & _BITS_64, f.hash_xor & _BITS_64)


@dataclass(frozen=True)
class _Reads:
    """What a commit's check reads: the rewritten files' rows (None when the rewrite observed exactly
    those: `seen` stands for them), the added files' rows, and the requested rows of files that got
    deletes as the erasure must leave them (known before any read)."""

    removed: DataFrame | None
    added: DataFrame | None
    added_files: frozenset[str]
    added_rows: int | None  # in the added files (their manifests)
    requested_kept: Fingerprint
    seen: Observed | None
    kept_clean: frozenset[str] = frozenset()  # files that got deletes and hold no requested row after them


def _prepare(handle: TableHandle, action: str, erase: EraseSettings, commit: Commit) -> CollateralResult | _Reads:
    """A commit's check up to its fingerprints: a result already (other writers' commits in between,
    files beyond the keys' reach, rows gone from files that got deletes), or what is left to read."""
    table_keys, erase_snapshot, spark = commit.keys, commit.snapshot_id, handle.spark
    between = handle.commits_between(commit.snapshot_before, erase_snapshot)
    if between is None or any(c.operation not in ("append", "replace") for c in between):
        ops = sorted({c.operation for c in between or []} - {"append", "replace"})
        return CollateralResult(False, False, "cannot prove: the table changed by other than appends while it was "
                                f"erased ({', '.join(ops) or 'history rewritten'}); nothing purged, retried next run")
    changed = handle.commit_files(erase_snapshot)
    before = table_keys.candidates(handle, changed.parent_id)
    beyond = (changed.removed | changed.deleted_from) - set(before.paths())
    if beyond:  # metadata proves those files held no requested key
        return CollateralResult(False, True, f"the erase commit changed {len(beyond)} file(s) that hold no requested "
                                f"key (snapshot {erase_snapshot})")
    kept = changed.deleted_from - changed.removed  # still live, with new deletes
    redacting = action == "redact"
    others_before, requested_kept = _kept_before(before, kept, table_keys, redacting, commit.planned)
    after = table_keys.candidates(handle, erase_snapshot)
    others_after, requested_after = _count_split(skipping.read(after, kept), table_keys)
    if others_before != others_after:
        return CollateralResult(False, True, f"{others_before - others_after} rows not requested were deleted from "
                                f"files the erase commit attached deletes to (snapshot {erase_snapshot})")
    seen = commit.seen if commit.seen is not None and commit.seen.files == changed.removed else None
    if not kept and seen is None and changed.removed:
        in_driver = _fingerprinted_in_driver(spark, action, erase, commit, changed, before)
        if in_driver is not None:
            return in_driver
    removed = skipping.read(before, set(changed.removed)) if seen is None else None
    added = handle.read_raw(sorted(changed.added), spark.table(handle.quoted).schema
                                            ) if changed.added else None  # new files: no deletes yet
    return _Reads(removed, added, changed.added, changed.added_rows, requested_kept, seen,
                  kept if not requested_after else frozenset())


def _kept_before(before: skipping.Candidates, kept: frozenset[str], table_keys: TableKeys, redacting: bool,
                 planned: Planned | None) -> tuple[int, Fingerprint]:
    """(rows not requested, requested rows as redacted) of the files that got deletes, before the
    commit: a redaction on merge-on-read deletes those rows and adds them redacted in new files.
    A deletion's count comes from the plan's own scan where it read those files without deletes
    (no read: the plan found every requested row in them, their manifests count all rows); a
    plan that missed a requested row makes the counts differ (damage reported), never agree."""
    known = planned.others(before, kept) if planned is not None and not redacting and kept else None
    if known is not None:
        return known, Fingerprint()
    rows = skipping.read(before, kept)
    if rows is None:
        return 0, Fingerprint()
    if not redacting:
        return _count_split(rows, table_keys)[0], Fingerprint()
    sides = split(rows, table_keys)
    return sides.other.rows, sides.redacted


def _count_split(rows: DataFrame | None, table_keys: TableKeys) -> tuple[int, int]:
    """(rows no requested key names, rows one does) of `rows`: one job over the key columns."""
    if rows is None:
        return 0, 0
    hit = matching.any_hit(table_keys)
    totals = cast(Row, matching.mark(rows, table_keys, requests=False).agg(  # an aggregate without groups: one row
        F.sum(F.when(hit, 0).otherwise(1)).alias("other"),
        F.sum(F.when(hit, 1).otherwise(0)).alias("requested")).first())
    return int(totals["other"] or 0), int(totals["requested"] or 0)


def check_counts(table: TableHandle, snapshot_before: int | None, erase_snapshot: int, expected_rows: int,
                 rows_after: int) -> CollateralResult:
    """The cheap check (`erase.collateral_check: count`): rows after the commit, from its metadata.

    Counts cannot tell which writer added a row, so other commits in between make it inconclusive.
    """
    if table.commits_between(snapshot_before, erase_snapshot) != []:
        return CollateralResult(False, False, "cannot prove by counts: other writers committed while it was "
                                              "erased; nothing purged, retried next run")
    if rows_after != expected_rows:
        return CollateralResult(False, True, f"{rows_after} rows after the erase commit, expected {expected_rows}")
    return CollateralResult(True)
