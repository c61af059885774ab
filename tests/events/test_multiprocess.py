"""Two `bettercompute serve` processes over one PostgreSQL and one Redis: subscribers
spread over both, mutations spread over both (full size, `soak`: 50 subscribers and 2,000
mutations; the default run: 9 and 150). Every subscriber receives exactly
the events its tenant may see (CONTRACT section 7: the events whose audience names it),
each once, every pool's in commit order, and none of another tenant's. (Events of different
pools have no fleet-wide order: one committed above the transaction-id horizon is
delivered before an older transaction's, ADR 0012.)"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from app.db.engine import Database
from app.events.cursor import encode_cursor
from app.events.reader import outbox_bounds, read_events
from tests.events.processes import Served, bettercompute_serve
from tests.events.support import visible_outbox, wait_until
from tests.support import Api, Fleet, by_size


@dataclass(frozen=True)
class Size:
    tenants: list[str]
    subscribers_per_tenant: int
    mutations: int
    workers: int


SIZES = {
    "default": Size([f"t{i}" for i in range(3)], 3, 150, 6),
    "full": Size([f"t{i}" for i in range(10)], 5, 2000, 16),
}
# A busy machine may keep a call or a handshake waiting for many seconds: these bound a
# hang, not the speed.
TIMEOUT_S = 120
DOCUMENT = """subscription($tenantId: String!, $after: String) {
  poolEvents(tenantId: $tenantId, after: $after) { cursor type poolId occurredAt }
}"""


class Subscriber:
    """A gql client on one server, reading its stream into `cursors`."""

    def __init__(self, address: str, token: str, tenant: str, after: str, protocol: str) -> None:
        self.tenant = tenant
        self.cursors: list[str] = []
        self.events: list[tuple[str, str, datetime]] = []  # (type, pool, occurredAt)
        self.error: BaseException | None = None
        transport = WebsocketsTransport(
            url=f"ws://{address}/graphql",
            init_payload={"authorization": f"Bearer {token}"},
            subprotocols=[protocol],
            connect_timeout=TIMEOUT_S,
            ack_timeout=TIMEOUT_S,
        )
        request = GraphQLRequest(DOCUMENT, variable_values={"tenantId": tenant, "after": after})
        self.task = asyncio.create_task(self._run(Client(transport=transport), request))

    async def _run(self, client: Client, request: GraphQLRequest) -> None:
        try:
            async with client as session:
                async for result in session.subscribe(request):
                    event = result["poolEvents"]
                    self.cursors.append(event["cursor"])
                    occurred = datetime.fromisoformat(event["occurredAt"])
                    self.events.append((event["type"], event["poolId"], occurred))
        except Exception as exc:  # reported by the test
            self.error = exc

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _per_pool(events: list[tuple[str, str, datetime]]) -> dict[str, list[tuple[str, datetime]]]:
    """Each pool's events in the order given: commit order, for the committed list."""
    found: dict[str, list[tuple[str, datetime]]] = defaultdict(list)
    for kind, pool_id, occurred in events:
        found[pool_id].append((kind, occurred))
    return dict(found)


@asynccontextmanager
async def two_servers(database_url: str, redis_url: str) -> AsyncIterator[list[Served]]:
    env = {"BETTERCOMPUTE_DATABASE_URL": database_url, "BETTERCOMPUTE_BROADCAST_URL": redis_url}
    async with AsyncExitStack() as stack:
        servers = await asyncio.gather(
            stack.enter_async_context(bettercompute_serve(**env)),
            stack.enter_async_context(bettercompute_serve(**env)),
        )
        yield list(servers)


