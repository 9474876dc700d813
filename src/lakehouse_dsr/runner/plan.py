"""`dsr plan`: what the next `dsr run` would do to each mapped table for the open erase requests, and
every data-map problem that would stop it, found by the run's own code (work.py's `read_work`,
stages/identity.py's `resolve`, stages/matching.py's `key_sets`, stages/erase.py's `plan_many`)
and changing nothing: no commit to any table or to the ledger, no lease, nothing in the audit.

The estimate is a model of a whole run's seconds: a fixed part, a part per erase request and a part
per byte rewritten. Its shape was fitted on seed 003's case on a 2-core machine; this installation's
recorded runs (the ledger's `runs` table) scale it by how long they took against what the model gives
them (the median ratio: one slow run does not move it far). Without a recorded run, the defaults apply
and the report says so (`Rate.source`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import date, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import SparkSession

from ..config import Settings
from ..datamap import DataMap
from ..inventory.check import Problem, catalog_problems, format_problems
from ..lake import skipping
from ..lake.lakehouse import Lake
from ..lake.spark import starting
from ..ledger.ledger import Ledger
from ..ledger.requests import utc_now
from ..stages import erase, identity, matching
from .context import batch, batch_rows
from .work import Work, read_work

RUNS_MEASURED = 20  # the newest recorded runs the model is scaled by
# The model's defaults: `dsr run` wall seconds (from start to finish) fitted on seed 003's case on a
# 2-core machine, a 10M-row Delta table of 145 MB: 10,000 requests matching nothing in 10 s, 100,000
# in 54 s and 1,000,000 in 57 s, both rewriting every file (bench/results/delta-*.json). Per byte the
# fit is slow (a row there is 15 bytes: reading and matching rows costs more than bytes say); recorded
# runs scale it to this installation's tables and machine.
DEFAULT_FIXED_SECONDS = 9.7
DEFAULT_SECONDS_PER_REQUEST = 3.3e-6
DEFAULT_REWRITE_BYTES_PER_SECOND = 3.3e6


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
    value: float = Field(description="bytes per second, seconds per request, or seconds")
    source: Literal["measured", "default"] = Field(
        description="measured: the default scaled by the recorded runs counted in `runs`; default: no recorded "
                    "run to measure")
    runs: int = Field(description="recorded runs it was measured over (0: the default)")


class Rates(_Model):
    rewrite_bytes_per_second: Rate = Field(description="bytes a run rewrites per second of its run time")
    seconds_per_request: Rate = Field(description="seconds of a run per request it works on (the plan's: its erase "
                                                  "requests)")
    fixed_seconds: Rate = Field(description="seconds of a run whatever its size (starting Spark, reading the "
                                            "ledger and the tables' metadata, committing)")
    scale: float = Field(description="how much longer this installation's recorded runs took than the defaults "
                                     "give them (the median ratio; 1.0 without a recorded run): every rate's "
                                     "factor")


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
    estimated_seconds: float = Field(description="the run's seconds: fixed_seconds, plus erase requests times "
                                                 "seconds_per_request, plus every table's estimated_seconds")
    seconds: float = Field(description="what this plan took")


def plan(spark: SparkSession | Callable[[], SparkSession], settings: Settings, today: date | None = None
         ) -> PlanReport:
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
    DataMapError, as it stops a run. `spark`: a session, or a function making one, called on a
    thread at once: the JVM starts while the ledger is read (at a million requests, 2 s of a 10 s
    plan). Cost: the checks of a run (schemas, metadata), the resolution and plan reads of a run's
    erase stage, one more metadata planning per table with matches (its matched files' sizes), and
    one read of the ledger's run history.
    """
    started = time.perf_counter()
    session = starting(spark)
    datamap = settings.datamap
    ledger = Ledger(settings)
    work = read_work(ledger, settings, today or utc_now().date())
    lake = Lake.of(session.result(), settings)
    found, key_types = catalog_problems(lake.spark, datamap, settings.table)
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
            rows = batch_rows(work.erase)
            keys = identity.resolve(lake, resolvable, batch(lake.spark, rows, settings.erase.in_driver_max_requests))
            key_sets = matching.key_sets(datamap, keys, key_types, tables, rows)
            plans = erase.plan_many(lake, datamap, settings.erase, tables, key_sets, work.purge_now,
                                    parallel_tables=settings.run.parallel_tables, per_request=False)
            forecasts = {t: _forecast(lake, key_sets[t], p, work.purge_now, rates) for t, p in plans.items()}
    finally:
        skipping.release()  # the plan's staged file lists
    requests = RequestCounts(erase=len(work.erase), access=len(work.access), consent=len(work.consent),
                             held=len(work.legal_subjects), waiting_for_purge=len(work.waiting))
    estimated = rates.fixed_seconds.value + len(work.erase) * rates.seconds_per_request.value + sum(
        f.estimated_seconds for f in forecasts.values())
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
        elif table in work.exempt_tables:
            out[table] = f"exempt from erasure: {work.exempt_tables[table]}"
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
    """The model's rates for this installation: the defaults, scaled by the median over the recorded
    runs (Ledger.runs) that worked on erase requests or rewrote bytes of how long each took (start to
    finish) against what the defaults give it. Without such a run, the defaults."""
    ratios = [_wall(r) / _modelled(_requests(r), _rewritten(r)) for r in runs
              if (_requests(r) or _rewritten(r)) and _wall(r) > 0]
    scale = statistics.median(ratios) if ratios else 1.0
    source: Literal["measured", "default"] = "measured" if ratios else "default"

    def rate(value: float) -> Rate:
        return Rate(value=value, source=source, runs=len(ratios))

    return Rates(rewrite_bytes_per_second=rate(DEFAULT_REWRITE_BYTES_PER_SECOND / scale),
                 seconds_per_request=rate(DEFAULT_SECONDS_PER_REQUEST * scale),
                 fixed_seconds=rate(DEFAULT_FIXED_SECONDS * scale), scale=scale)


def _modelled(requests: int, rewritten: int) -> float:
    """The defaults' seconds for a run of `requests` erase requests rewriting `rewritten` bytes."""
    return DEFAULT_FIXED_SECONDS + requests * DEFAULT_SECONDS_PER_REQUEST + rewritten / DEFAULT_REWRITE_BYTES_PER_SECOND


def _requests(run: dict) -> int:
    return run["requests_completed"] + run["requests_failed"] + run["requests_erased"]


def _rewritten(run: dict) -> int:
    return sum(t["bytes_rewritten"] for t in run["tables"].values())


def _wall(run: dict) -> float:
    return (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
