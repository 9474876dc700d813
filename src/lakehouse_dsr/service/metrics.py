"""`/metrics`: the intake service in Prometheus' text format, through prometheus_client, in a registry
of each application's own.

Two sources. What this process sees: every HTTP answer's latency (a histogram by method, route
template and status: never the raw path, which holds request ids), and the filings it refused, by
reason. What the shared state says, read at scrape time: requests acknowledged and ingested (the
queue keeps a row per request, so these totals survive restarts and are the same on every instance
sharing the queue, a SQLite file or a PostgreSQL server), the queue's depth and age, the ingester's
lag, whether it runs and how often it was started again, and the open requests by days left (from
the ledger). The ingester is a process of its own; reading its work from the queue it writes needs no
multiprocess mode.

No label or value holds an identifier: labels are request types, states, refusal reasons, route
templates, methods, status codes and day ranges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Match

from ..ledger.requests import REQUEST_TYPES
from .intake import Intake
from .queue import QueueUnavailableError

log = logging.getLogger("lakehouse_dsr.service")
FILING_ROUTE = "/api/v1/requests"
QUEUE_STATES = ("identity_unverified", "received", "locked")
# Days left until the deadline: (label, below), the last without a bound.
DAYS_LEFT = (("overdue", 0), ("under_5", 5), ("under_15", 15), ("under_30", 30), ("30_or_more", None))
REASONS = {400: "wrong_code", 401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict",
           410: "expired", 413: "body_too_large", 422: "invalid_input", 423: "locked", 429: "rate_limited",
           500: "internal_error", 503: "unavailable"}


class Metrics:
    """The registry of one application. `observe` is called by the Guard once per HTTP answer;
    `render` is the scrape. Cost of a scrape: one pass over the queue's rows (on a
    connection of its own, beside the group commits) and one read of the ledger's requests table."""

    def __init__(self, intake: Intake, routes: list[BaseRoute]):
        self.registry = CollectorRegistry(auto_describe=True)
        self._routes = routes
        self.latency = Histogram("dsr_http_request_duration_seconds", "Time to answer an HTTP request",
                                 ("method", "route", "status"), registry=self.registry)
        self.refused = Counter("dsr_intake_requests_refused", "Filings refused, by reason",
                               ("reason",), registry=self.registry)
        self.registry.register(_Shared(intake))

    def observe(self, scope: dict[str, Any], status: int, seconds: float) -> None:
        route = self.route(scope)
        self.latency.labels(scope["method"], route, str(status)).observe(seconds)
        if route == FILING_ROUTE and scope["method"] == "POST" and status >= 400:
            self.refused.labels(REASONS.get(status, "other")).inc()

    def route(self, scope: dict[str, Any]) -> str:
        """The route template a request belongs to (`/api/v1/requests/{request_id}`), `unmatched` for
        any other path. Cost: one match per route (a regular expression each), the first found wins."""
        for route in self._routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path is a route's, the method is not
                return getattr(route, "path", "unmatched") or "unmatched"
        return "unmatched"

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Shared(Collector):
    """The figures read from the queue, the ingester and the ledger at each scrape."""

    def __init__(self, intake: Intake):
        self.intake = intake

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time: nothing to check against at registration

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        try:
            rows = self.intake.queue.read(lambda c: c.execute(
                "SELECT request_type, state, ingested_at IS NOT NULL AS ingested, COUNT(*) AS n,"
                " MIN(received_at) AS oldest FROM intake GROUP BY 1, 2, 3").fetchall())
        except QueueUnavailableError as exc:  # /readyz says so; the figures of this process still count
            log.warning("metrics: %s", exc)
            rows = None
        if rows is not None:
            yield from self._queue(rows, now)
        yield GaugeMetricFamily("dsr_intake_ingester_up", "1 while the ingester process runs",
                                value=1 if self.intake.ingester_alive() else 0)
        yield CounterMetricFamily("dsr_intake_ingester_restarts", "Ingester processes started again after a crash",
                                  value=self.intake.ingester_restarts)
        yield from self._open_requests()

    def _queue(self, rows: list[Any], now: float) -> Iterator[Metric]:
        acknowledged = CounterMetricFamily("dsr_intake_requests_acknowledged", "Filings acknowledged (202), by "
                                           "type: the queue's total", labels=["type"])
        ingested = CounterMetricFamily("dsr_intake_requests_ingested", "Acknowledged requests moved into the "
                                       "ledger, by type: the queue's total", labels=["type"])
        for kind in REQUEST_TYPES:
            acknowledged.add_metric([kind], sum(r["n"] for r in rows if r["request_type"] == kind))
            ingested.add_metric([kind], sum(r["n"] for r in rows if r["request_type"] == kind and r["ingested"]))
        yield acknowledged
        yield ingested
        waiting = [r for r in rows if not r["ingested"]]
        depth = GaugeMetricFamily("dsr_intake_queue_depth", "Acknowledged requests not in the ledger yet, by state",
                                  labels=["state"])
        for state in QUEUE_STATES:
            depth.add_metric([state], sum(r["n"] for r in waiting if r["state"] == state))
        yield depth
        yield GaugeMetricFamily(
            "dsr_intake_queue_oldest_age_seconds", "Age of the oldest request waiting in the queue (for its "
            "verification code or for the ingester); 0 when none",
            value=_age([r["oldest"] for r in waiting if r["state"] != "locked"], now))
        yield GaugeMetricFamily(
            "dsr_intake_ingester_lag_seconds", "Age of the oldest acknowledged request the ingester has not "
            "moved into the ledger yet; 0 when none", value=_age([r["oldest"] for r in waiting
                                                                  if r["state"] == "received"], now))

    def _open_requests(self) -> Iterator[Metric]:
        try:
            found = self.intake.requests("open")
        except Exception as exc:  # the ledger is unreachable: /readyz says so; the other figures still count
            log.warning("metrics: open requests: %s", type(exc).__name__)
            return
        family = GaugeMetricFamily("dsr_requests_open", "Open requests (queued or in the ledger) by days left "
                                   "until their deadline", labels=["days_left"])
        counts = dict.fromkeys((label for label, _ in DAYS_LEFT), 0)
        for request in found:
            days = request.days_left if request.days_left is not None else 0
            counts[next(label for label, below in DAYS_LEFT if below is None or days < below)] += 1
        for label, count in counts.items():
            family.add_metric([label], count)
        yield family


def _age(received: list[str | None], now: float) -> float:
    stamps = [datetime.fromisoformat(r) for r in received if r]
    if not stamps:
        return 0.0
    oldest = min(s if s.tzinfo else s.replace(tzinfo=UTC) for s in stamps)
    return max(0.0, now - oldest.timestamp())
