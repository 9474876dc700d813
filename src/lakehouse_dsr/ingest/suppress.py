"""Suppression: keep erased people from coming back through late data, replays and backfills.

The suppression list is the ledger's keyed hashes of every identifier resolved for an erase
request (`<ledger>.request_keys`), so it holds no plaintext and survives completion. An ingestion
job filters each incoming DataFrame before it writes:

    from lakehouse_dsr import suppress
    clean = suppress(incoming, "user_id")             # the data map's subject identifier
    clean = suppress(signups, "mail", "email")        # a column holding another identifier
    clean = suppress_for(sales, "sales.web_sales")    # as the data map erases that table: every key column
    clean.writeTo("lakehouse.web.events").append()

A job that decides for itself (delete downstream, flag, count) asks per row:

    gone = erased(orders, settings, "customer_email", "email")
    orders.where(~gone)                               # or: DELETE ... / MERGE with orders.where(gone)
"""

from __future__ import annotations

import uuid

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from ..config import Settings, load_settings
from ..datamap import column_ref
from ..exceptions import DataMapError
from ..keys import keys_in_use
from ..lake.catalyst import try_cast
from ..lake.hmac import join_on_key, with_keyring_hashes
from ..lake.indriver import local_rows
from ..ledger.ledger import Ledger
from ..stages.collateral import erased_rows
from ..stages.matching import KeySet, TableKeys


def suppress(df: DataFrame, key_column: str, identifier: str | None = None,
             settings: Settings | None = None) -> DataFrame:
    """`df` without the rows whose `key_column` holds an identifier of a person who asked to be erased.

    `identifier` names the kind of value in the column (a data map identifier; default: the
    subject identifier). Rows with a NULL key pass. Cost: `df` is read twice (cache it if it is
    expensive to recompute): once for its distinct keys, which are hashed (one HMAC per distinct
    value and key of the keyring: hashes made before a key rotation are matched under their
    retired key) and matched against the broadcast suppression list, and once for a broadcast
    anti-join with the few keys found. Settings default to ./dsr.yaml (see config.load_settings).
    """
    settings = settings or load_settings()
    identifier = known_identifier(settings, identifier)
    if key_column not in df.columns:
        raise DataMapError(f"the DataFrame has no column {key_column!r} (columns: {', '.join(df.columns)})")
    erased = _erased_values(df, F.col(key_column), Ledger(settings), identifier)
    return df.join(F.broadcast(erased), F.col(key_column).cast("string") == erased.dsr_value, "left_anti")


def known_identifier(settings: Settings, identifier: str | None) -> str:
    """`identifier`, or the subject identifier when None; DataMapError when the data map does not know it."""
    identifier = identifier or settings.datamap.subject
    known = settings.datamap.identifier_types()
    if identifier not in known:
        raise DataMapError(f"unknown identifier {identifier!r}: the data map knows {', '.join(sorted(known))}")
    return identifier


def erased(df: DataFrame, settings: Settings, column: str, identifier: str | None = None) -> Column:
    """A boolean Column over `df`: true where `column` holds an identifier of a person who asked to be
    erased (by keyed hash, as `suppress`), false otherwise (NULL included).

    Cost: `df`'s distinct values of `column` are hashed and matched once, here; the few erased ones
    are kept (local checkpoint) in a temporary view the Column reads through a scalar subquery, so
    no identifier appears in a query plan's text.
    """
    identifier = known_identifier(settings, identifier)
    if column not in df.columns:
        raise DataMapError(f"the DataFrame has no column {column!r} (columns: {', '.join(df.columns)})")
    view = f"dsr_erased_{uuid.uuid4().hex[:12]}"
    _erased_values(df, F.col(column_ref(column)), Ledger(settings), identifier).createOrReplaceTempView(view)
    return F.coalesce(F.expr(f"array_contains((SELECT collect_set(dsr_value) FROM {view}), "
                             f"CAST({column_ref(column)} AS STRING))"), F.lit(False))


def _erased_values(df: DataFrame, values: Column, ledger: Ledger, identifier: str) -> DataFrame:
    """(dsr_value): the distinct values of `values` (a column of `df`; an array's elements) that the
    suppression list holds for `identifier`, as text. Checkpointed: small, computed once, and no longer
    sharing lineage with `df` for the join that follows."""
    is_array = isinstance(df.select(values).schema[0].dataType, ArrayType)
    texts = df.select((F.explode(values) if is_array else values).alias("dsr_value")) \
        .select(F.col("dsr_value").cast("string").alias("dsr_value"))
    hashes = ledger.suppression_hashes(identifier)
    listed = local_rows(df.sparkSession, [(h["key_hash"], h["key_id"]) for h in hashes],
                        "key_hash string, key_id string")
    keys = keys_in_use(ledger.keyring, {h["key_id"] for h in hashes})
    hashed = with_keyring_hashes(df.sparkSession, texts.where("dsr_value IS NOT NULL").distinct(), "dsr_value", keys)
    return join_on_key(hashed, listed, "left_semi").select("dsr_value").distinct().localCheckpoint()


def suppress_for(df: DataFrame, table: str, settings: Settings | None = None) -> DataFrame:
    """`df`, rows bound for a mapped table or `files:` dataset, as its data-map entry says erased people
    must be: rows naming one by any key column dropped (action: delete), or each key group's columns
    nulled where its own key names one and erased elements taken out of array keys (action: redact),
    the other person's columns in a shared row kept. Cost: per key column, `df`'s distinct values are
    hashed and matched as in `suppress`; then one pass with a broadcast join per key column.
    """
    settings = settings or load_settings()
    if table not in settings.datamap.keyed and table not in settings.datamap.files:
        raise DataMapError(f"{table} is neither a table nor a files dataset of the data map "
                           "(an aggregate holds no keys)")
    mapping = settings.datamap.table_mapping(table)
    ledger = Ledger(settings)
    sets = []
    for group in mapping.groups:
        column = F.col(column_ref(group.column))
        data_type = df.select(column).schema[0].dataType
        value_type = data_type.elementType if isinstance(data_type, ArrayType) else data_type
        erased = _erased_values(df, column, ledger, group.identifier)
        sets.append(KeySet(erased.select(try_cast(df.sparkSession, F.col("dsr_value"), value_type).alias("key_value"),
                                         F.array(F.lit("suppressed")).alias("request_ids")), 0))
    return erased_rows(df, TableKeys(tuple(mapping.groups), tuple(sets)), mapping.action)
