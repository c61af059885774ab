"""Starlette assembly: REST shims (and GraphQL), one Capacity domain per process."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from app import compat, tracing
from app.capacity.event_visibility import PoolEventVisibility
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import create_database
from app.events.bounds import SubscriptionBounds
from app.events.bus import EventBus
from app.events.relay import relay_for
from app.health import livez, readyz
from app.http.admission import Admission
from app.http.body_limit import BodyLimit
from app.http.responses import JSONResponse
from app.iam.revocations import RevocationWatcher
from app.metrics import instrument_engine, metrics, worker_stopped
from app.observe import Observe
from app.rate_limit import RateLimiter
from app.rest.errors import error_response, http_error
from app.rest.routes import routes
from app.security_headers import PAGE_BASE, SecurityHeaders
from schema import shared_frames
from schema.app import build_schema
from schema.graphiql import assets_endpoint
from schema.view import GraphQLView


async def healthz(_: Request) -> Response:
    return JSONResponse({"ok": True})


CONSOLE_DIR = Path(__file__).resolve().parent / "console"


# The console loads its script and styles from /console/static and talks to /graphql
# (fetch and the websocket) on this origin; nothing inline, nothing else.
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    f"img-src 'self'; {PAGE_BASE}; form-action 'none'"
)


async def console_page(_: Request) -> Response:
    """The live console (app/console/): static HTML and JavaScript, no build step."""
    return FileResponse(
        CONSOLE_DIR / "index.html", headers={"content-security-policy": CONSOLE_CSP}
    )


async def _unhandled(_: Request, exc: Exception) -> Response:
    return error_response(exc)


_gc_tuned = False


def tune_gc() -> None:
    """Once per process, after start-up: move everything built so far (modules, the
    schema, engines) out of the collector's sight, and collect the youngest generation
    less often. A large GraphQL answer allocates tens of thousands of short-lived objects;
    with the defaults the collector ran dozens of times per request, rescanning that
    long-lived heap, and throughput fell as concurrency rose (docs/performance.md)."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    traced = tracing.enabled()  # OTEL_TRACES_EXPORTER (app/tracing.py)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        db = create_database(settings.database_url, settings)
        bus = EventBus(settings.broadcast_url, probe_interval_s=settings.broker_probe_interval_s)
        if traced:
            tracing.instrument_clients(db)
        instrument_engine(db.writer, "writer")
        if db.reader is not db.writer:
            instrument_engine(db.reader, "reader")
        events = PoolEventVisibility()
        relay = relay_for(db, settings, events)
        bus.add_listener(relay.wake)
        revocations = RevocationWatcher(db, settings.revocation_poll_interval_s)
        bus.add_revocation_listener(revocations.wake)
        await revocations.start()
        await relay.start()
        await bus.connect()
        app.state.settings = settings
        app.state.db = db
        app.state.bus = bus
        app.state.relay = relay
        app.state.revocations = revocations
        app.state.subscription_bounds = SubscriptionBounds(
            settings.max_subscriptions_per_caller, settings.max_subscriptions_per_tenant
        )
        app.state.rate_limiter = limiter = RateLimiter(settings)
        # The admission of every request and websocket operation (app/http/admission.py).
        app.state.admission = Admission(settings, limiter)
        app.state.capacity = Capacity(
            db, bus.notify, relay=relay, events=events, event_pool_reads=settings.event_pool_reads
        )
        tune_gc()
        try:
            yield
        finally:
            await limiter.close()
            await bus.disconnect()
            await relay.stop()
            await revocations.stop()
            await db.dispose()
            if traced:
                tracing.uninstrument_clients()
            worker_stopped()

    # The fast path's pieces that can run with these libraries (one warning for each
    # that cannot), then one endpoint for queries, mutations (POST; GET for queries) and
    # both websocket protocols (graphql-transport-ws, graphql-ws); GraphiQL in a browser.
    pieces = compat.check(settings)
    graphql = GraphQLView(
        build_schema(settings, tracing=traced, fast_executor=pieces.executor),
        settings,
        our_websocket_handlers=pieces.websocket_handlers,
        tracing=traced,
        shared_frames=pieces.executor
        and pieces.websocket_handlers
        and compat.usable(
            "shared event frames",
            shared_frames.strawberry_frame_problem,
            "every subscriber's event goes through strawberry's pipeline",
        ),
    )
    middleware = [
        # Outermost: request ids, metrics and logs see every answer.
        Middleware(Observe, max_operations=settings.metrics_max_operations),
        Middleware(SecurityHeaders),  # nosniff, no framing, a CSP (app/security_headers.py)
        Middleware(BodyLimit, max_bytes=settings.max_body_bytes),
    ]
    if settings.allowed_origins:
        # Browser dashboards on those origins (REST and /graphql, preflight included);
        # off when none is configured. Outside the body limit, so refusals carry them too.
        middleware.insert(
            1,
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.allowed_origins),
                allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                allow_headers=["authorization", "content-type", "accept"],
                expose_headers=[
                    "retry-after",
                    "x-request-id",
                    "x-ratelimit-limit",
                    "x-ratelimit-remaining",
                    "x-ratelimit-used",
                    "x-ratelimit-reset",
                    "x-ratelimit-resource",
                ],
                max_age=600,
            ),
        )
    app = Starlette(
        routes=[
            # The busiest path first: routes are matched in order.
            Route("/graphql", graphql, methods=["GET", "POST"]),
            WebSocketRoute("/graphql", graphql),
            *routes(),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/livez", livez),
            Route("/metrics", metrics),
            # GraphiQL's pinned assets (schema/graphiql.py) and the live console page.
            Route("/assets/{path:path}", assets_endpoint(settings.web_assets_dir)),
            Route("/console", console_page),
            Mount("/console/static", StaticFiles(directory=CONSOLE_DIR)),
        ],
        lifespan=lifespan,
        middleware=middleware,
        exception_handlers={HTTPException: http_error, Exception: _unhandled},
    )
    if traced:
        tracing.instrument_app(app)
    return app


def app_from_env() -> Starlette:
    """The uvicorn factory: `uvicorn --factory app.server:app_from_env`."""
    return create_app()
