"""`/livez` checks nothing outside the process; `/readyz` also says whether the event
relay has caught up with the newest committed event."""

from __future__ import annotations

import asyncio

from app.config import Settings
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
