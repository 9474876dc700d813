"""`dsr plan`: what the next `dsr run` would do to each mapped table for the open erase requests, and
every data-map problem that would stop it, found by the run's own code (work.py's `read_work`,
stages/identity.py's `resolve`, stages/matching.py's `key_sets`, stages/erase.py's `plan_many`)
and changing nothing: no commit to any table or to the ledger, no lease, nothing in the audit.

The estimate is a model of this installation's recorded runs (the ledger's `runs` table): a run's
erase, propagate, purge and verify stages take about the bytes it rewrites over a measured rate,
and its resolve and ledger stages a measured time per request. Without a recorded run to measure,
documented defaults apply and the report says so (`Rate.source`).
"""

from __future__ import annotations

import time
from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import SparkSession

from ..config import Settings
from ..datamap import DataMap
from ..inventory.check import Problem, catalog_problems, format_problems
from ..lake import skipping
from ..lake.lakehouse import Lake
from ..ledger.ledger import Ledger
from ..ledger.requests import utc_now
from ..stages import erase, identity, matching
from .context import batch
from .work import Work, read_work

# The run report's stages whose seconds follow the bytes a run rewrites, and those that follow its requests.
TABLE_STAGES = ("erase", "propagate", "purge", "verify")
REQUEST_STAGES = ("resolve", "ledger")
RUNS_MEASURED = 20  # the newest recorded runs the rates are measured over
# Defaults, measured on a 2-core machine: bench/results/10000000.json (`dsr run` on 10M events, 474 MB
# rewritten in 12.7 s of erase, purge and verify) and bench/results/delta-10000000-100000.json (100,000
# requests: resolve 8.8 s and ledger 10.7 s, medians of 3).
DEFAULT_REWRITE_BYTES_PER_SECOND = 37e6
DEFAULT_SECONDS_PER_REQUEST = 0.0002


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TableForecast(_Model):
    """One table as the next run would erase it (counts only, no identifier)."""

    action: str = Field(description="delete | redact")
    strategy: str = Field(description="the erase strategy the run would choose (stages/erase.py choose_strategy)")
    files: int = Field(description="candidate data files: those data skipping leaves, which the run's plan reads")
    bytes: int = Field(description="their bytes")
    total_files: int = Field(description="data files of the table's current snapshot or version")
    total_bytes: int = Field(description="their bytes")
    rows: int | None = Field(description="rows the open requests name (a row named by several counts once); null "
                                         "when the plan folds: the run's rewrite of every candidate file counts them")
    matched_files: int | None = Field(description="data files holding such rows: those the erase rewrites, or masks "
                                                   "with delete files or deletion vectors; null when the plan folds")
    rewrite_bytes: int = Field(description="bytes of data files the run would rewrite, in its erase or its purge: "
                                           "the matched files (every candidate file when the plan folds), or 0 "
                                           "when the erase only masks rows and no purge follows in the run")
    estimated_seconds: float = Field(description="rewrite_bytes over rates.rewrite_bytes_per_second")


class Rate(_Model):
    value: float = Field(description="bytes per second, or seconds per request")
    source: Literal["measured", "default"] = Field(
        description="measured: from the recorded runs counted in `runs`; default: no recorded run to measure")
    runs: int = Field(description="recorded runs it was measured over (0: the default)")


class Rates(_Model):
    rewrite_bytes_per_second: Rate = Field(description="bytes rewritten per second of the erase, propagate, purge "
                                                       "and verify stages")
    seconds_per_request: Rate = Field(description="seconds of the resolve and ledger stages per request a run "
                                                  "recorded (completed, failed or erased)")


class RequestCounts(_Model):
    erase: int = Field(description="open erase requests the run would erase (the plan's batch)")
    access: int = Field(description="open access requests (their export is not planned)")
    consent: int = Field(description="open opt-out and opt-in requests (the shares' refresh is not planned)")
    held: int = Field(description="erase requests of subjects under a legal hold, left out of the batch")
    waiting_for_purge: int = Field(description="requests erased already, waiting for the batched purge")


