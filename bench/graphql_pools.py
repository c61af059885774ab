"""Benchmark: the nested dashboard query over GraphQL against a floor (printed figures).

    .venv/bin/python -m bench.graphql_pools            # needs PostgreSQL at 127.0.0.1:5432

Creates a fresh PostgreSQL database (dropped at the end), seeds 1,000 pools owned by a
provider tenant and offers the first 10, 100, 200 and 1,000 of them to four tenants, each
pool with 4 quota rows for the tenant and 3 capacity rows. Starts the real server
(`uvicorn --factory app.server:app_from_env`) and the floor (bench/floor.py: one SQL
statement that builds the JSON) as two uvicorn processes, checks they answer the same
data, then drives each with 16 concurrent keep-alive connections (httpx) and a fixed
number of requests. A "dashboard load" fetches every pool the tenant sees, in pages of
up to 100 (`first`, following `endCursor`), so 200 pools are 2 requests and 1,000 are 10.
Every figure is printed with its ratio to the floor.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from app.db.engine import create_database
from app.db.models import (
    AuthzRow,
    CapacityRow,
    Offer,
    Pool,
    QuotaRow,
    Site,
    Tenant,
    utcnow,
)
from app.iam.callers import create_caller
from app.ids import new_id
from bench.database import bench_database

CONCURRENCY = 16
SIZES = (10, 100, 200, 1000)
MAIN_SIZE = 200
PAGE = 100
# Dashboard loads per run (GraphQL; the floor gets FLOOR_FACTOR times as many).
LOADS = {10: 600, 100: 150, 200: 90, 1000: 48}  # at least 16 a round: every worker busy
FLOOR_FACTOR = 5
SMALL_REQUESTS = 600
WARMUP = 16

DASHBOARD = """query Dashboard($tenantId: String!, $first: Int, $after: String) {
  pools(tenantId: $tenantId, first: $first, after: $after) {
    pageInfo { hasNextPage endCursor }
    nodes {
      id class gpuModel sharing region owned archived version
      quotas { resource max used }
      capacity { resource available }
    }
  }
}"""
SMALL = """query One($tenantId: String!, $poolId: ID!) {
  pool(tenantId: $tenantId, poolId: $poolId) { id quotas { resource max used } }
}"""


# --- database -----------------------------------------------------------------------


@dataclass
class Seeded:
    tokens: dict[int, str]  # pools visible -> a viewer token of that tenant
    first_pool: str


async def seed(url: str) -> Seeded:
    """Rows as the domain writes them (owner offer and authz row, guest offers, authz rows
    and quota rows), inserted in bulk: the shape of the data is what is measured."""
    db = create_database(url)
    now = utcnow()
    tenants = {size: f"tenant-{size}" for size in SIZES}
    pools = [new_id("pool") for _ in range(max(SIZES))]
    site = new_id("site")
    rows: dict[Any, list[dict[str, Any]]] = {
        Tenant: [{"id": "provider"}] + [{"id": t} for t in tenants.values()],
        Site: [{"id": site, "tenant_id": "provider", "kind": "custom", "region": "eu-west"}],
        Pool: [],
        Offer: [],
        AuthzRow: [],
        QuotaRow: [],
        CapacityRow: [],
    }
    attrs = {"gpu_model": "H100", "pool_class": "metal-host", "sharing": "mig", "region": "eu-west"}
    for i, pool_id in enumerate(pools):
        rows[Pool].append(
            {
                "id": pool_id,
                "tenant_id": "provider",
                "site_id": site,
                "pool_class": "metal-host",
                "gpu_model": "H100",
                "sharing": "mig",
                "agent": "bcd",
                "policy": {"migLayout": ["1g.10gb"]},
                "provider_account_id": None,
                "region": "eu-west",
                "archived": False,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            }
        )
        for resource, total in (("gpu", 8), ("gpu.mig", 56), ("gpu.slot", 0)):
            rows[CapacityRow].append(
                {
                    "pool_id": pool_id,
                    "resource": resource,
                    "total": total,
                    "allocatable": total,
                    "booked": i % 3,
                }
            )
        holders = ["provider"] + [t for size, t in tenants.items() if i < size]
        for tenant in holders:
            owned = tenant == "provider"
            rows[Offer].append({"pool_id": pool_id, "tenant_id": tenant, "created_at": now})
            rows[AuthzRow].append(
                {
                    "pool_id": pool_id,
                    "tenant_id": tenant,
                    "owned": owned,
                    "include_descendants": False,
                    **attrs,
                }
            )
            for resource in ("cpu", "gpu", "gpu.mig", "gpu.slot"):
                rows[QuotaRow].append(
                    {
                        "pool_id": pool_id,
                        "tenant_id": tenant,
                        "resource": resource,
                        "max": 64,
                        "used": i % 5,
                    }
                )
    async with db.writer.begin() as conn:
        for model in (Tenant, Site, Pool, Offer, AuthzRow, QuotaRow, CapacityRow):
            for start in range(0, len(rows[model]), 2000):
                await conn.execute(insert(model), rows[model][start : start + 2000])
    tokens = {}
    for size, tenant in tenants.items():
        _, tokens[size] = await create_caller(db, tenant, "viewer")
    await db.dispose()
    return Seeded(tokens, pools[0])


# --- servers ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(target: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        *target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    process = subprocess.Popen(command, env={**os.environ, **env})
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"server {target} did not start")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


# --- load ---------------------------------------------------------------------------


@dataclass
class Figures:
    per_second: float
    p50_ms: float
    p99_ms: float


ROUNDS = 3  # floor and GraphQL alternate, so a burst of load elsewhere hits both


async def compare(
    count: int,
    floor: Callable[[], Awaitable[object]],
    measured: Callable[[], Awaitable[object]],
) -> tuple[Figures, Figures]:
    """The floor gets FLOOR_FACTOR times `count` calls, GraphQL `count`, in ROUNDS turns."""
    for one in (floor, measured):
        for _ in range(WARMUP):
            await one()
    runs: tuple[list[tuple[float, list[float]]], list[tuple[float, list[float]]]] = ([], [])
    for _ in range(ROUNDS):
        runs[0].append(await drive(count * FLOOR_FACTOR // ROUNDS, floor))
        runs[1].append(await drive(count // ROUNDS, measured))
    return _figures(runs[0]), _figures(runs[1])


def _figures(runs: list[tuple[float, list[float]]]) -> Figures:
    elapsed = sum(e for e, _ in runs)
    latencies = sorted(x for _, lat in runs for x in lat)
    return Figures(
        per_second=len(latencies) / elapsed,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    )


async def drive(count: int, one: Callable[[], Awaitable[object]]) -> tuple[float, list[float]]:
    """`count` calls of `one` over CONCURRENCY workers: (elapsed seconds, latencies)."""
    latencies: list[float] = []
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - start)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started, latencies


class Clients:
    def __init__(self, graphql_port: int, floor_port: int) -> None:
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
        self.graphql = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{graphql_port}", limits=limits, timeout=120
        )
        self.floor = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{floor_port}", limits=limits, timeout=120
        )

    async def close(self) -> None:
        await self.graphql.aclose()
        await self.floor.aclose()

    async def graphql_load(self, token: str, tenant: str, size: int) -> list[Any]:
        nodes: list[Any] = []
        after = None
        while True:
            response = await self.graphql.post(
                "/graphql",
                json={
                    "query": DASHBOARD,
                    "variables": {"tenantId": tenant, "first": min(size, PAGE), "after": after},
                },
                headers={"authorization": f"Bearer {token}"},
            )
            page = response.json()
            if "errors" in page:
                raise RuntimeError(page["errors"])
            pools = page["data"]["pools"]
            nodes.extend(pools["nodes"])
            if not pools["pageInfo"]["hasNextPage"]:
                return nodes
            after = pools["pageInfo"]["endCursor"]

    async def floor_load(self, tenant: str, size: int) -> list[Any]:
        nodes: list[Any] = []
        params = {"tenant": tenant, "first": str(min(size, PAGE))}
        while True:
            page = (await self.floor.get("/dashboard", params=params)).json()
            pools = page["data"]["pools"]
            nodes.extend(pools["nodes"])
            if not pools["pageInfo"]["hasNextPage"]:
                return nodes
            params["after"] = pools["pageInfo"]["endCursor"]


def ratio_line(name: str, measured: Figures, floor: Figures) -> str:
    return (
        f"{name:<34} {measured.per_second:9.1f}/s ({measured.per_second / floor.per_second:6.3f})"
        f"  p50 {measured.p50_ms:8.1f} ms ({measured.p50_ms / floor.p50_ms:6.2f}x)"
        f"  p99 {measured.p99_ms:8.1f} ms ({measured.p99_ms / floor.p99_ms:6.2f}x)"
    )


async def main() -> None:
    async with bench_database() as url:
        await measure(url)


async def measure(url: str) -> None:
    servers: list[subprocess.Popen[bytes]] = []
    try:
        seeded = await seed(url)
        graphql, graphql_port = start_server(
            ["--factory", "app.server:app_from_env"],
            {"BETTERCOMPUTE_DATABASE_URL": url},
        )
        servers.append(graphql)
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        floor, floor_port = start_server(["bench.floor:app"], {"BENCH_FLOOR_DSN": dsn})
        servers.append(floor)
        clients = Clients(graphql_port, floor_port)
        try:
            await report(clients, seeded)
        finally:
            await clients.close()
    finally:
        for process in servers:
            stop_server(process)


async def report(clients: Clients, seeded: Seeded) -> None:
    print(f"concurrency {CONCURRENCY} connections; ratios are to the floor (one SQL statement)")
    print(
        "dashboard: id class gpuModel sharing region owned archived version, "
        "quotas{resource max used} x4, capacity{resource available} x3 per pool "
        "(28 fields a pool)"
    )
    for size in (MAIN_SIZE, *[s for s in SIZES if s != MAIN_SIZE]):
        token, tenant = seeded.tokens[size], f"tenant-{size}"
        same = await clients.graphql_load(token, tenant, size)
        assert same == await clients.floor_load(tenant, size), "floor and GraphQL disagree"
        assert len(same) == size
        floor, measured = await compare(
            LOADS[size],
            lambda t=tenant, s=size: clients.floor_load(t, s),
            lambda k=token, t=tenant, s=size: clients.graphql_load(k, t, s),
        )
        pages = -(-size // PAGE)
        print(
            f"\nnested dashboard, {size} pools ({pages} page{'s' * (pages > 1)} per load, "
            f"{size * 28:,} fields)"
        )
        print(ratio_line("  floor (loads/s)", floor, floor))
        print(ratio_line("  GraphQL (loads/s)", measured, floor))
        print(f"  GraphQL p50 per pool: {measured.p50_ms / size * 1000:.0f} us")

    token, tenant, pool_id = seeded.tokens[MAIN_SIZE], f"tenant-{MAIN_SIZE}", seeded.first_pool
    headers = {"authorization": f"Bearer {token}"}
    body = {"query": SMALL, "variables": {"tenantId": tenant, "poolId": pool_id}}

    async def small_graphql() -> None:
        answer = (await clients.graphql.post("/graphql", json=body, headers=headers)).json()
        assert "errors" not in answer

    async def small_floor() -> None:
        (await clients.floor.get("/pool", params={"tenant": tenant, "pool": pool_id})).json()

    graphql_answer = (await clients.graphql.post("/graphql", json=body, headers=headers)).json()
    floor_answer = (
        await clients.floor.get("/pool", params={"tenant": tenant, "pool": pool_id})
    ).json()
    assert graphql_answer == floor_answer, (graphql_answer, floor_answer)
    floor, measured = await compare(SMALL_REQUESTS, small_floor, small_graphql)
    print("\nsmall query: one pool with its quotas")
    print(ratio_line("  floor (requests/s)", floor, floor))
    print(ratio_line("  GraphQL (requests/s)", measured, floor))


if __name__ == "__main__":
    asyncio.run(main())
