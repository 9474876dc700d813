"""`dsr expire` and `dsr retention` on their own: the data map's retention rules outside a `dsr run`
(which enforces them too, as a stage after its erasures)."""

from __future__ import annotations

import uuid
from datetime import date

from pyspark.sql import SparkSession

from ..config import Settings
from ..inventory.check import check_against_catalog, check_formats
from ..lake.lakehouse import Lake
from ..ledger.holds import active_holds
from ..ledger.lease import Lease
from ..ledger.ledger import Ledger
from ..ledger.requests import utc_now
from ..stages import retention
from ..stages.retention_models import RetentionPass, RetentionStatus


def expire(spark: SparkSession, settings: Settings, dry_run: bool = False, tables: list[str] | None = None,
           today: date | None = None) -> RetentionPass:
    """Enforce the retention rules of `tables` (default: every table with rules) as of `today`
    (default: the current UTC date). The data map is checked against the catalog first (a clock
    column that is missing or not a date/timestamp, an unknown --table: DataMapError, nothing
    changed); tables under a legal or a collateral hold are skipped. A change takes the ledger's
    lease, so it never races a `dsr run`; a dry run changes nothing and takes none. Cost: see
    stages/retention.enforce."""
    now = utc_now()
    today = today or now.date()
    retention.selected(settings.datamap, tables)  # an unknown --table fails before Spark reads anything
    lake, datamap = Lake.of(spark, settings), settings.datamap
    check_formats(lake)
    check_against_catalog(spark, settings.datamap, settings.table)
    ledger = Ledger(settings)
    run_id = f"expire-{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    if dry_run:
        return retention.enforce(lake, datamap, settings.purge, ledger, active_holds(ledger, today), today, run_id,
                                 True, tables)
    with Lease(ledger.store, run_id, settings.run.lease_seconds).held(settings.run.concurrent == "wait"):
        collateral = {t: f"collateral hold: {s.detail.get('reason', '')} (dsr release lifts it)"
                      for t, s in ledger.journal.holds(ledger.journal.steps()).items()}
        return retention.enforce(lake, datamap, settings.purge, ledger, active_holds(ledger, today), today, run_id,
                                 tables=tables, paused=collateral)


def status(spark: SparkSession, settings: Settings, tables: list[str] | None = None, today: date | None = None
           ) -> RetentionStatus:
    """The conformance report of `dsr retention`; changes nothing (checked like `expire`)."""
    today = today or utc_now().date()
    retention.selected(settings.datamap, tables)
    lake = Lake.of(spark, settings)
    check_formats(lake)
    check_against_catalog(spark, settings.datamap, settings.table)
    return retention.status(lake, settings.datamap, active_holds(Ledger(settings), today), today,
                            tables)
