"""`poolEvents` through a real uvicorn server and a real GraphQL client (gql over
websockets), on both protocols: graphql-transport-ws and the legacy graphql-ws."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from gql import Client, GraphQLRequest
from gql.transport.exceptions import TransportQueryError
from gql.transport.websockets import WebsocketsTransport
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.applications import Starlette

from app.config import Settings
from app.db.engine import Database
from app.events.reader import outbox_bounds
from tests.events.conftest import served
from tests.events.support import wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet, by_size

POOL_EVENTS = """
subscription($tenantId: String!, $poolId: ID, $types: [String!], $after: String) {
  poolEvents(tenantId: $tenantId, poolId: $poolId, types: $types, after: $after) {
    cursor type poolId tenantId occurredAt data
    pool { id version owned archived quotas { resource max } }
  }
}
"""
LIGHT_EVENTS = """
subscription($tenantId: String!, $after: String) {
  poolEvents(tenantId: $tenantId, after: $after) { cursor type data }
}
"""
# Bounds on a hang, not on the speed: a busy machine may be many times slower.
WAIT_S = 60
PROTOCOLS = [
    pytest.param(WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL, id="graphql-transport-ws"),
    pytest.param(WebsocketsTransport.APOLLO_SUBPROTOCOL, id="graphql-ws"),
]


class Stream:
    """One gql subscription read in the background; `next()` waits for the next event."""

    def __init__(self, client: Client, document: str = POOL_EVENTS, **variables: Any) -> None:
        self._queue: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(client, document, variables))

    async def _run(self, client: Client, document: str, variables: dict[str, Any]) -> None:
        try:
            async with client as session:
                request = GraphQLRequest(document, variable_values=variables)
                async for result in session.subscribe(request):
                    await self._queue.put(result["poolEvents"])
        except Exception as exc:  # handed to the reader
            await self._queue.put(exc)

    async def next(self) -> dict[str, Any]:
        item = await asyncio.wait_for(self._queue.get(), WAIT_S)
        if isinstance(item, BaseException):
            raise item
        return item

    def pending(self) -> int:
        return self._queue.qsize()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def ws_client(address: str, token: str, protocol: str) -> Client:
    transport = WebsocketsTransport(
        url=f"ws://{address}/graphql",
        init_payload={"authorization": f"Bearer {token}"},
        subprotocols=[protocol],
        connect_timeout=WAIT_S,
        ack_timeout=WAIT_S,
    )
    return Client(transport=transport)


async def subscribed(app: Starlette, count: int) -> None:
    """Until `count` subscriptions are streaming: events from now on reach them."""
    await wait_until(lambda: app.state.relay.subscriptions >= count, within_s=WAIT_S)


async def a_created_event_streams(
    app: Starlette, address: str, fleet: Fleet, protocol: str
) -> None:
    """Over `protocol`, a subscriber of a new tenant receives its first pool's creation."""
    async with http_api(address) as api:
        s = await Scene.start(api, fleet)
        stream = Stream(ws_client(address, s.token, protocol), LIGHT_EVENTS, tenantId="acme")
        try:
            await subscribed(app, 1)
            await s.pool()
            assert (await stream.next())["type"] == "pool.created"
        finally:
            await stream.close()


