"""Fixtures for the event tests: apps with event settings, a PostgreSQL-only database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest_asyncio
import uvicorn
from starlette.applications import Starlette

from app.compat import http_protocol, websocket_protocol
from app.config import Settings
from app.server import create_app
from tests.events.brokers import free_port
from tests.support import Api

AppFactory = Callable[..., AbstractAsyncContextManager[Starlette]]


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[Starlette, Api]]:
    """The real app with its lifespan running, and a REST client for it."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield application, Api(client)


@asynccontextmanager
async def uvicorn_running(config: uvicorn.Config) -> AsyncIterator[uvicorn.Server]:
    """A real uvicorn server on `config`, serving in a task of this loop until the block
    ends."""
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                serving.result()
                raise RuntimeError("uvicorn exited before it started")
            await asyncio.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        await serving


@asynccontextmanager
async def served_by(
    settings: Settings, http: type[asyncio.Protocol] | None = None
) -> AsyncIterator[tuple[Starlette, uvicorn.Server, str]]:
    """The app behind a real uvicorn server on a free port, with the protocols `serve`
    picks (`http` in place of its HTTP protocol): (app, the server, whose state holds each
    connection's protocol, "127.0.0.1:port")."""
    application = create_app(settings)
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=free_port(),
        http=http or http_protocol(settings),  # as `bettercompute serve`
        ws=websocket_protocol(settings),
        ws_per_message_deflate=False,
        lifespan="on",
        log_level="warning",
    )
    async with uvicorn_running(config) as server:
        yield application, server, f"127.0.0.1:{config.port}"


@asynccontextmanager
async def served(
    settings: Settings, http: type[asyncio.Protocol] | None = None
) -> AsyncIterator[tuple[Starlette, str]]:
    """`served_by` without the server: (app, "127.0.0.1:port")."""
    async with served_by(settings, http) as (application, _, address):
        yield application, address


@pytest_asyncio.fixture(loop_scope="session")
async def app_with(database_url: str) -> AppFactory:
    """`async with app_with(subscriber_queue_size=5) as app:` the real app, lifespan
    running, on this test's database, with some settings changed."""

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[Starlette]:
        application = create_app(Settings(database_url=database_url, **overrides))
        async with application.router.lifespan_context(application):
            yield application

    return start
