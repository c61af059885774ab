"""Benchmark: 1, 2 and 4 `serve` processes over one PostgreSQL and one Redis.

    .venv/bin/python -m bench.scale_out            # needs PostgreSQL and Redis on 127.0.0.1
    .venv/bin/python -m bench.scale_out --quick    # a minute: 1 and 2 processes, short runs
    .venv/bin/python -m bench.scale_out --pgbouncer   # the processes behind a PgBouncer

For each process count N, a fresh database (dropped at the end) and N real server
processes (`bettercompute serve`, Redis wake-ups), each on its own port; the load is
spread round-robin over the ports from this one client process (no load balancer):

1. Dashboard reads: `pools/list` of a tenant with 20 pools, `--concurrency` at a time.
2. Bookings on one contended quota: `reservations/create` of 1 gpu, every client on the
   same pool and tenant (one quota row, one capacity row).
3. Bookings on 100 independent quotas: each of 100 tenants books in its own pool.
4. Events: 1,000 subscribers (10 per tenant of 100) spread over the processes; events
   committed at `--rate`/s through the real outbox; commit->receipt p50/p99.
5. Outbox writes: one-event transactions from 32 writers in this process, as fast as
   the commit-order lock lets them (every event-writing transaction takes it).

During each phase the PostgreSQL connections to the database are sampled
(pg_stat_activity): the peak is printed. Per-process figures and the ratio to N=1 follow.
The client shares the machine's cores with the servers and PostgreSQL, so on a small
machine the ratios, not the absolute numbers, are what carry over; `uptime`'s load
average is printed with the table (other work on the machine skews every figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.capacity import inventory, nodes
from app.capacity.inputs import CreatePoolInput
from app.capacity.service import Capacity
from app.db.engine import create_database
from app.events.bus import EventBus
from app.iam.callers import authenticate, create_caller
from bench.database import ADMIN_URL, bench_database
from bench.events_fanout import percentile, seed_tenant
from bench.fanout_inproc import Producer, Subscriber, open_all

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class Seeded:
    dash_tenant: str = "dash"
    dash_token: str = ""
    hot_pool: str = ""
    hot_token: str = ""
    # tenant -> (pool, admin token, viewer token)
    tenants: dict[str, tuple[str, str, str]] = field(default_factory=dict)


@dataclass
class Row:
    processes: int
    reads: float = 0.0
    hot: float = 0.0
    independent: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    outbox: float = 0.0
    delivered: str = ""
    connections: dict[str, int] = field(default_factory=dict)
    errors: int = 0


async def seed(url: str, tenants: int, hot_nodes: int) -> Seeded:
    db = create_database(url)
    try:
        capacity = Capacity(db)
        seeded = Seeded()
        # The dashboard tenant: 20 pools to list.
        await seed_tenant(db, capacity, seeded.dash_tenant)
        _, seeded.dash_token = await create_caller(db, seeded.dash_tenant, "viewer")
        site = await inventory.create_site(db, seeded.dash_tenant, "custom", "eu-west")
        _, admin = await create_caller(db, seeded.dash_tenant, "admin")
        principal = await authenticate(db, f"Bearer {admin}")
        for _ in range(19):
            inp = CreatePoolInput.model_validate(
                {"tenantId": seeded.dash_tenant, "siteId": site, "class": "metal-host"}
            )
            await capacity.create_pool(principal, inp)
        # The hot quota: one pool with plenty of capacity, one tenant booking in it.
        seeded.hot_pool, _ = await seed_tenant(db, capacity, "hot")
        for _ in range(hot_nodes):
            await nodes.add_node(db, seeded.hot_pool, 1024)
        _, seeded.hot_token = await create_caller(db, "hot", "admin")
        # Independent tenants: a pool and a node each.
        for i in range(tenants):
            tenant = f"t{i:03d}"
            pool, viewer = await seed_tenant(db, capacity, tenant)
            await nodes.add_node(db, pool, 1024)
            _, token = await create_caller(db, tenant, "admin")
            seeded.tenants[tenant] = (pool, token, viewer)
        return seeded
    finally:
        await db.dispose()


def start_servers(
    url: str, count: int, logs: Path
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    binary = Path(sys.executable).with_name("bettercompute")
    env = {
        **os.environ,
        "BETTERCOMPUTE_DATABASE_URL": url,
        "BETTERCOMPUTE_BROADCAST_URL": REDIS_URL,
    }
    processes, ports = [], []
    for n in range(count):
        port = 18000 + secrets.randbelow(4000)
        with (logs / f"server_{n}.log").open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [str(binary), "serve", "--port", str(port)], env=env, stdout=out, stderr=out
                )
            )
        ports.append(port)
    return processes, ports


async def wait_ready(ports: list[int]) -> None:
    async with httpx.AsyncClient() as client:
        for port in ports:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"server on {port} did not become ready")


def stop_servers(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.asynccontextmanager
async def connection_sampler(
    database: str, ours: Callable[[], int] = lambda: 0
) -> AsyncIterator[dict[str, int]]:
    """Samples the server's connections to `database` every 0.2 s, less this process's
    own (`ours()` and the sampler's); yields the peak."""
    engine = create_async_engine(ADMIN_URL, poolclass=NullPool)
    peak = {"peak": 0}

    async def sample() -> None:
        async with engine.connect() as conn:
            while True:
                count = await conn.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": database},
                )
                peak["peak"] = max(peak["peak"], int(count or 0) - ours())
                await conn.commit()
                await asyncio.sleep(0.2)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await engine.dispose()