@asynccontextmanager
async def http_api(address: str) -> AsyncIterator[Api]:
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=WAIT_S) as client:
        yield Api(client)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_subscribers_follow_a_pool_through_its_life(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        beta_token = await s.guest("beta")
        owner = Stream(ws_client(address, s.token, protocol), tenantId="acme")
        beta = Stream(ws_client(address, beta_token, protocol), tenantId="beta")
        await subscribed(app, 2)

        pool_id = (await s.pool(gpuModel="H100"))["id"]
        created = await owner.next()
        assert (created["type"], created["poolId"], created["tenantId"]) == (
            "pool.created",
            pool_id,
            "acme",
        )
        assert created["data"]["version"] == 1 and created["occurredAt"].endswith("Z")
        assert created["pool"] == {
            "id": pool_id,
            "version": 1,
            "owned": True,
            "archived": False,
            "quotas": [{"resource": "gpu", "max": 2147483647}],
        }

        await s.offer(pool_id, "beta", {"gpu": 3})
        for stream in (owner, beta):
            offered = await stream.next()
            assert offered["type"] == "pool.offered" and offered["data"]["toTenantId"] == "beta"
        # `pool` as each subscriber sees it: beta's own quota rows, not owned.
        assert offered["pool"]["owned"] is False
        assert offered["pool"]["quotas"] == [{"resource": "gpu", "max": 3}]

        await s.unoffer(pool_id, "beta")
        unoffered = await beta.next()
        assert unoffered["type"] == "pool.unoffered" and unoffered["pool"] is None
        await s.archive(pool_id)
        assert [(await owner.next())["type"] for _ in range(2)] == [
            "pool.unoffered",
            "pool.archived",
        ]
        await asyncio.sleep(0.3)
        assert beta.pending() == 0  # nothing more of that pool for beta

        # Resume after the offer: exactly the later events, in order.
        resumed = Stream(
            ws_client(address, s.token, protocol), tenantId="acme", after=created["cursor"]
        )
        assert [(await resumed.next())["type"] for _ in range(3)] == [
            "pool.offered",
            "pool.unoffered",
            "pool.archived",
        ]
        for stream in (owner, beta, resumed):
            await stream.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_refused_subscriptions_carry_their_codes(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    async with served(Settings(database_url=database_url)) as (_, address):
        await fleet.tenant("acme")
        await fleet.tenant("beta")
        token = await fleet.caller("acme", "viewer")
        cases = [
            ({"tenantId": "acme", "after": "garbage"}, "INVALID_INPUT"),
            ({"tenantId": "acme", "types": ["pool.nope"]}, "INVALID_INPUT"),
            ({"tenantId": "beta"}, "PERMISSION_DENIED"),
            ({"tenantId": "nobody"}, "PERMISSION_DENIED"),
        ]
        for variables, code in cases:
            stream = Stream(ws_client(address, token, protocol), **variables)
            with pytest.raises(TransportQueryError) as refused:
                await stream.next()
            assert refused.value.errors is not None
            assert refused.value.errors[0]["extensions"]["code"] == code
            await stream.close()


@pytest.mark.parametrize("dialect", ["postgresql"])  # the transaction-id horizon
async def test_a_new_subscription_skips_what_committed_before_it_behind_a_held_horizon(
    database_url: str, db: Database
) -> None:
    """A subscription opened while a longer transaction holds the horizon back (here one
    that only holds a transaction id; on a shared server, any database's writer) starts
    after every change committed before it opened, those still above the horizon too:
    the first event it receives is the first change made after it."""
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, Fleet(db))
        pool_id = (await s.pool())["id"]
        holder = AsyncSession(db.writer)
        try:
            await holder.execute(text("SELECT pg_current_xact_id()"))
            before = s.body(pool_id, policy={"hugepages": {"2Mi": 1}})
            assert (await api.ok(s.token, "pools/update", before))["pool"]["version"] == 2
            protocol = WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL
            stream = Stream(ws_client(address, s.token, protocol), LIGHT_EVENTS, tenantId="acme")
            await subscribed(app, 1)
        finally:
            await holder.rollback()
            await holder.close()
        after = s.body(pool_id, policy={"hugepages": {"2Mi": 2}})
        await api.ok(s.token, "pools/update", after)
        try:
            assert (await stream.next())["data"]["version"] == 3
        finally:
            await stream.close()


@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
@by_size("changes", 100, 500)
async def test_disconnect_500_changes_reconnect_with_the_last_cursor(
    database_url: str, db: Database, changes: int
) -> None:
    """Exactly those 500 (100 in the default run), in order, then live again."""
    protocol = WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL
    settings = Settings(database_url=database_url)
    async with served(settings) as (app, address), http_api(address) as api:
        s = await Scene.start(api, Fleet(db))
        pool_id = (await s.pool())["id"]
        first = Stream(ws_client(address, s.token, protocol), LIGHT_EVENTS, tenantId="acme")
        await subscribed(app, 1)
        await api.ok(s.token, "pools/update", s.body(pool_id, policy={}))
        last = await first.next()
        await first.close()  # disconnected

        async def change(n: int) -> None:
            body = s.body(pool_id, policy={"hugepages": {"2Mi": n}})
            await api.ok(s.token, "pools/update", body)

        for start in range(0, changes, 10):
            await asyncio.gather(*(change(n) for n in range(start, start + 10)))

        resumed = Stream(
            ws_client(address, s.token, protocol),
            LIGHT_EVENTS,
            tenantId="acme",
            after=last["cursor"],
        )
        missed = [await resumed.next() for _ in range(changes)]
        assert [e["type"] for e in missed] == ["pool.updated"] * changes
        # commit order
        assert [e["data"]["version"] for e in missed] == list(range(3, 3 + changes))
        await api.ok(s.token, "pools/update", s.body(pool_id, policy={}))
        assert (await resumed.next())["data"]["version"] == 3 + changes
        await asyncio.sleep(0.3)
        assert resumed.pending() == 0
        await resumed.close()


async def test_an_expired_cursor_is_invalid_state_with_its_reason(
    database_url: str, fleet: Fleet
) -> None:
    """Older than the retention window: INVALID_STATE, `extensions.reason` CURSOR_EXPIRED,
    naming the `after` argument (docs/events.md)."""
    settings = Settings(database_url=database_url, event_retention_s=1)
    async with served(settings) as (app, address), http_api(address) as api:
        s = await Scene.start(api, fleet)
        watching = Stream(
            ws_client(address, s.token, WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL),
            LIGHT_EVENTS,
            tenantId="acme",
        )
        await subscribed(app, 1)
        pool_id = (await s.pool())["id"]
        first = await watching.next()
        for _ in range(2):  # the first of these is what the cursor would miss
            await api.ok(s.token, "pools/update", s.body(pool_id, policy={}))
            await watching.next()
        await watching.close()
        capacity = app.state.capacity
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # pruned within seconds; the newest event stays
            async with capacity.db.reader.connect() as conn:
                bounds = await outbox_bounds(conn)
            if bounds.oldest == bounds.newest:
                break
            await asyncio.sleep(0.1)
        stream = Stream(
            ws_client(address, s.token, WebsocketsTransport.APOLLO_SUBPROTOCOL),
            LIGHT_EVENTS,
            tenantId="acme",
            after=first["cursor"],
        )
        with pytest.raises(TransportQueryError) as expired:
            await stream.next()
        assert expired.value.errors is not None
        assert expired.value.errors[0]["extensions"] == {
            "code": "INVALID_STATE",
            "field": "after",
            "reason": "CURSOR_EXPIRED",
        }
        await stream.close()
