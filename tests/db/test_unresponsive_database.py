"""A database that stops answering, or a statement that waits too long, answers 503 in
bounded time; `/readyz` tells (database, broker) while `/healthz` stays 200.

The stalled database is a TCP proxy of the test's own in front of PostgreSQL that stops
forwarding (as a hung server or a broken network path does); the service runs as a
real `bettercompute serve` process with small bounds, under load on REST and GraphQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db.engine import Database
from tests.db.faults import Load, StallingProxy, hold_lock, report, wait_for
from tests.events.brokers import PrivateRedis
from tests.events.conftest import running
from tests.events.processes import bettercompute_serve
from tests.rest.scene import Scene
from tests.support import Fleet

LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id } } }'

# The bounds the served process gets, and what they add up to for one request: a pool
# wait, a ping of a pooled connection (statement bound + asyncpg's 1 s margin) and its
# invalidation (SQLAlchemy closes it with a 2 s grace), or a new connection.
CONNECT_S, ACQUIRE_S, STATEMENT_S, READINESS_S = 1.0, 1.0, 1.0, 0.5
REQUEST_BOUND_S = ACQUIRE_S + (STATEMENT_S + 1.0) + 2.0 + CONNECT_S
MARGIN_S = 6.0  # a busy 2-core machine
FAULT_CAP_S = 30.0  # how long the stall lasts at most, if answers do not come
ANSWERS_DURING_FAULT = 10  # per surface


@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_a_database_that_stops_answering_is_503_in_bounded_time(
    database_url: str, db: Database
) -> None:
    fleet = Fleet(db)
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "viewer")
    await db.dispose()
    upstream = make_url(database_url)
    proxy = StallingProxy(upstream.host or "127.0.0.1", upstream.port or 5432)
    await proxy.start()
    through_proxy = upstream.set(host="127.0.0.1", port=proxy.port)
    env = {
        "BETTERCOMPUTE_DATABASE_URL": through_proxy.render_as_string(hide_password=False),
        "BETTERCOMPUTE_DB_CONNECT_TIMEOUT_SECONDS": str(CONNECT_S),
        "BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT_SECONDS": str(ACQUIRE_S),
        "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": str(STATEMENT_S),
        "BETTERCOMPUTE_READINESS_TIMEOUT_SECONDS": str(READINESS_S),
    }
    headers = {"authorization": f"Bearer {token}"}
    try:
        async with (
            bettercompute_serve(**env) as served,
            httpx.AsyncClient(base_url=f"http://{served.address}", timeout=60) as client,
        ):

            def rest() -> Awaitable[httpx.Response]:
                body = {"tenantId": "acme"}
                return client.post("/api/compute/pools/list", json=body, headers=headers)

            def graphql() -> Awaitable[httpx.Response]:
                return client.post("/graphql", json={"query": LIST_POOLS}, headers=headers)

            async with Load(rest, clients=4) as rest_load, Load(graphql, clients=4) as gql_load:
                await rest_load.first_success_after(0.0, 30)
                await gql_load.first_success_after(0.0, 30)
                await wait_for_ready(client)

                proxy.stall()
                stalled = time.monotonic()
                began = time.monotonic()
                ready = await client.get("/readyz")
                readyz_s = time.monotonic() - began
                live = await client.get("/healthz")

                def enough() -> bool:
                    return (
                        min(rest_load.answered_since(stalled), gql_load.answered_since(stalled))
                        >= ANSWERS_DURING_FAULT
                    )

                with contextlib.suppress(AssertionError):  # measured and asserted below
                    await wait_for(enough, FAULT_CAP_S, "answers during the stall")
                resumed = time.monotonic()
                proxy.resume()
                recovery = max(
                    await rest_load.first_success_after(resumed, 60),
                    await gql_load.first_success_after(resumed, 60),
                )
                await wait_for_ready(client)
    finally:
        await proxy.close()

    loads = (rest_load, gql_load)
    during = rest_load.statuses(stalled, resumed) + gql_load.statuses(stalled, resumed)
    # Every request that was waiting at some point of the stall (those running when it
    # began, and those that hung until it ended): how long the slowest took.
    slowest = max(
        (
            a.ended - a.began
            for ld in loads
            for a in ld.answers
            if a.began < resumed and a.ended >= stalled
        ),
        default=0.0,
    )
    report(
        "database stops answering",
        during,
        recovery,
        stalled_for=f"{resumed - stalled:.1f} s",
        slowest_answer=f"{slowest:.2f} s",
        readyz=f"{ready.status_code} in {readyz_s:.2f} s",
    )
    assert min(ld.answered_since(stalled) for ld in loads) >= ANSWERS_DURING_FAULT
    assert set(during) == {503}, during
    assert slowest < REQUEST_BOUND_S + MARGIN_S
    assert ready.status_code == 503
    assert ready.json() == {
        "ready": False,
        "checks": {"database": "unavailable", "broker": "ok", "relay": "ok"},
        "rateLimits": "on",
    }
    assert int(ready.headers["retry-after"]) > 0
    assert readyz_s < READINESS_S + MARGIN_S
    assert live.status_code == 200


async def wait_for_ready(client: httpx.AsyncClient, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while (await client.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, "not ready again"
        await asyncio.sleep(0.05)


async def test_a_write_held_up_by_a_lock_is_503_within_the_statement_bound(
    database_url: str, db: Database, dialect: str
) -> None:
    """PostgreSQL: a session holds a lock the booking needs (statement_timeout cancels
    the wait). SQLite: a session holds the write lock (busy_timeout gives up)."""
    bound_s = 1.0
    bounded = Settings(database_url=database_url, db_statement_timeout_s=bound_s)
    # The scene is built through an app with the default bounds, so that only the request
    # under test meets the short one, however busy the machine.
    async with (
        running(Settings(database_url=database_url)) as (_, api),
        running(bounded) as (
            _,
            bounded_api,
        ),
    ):
        s = await Scene.start(api, Fleet(db))
        pool = await s.pool()
        await Fleet(db).node(pool["id"], 8)
        body = {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu": 1}}
        release = await _hold_write_lock(database_url, dialect)
        try:
            began = time.monotonic()
            async with asyncio.timeout(bound_s + 15):
                held_up = await bounded_api.post(s.token, "reservations/create", body)
            took = time.monotonic() - began
        finally:
            await release()
        booked = await api.post(s.token, "reservations/create", body)

    print(f"{dialect}: a write held up by a lock answered {held_up.status_code} in {took:.2f} s")
    assert held_up.status_code == 503, held_up.text
    assert held_up.json()["error"]["code"] == "UNAVAILABLE"
    assert int(held_up.headers["retry-after"]) > 0
    assert took < bound_s + MARGIN_S
    assert booked.status_code == 200, booked.text


async def _hold_write_lock(database_url: str, dialect: str) -> Callable[[], Awaitable[None]]:
    """Take a lock every booking needs in a session of the test's own; returns its release."""
    if dialect == "sqlite":
        path = make_url(database_url).database or ""
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")

        async def release_sqlite() -> None:
            connection.execute("ROLLBACK")
            connection.close()

        return release_sqlite
    return await hold_lock(database_url, "LOCK TABLE quota_rows IN EXCLUSIVE MODE")


