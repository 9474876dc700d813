"""Matching DROP work items to the people of the lake, in Spark.

Each list the data map's `drop:` section places is hashed where its identifiers are (drop/hashing.py)
and joined with the work items' hashes: a shuffle join, at any size (a million hashes against ten
million identity rows). The identifiers are standardized and hashed inside Spark's jobs; what comes
back to the driver is the matches alone: work-item ID and subject id, which the ledger's requests hold
anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..config import Settings
from ..datamap import DataMap
from ..datamap.model import column_path
from ..lake.frames import arrow_frame, to_arrow
from ..lake.lakehouse import Lake
from ..ledger.ledger import Ledger
from .hashing import Rules, list_hash, names_ascii
from .items import MatchResult, file_matches, unmatched_items
from .lists import LISTS

# Where a row has no hash: a prefix no Base64 hash has (its alphabet is letters, digits, + and /)
NO_HASH = "-"
# Work items a match broadcasts (about 100 bytes each in the driver's JVM: 200 MB of its 1 GB at most)
BROADCAST_ITEMS = 2_000_000
MATCHES = pa.schema([("work_item_id", pa.string()), ("subject_id", pa.string())])


@dataclass(frozen=True)
class Placement:
    """Where one mapped DROP list's values are: a table, its column holding the subject, and the
    column of each field of the list (one for a single-identifier list)."""

    list_name: str
    table: str
    subject_column: str
    columns: dict[str, str]  # field -> column

    def hash(self, schema: StructType, rules: Rules | None = None, ascii_names: bool = False) -> Column:
        """The list's DROP hash of a row of a frame with the table's `schema`; null when invalid."""
        types = {f: schema[c].dataType for f, c in self.columns.items()}
        return list_hash(self.list_name, self._values, types, rules, ascii_names)

    @property
    def _values(self) -> dict[str, Column]:
        return {f: F.col(c) for f, c in self.columns.items()}

    def hashed(self, frame: DataFrame, rules: Rules | None, *keep: Column) -> DataFrame:
        """`keep` and the list's `hash` of every row of `frame` (the table's columns); a row with no hash
        (a value invalid or missing) has `NO_HASH` and its subject instead, which no DROP hash equals.
        Never null, so the `IS NOT NULL` a join on the hash makes Spark infer is not pushed below the
        hashing, which would then run twice (a 10M-row NDZ match took 159 s instead of 40). A list with
        names hashes the rows whose names are ASCII with Spark's own functions, and sends only the
        others to the Python workers (two branches of one plan: the table's columns are read twice)."""
        none = F.concat(F.lit(NO_HASH), F.coalesce(F.col(self.subject_column).cast("string"), F.lit("")))

        def branch(rows: DataFrame, ascii_names: bool = False) -> DataFrame:
            return rows.select(*keep, F.coalesce(self.hash(frame.schema, rules, ascii_names), none).alias("hash"))

        ascii_ = names_ascii(self._values)
        if ascii_ is None:
            return branch(frame)
        return branch(frame.where(ascii_), True).unionByName(branch(frame.where(~ascii_)))


def placements(datamap: DataMap, lists: set[str] | None = None) -> list[Placement]:
    """Every place the data map's `drop:` section puts a list's values (of `lists`, default all). A
    single-identifier list is where its identifier is: a linked identifier's table, or for the subject
    itself every mapped table whose key column (a plain column) holds it; a composite list is in its
    table, every field from the same row."""
    out = []
    for list_name, where in datamap.drop.items():
        if lists is not None and list_name not in lists:
            continue
        if where.identifier is None:
            assert where.table is not None and where.subject_column is not None  # DropList.checked
            out.append(Placement(list_name, where.table, where.subject_column, where.columns(list_name)))
            continue
        (field,) = LISTS[list_name]
        out += [Placement(list_name, table, subject_column, {field: column})
                for table, subject_column, column in _holders(datamap, where.identifier)]
    return out


def lake_hashes(lake: Lake, datamap: DataMap, lists: set[str] | None = None, rules: Rules | None = None) -> DataFrame:
    """(list_type, hash, subject_id) for every value of the lake a mapped DROP list can match (of
    `lists`, default all mapped), read where `placements` puts them (the columns of each place only).
    Values that standardize to nothing have `NO_HASH` and the subject (see `Placement.hashed`).
    Cost: a scan of those columns when the frame is read; nothing here runs a job."""
    spark, parts = lake.spark, []
    for place in placements(datamap, lists):
        parts.append(place.hashed(spark.table(lake.quoted(place.table)), rules, F.lit(place.list_name).alias(
            "list_type"), F.col(place.subject_column).cast("string").alias("subject_id")))
    if not parts:
        return spark.createDataFrame([], "list_type string, hash string, subject_id string")
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    return found.where(F.col("subject_id").isNotNull())


def _holders(datamap: DataMap, identifier: str) -> list[tuple[str, str, str]]:
    """(table, subject column, value column) where `identifier`'s values are: a linked identifier's
    table, or for the subject itself every mapped table whose key column (a plain column) holds it."""
    if identifier != datamap.subject:
        link = datamap.identifiers[identifier]
        return [(link.table, link.subject_column, link.column)]
    return [(name, g.column, g.column) for name, mapping in datamap.tables.items() for g in mapping.groups
            if g.identifier == identifier and "." not in g.column and g.column == column_path(g.column)]


def match(lake: Lake, datamap: DataMap, items: pa.Table, rules: Rules | None = None) -> pa.Table:
    """The people each work item (`items`: work_item_id, list_type, hash) matches, as (work_item_id,
    subject_id) pairs, each pair once. One Spark job: the items shipped as Arrow batches, joined with
    `lake_hashes` of the lists they come from: up to BROADCAST_ITEMS items broadcast, so the lake's
    hashes stream past them and only the matches move (a 10M-row Email+NDZ match: 81 s against 105 s
    with a shuffle join); more items, a shuffle join."""
    if not items.num_rows:
        return MATCHES.empty_table()
    wanted = {str(v) for v in items.column("list_type").unique().to_pylist()}
    found = lake_hashes(lake, datamap, wanted & set(datamap.drop), rules)
    frame = arrow_frame(lake.spark, items.select(["work_item_id", "list_type", "hash"]))
    frame = F.broadcast(frame) if items.num_rows <= BROADCAST_ITEMS else frame
    pairs = found.join(frame, ["list_type", "hash"]).select("work_item_id", "subject_id").distinct()
    return to_arrow(pairs).select(MATCHES.names).cast(MATCHES)


def match_items(lake: Lake, ledger: Ledger, settings: Settings, looked_for: pa.Table | None = None) -> MatchResult:
    """Match every work item waiting for it (`looked_for`, default drop/items.py's `unmatched_items`)
    against the lake and file the outcomes (`file_matches`): erase requests for the next `dsr run`,
    opt-outs, status 5. Cost: one Spark job (`match`), then the ledger's commits."""
    looked_for = unmatched_items(ledger) if looked_for is None else looked_for
    found = match(lake, settings.datamap, looked_for, Rules(zip_plus4=settings.drop.zip_plus4))
    return file_matches(ledger, looked_for, found)


def match_waiting(spark: SparkSession | Callable[[], SparkSession], settings: Settings, ledger: Ledger,
                  looked_for: pa.Table | None = None) -> dict:
    """What every run of a data map with a `drop:` section does first: `match_items`, when work items
    wait (never matched, or found nobody before: the lake may have gained them), so the requests it
    files are carried out by the same run. `spark`: a session, or a function making one, called only
    when items wait; `looked_for`: those items, when the caller has read them (`unmatched_items`).
    The counts of `MatchResult`, or {} when nothing waited (no Spark then)."""
    looked_for = unmatched_items(ledger) if looked_for is None else looked_for
    if not looked_for.num_rows:
        return {}
    session = spark() if callable(spark) else spark
    return asdict(match_items(Lake.of(session, settings), ledger, settings, looked_for))
