"""Per-pool order and exactly-once over three processes, with rollbacks and kills (issue 20,
docs/decisions/0012-commit-ordered-positions.md), at full size under `-m soak`.

Writers update many pools through all three `bettercompute serve` processes; a share of
their calls name a stale version and roll back after taking the pool's lock; now and then
one process is killed (SIGKILL, its transactions in flight die with it) and started again.
One subscriber per process reads the owner's stream; a subscriber whose process died
resumes on the restarted one after its last cursor. At the end each subscriber's stream
is compared with what committed: per pool every version in order, none missing, none
twice, and no cursor twice overall.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import defaultdict
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from app.db.engine import Database
from app.events.cursor import START, encode_cursor
from app.events.reader import outbox_bounds, read_events
from tests.events.processes import Served, bettercompute_serve
from tests.events.support import visible_outbox, wait_until
from tests.support import Fleet

POOLS = int(os.environ.get("BETTERCOMPUTE_ORDER_SOAK_POOLS", "24"))
SECONDS = float(os.environ.get("BETTERCOMPUTE_ORDER_SOAK_SECONDS", "90"))
WRITERS = int(os.environ.get("BETTERCOMPUTE_ORDER_SOAK_WRITERS", "12"))
TIMEOUT_S = 120
DOCUMENT = """subscription($tenantId: String!, $after: String) {
  poolEvents(tenantId: $tenantId, after: $after) { cursor type poolId data }
}"""


class Stream:
    """One subscriber's stream, across reconnects: (cursor, pool, version) as received."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.got: list[tuple[str, str, int]] = []
        self.task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()

    def start(self, address: str, after: str) -> None:
        self.ended.clear()
        self.task = asyncio.create_task(self._run(address, after))

    @property
    def last(self) -> str | None:
        return self.got[-1][0] if self.got else None

    async def _run(self, address: str, after: str) -> None:
        transport = WebsocketsTransport(
            url=f"ws://{address}/graphql",
            init_payload={"authorization": f"Bearer {self.token}"},
            connect_timeout=TIMEOUT_S,
            ack_timeout=TIMEOUT_S,
        )
        request = GraphQLRequest(DOCUMENT, variable_values={"tenantId": "acme", "after": after})
        try:
            async with Client(transport=transport) as session:
                async for result in session.subscribe(request):
                    event = result["poolEvents"]
                    version = int(event["data"]["version"])
                    self.got.append((event["cursor"], event["poolId"], version))
        except Exception:  # its process was killed: the test resumes it
            pass
        finally:
            self.ended.set()

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


@pytest.mark.soak
@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
async def test_three_processes_with_rollbacks_and_kills_keep_each_pools_order(
    database_url: str, db: Database, redis_url: str
) -> None:
    fleet = Fleet(db)
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    env = {"BETTERCOMPUTE_DATABASE_URL": database_url, "BETTERCOMPUTE_BROADCAST_URL": redis_url}
    rng = random.Random(20)
    stats = {"committed": 0, "conflicts": 0, "lost": 0, "kills": 0}

    async with AsyncExitStack() as stack:
        servers: list[Served] = list(
            await asyncio.gather(
                *(stack.enter_async_context(bettercompute_serve(**env)) for _ in range(3))
            )
        )
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=TIMEOUT_S))
        headers = {"authorization": f"Bearer {token}"}

        async def call(path: str, body: dict[str, Any]) -> httpx.Response:
            server = servers[rng.randrange(3)]
            return await client.post(
                f"http://{server.address}/api/compute/{path}", json=body, headers=headers
            )

        pools = []
        for _ in range(POOLS):
            body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
            pools.append((await call("pools/create", body)).json()["pool"]["id"])
        async with visible_outbox(db) as conn:
            start = encode_cursor((await outbox_bounds(conn)).newest)
        streams = [Stream(token) for _ in servers]
        for stream, server in zip(streams, servers, strict=True):
            stream.start(server.address, start)
        stop = time.monotonic() + SECONDS

        async def writer() -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                body: dict[str, Any] = {
                    "tenantId": "acme",
                    "poolId": rng.choice(pools),
                    "policy": {"hugepages": {"2Mi": n % 64}},
                }
                if rng.random() < 0.2:
                    body["version"] = 1  # stale: refused under the pool's lock, rolled back
                try:
                    response = await call("pools/update", body)
                except httpx.HTTPError:
                    stats["lost"] += 1  # its process was killed; committed or not
                    continue
                if response.status_code == 200:
                    stats["committed"] += 1
                elif response.status_code == 409:
                    stats["conflicts"] += 1
                else:
                    raise AssertionError(response.text)

        async def killer() -> None:
            while time.monotonic() < stop - 10:
                await asyncio.sleep(rng.uniform(8, 15))
                i = rng.randrange(3)
                os.kill(servers[i].pid, signal.SIGKILL)
                stats["kills"] += 1
                await streams[i].ended.wait()
                servers[i] = await stack.enter_async_context(bettercompute_serve(**env))
                streams[i].start(servers[i].address, streams[i].last or start)

        async with asyncio.timeout(SECONDS + 600):
            await asyncio.gather(killer(), *(writer() for _ in range(WRITERS)))
            async with visible_outbox(db) as conn:
                after_start = await read_events(conn, START, limit=1_000_000)
            committed: dict[str, list[int]] = defaultdict(list)
            cursors = []
            for event in after_start:
                if event.type == "pool.updated":
                    committed[event.pool_id].append(int(event.data["version"]))
                    cursors.append(event.cursor)
            await wait_until(lambda: all(len(s.got) >= len(cursors) for s in streams), within_s=120)
        for stream in streams:
            await stream.close()

    assert stats["committed"] > 0 and stats["conflicts"] > 0 and stats["kills"] > 0, stats
    for i, stream in enumerate(streams):
        seen = [c for c, _, _ in stream.got]
        assert len(seen) == len(set(seen)), f"stream {i}: an event twice"
        # Exactly once: as many as committed, no cursor twice, and (below) every pool's
        # versions each once, in order. No fleet-wide order: an event committed above the
        # transaction-id horizon comes before an older transaction's (ADR 0012).
        assert len(seen) == len(cursors), f"stream {i}: not as many as committed"
        per_pool: dict[str, list[int]] = defaultdict(list)
        for _, pool_id, version in stream.got:
            per_pool[pool_id].append(version)
        assert per_pool == committed
        for versions in per_pool.values():
            assert versions == list(range(2, 2 + len(versions)))  # commit order, no gap
    with contextlib.suppress(Exception):
        print(f"order soak: {stats}, {len(cursors)} events over {POOLS} pools")
