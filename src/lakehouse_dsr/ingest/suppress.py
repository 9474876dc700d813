"""Suppression: keep erased people from coming back through late data, replays and backfills.

The suppression list is the ledger's keyed hashes of every identifier resolved for an erase
request (`<ledger>.request_keys`), so it holds no plaintext and survives completion. An ingestion
job filters each incoming DataFrame before it writes:

    from lakehouse_dsr import suppress
    clean = suppress(incoming, "user_id")             # the data map's subject identifier
    clean = suppress(signups, "mail", "email")        # a column holding another identifier
    clean.writeTo("lakehouse.web.events").append()
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..config import Settings, load_settings
from ..exceptions import DataMapError
from ..lake.hmac import join_on_key, with_keyring_hashes
from ..ledger.keys import keys_in_use
from ..ledger.ledger import Ledger


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
    identifier = identifier or settings.datamap.subject
    known = {settings.datamap.subject, *settings.datamap.identifiers}
    if identifier not in known:
        raise DataMapError(f"unknown identifier {identifier!r}: the data map knows {', '.join(sorted(known))}")
    if key_column not in df.columns:
        raise DataMapError(f"the DataFrame has no column {key_column!r} (columns: {', '.join(df.columns)})")
    ledger = Ledger(settings)
    values = df.select(F.col(key_column).cast("string").alias("dsr_value")).where(F.col("dsr_value").isNotNull())
    hashes = ledger.suppression_hashes(identifier)
    listed = df.sparkSession.createDataFrame([(h["key_hash"], h["key_id"]) for h in hashes],
                                             "key_hash string, key_id string")
    keys = keys_in_use(ledger.keyring, {h["key_id"] for h in hashes})
    hashed = with_keyring_hashes(df.sparkSession, values.distinct(), "dsr_value", keys)
    # Checkpointed: small, computed once, and no longer sharing lineage with `df` for the self-join.
    erased = join_on_key(hashed, listed, "left_semi").select("dsr_value").distinct().localCheckpoint()
    return df.join(F.broadcast(erased), F.col(key_column).cast("string") == erased.dsr_value, "left_anti")
