"""Prometheus metrics at `/metrics` (prometheus-client).

With `PROMETHEUS_MULTIPROC_DIR` set (`serve --workers N` sets it), every worker writes its
figures to files there and `/metrics` sums them, so one scrape of any worker sees the
whole server. Gauges say how they add up across processes (`multiprocess_mode`).

Only this service's own events are counted here; each update is a dictionary lookup and
an addition (a few microseconds per request).
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

REQUESTS = Histogram(
    "bettercompute_request_duration_seconds",
    "Requests by transport (rest, graphql) and method or GraphQL operation name, with "
    "their latency; _count is the request count",
    ["transport", "operation"],
)
ERRORS = Counter(
    "bettercompute_errors_total",
    "Failed requests (and GraphQL errors) by transport and error code",
    ["transport", "code"],
)
COMPILED_READS = Counter(
    "bettercompute_compiled_reads_total",
    "GraphQL reads with a compiled plan: answered by its one statement, or declined to "
    "the plain path (an error to report, a caller whose decisions differ per pool...)",
    ["outcome"],
)
DB_IN_USE = Gauge(
    "bettercompute_db_connections_in_use",
    "Database connections checked out of the pool",
    ["role"],
    multiprocess_mode="livesum",
)
DB_POOL_WAITS = Counter(
    "bettercompute_db_pool_timeouts_total",
    "Waits for a pooled connection that ran past the bound (answered UNAVAILABLE)",
)
DB_TRANSACTIONS = Counter(
    "bettercompute_db_transactions_total",
    "Database transactions ended, by outcome (commit, rollback; a read ends in rollback)",
    ["outcome"],
)
OUTBOX_LAG = Gauge(
    "bettercompute_outbox_lag_events",
    "Newest committed event seq this process knows of minus the seq its relay delivered",
    multiprocess_mode="livemax",
)
RELAY_LATENCY = Histogram(
    "bettercompute_relay_delivery_seconds",
    "From an event's commit to its relay offering it to the subscriptions",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WEBSOCKETS = Gauge(
    "bettercompute_websockets_open", "Open websocket connections", multiprocess_mode="livesum"
)
SUBSCRIPTIONS = Gauge(
    "bettercompute_subscriptions_open",
    "Live event subscriptions",
    multiprocess_mode="livesum",
)
EVENT_POOL_READS = Counter(
    "bettercompute_event_pool_reads_total",
    "Reads of the pool an event shows (`PoolEvent.pool`): one per event and view, however "
    "many subscribers share that view",
)
SUBSCRIPTIONS_REFUSED = Counter(
    "bettercompute_subscriptions_refused_total",
    "Subscriptions refused with RESOURCE_EXHAUSTED, by the bound they met (caller, tenant)",
    ["bound"],
)
BROKER_CONNECTED = Gauge(
    "bettercompute_broker_connected",
    "1 when the event broker subscription is up (per process; min across processes)",
    multiprocess_mode="livemin",
)
DB_STATEMENTS = Counter(
    "bettercompute_db_statements_total",
    "SQL statements sent to the database (BEGIN, COMMIT and pool pings not included), by the "
    "transport of the request that ran them (rest, graphql, http) or none (background "
    "tasks and websockets)",
    ["transport"],
)
RATE_LIMITED = Counter(
    "bettercompute_rate_limited_total",
    "Requests refused by the per-caller budget, by what ran out (requests, cost)",
    ["budget"],
)


def observe_request(transport: str, operation: str, duration_s: float, codes: list[str]) -> None:
    REQUESTS.labels(transport, operation).observe(duration_s)
    for code in codes:
        ERRORS.labels(transport, code).inc()


def instrument_engine(engine: AsyncEngine, role: str) -> None:
    """Pool checkouts, statements and transaction outcomes, from SQLAlchemy's events."""
    in_use = DB_IN_USE.labels(role)
    commits = DB_TRANSACTIONS.labels("commit")
    rollbacks = DB_TRANSACTIONS.labels("rollback")
    sync = engine.sync_engine

    @event.listens_for(sync.pool, "checkout")
    def _checkout(*_: Any) -> None:
        in_use.inc()

    @event.listens_for(sync.pool, "checkin")
    def _checkin(*_: Any) -> None:
        in_use.dec()

    @event.listens_for(sync, "commit")
    def _commit(_: Any) -> None:
        commits.inc()

    @event.listens_for(sync, "rollback")
    def _rollback(_: Any) -> None:
        rollbacks.inc()

    @event.listens_for(sync, "before_cursor_execute")
    def _statement(*_: Any) -> None:
        # SQLAlchemy runs the driver in a greenlet that carries the request's context.
        statement_sent()


_statements = {t: DB_STATEMENTS.labels(t) for t in ("rest", "graphql", "http", "none")}


# The transport of the request being served (app/observe.py sets it), for the counts.
request_transport: ContextVar[str] = ContextVar("request_transport", default="none")


def statement_sent() -> None:
    """One SQL statement, counted for the transport of the request that sent it: from the
    engines' events, and by the compiled reads' direct pool (app/db/direct.py)."""
    transport = request_transport.get()
    counter = _statements.get(transport)
    if counter is None:
        counter = _statements[transport] = DB_STATEMENTS.labels(transport)
    counter.inc()


def relay_delivered(occurred_at_s: float) -> None:
    RELAY_LATENCY.observe(max(0.0, time.time() - occurred_at_s))


def worker_stopped() -> None:
    """A worker that stops takes its live gauges (connections, websockets...) with it."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


async def metrics(_: Request) -> Response:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
