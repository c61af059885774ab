"""Prometheus metrics at `/metrics` (prometheus-client).

With `PROMETHEUS_MULTIPROC_DIR` set (`serve --workers N` sets it), every worker writes its
figures to files there and `/metrics` sums them, so one scrape of any worker sees the
whole server. Gauges say how they add up across processes (`multiprocess_mode`).

Only this service's own events are counted here; each update is a dictionary lookup and
an addition (a few microseconds per request).

Every label takes its values from a closed set, whatever a request sends: a label value
is a series kept for the life of the process and printed by every scrape, so one made
per request (a random path, a made-up operation name) would grow memory and the scrape
without bound. Transports, error codes and outcomes are listed here; REST methods come
from the catalog (app/observe.py); GraphQL operation names are kept up to a bound
(`OperationNames`), later ones counted as `other`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from app.errors import CODES

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
COMPILED_WRITES = Counter(
    "bettercompute_compiled_writes_total",
    "Bookings and releases tried as one statement (PostgreSQL, app/capacity/booking.py): "
    "answered by it, refused by it (quota, capacity, state), or declined to the plain path",
    ["write", "outcome"],
)
COMPILED_PLANS = Gauge(
    "bettercompute_compiled_plans",
    "GraphQL query texts with a compiled-read plan kept (schema/compiled_reads.py)",
    multiprocess_mode="livesum",
)
COMPILED_PLAN_BYTES = Gauge(
    "bettercompute_compiled_plan_bytes",
    "Bytes the compiled-read plans hold; at most BETTERCOMPUTE_COMPILED_PLAN_CACHE_BYTES "
    "per process",
    multiprocess_mode="livesum",
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
EVENT_POOL_COMPILED = Counter(
    "bettercompute_event_pool_compiled_total",
    "Reads of `PoolEvent.pool` with a compiled statement (Query.pool's): `answered` by it, "
    "or `declined` to the plain read in the same read (a pool no longer seen, a narrowed "
    "binding, a token no longer live...)",
    ["outcome"],
)
EVENT_RENDERINGS = Counter(
    "bettercompute_event_renderings_total",
    "Subscription events rendered by the fast executor (schema/executor.py): `executed` "
    "ran a GraphQL execution, `shared` reused the one an earlier subscriber's identical "
    "request ran for the same event (and view) through strawberry's pipeline, `frame` "
    "was sent that rendering's frame directly (schema/shared_frames.py); executed per "
    "event shows the sharing",
    ["how"],
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
    "Requests refused by a budget, by what ran out (requests, cost: the caller's; "
    "unauthenticated: a client address's, for requests without a valid token)",
    ["budget"],
)
RATE_LIMITS_ENFORCED = Gauge(
    "bettercompute_rate_limits_enforced",
    "1 while the rate limits are enforced; 0 while their store (Redis) does not answer and "
    "requests pass unlimited (per process; min across processes)",
    multiprocess_mode="livemin",
)


# The closed sets of label values (anything else is `OTHER`).
OTHER = "other"
TRANSPORTS = frozenset({"rest", "graphql", "http"})
# CONTRACT section 3, and the persisted-query refusals (schema/persisted.py).
ERROR_CODES = frozenset(CODES) | {
    "PERSISTED_QUERY_NOT_FOUND",
    "PERSISTED_QUERY_NOT_SUPPORTED",
    "PERSISTED_QUERY_NOT_ALLOWED",
}


class OperationNames:
    """The `operation` label of GraphQL requests: the first `bound` distinct names this
    process sees (the `fixed` ones not counted), then `other`. Names come only from
    authenticated requests (schema/view.py refuses the others before parsing), but any
    caller may send as many as it likes. Per process: `serve --workers N` may show up to
    N times `bound` in one scrape."""

    def __init__(self, bound: int, fixed: Iterable[str] = ()) -> None:
        self.bound = max(0, bound)
        self._fixed = frozenset(fixed)
        self._names: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._fixed or name in self._names:
            return name
        if len(self._names) < self.bound:
            self._names.add(name)
            return name
        return OTHER


# Each (transport, operation)'s histogram, looked up once: `labels` takes a lock and
# builds its key per call. As many as the label sets, which prometheus keeps anyway.
_request_durations: dict[tuple[str, str], Histogram] = {}


def observe_request(transport: str, operation: str, duration_s: float, codes: list[str]) -> None:
    """One request; `operation` is one of a closed set already (app/observe.py)."""
    if transport not in TRANSPORTS:
        transport = OTHER
    durations = _request_durations.get((transport, operation))
    if durations is None:
        durations = _request_durations[transport, operation] = REQUESTS.labels(transport, operation)
    durations.observe(duration_s)
    for code in codes:
        ERRORS.labels(transport, code if code in ERROR_CODES else OTHER).inc()


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


_statements = {t: DB_STATEMENTS.labels(t) for t in (*sorted(TRANSPORTS), "none", OTHER)}


# The transport of the request being served (app/observe.py sets it), for the counts.
request_transport: ContextVar[str] = ContextVar("request_transport", default="none")


def statement_sent() -> None:
    """One SQL statement, counted for the transport of the request that sent it: from the
    engines' events, and by the compiled reads' direct pool (app/db/direct.py)."""
    # A transport not listed is counted as `other`, not given a label of its own.
    _statements.get(request_transport.get(), _statements[OTHER]).inc()


def transaction_ended(outcome: str) -> None:
    """A transaction ended outside SQLAlchemy's `Connection` (app/db/lease.py), whose
    events count the rest (`instrument_engine`): "commit" or "rollback"."""
    DB_TRANSACTIONS.labels(outcome).inc()


def relay_delivered(occurred_at_s: float) -> None:
    RELAY_LATENCY.observe(max(0.0, time.time() - occurred_at_s))


def worker_stopped() -> None:
    """A worker that stops takes its live gauges (connections, websockets...) with it."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


class _Family(Collector):
    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterable[Metric]:
        return (self.family,)


async def _exposition() -> bytes:
    """One metric family at a time with the event loop free in between: a scrape never
    holds up the requests being served for longer than one family takes."""
    registry: Collector = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    parts = []
    for family in registry.collect():
        parts.append(generate_latest(_Family(family)))
        await asyncio.sleep(0)
    return b"".join(parts)


_making: asyncio.Task[bytes] | None = None


async def metrics(_: Request) -> Response:
    """Any client may scrape, as often as it likes: scrapes that arrive while one is
    being made share it (figures as of a moment after they were asked for)."""
    global _making
    if _making is None or _making.done() or _making.get_loop() is not asyncio.get_running_loop():
        _making = asyncio.create_task(_exposition())
    # Shielded: a client that goes away does not cancel the others' scrape.
    body = await asyncio.shield(_making)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
