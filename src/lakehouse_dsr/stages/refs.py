"""Branches and tags that pin erased rows: which do, and cleaning them without losing anyone else's rows.

A ref keeps its snapshot, and every file that snapshot references, from expiry. For each ref not at
the current snapshot, the purge (purge.py) asks here whether the ref's snapshot holds a row of a
subject being proven erased, by the keyed-hash check the verification makes of refs (verify.py):
a ref holding none is left alone. One that does is settled by `purge.pinned_refs`:

  block    kept; the verification then names it and the request stays open.
  drop     a tag is dropped; a branch is erased in place (below), never dropped: it may hold other
           people's staged rows (write-audit-publish).
  rewrite  a branch is erased in place; a tag is re-pointed to a cleaned copy of its snapshot, so an
           audit keeps its tag name: the same rewrite is committed on a temporary branch created at
           the tag's snapshot, then one metadata commit moves the tag there and removes that branch.

Erased in place: one `overwrite` commit on the branch rewriting the files of its snapshot that hold
erased rows, without those rows (or with their columns nulled, `action: redact`): copy-on-write
whatever the table's write mode, as a delete file would leave the rows in the branch's files. The
old snapshots are then referenced by no ref and expire with the rest of the table's history.

Who no ref may keep is an `Unwanted`: erasure's `ErasedHashes` (rows of erased subjects, found by
keyed hash), or retention's rows past a rule (stages/retention.py). Each tells whether a snapshot
holds such rows and, if so, how its files are cleaned (a `Cleaning`); the policy above and the
rewrite are the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..config import PurgeSettings
from ..datamap import DataMap
from ..inventory.check import KeyTypes
from ..lake import skipping
from ..lake.table import Ref, RefKeeping, TableHandle
from . import collateral, matching, verify
from .matching import TableKeys

# The temporary branch a tag's rewrite commits on is named after the tag with this prefix; one left by
# an interrupted purge is removed by the next (its snapshot is the tag's, cleaned or not).
TEMPORARY = "dsr-rewrite-"

Outcome = Literal["kept", "clean", "dropped", "rewritten"]


@dataclass(frozen=True)
class ErasedHashes:
    """Who no ref may keep: the keyed hashes of every subject the run proves erased (request_id,
    key_type, key_hash, key_id), the keys that made them, and the key columns' types (to cast the
    values found back to them)."""

    hashes: DataFrame
    keys: verify.HashKeys
    key_types: KeyTypes

    def pinned(self, table: TableHandle, datamap: DataMap, snapshot_id: int) -> Cleaning | None:
        """How the snapshot's erased rows are cleaned (None: it holds none). Cost: see pinned_keys."""
        keys = pinned_keys(table, datamap, snapshot_id, self)
        return None if keys is None else key_cleaning(table, datamap.table_mapping(table.name).action, keys)


@dataclass(frozen=True)
class Cleaning:
    """How the files of a snapshot are cleaned of the rows no ref may keep (see rewrite_on_branch):
    `candidates` (snapshot id -> the files that may hold them, planned from metadata), `unwanted`
    (rows of those files, `dsr_file` included -> the rows no ref may keep, a filter) and `cleaned`
    (the rows of a file holding some -> the rows its rewrite keeps, the table's columns only)."""

    candidates: Callable[[int], skipping.Candidates]
    unwanted: Callable[[DataFrame], DataFrame]
    cleaned: Callable[[DataFrame], DataFrame]


class Unwanted(Protocol):
    """Rows no branch or tag may keep (erased subjects', or past a retention rule)."""

    def pinned(self, table: TableHandle, datamap: DataMap, snapshot_id: int) -> Cleaning | None:
        """How the snapshot's unwanted rows in `table` (mapped in `datamap`) are cleaned; None when it
        holds none."""
        ...


def label(ref: Ref) -> str:
    """How the report names a ref: `tag audit_q3`, `branch staging`."""
    return f"{ref.kind.lower()} {ref.name}"


