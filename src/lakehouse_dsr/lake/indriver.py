"""Small tables planned and rewritten inside the driver's JVM, without a Spark query.

On a wide lake most mapped tables are small, and a Spark query over a small table costs its fixed
overhead (analysis, planning, scheduling, a result stage: 0.2-0.5 s of driver CPU here) whatever it
reads. `InDriver.java` (compiled in the driver by Janino, like Bridge.java) reads the few files
holding a batch's keys with Iceberg's generic Parquet reader and writes their replacements with the
table's own writer settings, in milliseconds per file; the collateral check fingerprints the
replaced and the new files the same way, each read back from storage as its snapshot holds it, and
the live verification looks the key columns' keyed hashes up among the ledger's (HMAC-SHA256). It
takes what Spark's read would take: the candidate files, the key columns and the batch's values as
JVM objects (lake/skipping.py's KeyValues), so no identifier crosses Py4J or enters a plan.

Only what it can do exactly as Spark would is done here: whole Parquet files without delete files,
flat top-level key and redacted columns of a type data skipping knows (string, int, bigint), no
partition derived from a redacted column, and at most `erase.in_driver_max_bytes` of files. Anything
else goes to Spark; `refusal` says why.

A merge-on-read deletion of any table size also writes its position delete files here
(`position_deletes`): Spark's scan for the plan found the positions already, so writing a few small
files replaces a MERGE that would read every candidate file's key columns again.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DataType, IntegerType, LongType, StringType, StructType

from ..exceptions import first_line
from .bridge import compiled, helper
from .skipping import Candidates, KeyValues

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class KeyColumn:
    """A top-level key column, the batch's values for it, and the columns a row it names loses."""

    column: str
    values: KeyValues | None
    redact: tuple[str, ...] = ()


def _flat(column: str) -> bool:
    return "." not in column and not column.endswith("[]")


def _keys(spark: SparkSession, keys: list[KeyColumn]):
    java_keys = compiled(spark, "InDriver").keys()
    for key in keys:
        values = cast(KeyValues, key.values)  # `refusal` turned away keys without values
        java_keys.add(key.column, values.lookup, list(key.redact))
    return java_keys


def attempt(what: str, work: Callable[[], T]) -> T | None:
    """`work()`, or None when the driver's JVM fails at it (a type its generic reader does not know,
    say): the caller then has Spark do it. Nothing is left behind: a failed rewrite deletes what it
    wrote."""
    try:
        return work()
    except Py4JJavaError as exc:
        log.warning("%s in the driver failed, Spark does it: %s", what, first_line(exc.java_exception))
        return None


def kept(df: DataFrame) -> DataFrame:
    """`df`'s distinct rows computed once (one Spark job without a shuffle; none when `df` is a local
    relation already) and kept in the driver's JVM as a local relation: later queries that only
    filter and project them run no job, and no row crosses Py4J. For small results (a batch's
    identifiers), as a local checkpoint would keep them on the executors."""
    return DataFrame(compiled(df.sparkSession, "LocalRows").kept(df._jdf), df.sparkSession)


def kept_where(df: DataFrame, column: str, values: Iterable[str]) -> DataFrame:
    """The rows of `df` (a local relation, as `kept` makes) whose string `column` is one of `values`,
    as a new local relation, filtered in the driver's JVM. `df.where(col.isin(values))` would do the
    same, but Spark folds a filter on a local relation by generating and compiling its condition:
    an IN of 1,000 request ids became a 400 KB class, compiled in every process that ran it."""
    return DataFrame(compiled(df.sparkSession, "LocalRows").keptWhere(df._jdf, column, list(values)), df.sparkSession)


def distinct_values(df: DataFrame, column: str) -> list[str | None]:
    """The distinct values of string `column` of `df`: read in the driver's JVM when `df` is a local
    relation (no job, and only they cross Py4J: a collect of 100,000 hash rows took seconds), else
    by one Spark job."""
    if is_local(df):
        return list(compiled(df.sparkSession, "LocalRows").distinctValues(df._jdf, column))
    return [r[0] for r in df.select(column).distinct().collect()]