class PlanReport(_Model):
    """What the next `dsr run` would do for the open erase requests; no identifier."""

    requests: RequestCounts
    purge: bool = Field(description="the run would purge (strategies are chosen for it)")
    tables: dict[str, TableForecast] = Field(description="each table planned, in the run's erase order")
    not_planned: dict[str, str] = Field(description="tables of the data map not planned -> why")
    problems: list[Problem] = Field(description="every data-map problem a run would stop at (table, text)")
    rates: Rates
    estimated_seconds: float = Field(description="the erase batch's seconds: erase requests times "
                                                 "seconds_per_request plus every table's estimated_seconds")
    seconds: float = Field(description="what this plan took")


def plan(spark: SparkSession, settings: Settings, today: date | None = None) -> PlanReport:
    """Plan the next run's erasure of the open erase requests and check the data map against the lake;
    nothing is changed (no commit to a table or the ledger, no lease).

    The run's own steps: the ledger's open work (`read_work`, as of `today`, default the current UTC
    date), the data map's checks with every problem collected instead of the first check raising,
    identifiers resolved (through the linked tables that have no problem), key sets, and each table's
    erase plan (`erase.plan_many`: data skipping, then the key columns of the candidate files read;
    no table is read without open erase requests). Tables with a problem, under a legal hold, or
    keyed by an identifier resolved through a table with a problem are listed as not planned. Not
    planned either: file datasets, aggregates, shredded tables, and people erased earlier whose rows
    came back (the run finds those itself). A Delta table named in a metastore that has none raises
    DataMapError, as it stops a run. Cost: the checks of a run (schemas, metadata), the resolution
    and plan reads of a run's erase stage, one more metadata planning per table with matches (its
    matched files' sizes), and one read of the ledger's run history.
    """
    started = time.perf_counter()
    datamap = settings.datamap
    ledger = Ledger(settings)
    work = read_work(ledger, settings, today or utc_now().date())
    lake = Lake.of(spark, settings)
    found, key_types = catalog_problems(spark, datamap, settings.table)
    problems = [*format_problems(lake), *found]
    broken = {p.table for p in problems}
    not_planned = _not_planned(datamap, work, broken)
    tables = [t for t in datamap.keyed_order() if t not in not_planned] if work.erase else []
    rates = measured_rates(ledger.runs(RUNS_MEASURED))
    forecasts: dict[str, TableForecast] = {}
    try:
        if tables:
            resolvable = datamap.model_copy(update={"identifiers": {
                n: link for n, link in datamap.identifiers.items() if link.table not in broken}})
            keys = identity.resolve(lake, resolvable, batch(spark, work.erase, settings.erase.in_driver_max_requests))
            key_sets = matching.key_sets(datamap, keys, key_types, tables)
            plans = erase.plan_many(lake, datamap, settings.erase, tables, key_sets, work.purge_now,
                                    parallel_tables=settings.run.parallel_tables)
            forecasts = {t: _forecast(lake, key_sets[t], p, work.purge_now, rates) for t, p in plans.items()}
    finally:
        skipping.release()  # the plan's staged file lists
    requests = RequestCounts(erase=len(work.erase), access=len(work.access), consent=len(work.consent),
                             held=len(work.legal_subjects), waiting_for_purge=len(work.waiting))
    estimated = len(work.erase) * rates.seconds_per_request.value + sum(f.estimated_seconds for f in forecasts.values())
    return PlanReport(requests=requests, purge=work.purge_now, tables=forecasts, not_planned=not_planned,
                      problems=problems, rates=rates, estimated_seconds=estimated,
                      seconds=round(time.perf_counter() - started, 3))