async def test_readyz_reports_the_broker_and_healthz_does_not(
    database_url: str, dialect: str
) -> None:
    redis = PrivateRedis()
    await redis.start()
    settings = Settings(
        database_url=database_url, broadcast_url=redis.url, broker_probe_interval_s=0.2
    )
    try:
        async with running(settings) as (_, api):
            ready = await api.client.get("/readyz")
            assert ready.status_code == 200
            checks = {"database": "ok", "broker": "ok", "relay": "ok"}
            assert ready.json() == {"ready": True, "checks": checks, "rateLimits": "on"}

            await redis.stop()
            deadline = time.monotonic() + 30
            while (ready := await api.client.get("/readyz")).status_code == 200:
                assert time.monotonic() < deadline, "the broker outage never showed"
                await asyncio.sleep(0.05)
            assert ready.status_code == 503
            assert ready.json() == {
                "ready": False,
                "checks": {"database": "ok", "broker": "unavailable", "relay": "ok"},
                "rateLimits": "on",
            }
            assert (await api.client.get("/healthz")).status_code == 200

            await redis.start()
            deadline = time.monotonic() + 30
            while (await api.client.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "not ready after the broker came back"
                await asyncio.sleep(0.05)
    finally:
        await redis.stop()


def _compiled_answered(metrics: str) -> float:
    """bettercompute_compiled_reads_total{outcome="answered"} in a /metrics page."""
    for line in metrics.splitlines():
        if line.startswith('bettercompute_compiled_reads_total{outcome="answered"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("dialect", ["postgresql"])  # the compiled reads' store
async def test_a_compiled_read_meets_a_silent_database_once(
    database_url: str, db: Database
) -> None:
    """A compiled read whose statement meets a database that stops answering answers 503
    at once: no second wait on the plain path. Two served processes through the same
    stalling proxy, one with compiled reads and one without, each loaded with the same
    GraphQL `pools` and REST `pools/get`; during the stall the slowest 503 of each
    compiled surface is at most its plain twin's + 1 s."""
    fleet = Fleet(db)
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    await db.dispose()
    upstream = make_url(database_url)
    proxy = StallingProxy(upstream.host or "127.0.0.1", upstream.port or 5432)
    await proxy.start()
    through_proxy = upstream.set(host="127.0.0.1", port=proxy.port)
    env = {
        "BETTERCOMPUTE_DATABASE_URL": through_proxy.render_as_string(hide_password=False),
        "BETTERCOMPUTE_DB_CONNECT_TIMEOUT_SECONDS": str(CONNECT_S),
        "BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT_SECONDS": str(ACQUIRE_S),
        "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": str(STATEMENT_S),
        "BETTERCOMPUTE_FAST_PATH": "true",  # whatever the run asks: the executor alike
    }
    headers = {"authorization": f"Bearer {token}"}
    loads: dict[str, Load] = {}
    try:
        async with (
            bettercompute_serve(**env, BETTERCOMPUTE_COMPILED_READS="true") as compiled,
            bettercompute_serve(**env, BETTERCOMPUTE_COMPILED_READS="false") as plain,
            httpx.AsyncClient(base_url=f"http://{compiled.address}", timeout=60) as fast,
            httpx.AsyncClient(base_url=f"http://{plain.address}", timeout=60) as slow,
        ):
            body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
            created = await fast.post("/api/compute/pools/create", json=body, headers=headers)
            assert created.status_code == 200, created.text
            get = {"tenantId": "acme", "poolId": created.json()["pool"]["id"]}

            def calls(client: httpx.AsyncClient) -> dict[str, Callable[[], Awaitable[Any]]]:
                return {
                    "graphql pools": lambda: client.post(
                        "/graphql", json={"query": LIST_POOLS}, headers=headers
                    ),
                    "rest pools/get": lambda: client.post(
                        "/api/compute/pools/get", json=get, headers=headers
                    ),
                }

            for path, client in (("compiled", fast), ("plain", slow)):
                for surface, call in calls(client).items():
                    loads[f"{surface} ({path})"] = Load(call, clients=2)
            async with contextlib.AsyncExitStack() as stack:
                for load in loads.values():
                    await stack.enter_async_context(load)
                for load in loads.values():
                    await load.first_success_after(0.0, 30)
                answered = _compiled_answered((await fast.get("/metrics")).text)
                await wait_for_ready(fast)
                await wait_for_ready(slow)
                # Both compiled surfaces are answered by their statement by now.
                settled = time.monotonic()
                for load in loads.values():
                    await load.answered(4, settled, 30)
                assert _compiled_answered((await fast.get("/metrics")).text) >= answered + 8

                proxy.stall()
                stalled = time.monotonic()

                def enough() -> bool:
                    return all(
                        ld.answered_since(stalled) >= ANSWERS_DURING_FAULT for ld in loads.values()
                    )

                with contextlib.suppress(AssertionError):  # measured and asserted below
                    await wait_for(enough, FAULT_CAP_S, "answers during the stall")
                resumed = time.monotonic()
                proxy.resume()
                for load in loads.values():
                    await load.first_success_after(resumed, 60)
    finally:
        await proxy.close()

    def slowest(load: Load) -> float:
        waited = [
            a.ended - a.began for a in load.answers if a.began < resumed and a.ended >= stalled
        ]
        return max(waited, default=0.0)

    for name, load in loads.items():
        report(name, load.statuses(stalled, resumed), None, slowest=f"{slowest(load):.2f} s")
    for name, load in loads.items():
        assert load.answered_since(stalled) >= ANSWERS_DURING_FAULT, name
        assert set(load.statuses(stalled, resumed)) == {503}, (
            name,
            load.statuses(stalled, resumed),
        )
    for surface in ("graphql pools", "rest pools/get"):
        fast_s, plain_s = (slowest(loads[f"{surface} ({p})"]) for p in ("compiled", "plain"))
        assert fast_s <= plain_s + 1.0, (surface, fast_s, plain_s)
