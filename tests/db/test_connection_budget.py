"""The connection budget holds: several `serve` processes under a burst of bookings stay
within the pool size, overflow and direct pool they are given (bookings run as one
statement on the direct pool, app/capacity/booking.py; plus the broker's LISTEN
connection),
so a server's max_connections is never passed and no booking fails for want of a
connection. Exactly the quota is booked; every other booking is RESOURCE_EXHAUSTED.

Each runs on a private PostgreSQL server sized for it, as a non-superuser role (so the
server's superuser_reserved_connections are not the service's), with the broker on the
same server (`postgres://`, one LISTEN connection per process).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass

import asyncpg
import httpx
import pytest

from app.config import Settings
from app.db.engine import create_database
from app.db.migrate import upgrade
from tests.db.faults import PrivatePostgres, private_postgres, report
from tests.events.processes import Served, bettercompute_serve
from tests.support import Fleet

PROCESSES = 3
ROLE = "bettercompute"
SUPERUSER_RESERVED = 3  # PostgreSQL's default superuser_reserved_connections
# A burst larger than the pools queues for a connection (that is the budget holding), and
# every booking of one quota queues for that quota's row lock. How long a request may wait
# for either is the acquire and statement bound (10 s by default; past it, 503 with
# Retry-After). A thousand bookings on a shared, busy 2-core machine can wait longer than
# that; this test is about connections, not latency, so the processes may wait a minute.
WAIT_BOUND_S = 60


@dataclass(frozen=True)
class Budget:
    max_connections: int
    pool_size: int | None  # None: the service's defaults
    max_overflow: int | None
    direct_pool_size: int | None
    bookings: int
    quota: int

    def per_process(self) -> int:
        """pool + overflow + direct + the broker's LISTEN (docs/operations.md "Connection
        budget")."""
        defaults = Settings()
        pool = defaults.db_pool_size if self.pool_size is None else self.pool_size
        overflow = defaults.db_max_overflow if self.max_overflow is None else self.max_overflow
        direct = (
            defaults.db_direct_pool_size if self.direct_pool_size is None else self.direct_pool_size
        )
        return pool + overflow + direct + 1


async def _seed(server: PrivatePostgres, served: Served, quota: int) -> tuple[str, str]:
    """A pool of acme's offered to globex with `quota` GPUs; (pool id, globex's token)."""
    db = create_database(server.url("bc"))
    try:
        fleet = Fleet(db)
        await fleet.tenant("acme")
        await fleet.tenant("globex")
        site = await fleet.site("acme")
        owner = await fleet.caller("acme", "admin")
        guest = await fleet.caller("globex", "operator")
        headers = {"authorization": f"Bearer {owner}"}
        async with httpx.AsyncClient(base_url=f"http://{served.address}", timeout=60) as c:
            created = await c.post(
                "/api/compute/pools/create",
                json={"tenantId": "acme", "siteId": site, "class": "metal-host"},
                headers=headers,
            )
            assert created.status_code == 200, created.text
            pool_id: str = created.json()["pool"]["id"]
            await fleet.node(pool_id, 10 * quota)
            offer = {
                "tenantId": "acme",
                "poolId": pool_id,
                "toTenantId": "globex",
                "quota": {"gpu": quota},
            }
            offered = await c.post("/api/compute/pools/offer", json=offer, headers=headers)
            assert offered.status_code == 200, offered.text
        return pool_id, guest
    finally:
        await db.dispose()


async def _watch_connections(watcher: asyncpg.Connection, peak: list[int]) -> None:
    """The most sessions the service's role held at once (as the superuser, on its
    reserved slots, so watching takes nothing from the service)."""
    while True:
        count = await watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", ROLE
        )
        peak[0] = max(peak[0], count)
        await asyncio.sleep(0.01)