def _not_planned(datamap: DataMap, work: Work, broken: set[str]) -> dict[str, str]:
    """Tables of the data map the plan leaves out -> why (`broken`: tables with a data-map problem)."""
    out: dict[str, str] = {}
    for table, mapping in datamap.keyed.items():
        through = [(g.identifier, datamap.identifiers[g.identifier].table) for g in mapping.groups
                   if g.identifier in datamap.identifiers and datamap.identifiers[g.identifier].table in broken]
        if table in work.legal_tables:
            out[table] = f"under a legal hold: {work.legal_tables[table]}"
        elif table in broken:
            out[table] = "a data-map problem (see problems)"
        elif through:
            identifier, source = through[0]
            out[table] = f"identifier {identifier!r} is resolved through {source}, which has a data-map problem"
        elif work.held:
            out[table] = "no erasure while a table is on a collateral hold: " + ", ".join(sorted(work.held))
    out.update({t: "a file dataset (its files are read by the run's own erasure)" for t in datamap.files})
    out.update({t: "an aggregate (recomputed from what its sources lose)" for t in datamap.aggregates})
    out.update({t: "shredded (the subject's vault entry is destroyed)" for t in datamap.shredded})
    return out


def _forecast(lake: Lake, keys: matching.TableKeys, table_plan: erase.TablePlan, purging: bool, rates: Rates
              ) -> TableForecast:
    """The table's forecast from its erase plan. The matched files' bytes come from the plan's candidates
    planned again at the plan's snapshot (metadata only; a Delta table's listing is memoised)."""
    candidates = table_plan.skipping or {}
    matched = set(table_plan.requested_by_file)
    if table_plan.folded:  # the rewrite takes every candidate file
        rewritten = candidates.get("bytes", 0)
    elif matched and (table_plan.write_mode == "copy-on-write" or purging):  # else rows are masked, not rewritten
        rewritten = keys.candidates(lake.table(table_plan.table), table_plan.snapshot_before).subset(
            lake.spark, matched).bytes
    else:
        rewritten = 0
    return TableForecast(
        action=table_plan.action, strategy=table_plan.strategy, files=candidates.get("files", 0),
        bytes=candidates.get("bytes", 0), total_files=candidates.get("total_files", 0),
        total_bytes=candidates.get("total_bytes", 0), rows=None if table_plan.folded else table_plan.rows_matched,
        matched_files=None if table_plan.folded else len(matched), rewrite_bytes=rewritten,
        estimated_seconds=rewritten / rates.rewrite_bytes_per_second.value)


def measured_rates(runs: list[dict]) -> Rates:
    """This installation's rates from recorded runs (Ledger.runs): bytes rewritten per second of the
    table stages, over the runs that rewrote some; seconds of the resolve and ledger stages per
    request, over the runs that recorded some. A rate with no such run is the default."""
    rewriting = [(sum(t["bytes_rewritten"] for t in r["tables"].values()),
                  sum(r["seconds"].get(s, 0.0) for s in TABLE_STAGES)) for r in runs]
    rewriting = [(b, s) for b, s in rewriting if b > 0 and s > 0]
    requesting = [(r["requests_completed"] + r["requests_failed"] + r["requests_erased"],
                   sum(r["seconds"].get(s, 0.0) for s in REQUEST_STAGES)) for r in runs]
    requesting = [(n, s) for n, s in requesting if n > 0]
    return Rates(
        rewrite_bytes_per_second=Rate(value=sum(b for b, _ in rewriting) / sum(s for _, s in rewriting),
                                      source="measured", runs=len(rewriting)) if rewriting
        else Rate(value=DEFAULT_REWRITE_BYTES_PER_SECOND, source="default", runs=0),
        seconds_per_request=Rate(value=sum(s for _, s in requesting) / sum(n for n, _ in requesting),
                                 source="measured", runs=len(requesting)) if requesting
        else Rate(value=DEFAULT_SECONDS_PER_REQUEST, source="default", runs=0))