async def mutate(
    size: Size, apis: list[Api], tokens: dict[str, str], pools: dict[str, list[str]]
) -> int:
    """`size.mutations` owner calls (update, offer, unoffer) from `size.workers` concurrent
    clients, alternating between the servers; returns how many succeeded."""
    rng = random.Random(11)
    plan = []
    for n in range(size.mutations):
        owner = rng.choice(size.tenants)
        pool_id = rng.choice(pools[owner])
        guest = rng.choice([t for t in size.tenants if t != owner])
        kind = rng.choices(["update", "offer", "unoffer"], weights=[5, 3, 2])[0]
        body: dict[str, Any] = {"tenantId": owner, "poolId": pool_id}
        if kind == "update":
            body["policy"] = {"hugepages": {"2Mi": n % 64}}
        elif kind == "offer":
            body |= {"toTenantId": guest, "quota": {"gpu": 1 + n % 4}}
        else:
            body["toTenantId"] = guest
        plan.append((apis[n % len(apis)], tokens[owner], f"pools/{kind}", body))
    queue: asyncio.Queue[tuple[Api, str, str, dict[str, Any]]] = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)
    done = 0

    async def worker() -> None:
        nonlocal done
        while not queue.empty():
            api, token, path, body = queue.get_nowait()
            await api.ok(token, path, body)
            done += 1

    await asyncio.gather(*(worker() for _ in range(size.workers)))
    return done


@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
@by_size("size", "default", "full")
async def test_two_processes_deliver_each_tenant_exactly_its_events(
    database_url: str, db: Database, redis_url: str, size: str
) -> None:
    await _run(SIZES[size], database_url, db, redis_url)


async def _run(size: Size, database_url: str, db: Database, redis_url: str) -> None:
    fleet = Fleet(db)
    tokens: dict[str, str] = {}
    sites: dict[str, str] = {}
    for tenant in size.tenants:
        await fleet.tenant(tenant)
        sites[tenant] = await fleet.site(tenant)
        tokens[tenant] = await fleet.caller(tenant, "admin")

    async with (
        two_servers(database_url, redis_url) as servers,
        httpx.AsyncClient(base_url=f"http://{servers[0].address}", timeout=TIMEOUT_S) as first,
        httpx.AsyncClient(base_url=f"http://{servers[1].address}", timeout=TIMEOUT_S) as second,
    ):
        apis = [Api(first), Api(second)]
        pools: dict[str, list[str]] = {}
        for i, tenant in enumerate(size.tenants):
            body = {"tenantId": tenant, "siteId": sites[tenant], "class": "metal-host"}
            pools[tenant] = [
                (await apis[(i + k) % 2].ok(tokens[tenant], "pools/create", body))["pool"]["id"]
                for k in range(2)
            ]
        # Else "newest" may be short of the last commit.
        async with visible_outbox(db) as conn:
            start = (await outbox_bounds(conn)).newest
        # Every subscriber resumes after the same cursor, so none misses the first mutations
        # however long its connection takes.
        protocols = [
            WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL,
            WebsocketsTransport.APOLLO_SUBPROTOCOL,
        ]
        subscribers = [
            Subscriber(
                servers[n % 2].address,
                tokens[tenant],
                tenant,
                encode_cursor(start),
                protocols[(n // 2) % 2],
            )
            for tenant in size.tenants
            for n in range(size.subscribers_per_tenant)
        ]

        assert await mutate(size, apis, tokens, pools) == size.mutations

        async with visible_outbox(db) as conn:
            committed = await read_events(conn, start, limit=100_000)
        expected = {
            tenant: [(e.type, e.pool_id, e.occurred_at) for e in committed if tenant in e.audience]
            for tenant in size.tenants
        }
        await wait_until(
            lambda: all(
                s.error is not None or len(s.events) >= len(expected[s.tenant]) for s in subscribers
            ),
            within_s=300,
        )
        await asyncio.sleep(0.5)  # anything extra would arrive now
        for s in subscribers:
            assert s.error is None, s.error
            assert len(set(s.cursors)) == len(s.cursors), s.tenant  # no cursor twice
            assert Counter(s.events) == Counter(expected[s.tenant]), s.tenant  # each once
            assert _per_pool(s.events) == _per_pool(expected[s.tenant]), s.tenant
            await s.close()
        # the audiences did overlap
        assert sum(len(v) for v in expected.values()) > size.mutations
