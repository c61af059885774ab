"""Benchmark: the write path (bookings, release, pool writes) against a one-statement
floor, driven by wrk (printed figures, docs/performance.md "Writes").

    .venv/bin/python -m bench.writes            # about 11 minutes
    .venv/bin/python -m bench.writes --quick    # a smoke test, tiny rounds (about 4 minutes)

Needs PostgreSQL at 127.0.0.1:5432 (BENCH_POSTGRES_URL) with pg_stat_statements in
shared_preload_libraries (the extension is created in the bench database), and Redis
(BENCH_REDIS_URL) for the 2-process round. Installs `wrk` with apt-get on first use.

Data (a fresh database, dropped at the end), written through the domain (app/capacity):
a provider tenant with a site and 100 `metal-host` exclusive pools booked in (and 16 more,
one per wrk connection, for `offer` and `update`), each offered to one guest tenant
(quota 10^12 gpu); capacity widened by adding nodes (1,024 GPUs each, through the domain)
until every pool has room for the whole booking round. The widening is in the
rollup itself, so a pool `update` (which refreshes the rollup from the nodes) keeps it;
the booking rounds also run before the pool writes and each booking round re-checks the
room first (the issue's first run lost its widened capacity to an update). What rounds
consume (reservations to release, offers to withdraw, pools to archive) is prepared
before each round with bulk SQL, rows of the shape the domain writes, twice the previous
round's rate; a round that ran out is INVALID. The database is analyzed before each round,
so both sides run on plans made for the tables as they are (a bulk load grows them many
times over at once, which the service's own writes never do).

The floor is bench/write_floor.py (its docstring says what it does and skips), its own
uvicorn process; the service one `bettercompute serve`. wrk runs 16 threads of one
connection each (closed loop: the rate achieved is what each sustains), so each
connection owns its list: the pools it books in (spread over the 100 pools), its own
pool for `offer`/`update`, its own reservations, offers and pools to consume;
idempotency keys are unique per request. Floor and service rounds alternate.

Per write it prints floor /s, service /s, the ratio, p50/p99 of each, round trips per
request (pg_stat_statements' `calls` over the round, divided by the requests wrk
counted), CPU ms per request of the service, the floor and the PostgreSQL backends of the
bench database, and non-2xx counts; then updates/s at 1 and 2 service processes
(`serve --workers N`, Redis broadcast), with the CPU of each process and of PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from app.capacity import inventory, nodes
from app.capacity.inputs import CreatePoolInput, OfferPoolInput
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import create_database
from app.iam.callers import authenticate, create_caller
from app.ids import new_id
from bench.database import bench_database
from bench.graphql_pools import (
    BackendsCpu,
    Processes,
    free_port,
    generator_version,
    machine_busy_s,
    print_logs,
    service_counts,
    settled_counts,
    start_server,
    stop_server,
    uptime,
)
from bench.native_load import _lua_string, _marked_json, _run_child, ensure_wrk
from bench.proc import Profiler, cpu_s, until_ready
from bench.usage_watch import UsageWatch, summary

CONNECTIONS = 16
POOLS = 100
PROVIDER, GUEST = "provider", "guest"
GUEST_QUOTA = 10**12
NODE_GPUS = 1024
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BOOKING = """mutation Book($input: CreateReservationInput!) {
  createReservation(input: $input) {
    reservation { id poolId tenantId resources { resource amount } state createdAt }
  }
}"""


@dataclass(frozen=True)
class Plan:
    seconds: float
    rounds: int
    warmup_seconds: float
    scale_seconds: float
    floor_guess: float  # requests/s, to size what the first round consumes
    service_guess: float
    quick: bool = False


FULL = Plan(5, 2, 2, 8, floor_guess=2000, service_guess=300)
QUICK = Plan(1, 1, 0, 1, floor_guess=1000, service_guess=100, quick=True)


# --- data ---------------------------------------------------------------------------


@dataclass
class Seeded:
    site: str
    pools: list[str]  # offered to the guest; pools[0] is the hot one
    own: list[str]  # one per connection, for offer and update (not booked in)
    tokens: dict[str, str]  # tenant -> admin token
    callers: dict[str, str]  # tenant -> caller id


async def seed(url: str) -> Seeded:
    db = create_database(url)
    try:
        capacity = Capacity(db)
        for tenant in (PROVIDER, GUEST):
            await inventory.create_tenant(db, tenant, None)
        site = await inventory.create_site(db, PROVIDER, "custom", "eu-west")
        callers, tokens = {}, {}
        for tenant in (PROVIDER, GUEST):
            callers[tenant], tokens[tenant] = await create_caller(db, tenant, "admin")
        owner = await authenticate(db, f"Bearer {tokens[PROVIDER]}")
        made = []
        for _ in range(POOLS + CONNECTIONS):
            inp = CreatePoolInput.model_validate(
                {"tenantId": PROVIDER, "siteId": site, "class": "metal-host", "gpuModel": "H100"}
            )
            pool = (await capacity.create_pool(owner, inp)).pool.id
            offer = {"tenantId": PROVIDER, "poolId": pool, "toTenantId": GUEST}
            await capacity.offer_pool(
                owner, OfferPoolInput.model_validate(offer | {"quota": {"gpu": GUEST_QUOTA}})
            )
            await nodes.add_node(db, pool, NODE_GPUS)
            made.append(pool)
        return Seeded(site, made[:POOLS], made[POOLS:], tokens, callers)
    finally:
        await db.dispose()


async def widen(url: str, conn: asyncpg.Connection, pools: list[str], room: int) -> int:
    """Add nodes (through the domain) until each pool has `room` GPUs free; nodes added."""
    rows = await conn.fetch(
        "SELECT pool_id, allocatable - booked AS free FROM capacity_rows"
        " WHERE pool_id = ANY($1) AND resource = 'gpu'",
        pools,
    )
    free: dict[str, int] = {row["pool_id"]: row["free"] for row in rows}
    missing = {p: room - free.get(p, 0) for p in pools if free.get(p, 0) < room}
    if not missing:
        return 0
    db = create_database(url)
    added = 0
    try:
        for pool, short in missing.items():
            for _ in range(math.ceil(short / NODE_GPUS)):
                await nodes.add_node(db, pool, NODE_GPUS)
                added += 1
    finally:
        await db.dispose()
    return added


async def prepare_reservations(conn: asyncpg.Connection, pools: list[str], count: int) -> list[str]:
    """Active one-GPU reservations of the guest, booked as the domain books them (quota
    `used` and capacity `booked` raised by as many)."""
    ids = [new_id("rsv") for _ in range(count)]
    where = [pools[i % len(pools)] for i in range(count)]
    async with conn.transaction():
        await conn.execute(
            """INSERT INTO reservations (id, pool_id, tenant_id, quota_tenant_id, resources,
                 state, created_at, ended_at)
               SELECT id, pool, $3, $3, '{"gpu": 1}', 'active', now(), NULL
               FROM unnest($1::text[], $2::text[]) AS r(id, pool)""",
            ids,
            where,
            GUEST,
        )
        await conn.execute(
            """WITH n AS (SELECT pool, count(*) AS k FROM unnest($1::text[]) pool GROUP BY pool)
               UPDATE quota_rows q SET used = used + n.k FROM n
               WHERE q.pool_id = n.pool AND q.tenant_id = $2 AND q.resource = 'gpu'""",
            where,
            GUEST,
        )
        await conn.execute(
            """WITH n AS (SELECT pool, count(*) AS k FROM unnest($1::text[]) pool GROUP BY pool)
               UPDATE capacity_rows c SET booked = booked + n.k FROM n
               WHERE c.pool_id = n.pool AND c.resource = 'gpu'""",
            where,
        )
    return ids


async def prepare_pools(
    conn: asyncpg.Connection, site: str, count: int, guests: int = 1
) -> list[str]:
    """Pools as create + offer write them: the owner's offer, quota and authz rows, and
    `guests` guest offers (the guest, then ids no tenant holds, as offers may name), each
    with a quota row and an authz row, and a capacity row."""
    ids = sorted(new_id("pool") for _ in range(count))
    tenants = [GUEST] + [f"gone-{k}" for k in range(guests - 1)]
    async with conn.transaction():
        await conn.execute(
            """INSERT INTO pools (id, tenant_id, site_id, class, gpu_model, sharing, agent,
                 policy, provider_account_id, region, archived, version, created_at, updated_at)
               SELECT id, $2, $3, 'metal-host', 'H100', 'exclusive', 'bcd', '{}', NULL,
                 'eu-west', false, 1 + $5, now(), now() FROM unnest($1::text[]) id;
               """.replace("$5", str(guests)),
            ids,
            PROVIDER,
            site,
        )
        for tenant, owned, maximum in [(PROVIDER, True, 2_147_483_647)] + [
            (t, False, GUEST_QUOTA) for t in tenants
        ]:
            await conn.execute(
                """INSERT INTO offers (pool_id, tenant_id, include_descendants, priority,
                     created_at) SELECT id, $2, false, 0, now() FROM unnest($1::text[]) id""",
                ids,
                tenant,
            )
            await conn.execute(
                """INSERT INTO quota_rows (pool_id, tenant_id, resource, max, used)
                   SELECT id, $2, 'gpu', $3, 0 FROM unnest($1::text[]) id""",
                ids,
                tenant,
                maximum,
            )
            await conn.execute(
                """INSERT INTO authz_rows (tenant_id, pool_id, gpu_model, class, sharing,
                     region, owned, include_descendants)
                   SELECT $2, id, 'H100', 'metal-host', 'exclusive', 'eu-west', $3, false
                   FROM unnest($1::text[]) id""",
                ids,
                tenant,
                owned,
            )
        await conn.execute(
            """INSERT INTO capacity_rows (pool_id, resource, total, allocatable, booked)
               SELECT id, 'gpu', 8, 8, 0 FROM unnest($1::text[]) id""",
            ids,
        )
    return ids


# --- the writes ---------------------------------------------------------------------


def _item(**fields: Any) -> str:
    """JSON members spliced into a body template at @ITEM@."""
    return json.dumps(fields, separators=(",", ":"))[1:-1]


@dataclass
class Write:
    name: str
    service_path: str
    floor_path: str
    body: str  # with @ITEM@ (per connection, in turn) and @KEY@ (unique per request)
    consumes: bool = False  # each item is used once (release, unoffer, archive)
    items: list[list[str]] = field(default_factory=list)  # per connection

    def request_body(self, item: str, key: str) -> str:
        return self.body.replace("@ITEM@", item).replace("@KEY@", key)


def rest(path: str, tenant: str, extra: str = "") -> tuple[str, str]:
    return f"/api/compute/{path}", '{"tenantId":"' + tenant + '",@ITEM@' + extra + "}"


ROW_NAMES = (
    f"booking, REST, {POOLS} quotas",
    "booking, REST, one hot quota",
    "booking, GraphQL createReservation",
    "release, REST",
    "pool create",
    "pool offer (resize)",
    "pool update (gpuModel)",
    "pool unoffer",
    "pool archive",
)


def writes(seeded: Seeded) -> list[Write]:
    book_path, book_body = rest(
        "reservations/create", GUEST, ',"resources":{"gpu":1},"idempotencyKey":"@KEY@"'
    )
    graphql_body = json.dumps(
        {
            "query": BOOKING,
            "variables": {
                "input": {"tenantId": GUEST, "resources": [{"resource": "gpu", "amount": 1}]}
            },
        },
        separators=(",", ":"),
    ).replace('{"tenantId"', '{@ITEM@,"idempotencyKey":"@KEY@","tenantId"')
    spread = [
        [_item(poolId=seeded.pools[(c + k * CONNECTIONS) % POOLS]) for k in range(7)]
        for c in range(CONNECTIONS)
    ]
    hot = [[_item(poolId=seeded.pools[0])] for _ in range(CONNECTIONS)]
    create_path, create_body = rest("pools/create", PROVIDER, ',"idempotencyKey":"@KEY@"')
    create_items = [[_item(siteId=seeded.site, **{"class": "metal-host"})]] * CONNECTIONS
    offer_items = [
        [_item(poolId=pool, toTenantId=GUEST, quota={"gpu": GUEST_QUOTA + k}) for k in (1, 2, 3)]
        for pool in seeded.own
    ]
    update_items = [
        [_item(poolId=pool, gpuModel=model) for model in ("H200", "H100")] for pool in seeded.own
    ]
    release_path, release_body = rest("reservations/release", GUEST)
    return [
        Write(f"booking, REST, {POOLS} quotas", book_path, "/book", book_body, items=spread),
        Write("booking, REST, one hot quota", book_path, "/book", book_body, items=hot),
        Write(
            "booking, GraphQL createReservation",
            "/graphql",
            "/book-graphql",
            graphql_body,
            items=spread,
        ),
        Write("release, REST", release_path, "/release", release_body, consumes=True),
        Write("pool create", create_path, "/pools/create", create_body, items=create_items),
        Write("pool offer (resize)", *_pool_write("offer"), items=offer_items),
        Write("pool update (gpuModel)", *_pool_write("update"), items=update_items),
        Write("pool unoffer", *_pool_write("unoffer"), consumes=True),
        Write("pool archive", *_pool_write("archive"), consumes=True),
    ]


def _pool_write(method: str) -> tuple[str, str, str]:
    path, body = rest(f"pools/{method}", PROVIDER)
    return path, f"/pools/{method}", body


async def prepare(write: Write, conn: asyncpg.Connection, seeded: Seeded, count: int) -> None:
    """Fresh items for a round of a write that consumes them, `count` in all."""
    per = max(2, math.ceil(count / CONNECTIONS))
    if write.name.startswith("release"):
        ids = await prepare_reservations(conn, seeded.pools, per * CONNECTIONS)
        items = [_item(reservationId=i) for i in ids]
    elif write.name == "pool unoffer":
        guests = 50  # guest offers per pool to withdraw (at most 100 offers a pool)
        pools = await prepare_pools(
            conn, seeded.site, math.ceil(per / guests) * CONNECTIONS, guests
        )
        tenants = [GUEST] + [f"gone-{k}" for k in range(guests - 1)]
        items = [_item(poolId=p, toTenantId=t) for p in pools for t in tenants]
    else:
        pools = await prepare_pools(conn, seeded.site, per * CONNECTIONS)
        items = [_item(poolId=p) for p in pools]
    per = len(items) // CONNECTIONS
    write.items = [items[c * per : (c + 1) * per] for c in range(CONNECTIONS)]


# --- wrk ----------------------------------------------------------------------------

_MARKER = "BENCH_WRITES "
_SCRIPT = r"""
local items = __ITEMS__
local body = __BODY__
local method, path = "POST", __PATH__
local headers = __HEADERS__
local prefix = __PREFIX__
local counter = 0
local threads = {}

