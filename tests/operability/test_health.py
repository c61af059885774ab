"""`/livez` checks nothing outside the process; `/readyz` also says whether the event
relay has caught up with the newest committed event."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import make_url

from app.config import Settings
from tests.db.faults import StallingSQLite
from tests.events.conftest import running
from tests.rest.scene import Scene
from tests.support import Fleet

DEADLINE_S = 30.0


async def test_readyz_is_not_ready_while_the_relay_is_behind(
    database_url: str, fleet: Fleet
) -> None:
    settings = Settings(database_url=database_url, readiness_relay_lag_s=0.5)
    async with running(settings) as (app, api):
        scene = await Scene.start(api, fleet)
        ready = await api.client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {
            "ready": True,
            "checks": {"database": "ok", "broker": "ok", "relay": "ok"},
            "rateLimits": "on",
        }
        # The relay stops relaying; a write commits an event it will not deliver.
        relay = app.state.relay
        await relay.stop()
        await scene.pool()
        assert relay.lag >= 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while (answer := await api.client.get("/readyz")).status_code == 200:
            assert loop.time() < deadline, answer.text
            await asyncio.sleep(0.1)
        assert answer.status_code == 503
        assert answer.json()["checks"] == {"database": "ok", "broker": "ok", "relay": "unavailable"}
        assert answer.headers["retry-after"]
        live = await api.client.get("/livez")
        assert (live.status_code, live.json()) == (200, {"ok": True})
        # Relaying again, it catches up and is ready.
        await relay.start()
        deadline = loop.time() + DEADLINE_S
        # Ready once it relays again; level once the event is below the horizon (another
        # transaction of this database may hold that back a moment longer).
        while (answer := await api.client.get("/readyz")).status_code != 200 or relay.lag:
            assert loop.time() < deadline, (answer.text, relay.lag)
            await asyncio.sleep(0.1)


async def test_readyz_is_not_ready_while_the_sqlite_file_is_stalled(
    database_url: str, dialect: str
) -> None:
    """On SQLite the database check reads the file: `SELECT 1` answered while another
    process held the WAL index's read locks and every read of the store failed."""
    if dialect != "sqlite":
        pytest.skip("a stalled file is SQLite's fault; PostgreSQL's are in tests/db")
    settings = Settings(database_url=database_url, readiness_timeout_s=0.5)
    async with running(settings) as (_, api):
        ready = await api.client.get("/readyz")
        assert ready.status_code == 200, ready.text
        stalling = StallingSQLite(make_url(database_url).database or "")
        await stalling.start()
        try:
            await stalling.stall()
            loop = asyncio.get_running_loop()
            began = loop.time()
            answer = await api.client.get("/readyz")
            took = loop.time() - began
            assert answer.status_code == 503, answer.text
            assert answer.json()["checks"]["database"] == "unavailable"
            assert took < settings.readiness_timeout_s + 2.0, took  # bounded, not SQLite's 10 s
            live = await api.client.get("/livez")
            assert live.status_code == 200
        finally:
            await stalling.resume()
            await stalling.close()
        # The file answers again: ready once the stalled probe has given up.
        deadline = loop.time() + DEADLINE_S
        while (answer := await api.client.get("/readyz")).status_code != 200:
            assert loop.time() < deadline, answer.text
            await asyncio.sleep(0.1)