def keyed_hashes(df: DataFrame, column: str, pads: DataFrame, out: str) -> DataFrame:
    """`df` (a local relation) crossed with the key `pads` (lake/hmac.py's, a local relation), with
    each key's HMAC of `column` as `out`: lake/hmac.py's hashes computed in the driver's JVM, no job."""
    return DataFrame(compiled(df.sparkSession, "LocalRows").keyedHashes(df._jdf, column, pads._jdf, out),
                     df.sparkSession)


def local_rows(spark: SparkSession, rows: Sequence[tuple], schema: str | StructType) -> DataFrame:
    """Small driver-side data (a batch's identifiers, keys, hashes: str, bytes, int or None values)
    as a local relation of `schema` built in the driver's JVM: queries that only filter and project
    it run no Spark job, and no job that reads it (a broadcast of it, say) runs Python.
    `spark.createDataFrame` of a Python list would be a Python RDD, evaluated by Python workers in
    every job that reads it (starting their daemon in the first: over a second of a small run). The
    rows reach the JVM as PySpark's own do, pickled in an owner-only file in the context's temporary
    directory, deleted once read; never as Py4J command text. With Spark's I/O encryption on,
    PySpark's authenticated socket is used instead."""
    sc = spark.sparkContext
    if sc._encryption_enabled:  # PySpark then never writes rows to a file: nor do we
        return spark.createDataFrame(list(rows), schema)
    text = schema if isinstance(schema, str) else schema.json()
    with tempfile.NamedTemporaryFile(dir=sc._temp_dir, prefix="dsr-rows-") as f:  # created 0600
        pickle.dump([tuple(r) for r in rows], f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        return DataFrame(compiled(spark, "LocalRows").localPickled(spark._jsparkSession, f.name, text), spark)


def is_local(df: DataFrame) -> bool:
    """Whether reading `df` takes no Spark job (a local relation once optimized)."""
    return bool(compiled(df.sparkSession, "LocalRows").isLocal(df._jdf))


def available(spark: SparkSession) -> bool:
    """Whether files may be read and written in the driver in this session: the InDriver helper is on
    and compiles (bridge.helper). Where not, Spark plans, rewrites and checks every table, and Spark's
    statement writes a merge-on-read table's delete files."""
    return helper(spark, "InDriver") is not None


def refusal(spark: SparkSession, candidates: Candidates, keys: list[KeyColumn], max_bytes: int,
            hashed: Sequence[DataType] | None = None) -> str | None:
    """Why `candidates` cannot be read and rewritten in the driver (None: they can). Metadata only.
    `hashed`: the key columns' types, for a check by keyed hash (`live_found`) that reads the key
    columns only, with no key set: each value's text must be the one Spark's cast gives."""
    if not available(spark):
        return "the driver's helper is off or cannot be compiled"
    if candidates.bytes > max_bytes:
        return f"{candidates.bytes} bytes of files, more than {max_bytes}"
    if candidates.jtable is None and not candidates.empty:
        return "files of a table the driver's reader does not read (not Iceberg)"
    if any(not _flat(k.column) or not all(_flat(c) for c in k.redact) for k in keys):
        return "a nested or array column"
    if hashed is not None:
        if not all(isinstance(t, StringType | IntegerType | LongType) for t in hashed):
            return "a key type whose text the driver may write otherwise than Spark"
    elif any(k.values is None or k.values.lookup is None for k in keys):
        return "a key type or key set data skipping cannot take"
    if candidates.empty:
        return None
    java_keys = compiled(spark, "InDriver").keys() if hashed is not None else _keys(spark, keys)
    return compiled(spark, "InDriver").refusal(candidates.jtable, candidates._tasks, java_keys)


def plan(spark: SparkSession, candidates: Candidates, keys: list[KeyColumn]) -> list[tuple[str, list[str] | None, int]]:
    """Per candidate file and combination of requests naming a row (None: rows nobody asked about),
    the row count. Reads the key columns of the candidate files, skipping row groups the keys
    cannot be in (statistics, dictionaries, bloom filters), like the Spark scan it replaces."""
    if candidates.empty:
        return []
    answer = compiled(spark, "InDriver").plan(candidates.jtable, candidates._tasks, _keys(spark, keys),
                                              candidates.predicate)
    return [(path, ids, count) for path, ids, count in json.loads(answer)]


def rewrite(spark: SparkSession, candidates: Candidates, keys: list[KeyColumn], delete: bool):
    """The candidate files rewritten as the erasure leaves them (a named row dropped if `delete`, else
    its key group's columns NULL), one new file per old file in the old order, written but not
    committed; returns the new Java DataFiles. Cost: one read and one write of those files."""
    return compiled(spark, "InDriver").rewrite(candidates.jtable, candidates._tasks, _keys(spark, keys), delete)


def position_deletes(spark: SparkSession, candidates: Candidates, positions: dict[str, list[int]]):
    """Position delete files for the candidate files named in `positions` (a data file's location ->
    the ascending positions of the rows to delete), one per data file, written with the table's
    delete-file settings but not committed; returns the Java DeleteFiles. Reads nothing; the
    positions cross Py4J as bytes, never as command text. Cost: one small file per data file."""
    locations = sorted(positions)
    return compiled(spark, "InDriver").positionDeletes(candidates.jtable, candidates._tasks, locations,
                                                      [_little_endian(positions[f]) for f in locations])


def _little_endian(values: list[int]) -> bytes:
    packed = array("q", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def fingerprint(spark: SparkSession, jtable, snapshot_id: int, locations: frozenset[str], keys: list[KeyColumn],
                delete: bool) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """The collateral check's fingerprints (rows, hash sum, hash XOR) of the files at `locations` as
    snapshot `snapshot_id` holds them: of the rows no key names, and of the named rows as the erasure
    leaves them (none when `delete`). None when a file has deletes or is not Parquet: Spark reads
    those. Cost: one read of every column of those files, and the snapshot's manifests."""
    answer = compiled(spark, "InDriver").fingerprint(jtable, snapshot_id, json.dumps(sorted(locations)),
                                                     _keys(spark, keys), delete)
    found = json.loads(answer)
    return None if found is None else (tuple(found[0]), tuple(found[1]))


def hash_lookup(spark: SparkSession, stored: list[tuple[str, str, str, str | None]], hash_keys: dict[str, bytes]):
    """The ledger's hashes (request id, identifier, hex hash, id of the key that made it) and the
    keys in use ({key id: key}) in the driver's JVM, for `live_found`. The keys travel as
    `local_rows`, as lake/hmac.py's pads do, never as Py4J command text. Cost: no Spark job."""
    rows = local_rows(spark, [(key_id, key.hex()) for key_id, key in hash_keys.items()],
                      "key_id string, key string")._jdf.collectAsList()  # a local relation: no job
    return compiled(spark, "InDriver").hashLookup(json.dumps(stored), rows)


def live_found(spark: SparkSession, candidates: Candidates, keys: list[KeyColumn], identifiers: list[str],
               lookup) -> dict[str, int]:
    """{request id: rows} of the candidate files whose key value (as text) hashes, under one of the
    keys of `lookup` (hash_lookup), to one of its hashes of that column's identifier:
    verify.find_hashed over the live files, in the driver. Cost: one read of the key columns of the
    candidate files, an HMAC per distinct value and key."""
    if candidates.empty:
        return {}
    answer = compiled(spark, "InDriver").liveFound(candidates.jtable, candidates._tasks, [k.column for k in keys],
                                                   identifiers, lookup, candidates.predicate)
    return {request_id: int(n) for request_id, n in json.loads(answer).items()}