function setup(thread)
  counter = counter + 1
  thread:set("me", counter)
  table.insert(threads, thread)
end

function init(args)
  mine = items[me]
  n = 0
end

function request()
  n = n + 1
  local item = mine[(n - 1) % #mine + 1]
  local key = prefix .. me .. "-" .. n
  local b = body:gsub("@ITEM@", function() return item end)
  b = b:gsub("@KEY@", function() return key end)
  return wrk.format(method, path, headers, b)
end

function done(summary, latency, requests)
  local over = 0
  for i, t in ipairs(threads) do
    local sent = t:get("n")
    if sent - #items[i] > over then over = sent - #items[i] end
  end
  local e = summary.errors
  io.write(string.format(
    '%s{"requests": %d, "duration_us": %d, "status": %d, "socket": %d, "p50_us": %d, '
    .. '"p99_us": %d, "over": %d}\n', "__MARKER__", summary.requests, summary.duration,
    e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), over))
end
""".replace("__MARKER__", _MARKER)


def lua_script(write: Write, path: str, headers: dict[str, str], prefix: str) -> str:
    items = (
        "{"
        + ",\n".join("{" + ", ".join(_lua_string(i) for i in mine) + "}" for mine in write.items)
        + "}"
    )
    header_table = (
        "{"
        + ", ".join(f"[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in headers.items())
        + "}"
    )
    return (
        _SCRIPT.replace("__ITEMS__", items)
        .replace("__BODY__", _lua_string(write.body))
        .replace("__PATH__", _lua_string(path))
        .replace("__HEADERS__", header_table)
        .replace("__PREFIX__", _lua_string(prefix))
    )


@dataclass(frozen=True)
class Load:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    non2xx: int
    socket_errors: int
    over: int  # requests past the prepared items of a connection (consumed twice)

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def run_wrk(wrk: str, url: str, script: str, seconds: float) -> Load:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as file:
        file.write(script)
    try:
        command = [
            wrk,
            f"-t{CONNECTIONS}",
            f"-c{CONNECTIONS}",
            f"-d{max(1, round(seconds))}s",
            "--timeout=30s",
            "-s",
            file.name,
            url,
        ]
        output, _ = _run_child(command, seconds + 60)
    finally:
        os.unlink(file.name)
    found = _marked_json(output, _MARKER)
    return Load(
        requests=int(found["requests"]),
        seconds=found["duration_us"] / 1e6,
        p50_ms=found["p50_us"] / 1000,
        p99_ms=found["p99_us"] / 1000,
        non2xx=int(found["status"]),
        socket_errors=int(found["socket"]),
        over=int(found["over"]),
    )


# --- processes ----------------------------------------------------------------------


def tree(pid: int) -> list[int]:
    """A process and its descendants (uvicorn's workers)."""
    found = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return found
    for child in children:
        found += tree(int(child))
    return found


def _this_checkout() -> str:
    """PYTHONPATH with this checkout first: the venv's `bettercompute` script imports the
    checkout the venv was installed from, which a git worktree sharing the venv is not."""
    given = os.environ.get("PYTHONPATH")
    root = str(Path(__file__).resolve().parents[1])
    return root if not given else os.pathsep.join((root, given))


def start_serve(
    url: str, workers: int, log: Path, broadcast: bool, settings: Mapping[str, str] = {}
) -> tuple[subprocess.Popen[bytes], int]:
    """`bettercompute serve` of this checkout on `url` and a free port, ready, with
    `settings` (BETTERCOMPUTE_* variables) beside the environment's."""
    port = free_port()
    binary = Path(sys.executable).with_name("bettercompute")
    env = {
        **os.environ,
        **settings,
        "BETTERCOMPUTE_DATABASE_URL": url,
        "PYTHONPATH": _this_checkout(),
    }
    if broadcast:
        env["BETTERCOMPUTE_BROADCAST_URL"] = REDIS_URL
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(binary), "serve", "--port", str(port), "--workers", str(workers)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    until_ready(process, port, log, lambda: workers == 1 or len(tree(process.pid)) > workers)
    return process, port


@dataclass
class Round:
    target: str
    load: Load
    statements: float  # pg_stat_statements calls over the round
    cpu_s: dict[str, float]  # service, floor, postgres, machine; service:<pid> per process
    wall_s: float  # the CPU was read over this time (wrk's start and end included)
    served: int  # requests the statements were counted over (the service: by its metrics)

    @property
    def invalid(self) -> str:
        why = []
        if self.load.non2xx or self.load.socket_errors:
            why.append(f"{self.load.non2xx} non-2xx, {self.load.socket_errors} socket errors")
        if self.load.over:
            why.append(f"ran out of prepared items ({self.load.over} over)")
        if not self.load.requests:
            why.append("no answer")
        return "; ".join(why)


@dataclass
class Bench:
    wrk: str
    url: str  # the database's
    seeded: Seeded
    conn: asyncpg.Connection  # the bench database: prepared rows, pg_stat_statements
    processes: Processes
    service_pid: int
    urls: dict[str, str]
    headers: dict[str, dict[str, str]]  # tenant -> the service's request headers
    floor_role: str

    async def calls(self, target: str) -> float:
        """Statements run so far in the bench database by the target: the floor connects
        as a role of its own; the rest is the service's, its background tasks included."""
        which = "=" if target == "floor" else "<>"
        return float(
            await self.conn.fetchval(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query NOT LIKE '%pg_stat_%'"
                f" AND userid {which} (SELECT oid FROM pg_roles WHERE rolname = $1)",
                self.floor_role,
            )
        )

    async def run(self, write: Write, target: str, seconds: float) -> Round:
        tenant = PROVIDER if write.service_path.startswith("/api/compute/pools") else GUEST
        path = write.service_path if target == "service" else write.floor_path
        headers = (
            self.headers[tenant] if target == "service" else {"content-type": "application/json"}
        )
        script = lua_script(write, path, headers, f"{target[0]}{secrets.token_hex(4)}-")
        transport = "graphql" if write.service_path == "/graphql" else "rest"
        metrics = httpx.AsyncClient(base_url=self.urls["service"], timeout=60)
        before_served = await service_counts(metrics, transport)
        pids = tree(self.service_pid)
        backends = BackendsCpu(self.processes)
        before_calls = await self.calls(target)
        await backends.start()
        before = {p: cpu_s(p) for p in pids} | {
            -1: cpu_s(self.processes.floor),
            -2: machine_busy_s(),
        }
        started = time.perf_counter()
        try:
            load = await asyncio.to_thread(run_wrk, self.wrk, self.urls[target], script, seconds)
            if not write.consumes:  # items used in turn, again and again
                load = dataclasses.replace(load, over=0)
            after = {p: cpu_s(p) for p in pids} | {
                -1: cpu_s(self.processes.floor),
                -2: machine_busy_s(),
            }
        finally:
            postgres = await backends.stop()
        wall = time.perf_counter() - started
        served = load.requests
        if target == "service":
            # The requests wrk left in flight still run: statements and requests are both
            # read once the service's counts stand still, the requests as it counted them.
            served = int((await settled_counts(metrics, transport) - before_served).requests)
        await metrics.aclose()
        statements = await self.calls(target) - before_calls
        used = {f"service:{p}": after[p] - before[p] for p in pids}
        cpu = used | {
            "service": sum(used.values()),
            "floor": after[-1] - before[-1],
            "postgres": postgres,
            "machine": after[-2] - before[-2],
        }
        return Round(target, load, statements, cpu, wall, served)


@dataclass
class Result:
    write: Write
    rounds: list[Round] = field(default_factory=list)
    usage: list[str] = field(default_factory=list)  # bench/usage_watch.py, per service round

    def of(self, target: str) -> list[Round]:
        return [r for r in self.rounds if r.target == target]

    def rate(self, target: str) -> float:
        rs = self.of(target)
        return sum(r.load.requests for r in rs) / sum(r.load.seconds for r in rs)

    def mean(self, target: str, attribute: str) -> float:
        rs = self.of(target)
        return sum(float(getattr(r.load, attribute)) for r in rs) / len(rs)

    def per_request(self, target: str, key: str) -> float:
        rs = self.of(target)
        requests = sum(r.load.requests for r in rs) or 1
        if key == "statements":
            return sum(r.statements for r in rs) / (sum(r.served for r in rs) or 1)
        return 1000 * sum(r.cpu_s[key] for r in rs) / requests


async def measure_write(bench: Bench, write: Write, plan: Plan, profiler: Profiler) -> Result:
    result = Result(write)
    guess = {"floor": plan.floor_guess, "service": plan.service_guess}
    rates = dict(guess)
    order = [("floor", plan.warmup_seconds, False), ("service", plan.warmup_seconds, False)]
    order = order if plan.warmup_seconds else []
    for n in range(plan.rounds):
        pair = ("floor", "service") if n % 2 == 0 else ("service", "floor")
        order += [(target, plan.seconds, True) for target in pair]
    for target, seconds, kept in order:
        # Twice the last round's rate (the first: the plan's guess): a round that outruns
        # what was prepared is INVALID.
        expected = max(2 * rates[target], guess[target]) * seconds + 20 * CONNECTIONS
        if write.name.startswith("release"):
            room = math.ceil(expected / POOLS) + 16
            await widen(bench.url, bench.conn, bench.seeded.pools, room)
        if write.consumes:
            await prepare(write, bench.conn, bench.seeded, math.ceil(expected))
        elif write.name.startswith("booking"):
            hot = write.name.endswith("hot quota")
            pools = bench.seeded.pools[:1] if hot else bench.seeded.pools
            await widen(bench.url, bench.conn, pools, math.ceil(expected / len(pools)) + 16)
        # The bulk rows above can grow a table many times over in one go, which a service
        # never does: both sides' connections would keep plans made for the table as it
        # was (a primary-key probe planned as a scan of what was one page) until
        # autovacuum's ANALYZE, and each statement would pay per scan it holds. Analyzed
        # here, each round runs on plans for the tables it runs on.
        await bench.conn.execute("ANALYZE")
        watch = None
        if kept and target == "service" and write.name.endswith("hot quota"):
            token = bench.seeded.tokens[GUEST]
            watch = UsageWatch(bench.urls["service"], token, GUEST, bench.seeded.pools[0])
        # `--profile`: the service's first kept round of each write, sampled by py-spy.
        profiled = kept and target == "service" and not result.of("service")
        async with watch or contextlib.nullcontext():
            started = time.monotonic()
            if profiled:
                profiler.start(write.name.replace(" ", "_").replace(",", ""))
            try:
                done = await bench.run(write, target, seconds)
            finally:
                if profiled:
                    profiler.stop()
            if watch is not None:
                watch.window = (started, time.monotonic())
                async with httpx.AsyncClient(base_url=bench.urls["service"], timeout=60) as c:
                    used = await watch.settle(c, bench.headers[GUEST])
                result.usage.append(summary(watch, used, Settings().usage_coalesce_ms))
        rates[target] = max(done.load.per_second, 1.0)
        if kept:
            result.rounds.append(done)
    return result


# --- templates: the service's own answers -------------------------------------------


def template(answer: str, values: dict[str, str]) -> str:
    """The answer with each value (as it appears in the text) replaced by @NAME@."""
    for name, value in values.items():
        if value not in answer:
            raise RuntimeError(f"{value} is not in the service's answer: {answer}")
        answer = answer.replace(value, f"@{name}@")
    return answer


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


async def capture_templates(
    bench: Bench, client: httpx.AsyncClient, all_writes: list[Write]
) -> tuple[dict[str, str], dict[str, str]]:
    """One real answer of the service per write, made a template for the floor: (the
    templates, the answers), by the floor's name of the write."""
    found: dict[str, str] = {}
    real: dict[str, str] = {}
    seeded = bench.seeded

    async def post(name: str, write: Write, item: str, tenant: str) -> dict[str, Any]:
        body = write.request_body(item, f"tpl-{secrets.token_hex(6)}")
        answer = await client.post(write.service_path, content=body, headers=bench.headers[tenant])
        if answer.status_code != 200:
            raise RuntimeError(f"{write.name}: {answer.status_code} {answer.text}")
        found_json: dict[str, Any] = answer.json()
        found_json["__text__"] = real[name] = answer.text
        return found_json

    by_name = {w.name: w for w in all_writes}
    a = await post(
        "book", by_name[f"booking, REST, {POOLS} quotas"], _item(poolId=seeded.pools[1]), GUEST
    )
    r = a["reservation"]
    found["book"] = template(
        a["__text__"], {"ID": r["id"], "POOL": r["poolId"], "CREATED": r["createdAt"]}
    )
    g = await post(
        "book-graphql",
        by_name["booking, GraphQL createReservation"],
        _item(poolId=seeded.pools[1]),
        GUEST,
    )
    r = g["data"]["createReservation"]["reservation"]
    found["book-graphql"] = template(
        g["__text__"], {"ID": r["id"], "POOL": r["poolId"], "CREATED": r["createdAt"]}
    )
    (rsv,) = await prepare_reservations(bench.conn, seeded.pools[1:2], 1)
    a = await post("release", by_name["release, REST"], _item(reservationId=rsv), GUEST)
    r = a["reservation"]
    found["release"] = template(
        a["__text__"],
        {"ID": r["id"], "POOL": r["poolId"], "CREATED": r["createdAt"], "ENDED": r["endedAt"]},
    )
    for name, key, item in (
        ("create", "pool create", _item(siteId=seeded.site, **{"class": "metal-host"})),
        (
            "offer",
            "pool offer (resize)",
            _item(poolId=seeded.own[0], toTenantId=GUEST, quota={"gpu": 7}),
        ),
        ("update", "pool update (gpuModel)", _item(poolId=seeded.own[0], gpuModel="H200")),
    ):
        a = await post(name, by_name[key], item, PROVIDER)
        p = a["pool"]
        values = {"POOL": p["id"], "UPDATED": p["updatedAt"]}
        if name != "create":  # a new pool's createdAt, updatedAt and offeredAt are one time
            values['"version":@VERSION@'] = f'"version":{p["version"]}'
        if name == "offer":
            values['"max":@MAX@'] = '"max":7'
        if name == "update":
            values["GPU"] = '"H200"'
        text = a["__text__"]
        for placeholder, value in values.items():
            if placeholder.startswith('"'):
                text = text.replace(value, placeholder)
            else:
                text = template(text, {placeholder: value})
        found[name] = text
    (pool,) = await prepare_pools(bench.conn, seeded.site, 1, guests=2)
    a = await post(
        "unoffer", by_name["pool unoffer"], _item(poolId=pool, toTenantId="gone-0"), PROVIDER
    )
    found["unoffer"] = a["__text__"]
    a = await post("archive", by_name["pool archive"], _item(poolId=pool), PROVIDER)
    p = a["pool"]
    found["archive"] = template(
        a["__text__"].replace(f'"version":{p["version"]}', '"version":@VERSION@'),
        {"POOL": p["id"], "UPDATED": p["updatedAt"]},
    )
    return found, real


async def check_floor(
    bench: Bench, floor: httpx.AsyncClient, service_answers: dict[str, str]
) -> list[str]:
    """One write of each kind to the floor: the same JSON shape as the service's answer
    and its size; returns the lines to print."""
    seeded = bench.seeded
    (rsv,) = await prepare_reservations(bench.conn, seeded.pools[2:3], 1)
    (pool,) = await prepare_pools(bench.conn, seeded.site, 1, guests=2)
    own = seeded.own[1]
    cases = [
        (
            "book",
            "/book",
            _item(poolId=seeded.pools[2])
            + ',"tenantId":"guest","resources":{"gpu":1},"idempotencyKey":"chk"',
        ),
        ("release", "/release", _item(reservationId=rsv, tenantId=GUEST)),
        (
            "create",
            "/pools/create",
            _item(
                siteId=seeded.site,
                tenantId=PROVIDER,
                idempotencyKey="chk",
                **{"class": "metal-host"},
            ),
        ),
        (
            "offer",
            "/pools/offer",
            _item(poolId=own, tenantId=PROVIDER, toTenantId=GUEST, quota={"gpu": 7}),
        ),
        ("update", "/pools/update", _item(poolId=own, tenantId=PROVIDER, gpuModel="H200")),
        ("unoffer", "/pools/unoffer", _item(poolId=pool, tenantId=PROVIDER, toTenantId="gone-0")),
        ("archive", "/pools/archive", _item(poolId=pool, tenantId=PROVIDER)),
    ]
    lines = []
    for name, path, members in cases:
        answer = await floor.post(path, content="{" + members + "}")
        if answer.status_code != 200:
            raise RuntimeError(f"floor {path}: {answer.status_code} {answer.text}")
        ours = service_answers[name]
        if shape(answer.json()) != shape(json.loads(ours)):
            raise RuntimeError(f"floor {path} answers another shape:\n{answer.text}\n{ours}")
        lines.append(f"{name} {len(ours)}/{len(answer.content)}")
    g = json.dumps(
        {
            "query": BOOKING,
            "variables": {
                "input": {
                    "tenantId": GUEST,
                    "poolId": seeded.pools[2],
                    "resources": [{"resource": "gpu", "amount": 1}],
                    "idempotencyKey": "chk-g",
                }
            },
        }
    )
    answer = await floor.post("/book-graphql", content=g)
    if answer.status_code != 200 or shape(answer.json()) != shape(
        json.loads(service_answers["book-graphql"])
    ):
        raise RuntimeError(f"floor /book-graphql: {answer.status_code} {answer.text}")
    lines.append(f"book-graphql {len(service_answers['book-graphql'])}/{len(answer.content)}")
    return lines


# --- the report ---------------------------------------------------------------------


def _slashed(values: list[float], digits: int) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


def print_results(results: list[Result]) -> None:
    columns = (
        f"{'write':<36} {'floor/s':>8} {'service/s':>9} {'ratio':>6} "
        f"{'p50/p99 ms floor':>17} {'p50/p99 ms service':>19} {'stmts/req f/s':>13} "
        f"{'cpu ms/req svc/floor/pg(s)/pg(f)':>34} {'non-2xx f/s':>11}  valid"
    )
    print("\n" + columns)
    print("-" * len(columns))
    for res in results:
        invalid = "; ".join(f"{r.target}: {r.invalid}" for r in res.rounds if r.invalid)
        f, s = res.rate("floor"), res.rate("service")
        latency = {t: [res.mean(t, "p50_ms"), res.mean(t, "p99_ms")] for t in ("floor", "service")}
        statements = [res.per_request(t, "statements") for t in ("floor", "service")]
        cpu = [
            res.per_request("service", "service"),
            res.per_request("floor", "floor"),
            res.per_request("service", "postgres"),
            res.per_request("floor", "postgres"),
        ]
        non2xx = "/".join(str(sum(r.load.non2xx for r in res.of(t))) for t in ("floor", "service"))
        print(
            f"{res.write.name:<36} {f:8.1f} {s:9.1f} {s / f if f else 0:6.3f} "
            f"{_slashed(latency['floor'], 1):>17} {_slashed(latency['service'], 1):>19} "
            f"{_slashed(statements, 2):>13} {_slashed(cpu, 2):>34} {non2xx:>11}  "
            + ("INVALID: " + invalid if invalid else "ok")
        )
    print(
        f"\nEach round: the rate asked is saturate (closed loop, {CONNECTIONS} connections), the"
        " rate achieved req/s; CPU over the round in % of one core (postgres: the bench"
        " database's backends; machine: /proc/stat, every core)"
    )
    columns = (
        f"{'write':<36} {'target':<8} {'req/s':>8} {'p50 ms':>8} "
        f"{'service':>8} {'floor':>6} {'postgres':>9} {'machine':>8}"
    )
    print(columns)
    print("-" * len(columns))
    for res in results:
        for r in res.rounds:
            pct = {
                k: 100 * r.cpu_s[k] / r.wall_s for k in ("service", "floor", "postgres", "machine")
            }
            print(
                f"{res.write.name:<36} {r.target:<8} {r.load.per_second:8.1f} "
                f"{r.load.p50_ms:8.2f} {pct['service']:7.0f}% {pct['floor']:5.0f}% "
                f"{pct['postgres']:8.0f}% {pct['machine']:7.0f}%"
                + (f"  INVALID: {r.invalid}" if r.invalid else "")
            )


def print_usage(results: list[Result]) -> None:
    watched = [(res.write.name, line) for res in results for line in res.usage]
    if not watched:
        return
    print(
        "\npool.usage, one subscriber (the booking tenant) of the hot pool during each service"
        f" round (BETTERCOMPUTE_USAGE_COALESCE_MS={Settings().usage_coalesce_ms}):"
    )
    for name, line in watched:
        print(f"  {name}: {line}")


async def scale(url: str, bench: Bench, plan: Plan, logs: Path) -> list[str]:
    """Updates/s at 1 and 2 service processes (`serve --workers N`, Redis broadcast)."""
    lines = []
    update = next(w for w in writes(bench.seeded) if w.name.startswith("pool update"))
    for workers in (1, 2):
        process, port = start_serve(url, workers, logs / f"serve-{workers}.log", broadcast=True)
        try:
            scaled = Bench(
                **{
                    **bench.__dict__,
                    "service_pid": process.pid,
                    "urls": {**bench.urls, "service": f"http://127.0.0.1:{port}"},
                }
            )
            # A fresh process: each worker answers a few updates one at a time first (its
            # imports, caches and connections warm), then a warm-up round under load.
            async with httpx.AsyncClient(base_url=scaled.urls["service"], timeout=120) as client:
                for k in range(4 * workers):
                    body = update.request_body(update.items[k % CONNECTIONS][0], "")
                    answer = await client.post(
                        update.service_path, content=body, headers=bench.headers[PROVIDER]
                    )
                    if answer.status_code != 200:
                        raise RuntimeError(f"update: {answer.status_code} {answer.text}")
            await scaled.run(update, "service", plan.warmup_seconds or 1)
            r = await scaled.run(update, "service", plan.scale_seconds)
            secs = r.wall_s
            each = ", ".join(
                f"pid {k.split(':')[1]} {100 * v / secs:.0f}%"
                for k, v in r.cpu_s.items()
                if k.startswith("service:")
            )
            lines.append(
                f"{workers} process{'es' * (workers > 1)}: {r.load.per_second:.1f} updates/s,"
                f" p50 {r.load.p50_ms:.1f} ms; CPU: service {100 * r.cpu_s['service'] / secs:.0f}%"
                f" ({each}), postgres {100 * r.cpu_s['postgres'] / secs:.0f}%, machine"
                f" {100 * r.cpu_s['machine'] / secs:.0f}% of {100 * (os.cpu_count() or 1)}%;"
                f" {1000 * r.cpu_s['service'] / max(r.load.requests, 1):.1f} ms service CPU"
                " per update" + (f"  INVALID: {r.invalid}" if r.invalid else "")
            )
        finally:
            stop_server(process)
    return lines


async def measure(
    url: str, plan: Plan, wrk: str, logs: Path, only: list[str], profile: str | None
) -> None:
    database = make_url(url).database
    assert database is not None
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    started = time.perf_counter()
    seeded = await seed(url)
    print(
        f"seeded {POOLS + CONNECTIONS} pools through the domain in"
        f" {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    conn = await asyncpg.connect(dsn)
    monitor = await asyncpg.connect(dsn)
    servers: list[subprocess.Popen[bytes]] = []
    role = f"{database}_floor"  # the floor's statements are told apart by their role
    floor_dsn = make_url(dsn).set(username=role).render_as_string(hide_password=False)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        await conn.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
        await conn.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        utility = await conn.fetchval("SHOW pg_stat_statements.track_utility")
        service, port = start_serve(url, 1, logs / "service.log", broadcast=False)
        servers.append(service)
        headers = {
            t: {"content-type": "application/json", "authorization": f"Bearer {seeded.tokens[t]}"}
            for t in (PROVIDER, GUEST)
        }
        bench = Bench(
            wrk,
            url,
            seeded,
            conn,
            Processes(service.pid, 0, database, monitor),
            service.pid,
            {"service": f"http://127.0.0.1:{port}"},
            headers,
            role,
        )
        all_writes = writes(seeded)
        async with httpx.AsyncClient(base_url=bench.urls["service"], timeout=60) as client:
            found, answers = await capture_templates(bench, client, all_writes)
        templates = logs / "templates.json"
        templates.write_text(json.dumps(found))
        floor, floor_port = start_server(
            ["bench.write_floor:app"],
            {
                "BENCH_FLOOR_DSN": floor_dsn,
                "BENCH_WRITE_FLOOR_TEMPLATES": str(templates),
                "BENCH_FLOOR_CALLERS": json.dumps(seeded.callers),
            },
            logs / "floor.log",
        )
        servers.append(floor)
        bench.processes.floor = floor.pid
        bench.urls["floor"] = f"http://127.0.0.1:{floor_port}"
        async with httpx.AsyncClient(base_url=bench.urls["floor"], timeout=60) as floor_client:
            sizes = await check_floor(bench, floor_client, answers)
        print(
            "floor answers have the service's shape; bytes service/floor: " + ", ".join(sizes),
            flush=True,
        )
        print(f"pg_stat_statements.track_utility = {utility} (BEGIN/COMMIT counted when on)")
        chosen = [w for w in all_writes if not only or any(o in w.name for o in only)]
        profiler = Profiler(profile, service.pid)
        results = []
        for write in chosen:
            results.append(await measure_write(bench, write, plan, profiler))
            print(f"  measured {write.name}", flush=True)
        print_results(results)
        print_usage(results)
        stop_server(service)
        servers.remove(service)
        if not any(w.name.startswith("pool update") for w in chosen):
            return
        print("\nupdates/s by service processes (`serve --workers N`, Redis broadcast):")
        for line in await scale(url, bench, plan, logs):
            print("  " + line, flush=True)
    except BaseException:
        for process in servers:  # their logs are complete once they stopped
            stop_server(process)
        servers.clear()
        print_logs(logs)
        raise
    finally:
        for process in servers:
            stop_server(process)
        with contextlib.suppress(asyncpg.UndefinedObjectError):
            await conn.execute(f'DROP OWNED BY "{role}"')  # its grants, then the role
            await conn.execute(f'DROP ROLE "{role}"')
        await conn.close()
        await monitor.close()


async def run(plan: Plan, only: list[str], profile: str | None) -> None:
    wrk = ensure_wrk()
    if wrk is None:
        raise RuntimeError("wrk could not be installed")
    settings = Settings()
    print(f"uptime at start: {uptime()}")
    print(
        f"load: {generator_version(wrk)}; asked: saturate, {CONNECTIONS} connections on"
        f" {CONNECTIONS} threads (one connection each; closed loop), {plan.seconds:g} s a"
        f" round, {plan.rounds} round{'s' * (plan.rounds > 1)} each alternating floor and"
        f" service"
        + (f" after a {plan.warmup_seconds:g} s warm-up of each" if plan.warmup_seconds else "")
    )
    print(
        "service: bettercompute serve, one process; floor: bench/write_floor.py, one SQL"
        f" statement per write, its own uvicorn process, asyncpg pool {settings.db_pool_size}"
        f" to {settings.db_pool_size + settings.db_max_overflow} connections (the service's"
        " db_pool_size + db_max_overflow)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-writes-") as logs:
        async with bench_database() as url:
            await measure(url, plan, wrk.executable, Path(logs), only, profile)
    print(
        "\nfloor/s, service/s: writes per second over the kept rounds; p50/p99 the mean of the"
        " rounds' percentiles; stmts/req: pg_stat_statements calls in the bench database over"
        " the rounds / requests (f: floor, by its own role, over the requests wrk counted; s:"
        " the service, its background tasks included, read once its request counter stood"
        " still, over the requests it counted); cpu ms/req: the service's processes,"
        " the floor's, and the PostgreSQL backends under the service (pg(s)) and the floor"
        " (pg(f)); a round with a non-2xx answer, a socket error or that ran out of prepared"
        " items is INVALID."
    )
    if plan.quick:
        print("quick run: tiny rounds, figures for a smoke test only")
    print(f"uptime at end: {uptime()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny rounds: a smoke test")
    parser.add_argument(
        "--only",
        metavar="TEXT[,TEXT]",
        default="",
        help="measure only the writes whose name holds one of these (e.g. 'pool update')",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="py-spy the service through each write's first service round (DIR/<write>.txt)",
    )
    args = parser.parse_args(argv)
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    asyncio.run(run(QUICK if args.quick else FULL, only, args.profile))


if __name__ == "__main__":
    main()