async def _burst(budget: Budget) -> None:
    async with private_postgres(budget.max_connections) as server:
        await server.execute(f"CREATE ROLE {ROLE} LOGIN")
        await server.execute(f"CREATE DATABASE bc OWNER {ROLE}")
        url = server.url("bc", user=ROLE)
        await upgrade(url)
        env = {
            "BETTERCOMPUTE_DATABASE_URL": url,
            "BETTERCOMPUTE_BROADCAST_URL": f"postgres://{ROLE}@127.0.0.1:{server.port}/bc",
            "BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT_SECONDS": str(WAIT_BOUND_S),
            "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": str(WAIT_BOUND_S),
        }
        if budget.pool_size is not None:
            env["BETTERCOMPUTE_DB_POOL_SIZE"] = str(budget.pool_size)
        if budget.max_overflow is not None:
            env["BETTERCOMPUTE_DB_MAX_OVERFLOW"] = str(budget.max_overflow)
        if budget.direct_pool_size is not None:
            env["BETTERCOMPUTE_DB_DIRECT_POOL_SIZE"] = str(budget.direct_pool_size)
        async with AsyncExitStack() as stack:
            processes = await asyncio.gather(
                *(stack.enter_async_context(bettercompute_serve(**env)) for _ in range(PROCESSES))
            )
            pool_id, token = await _seed(server, processes[0], budget.quota)
            peak = [0]
            # Connected before the burst: a thousand requests on this test's own event loop
            # can hold a connect past its timeout on a busy machine (seen in CI).
            watcher = await asyncpg.connect(server.dsn("bc"), timeout=10)
            stack.push_async_callback(watcher.close)
            watching = asyncio.create_task(_watch_connections(watcher, peak))
            limits = httpx.Limits(max_connections=budget.bookings, max_keepalive_connections=0)
            async with httpx.AsyncClient(limits=limits, timeout=120) as client:
                body = {"tenantId": "globex", "poolId": pool_id, "resources": {"gpu": 1}}
                headers = {"authorization": f"Bearer {token}"}

                async def book(n: int) -> httpx.Response:
                    address = processes[n % PROCESSES].address
                    url = f"http://{address}/api/compute/reservations/create"
                    return await client.post(url, json=body, headers=headers)

                began = time.monotonic()
                answers = await asyncio.gather(*(book(n) for n in range(budget.bookings)))
                took = time.monotonic() - began
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    statuses = Counter(a.status_code for a in answers)
    codes = Counter(a.json()["error"]["code"] for a in answers if a.status_code != 200)
    report(
        f"{budget.bookings} bookings over {PROCESSES} processes, quota {budget.quota}, "
        f"max_connections {budget.max_connections}",
        statuses,
        None,
        label="answers",
        codes=dict(codes),
        peak_connections=f"{peak[0]} (budget {PROCESSES} x {budget.per_process()})",
        took=f"{took:.1f} s",
    )
    assert statuses == {200: budget.quota, 429: budget.bookings - budget.quota}, statuses
    assert codes == {"RESOURCE_EXHAUSTED": budget.bookings - budget.quota}
    assert peak[0] <= PROCESSES * budget.per_process()
    assert PROCESSES * budget.per_process() <= budget.max_connections - SUPERUSER_RESERVED


async def test_a_burst_of_bookings_stays_within_the_connection_budget() -> None:
    """Scaled down: 150 bookings, a quota of 15, a server of 20 connections, and pools of
    2 + 1 and a direct pool of 1 (the settings the processes are given)."""
    await _burst(
        Budget(
            max_connections=20,
            pool_size=2,
            max_overflow=1,
            direct_pool_size=1,
            bookings=150,
            quota=15,
        )
    )


@pytest.mark.soak
async def test_a_thousand_bookings_over_three_processes_on_a_100_connection_server() -> None:
    """Full size, the service's default pool settings: 1,000 bookings, a guest quota of
    100, PostgreSQL's default max_connections of 100."""
    await _burst(
        Budget(
            max_connections=100,
            pool_size=None,
            max_overflow=None,
            direct_pool_size=None,
            bookings=1000,
            quota=100,
        )
    )
