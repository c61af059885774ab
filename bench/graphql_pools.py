"""Benchmark: the read path (GraphQL dashboard pages, one pool by GraphQL and by REST,
REST's list, the tenant's quota rows, one pool's rollup by GraphQL and by REST, why the
tenant may read a pool by GraphQL `access` and REST `pools/explain`, the owner's ranked
capacity rows by GraphQL `lending` and REST `pools/lending`, the tenant's reservations by
REST `reservations/list` and one pool's first page of them by GraphQL `Pool.reservations`)
against a floor, driven by a native load generator (printed figures, docs/performance.md),
on PostgreSQL and on the embedded SQLite default, one table each.

    .venv/bin/python -m bench.graphql_pools                    # both, about 12 minutes
    .venv/bin/python -m bench.graphql_pools --dialect sqlite   # one of them
    .venv/bin/python -m bench.graphql_pools --quick            # a smoke test, under a
                                                               # minute a dialect

PostgreSQL needs a server at 127.0.0.1:5432 (BENCH_POSTGRES_URL); SQLite needs nothing.
Installs `wrk` with apt-get on first use (bench/native_load.py; autocannon from npm when
apt cannot).

For each dialect, PostgreSQL first: creates a fresh database (PostgreSQL: a database
dropped at the end; SQLite: a file in a temporary directory, the service's own URL form)
and seeds 1,000 pools owned by a provider tenant, offered to four tenants who see the
first 10, 100, 200 and 1,000 of them; each pool has 4 quota rows per tenant and 3 capacity
rows; the tenant that sees 100 has 40 reservations in the first pool, every fourth released
(its quota rows and the pool's capacity rows carry the active ones' bookings). Starts
the real service (`uvicorn --factory app.server:app_from_env` with the HTTP protocol
`serve` picks, one process, BETTERCOMPUTE_DATABASE_URL the database) and the floor (its
own uvicorn process; one hand-written SQL statement per request builds the whole JSON
answer: bench/floor.py
through asyncpg, bench/floor_sqlite.py through aiosqlite on the same file), checks that
they answer the same data for every request below, then, for each query, runs wrk against
the floor and the service in turn (16 connections, closed loop: the rate achieved is what
each sustains), alternating them over the rounds, and last one connection at a time for
the sequential latency. While each run lasts it reads the CPU time of the service, the
floor, wrk, the database (PostgreSQL: the backends of the bench database; SQLite runs
inside the service and the floor, its CPU theirs) and the whole machine, and from the
service's /metrics the statements it sent per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from app.compat import http_protocol
from app.config import Settings
from app.db.embedded import sqlite_file
from app.db.engine import create_database
from app.db.models import (
    AuthzRow,
    CapacityRow,
    Offer,
    Pool,
    QuotaRow,
    Reservation,
    Site,
    Tenant,
    utcnow,
)
from app.iam.callers import create_caller
from app.ids import new_id
from bench.database import bench_database, bench_sqlite_database
from bench.floor import POOL_SIZE as POSTGRESQL_FLOOR_CONNECTIONS
from bench.floor_sqlite import CONNECTIONS as SQLITE_FLOOR_CONNECTIONS
from bench.native_load import HttpRequest, LoadGenerator, LoadResult, ensure_generator
from bench.proc import TICKS, Profiler, cpu_s

CONNECTIONS = 16
THREADS = 1  # wrk threads under load: one keeps up with these rates (its CPU is printed)
SIZES = (10, 100, 200, 1000)
PAGE = 100
ONE_POOL_TENANT = 100  # the one-pool queries run as the tenant that sees 100 pools

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
QUOTAS = """query Quotas($tenantId: String!) {
  quotas(tenantId: $tenantId) { poolId resource max used }
}"""
CAPACITY = """query Capacity($tenantId: String!, $poolId: ID!) {
  capacity(tenantId: $tenantId, poolId: $poolId) { resource total allocatable booked available }
}"""
# Every value of `access`, in REST `pools/explain`'s order (one floor statement for both).
ACCESS = """query Access($tenantId: String!, $poolId: ID!, $permission: String!) {
  access(tenantId: $tenantId, poolId: $poolId, permission: $permission) {
    allowed permission
    binding { callerId tenantId role where actingFor fleetAdmin }
    grant { via tenantId includeDescendants priority offeredAt }
    deniedBy { check message key }
  }
}"""
EXPLAINED = "compute:pools:read"  # the permission `access` and `explain` are asked about
# The owner's ranked capacity rows (its `first` 50: the default), in REST's order.
LENDING = """query Lending($tenantId: String!) {
  lending(tenantId: $tenantId) {
    poolId resource total allocatable booked available offered guestUsed overcommit
  }
}"""
OWNER = "provider"  # owns every pool; `lending` runs as its admin
# The one-pool tenant's reservations, all in the first pool (REST `reservations/list`
# answers all of them; GraphQL a page of RESERVATIONS_PAGE, with a next page).
RESERVATIONS = 40
RESERVATIONS_PAGE = 20
POOL_RESERVATIONS = """query PoolReservations($tenantId: String!, $poolId: ID!, $first: Int) {
  pool(tenantId: $tenantId, poolId: $poolId) {
    id
    reservations(first: $first) {
      pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
      edges {
        cursor
        node { id poolId tenantId state createdAt endedAt resources { resource amount } }
      }
    }
  }
}"""


@dataclass(frozen=True)
class Plan:
    seconds: float  # each run under load
    rounds: int  # floor and service alternate, one run each per round
    sequential_seconds: float
    warmup_seconds: float
    sizes: tuple[int, ...]  # dashboard sizes measured
    quick: bool = False


FULL = Plan(
    seconds=10, rounds=2, sequential_seconds=5, warmup_seconds=2, sizes=(100, 10, 1000, 200)
)
# No warm-up run: the checks and the statement count before the runs warm both up. A
# smoke test of every row over 100 pools (the owner's lending over 1,000 answered too
# slowly for 1-second runs).
QUICK = Plan(
    seconds=1, rounds=1, sequential_seconds=1, warmup_seconds=0, sizes=(100, 10), quick=True
)


# --- database -----------------------------------------------------------------------


@dataclass
class Seeded:
    tokens: dict[int, str]  # pools visible -> a viewer token of that tenant
    first_pool: str
    callers: dict[int, str]  # pools visible -> that viewer's caller id (`access` shows it)
    owner_token: str  # an admin of the pools' owner (compute:pools:share: `lending`)
    pools: int  # the owner's pools (`lending` reads them all)


def tenant_of(size: int) -> str:
    return f"tenant-{size}"


def reservation_rows(pool_id: str, tenant: str, now: datetime) -> list[dict[str, Any]]:
    """RESERVATIONS of `tenant` (booking against its own quota rows) in `pool_id`, as
    create_reservation writes them, one a minute up to `now` in id order; every fourth
    released as release_reservation leaves it (ended, a minute and a half on). Most book
    one MIG slice, every tenth a whole GPU and a slice (an object of two keys)."""
    rows = []
    for k, rsv_id in enumerate(sorted(new_id("rsv") for _ in range(RESERVATIONS))):
        created = now - timedelta(minutes=RESERVATIONS - k)
        ended = k % 4 == 3
        rows.append(
            {
                "id": rsv_id,
                "pool_id": pool_id,
                "tenant_id": tenant,
                "quota_tenant_id": tenant,
                "resources": {"gpu": 1, "gpu.mig": 1} if k % 10 == 0 else {"gpu.mig": 1},
                "state": "ended" if ended else "active",
                "created_at": created,
                "ended_at": created + timedelta(seconds=90) if ended else None,
            }
        )
    return rows


def booked(rows: list[dict[str, Any]]) -> dict[str, int]:
    """What the active reservations among `rows` hold, by resource (a release gives its
    bookings back)."""
    held: dict[str, int] = {}
    for row in rows:
        if row["state"] == "active":
            for resource, amount in row["resources"].items():
                held[resource] = held.get(resource, 0) + amount
    return held


async def seed(url: str, made: int = max(SIZES)) -> Seeded:
    """Rows as the domain writes them (owner offer and authz row, guest offers, authz rows
    and quota rows, one guest's reservations), inserted in bulk: the shape of the data is
    what is measured. `made` pools (a quick run's fewer), each tenant of SIZES up to it
    seeing that many."""
    db = create_database(url)
    now = utcnow()
    sizes = [s for s in SIZES if s <= made]
    pools = sorted(new_id("pool") for _ in range(made))
    site = new_id("site")
    guest = tenant_of(ONE_POOL_TENANT)
    reservations = reservation_rows(pools[0], guest, now)
    held = booked(reservations)
    rows: dict[Any, list[dict[str, Any]]] = {
        Tenant: [{"id": "provider"}] + [{"id": tenant_of(s)} for s in sizes],
        Site: [{"id": site, "tenant_id": "provider", "kind": "custom", "region": "eu-west"}],
        Pool: [],
        Offer: [],
        AuthzRow: [],
        QuotaRow: [],
        CapacityRow: [],
        Reservation: reservations,
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
                    "booked": i % 3 + (held.get(resource, 0) if i == 0 else 0),
                }
            )
        holders = ["provider"] + [tenant_of(s) for s in sizes if i < s]
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
                        "used": i % 5
                        + (held.get(resource, 0) if i == 0 and tenant == guest else 0),
                    }
                )
    async with db.writer.begin() as conn:
        for model in (Tenant, Site, Pool, Offer, AuthzRow, QuotaRow, CapacityRow, Reservation):
            for start in range(0, len(rows[model]), 2000):
                await conn.execute(insert(model), rows[model][start : start + 2000])
        # Fresh tables: give the planner its statistics, as autovacuum would soon.
        await conn.exec_driver_sql("ANALYZE")
    tokens, callers = {}, {}
    for size in sizes:
        callers[size], tokens[size] = await create_caller(db, tenant_of(size), "viewer")
    _, owner_token = await create_caller(db, OWNER, "admin")
    await db.dispose()
    return Seeded(tokens, pools[0], callers, owner_token, made)


# --- processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_http(url: str) -> str:
    """The HTTP protocol `bettercompute serve` runs on `url` with these settings
    (app/compat.py): on PostgreSQL with the fast path, each response in one write
    (app/http_protocol.py)."""
    return http_protocol(Settings.from_env().model_copy(update={"database_url": url}))


def start_server(
    target: list[str], env: dict[str, str], log: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """A uvicorn process, its output in `log`."""
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
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return process, port
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"server {target} did not start:\n{log.read_text()}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores; idle and iowait excluded)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICKS


class DatabaseCpu(Protocol):
    """The CPU the database spends over a run, in seconds; None: not a process of its
    own (SQLite runs inside each process that opens the file)."""

    async def start(self) -> None: ...

    async def stop(self) -> float | None: ...


class InProcess:
    """SQLite's: its work is the CPU of the service and the floor, counted there."""

    async def start(self) -> None:
        pass

    async def stop(self) -> float | None:
        return None


@dataclass
class Processes:
    service: int
    floor: int
    # PostgreSQL: the bench database and a connection that reads its backends' pids.
    database: str | None = None
    monitor: asyncpg.Connection | None = None

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the service, the floor and the whole machine."""
        return {
            "service": cpu_s(self.service),
            "floor": cpu_s(self.floor),
            # Each one's main thread, where its event loop runs (on SQLite the rest of a
            # process's CPU is aiosqlite's threads, which share the loop's one GIL).
            "service loop": cpu_s(self.service, thread=self.service),
            "floor loop": cpu_s(self.floor, thread=self.floor),
            "machine": machine_busy_s(),
        }

    def database_cpu(self) -> DatabaseCpu:
        return InProcess() if self.monitor is None else BackendsCpu(self)

    async def backends_cpu(self) -> dict[int, float]:
        """CPU seconds so far of each PostgreSQL backend connected to the bench database."""
        assert self.monitor is not None, "no PostgreSQL backends: the database is in process"
        rows = await self.monitor.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            self.database,
        )
        return {row["pid"]: cpu_s(row["pid"]) for row in rows}


class BackendsCpu:
    """The CPU the bench database's backends spend over a run. The service's pool opens
    and closes connections under load (its overflow), so the backends are looked up every
    0.2 s and each one's latest figure kept: one that ends between two looks loses at
    most those 0.2 s."""

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.first: dict[int, float] = {}
        self.latest: dict[int, float] = {}
        self.task: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()

    async def start(self) -> None:
        self.first = await self.processes.backends_cpu()
        self.latest = dict(self.first)
        self.task = asyncio.create_task(self._follow())

    async def _look(self) -> None:
        for pid, seconds in (await self.processes.backends_cpu()).items():
            self.latest[pid] = max(seconds, self.latest.get(pid, 0.0))  # 0 once it is gone

    async def _follow(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.stopping.wait(), 0.2)
                return
            except TimeoutError:
                await self._look()

    async def stop(self) -> float:
        assert self.task is not None
        self.stopping.set()  # not cancelled: a look in progress ends its query first
        await self.task
        await self._look()
        return sum(seconds - self.first.get(pid, 0.0) for pid, seconds in self.latest.items())


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        one, five, fifteen = os.getloadavg()
        return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


# --- the service's own counts ---------------------------------------------------------


def metric_samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def metric_sum(text: str, name: str, **labels: str) -> float:
    return sum(value for _, value in metric_samples(text, name, **labels))


@dataclass(frozen=True)
class Counts:
    requests: float
    statements: float
    errors: dict[str, float]  # by error code

    def __sub__(self, other: Counts) -> Counts:
        errors = {k: v - other.errors.get(k, 0.0) for k, v in self.errors.items()}
        return Counts(
            self.requests - other.requests,
            self.statements - other.statements,
            {k: v for k, v in errors.items() if v},
        )


async def service_counts(client: httpx.AsyncClient, transport: str) -> Counts:
    text = (await client.get("/metrics")).text
    errors = metric_samples(text, "bettercompute_errors_total", transport=transport)
    return Counts(
        requests=metric_sum(
            text, "bettercompute_request_duration_seconds_count", transport=transport
        ),
        statements=metric_sum(text, "bettercompute_db_statements_total", transport=transport),
        errors={labels["code"]: value for labels, value in errors},
    )


async def settled_counts(client: httpx.AsyncClient, transport: str) -> Counts:
    """The counts once the requests wrk left in flight have finished (they still run):
    unchanged for a second. Only the errors of a run are checked against these."""
    counts = await service_counts(client, transport)
    unchanged = 0
    for _ in range(300):
        await asyncio.sleep(0.1)
        again = await service_counts(client, transport)
        unchanged = unchanged + 1 if again == counts else 0
        if unchanged == 10:
            break
        counts = again
    return counts


# --- the queries --------------------------------------------------------------------


@dataclass
class Case:
    name: str
    transport: str  # the service's metrics label
    service: list[HttpRequest]
    floor: list[HttpRequest]
    statements: float = 0.0  # per request, counted by the service


async def count_statements(client: httpx.AsyncClient, case: Case, at_least: int = 20) -> float:
    """Statements per request, from the service's counter over requests sent one at a time
    (under wrk, the requests cut off at the end of a run would blur the count)."""
    before = await service_counts(client, case.transport)
    sent = 0
    while sent < at_least:
        for request in case.service:
            await send(client, request)
            sent += 1
    counted = await service_counts(client, case.transport) - before
    assert counted.requests == sent and not counted.errors, counted
    return counted.statements / sent


def graphql_request(token: str, query: str, variables: dict[str, Any]) -> HttpRequest:
    return HttpRequest(
        "POST",
        "/graphql",
        {"content-type": "application/json", "authorization": f"Bearer {token}"},
        json.dumps({"query": query, "variables": variables}, separators=(",", ":")),
    )


def rest_request(
    token: str, method: str, body: dict[str, Any], resource: str = "pools"
) -> HttpRequest:
    return HttpRequest(
        "POST",
        f"/api/compute/{resource}/{method}",
        {"content-type": "application/json", "authorization": f"Bearer {token}"},
        json.dumps(body, separators=(",", ":")),
    )


def floor_request(path: str, **params: str) -> HttpRequest:
    return HttpRequest("GET", f"{path}?{urlencode(params)}", {})


async def send(client: httpx.AsyncClient, request: HttpRequest) -> Any:
    response = await client.request(
        request.method, request.path, headers=request.headers, content=request.body
    )
    if response.status_code != 200:
        raise RuntimeError(
            f"{request.method} {request.path}: {response.status_code} {response.text}"
        )
    return response.json()


def same_data(ours: Any, theirs: Any) -> bool:
    """The same JSON, read back: the same keys in the same order and the same types (in
    Python True == 1 and 64 == 64.0, in JSON they differ)."""
    return json.dumps(ours) == json.dumps(theirs)


def disagreement(what: str, ours: Any, theirs: Any) -> RuntimeError:
    return RuntimeError(
        f"floor and service disagree on {what}:\nservice: {json.dumps(ours)[:2000]}"
        f"\nfloor:   {json.dumps(theirs)[:2000]}"
    )


async def dashboard_case(
    size: int, token: str, service: httpx.AsyncClient, floor: httpx.AsyncClient
) -> Case:
    """Every page of the tenant's pools, following endCursor: the requests wrk rotates
    through, each checked against the floor's answer for the same page."""
    tenant = tenant_of(size)
    service_requests, floor_requests = [], []
    after: str | None = None
    seen = 0
    while True:
        variables = {"tenantId": tenant, "first": min(size, PAGE), "after": after}
        ours = graphql_request(token, DASHBOARD, variables)
        params = {"tenant": tenant, "first": str(min(size, PAGE))}
        theirs = floor_request("/dashboard", **params, **({"after": after} if after else {}))
        answer = await send(service, ours)
        if "errors" in answer:
            raise RuntimeError(answer["errors"])
        floor_answer = await send(floor, theirs)
        if not same_data(answer["data"], floor_answer["data"]):  # the service adds its cost
            raise disagreement(f"{tenant}'s page after {after}", answer, floor_answer)
        service_requests.append(ours)
        floor_requests.append(theirs)
        page = answer["data"]["pools"]
        seen += len(page["nodes"])
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == size, (seen, size)
    pages = len(service_requests)
    name = f"dashboard, {size:,} pools" + (f" ({pages} pages of {PAGE})" if pages > 1 else "")
    return Case(name, "graphql", service_requests, floor_requests)


async def one_pool_cases(
    seeded: Seeded, service: httpx.AsyncClient, floor: httpx.AsyncClient
) -> list[Case]:
    token, tenant, pool = (
        seeded.tokens[ONE_POOL_TENANT],
        tenant_of(ONE_POOL_TENANT),
        seeded.first_pool,
    )
    small = graphql_request(token, SMALL, {"tenantId": tenant, "poolId": pool})
    small_floor = floor_request("/pool", tenant=tenant, pool=pool)
    rest = rest_request(token, "get", {"tenantId": tenant, "poolId": pool})
    rest_floor = floor_request("/rest/pools/get", tenant=tenant, pool=pool)
    listing = rest_request(token, "list", {"tenantId": tenant})
    listing_floor = floor_request("/rest/pools/list", tenant=tenant)
    quotas = graphql_request(token, QUOTAS, {"tenantId": tenant})
    quotas_floor = floor_request("/quotas", tenant=tenant)
    capacity = graphql_request(token, CAPACITY, {"tenantId": tenant, "poolId": pool})
    capacity_floor = floor_request("/capacity", tenant=tenant, pool=pool)
    rest_capacity = rest_request(token, "capacity", {"tenantId": tenant, "poolId": pool})
    rest_capacity_floor = floor_request("/rest/pools/capacity", tenant=tenant, pool=pool)
    explained = {"tenantId": tenant, "poolId": pool, "permission": EXPLAINED}
    caller = {"caller": seeded.callers[ONE_POOL_TENANT], "role": "viewer"}
    access = graphql_request(token, ACCESS, explained)
    access_floor = floor_request(
        "/access", tenant=tenant, pool=pool, permission=EXPLAINED, **caller
    )
    explain = rest_request(token, "explain", explained)
    explain_floor = floor_request(
        "/rest/pools/explain", tenant=tenant, pool=pool, permission=EXPLAINED, **caller
    )
    lending = graphql_request(seeded.owner_token, LENDING, {"tenantId": OWNER})
    lending_floor = floor_request("/lending", tenant=OWNER, first="50")
    rest_lending = rest_request(seeded.owner_token, "lending", {"tenantId": OWNER})
    rest_lending_floor = floor_request("/rest/pools/lending", tenant=OWNER, first="50")
    own = rest_request(token, "list", {"tenantId": tenant}, resource="reservations")
    own_floor = floor_request("/rest/reservations/list", tenant=tenant)
    page = {"tenantId": tenant, "poolId": pool, "first": RESERVATIONS_PAGE}
    pool_reservations = graphql_request(token, POOL_RESERVATIONS, page)
    pool_reservations_floor = floor_request(
        "/reservations", tenant=tenant, pool=pool, first=str(RESERVATIONS_PAGE)
    )
    for ours, theirs, key in (
        (small, small_floor, "data"),
        (rest, rest_floor, "pool"),
        (listing, listing_floor, "pools"),
        (quotas, quotas_floor, "data"),
        (capacity, capacity_floor, "data"),
        (rest_capacity, rest_capacity_floor, "capacity"),
        (access, access_floor, "data"),
        (explain, explain_floor, "access"),
        (lending, lending_floor, "data"),
        (rest_lending, rest_lending_floor, "lending"),
        (own, own_floor, "reservations"),
        (pool_reservations, pool_reservations_floor, "data"),
    ):
        answer, floor_answer = await send(service, ours), await send(floor, theirs)
        if answer.get(key) is None or not same_data(answer[key], floor_answer.get(key)):
            raise disagreement(ours.path, answer, floor_answer)
    return [
        Case("one pool with its quotas (GraphQL)", "graphql", [small], [small_floor]),
        Case("one pool, REST pools/get", "rest", [rest], [rest_floor]),
        Case(
            f"every pool, REST pools/list ({ONE_POOL_TENANT} pools)",
            "rest",
            [listing],
            [listing_floor],
        ),
        Case(
            f"quota rows, GraphQL quotas ({ONE_POOL_TENANT} pools)",
            "graphql",
            [quotas],
            [quotas_floor],
        ),
        Case("one pool's rollup (GraphQL capacity)", "graphql", [capacity], [capacity_floor]),
        Case(
            "one pool's rollup, REST pools/capacity", "rest", [rest_capacity], [rest_capacity_floor]
        ),
        Case("why it may read a pool (GraphQL access)", "graphql", [access], [access_floor]),
        Case("why it may read a pool, REST pools/explain", "rest", [explain], [explain_floor]),
        Case(
            f"the owner's lending, GraphQL ({seeded.pools:,} pools)",
            "graphql",
            [lending],
            [lending_floor],
        ),
        Case(
            f"the owner's lending, REST pools/lending ({seeded.pools:,} pools)",
            "rest",
            [rest_lending],
            [rest_lending_floor],
        ),
        Case(
            f"reservations, REST reservations/list ({RESERVATIONS})",
            "rest",
            [own],
            [own_floor],
        ),
        Case(
            f"a pool's reservations (GraphQL, {RESERVATIONS_PAGE} of {RESERVATIONS})",
            "graphql",
            [pool_reservations],
            [pool_reservations_floor],
        ),
    ]


# --- runs ---------------------------------------------------------------------------


@dataclass
class Run:
    load: LoadResult
    cpu_s: dict[str, float]  # service, floor, wrk, machine
    database_s: float | None  # PostgreSQL's backends; None: in process (SQLite)
    counts: Counts | None = None  # the service's, over the run


@dataclass
class Side:
    """One target's runs of one query."""

    runs: list[Run] = field(default_factory=list)
    sequential: Run | None = None

    @property
    def per_second(self) -> float:
        return sum(r.load.requests for r in self.runs) / sum(r.load.seconds for r in self.runs)

    def mean(self, attribute: str) -> float:
        return sum(float(getattr(r.load, attribute)) for r in self.runs) / len(self.runs)


@dataclass
class Bench:
    generator: LoadGenerator
    processes: Processes
    service_url: str
    floor_url: str
    service_client: httpx.AsyncClient
    profiler: Profiler

    async def run(
        self,
        case: Case,
        target: str,
        *,
        connections: int,
        threads: int,
        seconds: float,
    ) -> Run:
        requests = case.service if target == "service" else case.floor
        url = self.service_url if target == "service" else self.floor_url
        before_counts = (
            await service_counts(self.service_client, case.transport)
            if target == "service"
            else None
        )
        database = self.processes.database_cpu()
        await database.start()
        before = self.processes.cpu()
        try:
            load = await asyncio.to_thread(
                self.generator.run,
                url,
                requests,
                connections=connections,
                threads=threads,
                seconds=seconds,
            )
            after = self.processes.cpu()
        finally:
            database_s = await database.stop()
        used = {k: after[k] - before[k] for k in after} | {"wrk": load.cpu_s}
        run = Run(load, used, database_s)
        if before_counts is not None:
            run.counts = await settled_counts(self.service_client, case.transport) - before_counts
            # wrk stops with a request in flight on each connection: those the service had
            # not read yet end in ClientDisconnect. More than that is a failure.
            if sum(run.counts.errors.values()) > connections:
                raise RuntimeError(f"{case.name}: the service answered {run.counts.errors}")
        if load.errors:
            raise RuntimeError(f"{case.name}, {target}: {load.errors} failed requests")
        if not load.requests:
            raise RuntimeError(f"{case.name}, {target}: no answer within {seconds:g} s")
        return run


async def measure_case(bench: Bench, case: Case, plan: Plan) -> dict[str, Side]:
    sides = {"floor": Side(), "service": Side()}
    for target in sides if plan.warmup_seconds else ():  # caches, pools, the planner
        await bench.run(
            case, target, connections=CONNECTIONS, threads=THREADS, seconds=plan.warmup_seconds
        )
    for round_ in range(plan.rounds):
        order = ("floor", "service") if round_ % 2 == 0 else ("service", "floor")
        for target in order:
            # `--profile`: the service's first round of each read, sampled by py-spy.
            profiled = round_ == 0 and target == "service"
            if profiled:
                bench.profiler.start(re.sub(r"[^A-Za-z0-9]+", "_", case.name))
            try:
                run = await bench.run(
                    case, target, connections=CONNECTIONS, threads=THREADS, seconds=plan.seconds
                )
            finally:
                if profiled:
                    bench.profiler.stop()
            sides[target].runs.append(run)
    for target in ("floor", "service"):
        sides[target].sequential = await bench.run(
            case, target, connections=1, threads=1, seconds=plan.sequential_seconds
        )
    return sides


# --- the report ---------------------------------------------------------------------


def cpu_percent(run: Run, name: str) -> float:
    if name == "others":
        ours = sum(run.cpu_s[k] for k in ("service", "floor", "wrk")) + (run.database_s or 0.0)
        return 100 * (run.cpu_s["machine"] - ours) / run.load.seconds
    return 100 * run.cpu_s[name] / run.load.seconds


def cpu_cells(run: Run, target: str) -> str:
    """The CPU columns of a run: the service, the floor, the event loop's thread of the
    one measured (`target`), wrk, the database, the machine and the rest of it, % of one
    core each."""
    cells = [f"{cpu_percent(run, name):{width}.0f}%" for name, width in SHARES[:2]]
    cells.append(f"{cpu_percent(run, f'{target} loop'):5.0f}%")
    cells += [f"{cpu_percent(run, name):{width}.0f}%" for name, width in SHARES[2:3]]
    cells.append(
        f"{'in proc':>8}"
        if run.database_s is None
        else f"{100 * run.database_s / run.load.seconds:7.0f}%"
    )
    cells += [f"{cpu_percent(run, name):{width}.0f}%" for name, width in SHARES[3:]]
    return " ".join(cells)


SHARES = (("service", 6), ("floor", 5), ("wrk", 4), ("machine", 6), ("others", 5))


def print_tables(dialect: Dialect, results: list[tuple[Case, dict[str, Side]]]) -> None:
    header = (
        f"{'query':<40} {'floor/s':>8} {'service/s':>9} {'ratio':>6}  "
        f"{'floor p50/p99 ms':>17}  {'service p50/p99 ms':>18}  {'stmts/req':>9}  "
        f"{'seq p50 floor/service ms':>24} {'x':>6}"
    )
    print(f"\n{dialect.title}: floor and service, one run each of every query")
    print(header)
    print("-" * len(header))
    for case, sides in results:
        floor, service = sides["floor"], sides["service"]
        assert floor.sequential is not None and service.sequential is not None
        statements = case.statements
        seq_floor, seq_service = floor.sequential.load.p50_ms, service.sequential.load.p50_ms
        print(
            f"{case.name:<40} {floor.per_second:8.1f} {service.per_second:9.1f} "
            f"{service.per_second / floor.per_second:6.3f}  "
            f"{floor.mean('p50_ms'):8.1f}/{floor.mean('p99_ms'):<8.1f}  "
            f"{service.mean('p50_ms'):9.1f}/{service.mean('p99_ms'):<8.1f}  "
            f"{statements:9.2f}  "
            f"{seq_floor:11.2f}/{seq_service:<12.2f} {seq_service / seq_floor:5.1f}x"
        )

    print(
        f"\n{dialect.title}: what limits each run: the rate asked (closed loop: saturate with N"
        " connections) and achieved, and the CPU of each process over the run, % of one core"
        " (loop: the main thread of the process measured, where its event loop runs; on"
        " SQLite its other threads are aiosqlite's, which take the same GIL to run each"
        " statement and hand its rows back;"
        f" database: {dialect.database_cpu}; machine: all of its"
        f" {os.cpu_count()} cores, at most {100 * (os.cpu_count() or 1)}%; others: the machine"
        " less the processes of the bench, what else ran)"
    )
    header = (
        f"{'query':<40} {'target':<8} {'asked':<18} {'req/s':>8} {'p50 ms':>8}  "
        f"{'service':>7} {'floor':>6} {'loop':>6} {'wrk':>5} {'database':>8} {'machine':>7}"
        f" {'others':>6}"
    )
    print(header)
    print("-" * len(header))
    for case, sides in results:
        for target in ("floor", "service"):
            side = sides[target]
            assert side.sequential is not None
            labelled = [(f"saturate, {CONNECTIONS} conns", r) for r in side.runs]
            labelled.append(("saturate, 1 conn", side.sequential))
            for asked, run in labelled:
                print(
                    f"{case.name:<40} {target:<8} {asked:<18} {run.load.per_second:8.1f} "
                    f"{run.load.p50_ms:8.2f}  {cpu_cells(run, target)}"
                )


def print_logs(logs: Path) -> None:
    for log in sorted(logs.glob("*.log")):
        print(f"--- the end of {log.name}:\n{log.read_text()[-4000:]}", file=sys.stderr)


# --- the dialects -------------------------------------------------------------------


@dataclass
class Store:
    """One dialect's fresh database, seeded by the bench, read by the service and the
    floor."""

    url: str  # the service's BETTERCOMPUTE_DATABASE_URL
    floor_env: dict[str, str]  # where the floor finds it
    version: str  # the database's (PostgreSQL: the server's; SQLite: the library's)
    database: str | None = None  # PostgreSQL: the bench database's name
    monitor: asyncpg.Connection | None = None  # PostgreSQL: reads its backends


@asynccontextmanager
async def postgresql_store() -> AsyncIterator[Store]:
    async with bench_database() as url:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        monitor = await asyncpg.connect(dsn)
        try:
            version = await monitor.fetchval("SHOW server_version")  # 15.20 (Debian ...)
            yield Store(
                url,
                {"BENCH_FLOOR_DSN": dsn},
                version.split()[0],
                make_url(url).database,
                monitor,
            )
        finally:
            await monitor.close()


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Store]:
    async with bench_sqlite_database() as url:
        path = sqlite_file(url)
        assert path is not None, url
        yield Store(url, {"BENCH_FLOOR_SQLITE": path}, sqlite3.sqlite_version)


@dataclass(frozen=True)
class Dialect:
    name: str  # --dialect's
    title: str  # the heading of its tables
    floor: str  # the floor's uvicorn target
    floor_text: str  # what the floor is, printed
    database_cpu: str  # what the database column of the CPU table is
    store: Callable[[], AbstractAsyncContextManager[Store]]


DIALECTS = {
    "postgresql": Dialect(
        "postgresql",
        "PostgreSQL",
        "bench.floor:app",
        "bench/floor.py, one SQL statement per request building the JSON"
        " (json_build_object/json_agg) through an asyncpg pool of"
        f" {POSTGRESQL_FLOOR_CONNECTIONS}",
        "the PostgreSQL backends of the bench database",
        postgresql_store,
    ),
    "sqlite": Dialect(
        "sqlite",
        "SQLite, the embedded default",
        "bench.floor_sqlite:app",
        "bench/floor_sqlite.py, one SQL statement per request building the JSON"
        " (json_object/json_group_array) through aiosqlite,"
        f" {SQLITE_FLOOR_CONNECTIONS} connections to the service's file, WAL",
        "in process (SQLite runs inside the service and the floor, on their threads: its"
        " CPU is theirs)",
        sqlite_store,
    ),
}


# --- a run of one dialect -------------------------------------------------------------


async def measure(
    dialect: Dialect,
    store: Store,
    plan: Plan,
    generator: LoadGenerator,
    logs: Path,
    only: list[str],
    profile: str | None,
) -> None:
    servers: list[subprocess.Popen[bytes]] = []
    started = time.perf_counter()
    seeded = await seed(store.url, max((*plan.sizes, ONE_POOL_TENANT)))
    print(f"seeded {seeded.pools:,} pools in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        service, service_port = start_server(
            ["--factory", "app.server:app_from_env", "--http", service_http(store.url)],
            {"BETTERCOMPUTE_DATABASE_URL": store.url},
            logs / f"{dialect.name}-service.log",
        )
        servers.append(service)
        floor, floor_port = start_server(
            [dialect.floor], store.floor_env, logs / f"{dialect.name}-floor.log"
        )
        servers.append(floor)
        service_url, floor_url = (
            f"http://127.0.0.1:{service_port}",
            f"http://127.0.0.1:{floor_port}",
        )
        async with (
            httpx.AsyncClient(base_url=service_url, timeout=60) as service_client,
            httpx.AsyncClient(base_url=floor_url, timeout=60) as floor_client,
        ):
            cases = [
                await dashboard_case(size, seeded.tokens[size], service_client, floor_client)
                for size in plan.sizes
            ]
            cases[1:1] = await one_pool_cases(seeded, service_client, floor_client)
            cases = [c for c in cases if not only or any(o in c.name for o in only)]
            for case in cases:
                case.statements = await count_statements(service_client, case)
            print(
                "floor and service answer the same data for every request measured "
                f"({sum(len(c.service) for c in cases)} requests)",
                flush=True,
            )
            bench = Bench(
                generator,
                Processes(service.pid, floor.pid, store.database, store.monitor),
                service_url,
                floor_url,
                service_client,
                Profiler(profile, service.pid),
            )
            results = []
            for case in cases:
                results.append((case, await measure_case(bench, case, plan)))
                print(f"  measured {case.name}", flush=True)
        print_tables(dialect, results)
        cut_off: dict[str, float] = {}
        for _, sides in results:
            for r in sides["service"].runs:
                for code, n in (r.counts.errors if r.counts else {}).items():
                    cut_off[code] = cut_off.get(code, 0) + n
        if cut_off:
            print(
                f"errors the service counted, at most {CONNECTIONS} a run (the requests wrk"
                f" cut off when it stopped): {cut_off}"
            )
    except BaseException:
        print_logs(logs)
        raise
    finally:
        for process in servers:
            stop_server(process)


async def run_dialect(
    dialect: Dialect,
    plan: Plan,
    generator: LoadGenerator,
    logs: Path,
    only: list[str],
    profile: str | None,
) -> None:
    async with dialect.store() as store:
        print(f"\n== {dialect.title} (version {store.version}); database: {dialect.database_cpu}")
        print(f"uptime at start: {uptime()}")
        print(
            "service: uvicorn --factory app.server:app_from_env --http"
            f" {service_http(store.url)}, one"
            f" process (the protocol `serve` picks), on {store.url}; floor:"
            f" {dialect.floor_text}, its own uvicorn process with uvicorn's own protocol"
            " (--http auto)",
            flush=True,
        )
        await measure(dialect, store, plan, generator, logs, only, profile)
        print(f"uptime at end: {uptime()}", flush=True)


async def run(
    plan: Plan, prefer: str, dialects: list[Dialect], only: list[str], profile: str | None
) -> None:
    generator = ensure_generator(prefer)
    version = generator_version(generator)
    warm_up = (
        f"a {plan.warmup_seconds:g} s warm-up run of each"
        if plan.warmup_seconds
        else "the checks (no warm-up run)"
    )
    print(
        f"load: {version}; asked: saturate, {CONNECTIONS} connections on {THREADS} thread "
        f"(closed loop: each connection sends its next request when its answer arrives), "
        f"{plan.seconds:g} s a run, {plan.rounds} round{'s' * (plan.rounds > 1)} alternating "
        f"floor and service after {warm_up}; sequential: 1 connection, 1 thread, "
        f"{plan.sequential_seconds:g} s; dialects: {', '.join(d.title for d in dialects)}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-graphql-pools-") as logs:
        for dialect in dialects:
            await run_dialect(
                dialect, plan, generator, Path(logs), only, profile and f"{profile}/{dialect.name}"
            )
    print(
        "\nfloor/s, service/s: requests (pages) per second under load; p50/p99 the mean of the"
        " rounds' percentiles. stmts/req: the service's bettercompute_db_statements_total for"
        " the query's transport over 20 or more requests sent one at a time (SQL statements;"
        " ROLLBACK and pool pings not counted, nor BEGIN on PostgreSQL; on SQLite the service"
        " sends each transaction's BEGIN as a statement, app/db/engine.py, and counts it)."
        " seq p50: one connection, one thread;"
        " x: the service's over the floor's. Paged: one request is one page; a dashboard"
        " load is its pages in turn."
    )
    if plan.quick:
        print("quick run: short runs, figures for a smoke test only")


def generator_version(generator: LoadGenerator) -> str:
    if generator.name == "wrk":
        done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
        first = (done.stdout or done.stderr).splitlines()
        return first[0].split(" [")[0] if first else "wrk"
    return generator.name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test")
    parser.add_argument(
        "--generator",
        choices=("wrk", "autocannon"),
        default="wrk",
        help="the load generator to try first (the other is the fallback)",
    )
    parser.add_argument(
        "--dialect",
        choices=("postgresql", "sqlite", "both"),
        default="both",
        help="the database of the service and the floor (both: PostgreSQL, then SQLite)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="measure only the reads whose name holds one of these, comma-separated"
        " (e.g. 'one pool,lending'); the others are still checked against the floor",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy the service through each read's first service round"
        " (DIR/<dialect>/<read>.txt)",
    )
    args = parser.parse_args(argv)
    names = ("postgresql", "sqlite") if args.dialect == "both" else (args.dialect,)
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    plan = QUICK if args.quick else FULL
    asyncio.run(run(plan, args.generator, [DIALECTS[n] for n in names], only, args.profile))


if __name__ == "__main__":
    main()
