"""Benchmark: what clients see during database outages, and how fast the service recovers.

    .venv/bin/python -m bench.db_faults [--seconds 10] [--clients 8] [--dialect sqlite]

Runs one real `bettercompute serve` process (its settings from the environment, so
BETTERCOMPUTE_DB_* bounds apply) on a private PostgreSQL server of its own, reached
through a TCP proxy, as a non-superuser role (`--dialect sqlite`: on an SQLite file of
its own, the embedded default). Clients call REST (`pools/list`) and
GraphQL (`pools`) in a loop, half each. Beside them, the compiled reads and their plain
twins: GraphQL `pools` and REST `pools/get`, two clients each, on that process (compiled,
unless the environment switches BETTERCOMPUTE_COMPILED_READS off) and on a second
`serve` process through the same proxy with BETTERCOMPUTE_COMPILED_READS=false (plain).
Each fault is held `--seconds`:

1. 55000: the database set `ALLOW_CONNECTIONS false`, its sessions ended;
2. 53300: the service's role set `CONNECTION LIMIT 0`, its sessions ended;
3. a database that stops answering: the proxy forwards nothing (connections hang);
4. 57P03: a smart shutdown waiting on one session, the service's sessions ended; then
   the server stops and starts again.

On SQLite one fault: the file stops answering, another process holding its WAL index's
read locks (tests/db/faults.py `StallingSQLite`; SQLite gives each transaction up after
about 10 s of its own retries).

For each: answers by HTTP status received during the fault, the slowest
request that was waiting at some point of it, and the time from the fault ending to
the first 200 (REST `pools/list` and GraphQL `pools` together, as before); then a row per
compiled-read surface and its plain twin (a compiled read meeting a silent database
answers 503 at once, no slower than its plain twin: issue 21). `/readyz` and `/healthz`
are sampled during each fault.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import httpx

from app.db.engine import create_database
from app.db.migrate import upgrade
from tests.db.faults import (
    Call,
    Load,
    PrivatePostgres,
    StallingProxy,
    StallingSQLite,
    private_postgres,
)
from tests.db.faults import terminate_backends as ending
from tests.events.processes import bettercompute_serve
from tests.support import Fleet

ROLE = "bettercompute"
LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id } } }'
Step = Callable[[], Awaitable[None]]
Fault = tuple[str, Step, Step]  # name, cause, heal


async def _seed(url: str) -> tuple[str, str, str]:
    """A viewer's token (every load's), an admin's (it creates the pool `pools/get`
    reads) and a site for that pool."""
    db = create_database(url)
    try:
        fleet = Fleet(db)
        await fleet.tenant("acme")
        site = await fleet.site("acme")
        return await fleet.caller("acme", "viewer"), await fleet.caller("acme", "admin"), site
    finally:
        await db.dispose()


async def _ready(client: httpx.AsyncClient, within_s: float = 120) -> None:
    """Until /readyz stops answering 503 (a service without /readyz answers 404)."""
    deadline = time.monotonic() + within_s
    while (await client.get("/readyz")).status_code == 503:
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not become ready")
        await asyncio.sleep(0.1)


def _row(loads: list[Load], faulted: float, healed: float) -> str:
    during = Counter(
        a.status for load in loads for a in load.answers if faulted <= a.ended < healed
    )
    waiting = [
        a.ended - a.began
        for load in loads
        for a in load.answers
        if a.began < healed and a.ended >= faulted
    ]
    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(during.items()))
    return f"during: {{{statuses}}}  slowest {max(waiting, default=0):5.2f} s"


async def _outage(
    name: str,
    seconds: float,
    loads: tuple[Load, Load],
    client: httpx.AsyncClient,
    fault: Step,
    heal: Step,
    twins: dict[str, Load],
) -> None:
    await fault()
    faulted = time.monotonic()
    await asyncio.sleep(seconds / 2)
    ready = (await client.get("/readyz")).status_code
    live = (await client.get("/healthz")).status_code
    await asyncio.sleep(max(0.0, faulted + seconds - time.monotonic()))
    ending_at = time.monotonic()
    await heal()
    healed = time.monotonic()
    recovery = max([await load.first_success_after(healed, 120) for load in loads])
    print(
        f"{name:<32} held {ending_at - faulted:5.1f} s (+{healed - ending_at:.1f} s to heal)"
        f"  {_row(list(loads), faulted, healed)}"
        f"  first 200 after {recovery:.2f} s  /readyz {ready}  /healthz {live}",
        flush=True,
    )
    for surface, load in twins.items():
        twin_recovery = await load.first_success_after(healed, 120)
        print(
            f"  {surface:<30} {_row([load], faulted, healed)}"
            f"  first 200 after {twin_recovery:.2f} s",
            flush=True,
        )


async def run(args: argparse.Namespace) -> None:
    if args.dialect == "sqlite":
        await _run_sqlite(args)
        return
    async with private_postgres() as server:
        await server.execute(f"CREATE ROLE {ROLE} LOGIN")
        await server.execute(f"CREATE DATABASE bc OWNER {ROLE}")
        await upgrade(server.url("bc", user=ROLE))
        token, admin, site = await _seed(server.url("bc"))
        proxy = StallingProxy("127.0.0.1", server.port)
        await proxy.start()
        url = f"postgresql+asyncpg://{ROLE}@127.0.0.1:{proxy.port}/bc"
        try:
            async with _served(url) as (client, plain):
                faults = _postgres_faults(server, proxy)
                await _measure(args, client, plain, token, (admin, site), faults)
        finally:
            await proxy.close()


async def _run_sqlite(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-db-faults-") as directory:
        path = f"{directory}/bc.db"
        url = f"sqlite+aiosqlite:///{path}"
        await upgrade(url)
        token, admin, site = await _seed(url)
        stalling = StallingSQLite(path)
        try:
            async with _served(url) as (client, plain):
                await stalling.start()  # the file is open in WAL mode by now
                fault = ("file stops answering (WAL locks)", stalling.stall, stalling.resume)
                await _measure(args, client, plain, token, (admin, site), [fault])
        finally:
            await stalling.close()


@contextlib.asynccontextmanager
async def _served(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """The service on `url` (compiled reads as the environment says) and its plain twin
    (BETTERCOMPUTE_COMPILED_READS=false), a client for each."""
    async with (
        bettercompute_serve(BETTERCOMPUTE_DATABASE_URL=url) as served,
        bettercompute_serve(
            BETTERCOMPUTE_DATABASE_URL=url, BETTERCOMPUTE_COMPILED_READS="false"
        ) as twin,
        httpx.AsyncClient(base_url=f"http://{served.address}", timeout=300) as client,
        httpx.AsyncClient(base_url=f"http://{twin.address}", timeout=300) as plain,
    ):
        yield client, plain


def _postgres_faults(server: PrivatePostgres, proxy: StallingProxy) -> list[Fault]:
    held: list[Any] = []

    async def superuser(*statements: str) -> None:
        connection = await asyncpg.connect(server.dsn(), timeout=10)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    async def smart_shutdown() -> None:
        held.append(await asyncpg.connect(server.dsn(), timeout=10))
        await server.stop("smart", wait=False)
        await held[0].execute(ending("datname = 'bc'"))

    async def restart() -> None:
        await held.pop().close()
        await server.wait_stopped()
        await server.start()

    async def stall() -> None:
        proxy.stall()

    async def resume() -> None:
        proxy.resume()

    return [
        (
            "55000 not accepting connections",
            lambda: superuser(
                "ALTER DATABASE bc ALLOW_CONNECTIONS false", ending("datname = 'bc'")
            ),
            lambda: superuser("ALTER DATABASE bc ALLOW_CONNECTIONS true"),
        ),
        (
            "53300 too many connections",
            lambda: superuser(
                f"ALTER ROLE {ROLE} CONNECTION LIMIT 0", ending(f"usename = '{ROLE}'")
            ),
            lambda: superuser(f"ALTER ROLE {ROLE} CONNECTION LIMIT -1"),
        ),
        ("database stops answering", stall, resume),
        ("57P03 shutdown, down, restart", smart_shutdown, restart),
    ]


async def _measure(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    plain: httpx.AsyncClient,
    token: str,
    pool_maker: tuple[str, str],
    faults: list[Fault],
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    admin, site = pool_maker
    created = await client.post(
        "/api/compute/pools/create",
        json={"tenantId": "acme", "siteId": site, "class": "metal-host"},
        headers={"authorization": f"Bearer {admin}"},
    )
    created.raise_for_status()
    get = {"tenantId": "acme", "poolId": created.json()["pool"]["id"]}

    def twin_calls(on: httpx.AsyncClient) -> tuple[Call, Call]:
        def pools() -> Awaitable[httpx.Response]:
            return on.post("/graphql", json={"query": LIST_POOLS}, headers=headers)

        def one() -> Awaitable[httpx.Response]:
            return on.post("/api/compute/pools/get", json=get, headers=headers)

        return pools, one

    def rest() -> Awaitable[httpx.Response]:
        body = {"tenantId": "acme"}
        return client.post("/api/compute/pools/list", json=body, headers=headers)

    def graphql() -> Awaitable[httpx.Response]:
        return client.post("/graphql", json={"query": LIST_POOLS}, headers=headers)

    half = max(1, args.clients // 2)
    (fast_pools, fast_get), (plain_pools, plain_get) = twin_calls(client), twin_calls(plain)
    twins = {
        "graphql pools (compiled)": Load(fast_pools, clients=2),
        "graphql pools (plain)": Load(plain_pools, clients=2),
        "rest pools/get (compiled)": Load(fast_get, clients=2),
        "rest pools/get (plain)": Load(plain_get, clients=2),
    }
    async with (
        Load(rest, clients=half) as rest_load,
        Load(graphql, clients=half) as gql_load,
        contextlib.AsyncExitStack() as stack,
    ):
        for load in twins.values():
            await stack.enter_async_context(load)
        for name, fault, heal in faults:
            if args.only and args.only not in name:
                continue
            since = time.monotonic()
            for load in (rest_load, gql_load, *twins.values()):
                await load.first_success_after(since, 120)
            await _ready(client)
            await _ready(plain)
            await _outage(name, args.seconds, (rest_load, gql_load), client, fault, heal, twins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each fault lasts")
    parser.add_argument("--clients", type=int, default=8, help="clients calling in a loop")
    parser.add_argument("--only", default="", help="run the faults whose name contains this")
    parser.add_argument(
        "--dialect", choices=("postgresql", "sqlite"), default="postgresql", help="the store"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
