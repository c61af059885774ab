"""A subscriber whose request was rendered for an event already gets that rendering as
one frame written straight to its socket (schema/shared_frames.py), and that frame is
exactly what strawberry's pipeline sends, on both protocols. Raw websocket clients of a
real uvicorn server, so the frames are compared as the bytes that came over the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from websockets.asyncio.client import ClientConnection, connect

from app.config import Settings
from schema import shared_frames
from schema.shared_frames import FrameWriter
from tests.events.conftest import served
from tests.events.support import emit_updates, wait_until
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene
from tests.support import Fleet

WAIT_S = 60
SAME = 'subscription { poolEvents(tenantId: "acme") { cursor type data } }'
OTHER = 'subscription { poolEvents(tenantId: "acme") { cursor type occurredAt } }'
WITH_POOL = 'subscription { poolEvents(tenantId: "acme") { cursor type data pool { id } } }'
START = {"graphql-transport-ws": "subscribe", "graphql-ws": "start"}
RESULT = {"graphql-transport-ws": "next", "graphql-ws": "data"}


@asynccontextmanager
async def raw_subscriber(
    address: str, token: str, protocol: str, document: str, operation_id: str
) -> AsyncIterator[ClientConnection]:
    async with connect(f"ws://{address}/graphql", subprotocols=[protocol]) as ws:  # type: ignore[list-item]
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}})
        )
        while json.loads(await ws.recv())["type"] != "connection_ack":
            pass
        await ws.send(
            json.dumps(
                {"type": START[protocol], "id": operation_id, "payload": {"query": document}}
            )
        )
        yield ws


async def results(ws: ClientConnection, protocol: str, count: int) -> list[str]:
    """The next `count` result frames, as the text that arrived (keep-alives skipped)."""
    frames: list[str] = []
    while len(frames) < count:
        text = await asyncio.wait_for(ws.recv(), WAIT_S)
        assert isinstance(text, str)
        if json.loads(text)["type"] == RESULT[protocol]:
            frames.append(text)
    return frames


async def deliver(
    database_url: str, fleet: Fleet, protocol: str, events: int = 2, same: str = SAME
) -> list[list[str]]:
    """Three subscribers of one document (`same`) and one of another, each on its own
    socket with its own operation id; `events` updates; the frames each received."""
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool())["id"]
        plan = [(same, "a"), (same, "bb"), (same, 'c"3'), (OTHER, "d")]
        async with (
            raw_subscriber(address, s.token, protocol, *plan[0]) as a,
            raw_subscriber(address, s.token, protocol, *plan[1]) as b,
            raw_subscriber(address, s.token, protocol, *plan[2]) as c,
            raw_subscriber(address, s.token, protocol, *plan[3]) as d,
        ):
            relay = app.state.relay
            await wait_until(lambda: relay.live_subscriptions >= len(plan), within_s=WAIT_S)
            await emit_updates(app.state.capacity, pool_id, "acme", events)
            return [await results(ws, protocol, events) for ws in (a, b, c, d)]


def without_id(frame: str, operation_id: str) -> str:
    encoded = json.dumps(operation_id)
    assert frame.count(f'"id":{encoded}') == 1, frame
    return frame.replace(f'"id":{encoded}', '"id":"_"')


def sent_counter(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    send = FrameWriter.send

    async def counted(self: FrameWriter, payload: str) -> None:
        sent.append(payload)
        await send(self, payload)

    monkeypatch.setattr(FrameWriter, "send", counted)
    return sent


def check_frames(received: list[list[str]], protocol: str) -> None:
    """Every subscriber of SAME got the same bytes, its own id apart; the OTHER one got
    its own rendering; each frame is a result of its protocol with the event's data."""
    same = [
        [without_id(f, i) for f in frames]
        for frames, i in zip(received[:3], ("a", "bb", 'c"3'), strict=True)
    ]
    assert same[0] == same[1] == same[2]
    for n, frame in enumerate(same[0]):
        message = json.loads(frame)
        assert message["type"] == RESULT[protocol]
        assert message["payload"]["data"]["poolEvents"]["data"] == {"n": n}
        assert set(message["payload"]) == {"data"}
    other = [json.loads(f)["payload"]["data"]["poolEvents"] for f in received[3]]
    assert [set(e) for e in other] == [{"cursor", "type", "occurredAt"}] * len(other)


@pytest.mark.fast_path  # the shared frames need the fast executor's renderings
@pytest.mark.parametrize("protocol", ["graphql-transport-ws", "graphql-ws"])
async def test_a_shared_frame_is_the_frame_strawberry_sends(
    database_url: str, fleet: Fleet, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sent_counter(monkeypatch)
    received = await deliver(database_url, fleet, protocol)
    check_frames(received, protocol)
    # Per event, one of SAME's three subscribers took strawberry's pipeline (the first
    # to ask renders it); the other two were sent the shared frame. OTHER is alone.
    assert len(sent) == 2 * 2


@pytest.mark.fast_path
async def test_subscribers_reading_pool_are_sent_the_frame_whose_read_they_awaited(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `pool` selected, the rendering awaits its read: subscribers of the same view
    and request arriving meanwhile await that one and are sent its frame."""
    sent = sent_counter(monkeypatch)
    received = await deliver(database_url, fleet, "graphql-transport-ws", same=WITH_POOL)
    same = [
        [without_id(f, i) for f in frames]
        for frames, i in zip(received[:3], ("a", "bb", 'c"3'), strict=True)
    ]
    assert same[0] == same[1] == same[2]
    pools = [json.loads(f)["payload"]["data"]["poolEvents"]["pool"] for f in same[0]]
    assert len(pools) == 2 and all(p is not None and set(p) == {"id"} for p in pools)
    assert len(sent) == 2 * 2


@pytest.mark.fast_path
async def test_strawberry_sends_every_frame_when_the_shared_ones_cannot_run(
    database_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the start-up check finds them unusable (tests/test_compat.py changes
    strawberry's send path), every subscriber goes through strawberry's pipeline and
    receives the same frames."""
    monkeypatch.setattr(shared_frames, "strawberry_frame_problem", lambda: "changed")
    sent = sent_counter(monkeypatch)
    received = await deliver(database_url, fleet, "graphql-transport-ws")
    check_frames(received, "graphql-transport-ws")
    assert sent == []