async def drive(
    seconds: float, concurrency: int, one: Callable[[int, int], Awaitable[bool]]
) -> tuple[float, int]:
    """Calls `one(worker, i)` from `concurrency` workers for `seconds`; (ok/s, failures)."""
    ok, failed = 0, 0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()

    async def worker(w: int) -> None:
        nonlocal ok, failed
        i = 0
        while time.perf_counter() < deadline:
            if await one(w, i):
                ok += 1
            else:
                failed += 1
            i += 1

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return ok / (time.perf_counter() - started), failed


async def measure(args: argparse.Namespace, processes: int, url: str, logs: Path) -> Row:
    row = Row(processes)
    seeded = await seed(url, args.tenants, hot_nodes=args.hot_nodes)
    database = make_url(url).database or ""
    server_url = url
    bouncer = None
    if args.pgbouncer:
        from tests.pgbouncer import PgBouncer

        bouncer = await PgBouncer.start("127.0.0.1", 5432, "postgres", pool_size=20)
        server_url = (
            make_url(url)
            .set(host="127.0.0.1", port=bouncer.port)
            .update_query_dict({"pgbouncer": "true"})
            .render_as_string(hide_password=False)
        )
    servers, ports = start_servers(server_url, processes, logs)
    bus = EventBus(REDIS_URL)
    db = create_database(url)
    subscribers: list[Subscriber] = []
    try:
        await wait_ready(ports)
        limits = httpx.Limits(max_connections=args.concurrency * 2)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:

            async def post(port: int, token: str, path: str, body: object) -> bool:
                answer = await client.post(
                    f"http://127.0.0.1:{port}/api/compute/{path}",
                    json=body,
                    headers={"authorization": f"Bearer {token}"},
                )
                return answer.status_code == 200

            def port_for(w: int, i: int) -> int:
                return ports[(w + i) % len(ports)]

            async with connection_sampler(database) as idle:
                await asyncio.sleep(1)
            row.connections["idle"] = idle["peak"]

            async def read(w: int, i: int) -> bool:
                body = {"tenantId": seeded.dash_tenant}
                return await post(port_for(w, i), seeded.dash_token, "pools/list", body)

            async with connection_sampler(database) as peak:
                row.reads, failed = await drive(args.seconds, args.concurrency, read)
            row.connections["reads"] = peak["peak"]
            row.errors += failed

            async def book_hot(w: int, i: int) -> bool:
                body = {"tenantId": "hot", "poolId": seeded.hot_pool, "resources": {"gpu": 1}}
                return await post(port_for(w, i), seeded.hot_token, "reservations/create", body)

            async with connection_sampler(database) as peak:
                row.hot, failed = await drive(args.seconds, args.concurrency, book_hot)
            row.connections["hot"] = peak["peak"]
            row.errors += failed

            tenants = list(seeded.tenants)

            async def book_own(w: int, i: int) -> bool:
                tenant = tenants[(w * 7 + i) % len(tenants)]
                pool, token, _ = seeded.tenants[tenant]
                body = {"tenantId": tenant, "poolId": pool, "resources": {"gpu": 1}}
                return await post(port_for(w, i), token, "reservations/create", body)

            async with connection_sampler(database) as peak:
                row.independent, failed = await drive(args.seconds, args.concurrency, book_own)
            row.connections["independent"] = peak["peak"]
            row.errors += failed

        # Events: subscribers spread over the processes, round-robin.
        await bus.connect()
        producer = Producer(db, bus)
        per_tenant = max(1, args.subscribers // len(tenants))
        plan = [(t, seeded.tenants[t][2]) for t in tenants for _ in range(per_tenant)]
        for k, port in enumerate(ports):
            mine = [(token, t) for j, (t, token) in enumerate(plan) if j % len(ports) == k]
            subscribers += await open_all(f"127.0.0.1:{port}", mine)
        await asyncio.sleep(2)
        pool = db.writer.sync_engine.pool

        def producers() -> int:  # this process's connections, open now
            return int(pool.checkedin() + pool.checkedout())  # type: ignore[attr-defined]

        async with connection_sampler(database, producers) as peak:
            total = int(args.rate * args.seconds)
            start = time.perf_counter()
            emitting: set[asyncio.Task[None]] = set()
            for i in range(total):
                tenant = tenants[i % len(tenants)]
                task = asyncio.create_task(producer.emit(seeded.tenants[tenant][0], tenant))
                emitting.add(task)
                task.add_done_callback(emitting.discard)
                delay = start + (i + 1) * (1 / args.rate) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await asyncio.gather(*emitting)
            expected = total * per_tenant
            for _ in range(600):
                if sum(len(s.received) for s in subscribers) >= expected:
                    break
                await asyncio.sleep(0.05)
        row.connections["events"] = peak["peak"]

        latencies = [
            (received - producer.committed[seq]) * 1000
            for s in subscribers
            for seq, received in s.received.items()
            if seq in producer.committed
        ]
        row.delivered = f"{len(latencies)}/{expected}"
        if latencies:
            row.p50_ms = percentile(latencies, 0.5)
            row.p99_ms = percentile(latencies, 0.99)

        # The commit-order lock's ceiling: one-event transactions from 32 writers.
        async def write_one(w: int, i: int) -> bool:
            tenant = tenants[(w + i) % len(tenants)]
            await producer.emit(seeded.tenants[tenant][0], tenant)
            return True

        row.outbox, _ = await drive(args.seconds, 32, write_one)
        return row
    finally:
        for s in subscribers:
            await s.close()
        with contextlib.suppress(Exception):
            await bus.disconnect()
        await db.dispose()
        stop_servers(servers)
        if bouncer is not None:
            bouncer.stop()


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nscale-out over one PostgreSQL and one Redis ({os.cpu_count()} cores; "
        f"{args.concurrency} concurrent requests; {args.seconds:.0f} s per phase; "
        f"{'through PgBouncer' if args.pgbouncer else 'direct'}; "
        f"load average after: {load_average()})"
    )
    header = (
        f"{'procs':>5} {'reads/s':>9} {'per proc':>9} {'hot bk/s':>9} {'indep bk/s':>10} "
        f"{'per proc':>9} {'ev p50 ms':>9} {'ev p99 ms':>9} {'outbox tx/s':>11} {'delivered':>13} "
        f"{'conns idle/reads/hot/indep/events':>34} {'errors':>6}"
    )
    print(header)
    for r in rows:
        c = r.connections
        conns = "/".join(
            str(c.get(k, 0)) for k in ("idle", "reads", "hot", "independent", "events")
        )
        print(
            f"{r.processes:>5} {r.reads:>9.0f} {r.reads / r.processes:>9.0f} {r.hot:>9.0f} "
            f"{r.independent:>10.0f} {r.independent / r.processes:>9.0f} {r.p50_ms:>9.1f} "
            f"{r.p99_ms:>9.1f} {r.outbox:>11.0f} {r.delivered:>13} {conns:>34} {r.errors:>6}"
        )
    base = rows[0]
    print("\nratio to the first row (throughput: higher is better; p99: lower is better)")
    for r in rows[1:]:

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}x" if b else "n/a"

        print(
            f"{r.processes} vs {base.processes} processes: reads {ratio(r.reads, base.reads)}, "
            f"hot bookings {ratio(r.hot, base.hot)}, "
            f"independent bookings {ratio(r.independent, base.independent)}, "
            f"event p99 {ratio(r.p99_ms, base.p99_ms)}"
        )


async def run(args: argparse.Namespace) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logs = Path(tempfile.mkdtemp(prefix="bench_scale_out_"))
    print(f"load average before: {load_average()}")
    rows = []
    for processes in args.processes:
        async with bench_database() as url:
            row = await measure(args, processes, url, logs)
        rows.append(row)
        print(f"  {processes} process(es) done: {row}", flush=True)
    print_table(rows, args)
    print(f"server logs: {logs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--processes", type=lambda v: [int(x) for x in v.split(",")])
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--subscribers", type=int)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0, help="events per second")
    parser.add_argument("--hot-nodes", type=int, default=20, help="1,024 gpus each")
    parser.add_argument("--pgbouncer", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    quick = args.quick
    args.processes = args.processes or ([1, 2] if quick else [1, 2, 4])
    args.seconds = args.seconds or (3.0 if quick else 15.0)
    args.subscribers = args.subscribers or (200 if quick else 1000)
    if quick:
        args.tenants = min(args.tenants, 20)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
