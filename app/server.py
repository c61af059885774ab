"""Starlette assembly: REST shims (and GraphQL), one Capacity domain per process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import create_database
from app.events.bus import EventBus
from app.events.relay import relay_for
from app.rest.errors import error_response
from app.rest.responses import JSONResponse
from app.rest.routes import routes


async def healthz(_: Request) -> Response:
    return JSONResponse({"ok": True})


async def _unhandled(_: Request, exc: Exception) -> Response:
    return error_response(exc)


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        db = create_database(settings.database_url)
        bus = EventBus(settings.broadcast_url, probe_interval_s=settings.broker_probe_interval_s)
        relay = relay_for(db, settings)
        bus.add_listener(relay.wake)
        await relay.start()
        await bus.connect()
        app.state.settings = settings
        app.state.bus = bus
        app.state.relay = relay
        app.state.capacity = Capacity(db, bus.notify)
        try:
            yield
        finally:
            await bus.disconnect()
            await relay.stop()
            await db.dispose()

    return Starlette(
        routes=[*routes(), Route("/healthz", healthz)],
        lifespan=lifespan,
        exception_handlers={Exception: _unhandled},
    )


def app_from_env() -> Starlette:
    """The uvicorn factory: `uvicorn --factory app.server:app_from_env`."""
    return create_app()