def without_leftovers(table: TableHandle) -> list[Ref]:
    """The table's refs, after removing the temporary branches an interrupted tag rewrite left."""
    kept = []
    for ref in table.refs():
        if ref.kind == "BRANCH" and ref.name.startswith(TEMPORARY):
            cast(RefKeeping, table).drop_ref(ref)  # a handle with refs keeps them (capabilities.refs)
        else:
            kept.append(ref)
    return kept


def settle(table: RefKeeping, datamap: DataMap, purge: PurgeSettings, ref: Ref,
           erased: Unwanted | None) -> Outcome:
    """Apply `purge.pinned_refs` to one ref of `table` not at the current snapshot (see the module doc).
    `erased` None (the caller knows no hashes): the ref cannot be told clean, so it is kept.

    Cost: nothing under `block` or without `erased`; otherwise what `erased.pinned` reads (for
    erasure's hashes: one scan of the key columns of the ref's snapshot), and for a ref holding
    unwanted rows one more of its candidate files and a read and a write of the files holding them
    (a dropped tag: one metadata commit instead).
    """
    if purge.pinned_refs == "block" or erased is None:
        return "kept"
    cleaning = erased.pinned(table, datamap, ref.snapshot_id)
    if cleaning is None:
        return "clean"
    if ref.kind == "BRANCH":
        rewrite_on_branch(table, ref.name, ref.snapshot_id, cleaning)
        return "rewritten"
    if purge.pinned_refs == "drop":
        table.drop_ref(ref)
        return "dropped"
    temporary = TEMPORARY + ref.name
    table.create_branch(temporary, ref.snapshot_id)
    cleaned = rewrite_on_branch(table, temporary, ref.snapshot_id, cleaning)
    table.move_tag(ref.name, cleaned, temporary)
    return "rewritten"


def pinned_keys(table: TableHandle, datamap: DataMap, snapshot_id: int, erased: ErasedHashes) -> TableKeys | None:
    """The erased subjects' key values found in the snapshot, as the table's TableKeys (None: it holds
    none of their rows). Found by hash, so subjects whose identifiers this run no longer holds in
    plaintext (requests waiting for a batched purge) are found too. Cost: one scan of the snapshot's
    key columns; the values found are kept in Spark (a local checkpoint), never collected here."""
    groups = datamap.mapping(table.name).groups
    values = verify.key_values(table.read_at(snapshot_id), groups)
    found = verify.found_values(values, erased.hashes, erased.keys.keys).localCheckpoint()
    if found.isEmpty():
        return None
    return matching.key_sets(datamap, found, erased.key_types, [table.name])[table.name]


def key_cleaning(table: TableHandle, action: str, keys: TableKeys) -> Cleaning:
    """The erasure of `keys` as a Cleaning: candidate files by data skipping on the keys, rows
    marked by them, and the rows the table's action (`delete` | `redact`) leaves (collateral.erased_rows)."""
    return Cleaning(candidates=lambda snapshot_id: keys.candidates(table, snapshot_id),
                    unwanted=lambda rows: matching.requested_rows(rows, keys),
                    cleaned=lambda content: collateral.erased_rows(content, keys, action))


def rewrite_on_branch(table: RefKeeping, branch: str, snapshot_id: int, cleaning: Cleaning) -> int:
    """Commit on `branch` (whose head is `snapshot_id`) the files of that snapshot holding unwanted
    rows rewritten as `cleaning` leaves them; returns the branch's new head. A conflicting commit
    on the branch meanwhile fails it (the purge is retried). Cost: a scan of the candidate files
    (data skipping) for the files holding unwanted rows, then one read and one write of those files."""
    spark = table.spark
    candidates = cleaning.candidates(snapshot_id)
    rows = skipping.read(candidates)
    if rows is not None:
        found = cleaning.unwanted(rows.withColumn("dsr_file", F.input_file_name()))
        holding = {r.dsr_file for r in found.select("dsr_file").distinct().collect()}
        chosen = candidates.subset(spark, holding)
        content = skipping.read(chosen, file_per_task=True)
        if content is not None:
            table.overwrite_files(chosen, cleaning.cleaned(content), branch=branch)
    return next(r.snapshot_id for r in table.refs() if r.name == branch)
