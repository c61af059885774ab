"""Benchmark: `poolEvents` fan-out from one server process to 1,000 websockets.

    .venv/bin/python -m bench.events_fanout       # needs PostgreSQL and Redis on 127.0.0.1

Creates a fresh PostgreSQL database (dropped at the end) with 100 tenants, each owning
one pool and holding 10 subscriptions, plus one tenant `crowd` for the throughput run.
Starts the real server (`bettercompute serve`, one process, Redis for wake-ups) and
drives it with raw websocket clients (graphql-transport-ws) from this process.

1. Memory per idle subscription: the server's RSS before and after opening 1,000
   connections with one subscription each, divided by 1,000.
2. Latency: events committed at a steady rate (default 200/s for 20 s), each visible
   to one tenant and so to 10 of the 1,000 subscribers; p50/p99/max from commit (the
   moment the outbox transaction returned) to receipt by the client.
3. Throughput: 1,000 subscriptions of one tenant, events committed as fast as the
   outbox takes them; deliveries per second until every subscriber has every event.

Events are written to the outbox by this process through the real unit of work and
broker wake-up (the same rows a pools/update writes), so what is timed is the relay,
the per-subscriber decision, GraphQL execution and the websocket, not the mutation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from app.capacity import inventory
from app.capacity.inputs import CreatePoolInput
from app.capacity.service import Capacity
from app.db.engine import Database, create_database
from app.events.bus import EventBus
from app.events.cursor import decode_cursor
from app.events.outbox import PendingEvent
from app.iam.callers import authenticate, create_caller
from bench.database import bench_database

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SUBSCRIPTION = (
    "subscription($t: String!) { poolEvents(tenantId: $t) { cursor type poolId occurredAt } }"
)


# --- setup ----------------------------------------------------------------------------


async def seed_tenant(db: Database, capacity: Capacity, tenant: str) -> tuple[str, str]:
    """A tenant with one pool; returns (its pool id, a viewer token)."""
    await inventory.create_tenant(db, tenant, None)
    site = await inventory.create_site(db, tenant, "custom", "eu-west")
    _, admin = await create_caller(db, tenant, "admin")
    principal = await authenticate(db, f"Bearer {admin}")
    inp = CreatePoolInput.model_validate(
        {"tenantId": tenant, "siteId": site, "class": "metal-host"}
    )
    pool = await capacity.create_pool(principal, inp)
    _, viewer = await create_caller(db, tenant, "viewer")
    return pool.pool.id, viewer


def start_server(database_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "BETTERCOMPUTE_DATABASE_URL": database_url,
        "BETTERCOMPUTE_BROADCAST_URL": REDIS_URL,
    }
    binary = Path(sys.executable).with_name("bettercompute")
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(binary), "serve", "--port", str(port)], env=env, stdout=out, stderr=out
        )


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def wait_healthy(address: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(300):
            try:
                if (await client.get(f"http://{address}/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("server did not start")


# --- clients --------------------------------------------------------------------------


class Subscriber:
    """One websocket with one poolEvents subscription, recording receipt times by seq."""

    def __init__(self) -> None:
        self.received: dict[int, float] = {}
        self.ws: ClientConnection | None = None
        self.task: asyncio.Task[None] | None = None

    async def open(self, address: str, token: str, tenant: str, subscriptions: int = 1) -> None:
        self.ws = await connect(
            f"ws://{address}/graphql",
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            max_queue=None,
        )
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await self.ws.send(orjson.dumps(init).decode())
        ack = orjson.loads(await self.ws.recv())
        assert ack["type"] == "connection_ack", ack
        for n in range(subscriptions):
            payload = {"query": SUBSCRIPTION, "variables": {"t": tenant}}
            message = {"id": str(n), "type": "subscribe", "payload": payload}
            await self.ws.send(orjson.dumps(message).decode())
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.ws is not None
        async for raw in self.ws:
            now = time.time()
            message = orjson.loads(raw)
            if message["type"] == "next":
                seq = decode_cursor(message["payload"]["data"]["poolEvents"]["cursor"])
                self.received[seq] = now

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.ws is not None:
            await self.ws.close()


async def open_all(address: str, plan: list[tuple[str, str]]) -> list[Subscriber]:
    """Open one subscriber per (token, tenant), 50 at a time."""
    subscribers = [Subscriber() for _ in plan]
    for start in range(0, len(plan), 50):
        await asyncio.gather(
            *(
                s.open(address, *plan[i])
                for i, s in enumerate(subscribers)
                if start <= i < start + 50
            )
        )
    return subscribers


class Producer:
    """Commits events through the real unit of work; records each seq's commit time."""

    def __init__(self, db: Database, bus: EventBus) -> None:
        self.committed: dict[int, float] = {}
        self._bus = bus

        async def notify(seq: int) -> None:
            self.committed.setdefault(seq, time.time())
            await bus.notify(seq)

        self.capacity = Capacity(db, notify)

    async def emit(self, pool_id: str, tenant: str, count: int = 1) -> None:
        async with self.capacity.unit_of_work() as uow:
            for n in range(count):
                uow.emit(
                    PendingEvent("pool.updated", pool_id, tenant, {"n": n}, frozenset({tenant}))
                )


async def received_all(subscribers: list[Subscriber], expected: int, within_s: float) -> None:
    for _ in range(int(within_s / 0.05)):
        if sum(len(s.received) for s in subscribers) >= expected:
            return
        await asyncio.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the runs -------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    async with bench_database() as url:
        await measure(args, url)


async def measure(args: argparse.Namespace, url: str) -> None:
    db = create_database(url)
    bus = EventBus(REDIS_URL)
    server: subprocess.Popen[bytes] | None = None
    subscribers: list[Subscriber] = []
    try:
        seeding = Capacity(db)
        tenants = [f"t{i:03d}" for i in range(args.tenants)]
        seeded = {t: await seed_tenant(db, seeding, t) for t in tenants}
        crowd_pool, crowd_token = await seed_tenant(db, seeding, "crowd")
        port = 18000 + secrets.randbelow(2000)
        address = f"127.0.0.1:{port}"
        log = Path(f"/tmp/bench_events_server_{port}.log")
        server = start_server(url, port, log)
        await wait_healthy(address)
        await bus.connect()
        producer = Producer(db, bus)

        # 1. Memory per idle subscription.
        warm = await open_all(address, [(seeded[t][1], t) for t in tenants[:10]])
        for s in warm:
            await s.close()
        await asyncio.sleep(1)
        before = rss_kb(server.pid)
        per_tenant = args.subscribers // args.tenants
        plan = [(seeded[t][1], t) for t in tenants for _ in range(per_tenant)]
        subscribers = await open_all(address, plan)
        await asyncio.sleep(2)
        after = rss_kb(server.pid)
        per_subscription = (after - before) / len(subscribers)
        print(
            f"idle subscriptions, one per websocket: {len(subscribers)}; server RSS "
            f"{before / 1024:.1f} MiB -> {after / 1024:.1f} MiB; "
            f"{per_subscription:.1f} KiB per subscription"
        )
        # The same number of subscriptions, ten to a websocket.
        shared = [Subscriber() for _ in range(len(subscribers) // 10)]
        for k, subscriber in enumerate(shared):
            tenant = tenants[k % len(tenants)]
            await subscriber.open(address, seeded[tenant][1], tenant, subscriptions=10)
        await asyncio.sleep(2)
        more = rss_kb(server.pid)
        print(
            f"idle subscriptions, ten per websocket: {len(shared) * 10}; server RSS "
            f"+{(more - after) / 1024:.1f} MiB; {(more - after) / (len(shared) * 10):.1f} KiB "
            "per subscription"
        )
        for subscriber in shared:
            await subscriber.close()

        # 2. Latency at a steady rate.
        interval = 1 / args.rate
        total = int(args.rate * args.seconds)
        start = time.perf_counter()
        emitting: set[asyncio.Task[None]] = set()
        for i in range(total):  # on a fixed schedule, whether or not earlier commits returned
            tenant = tenants[i % len(tenants)]
            task = asyncio.create_task(producer.emit(seeded[tenant][0], tenant))
            emitting.add(task)
            task.add_done_callback(emitting.discard)
            delay = start + (i + 1) * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*emitting)
        elapsed = time.perf_counter() - start
        expected = total * per_tenant
        await received_all(subscribers, expected, within_s=30)
        latencies = [
            (received - producer.committed[seq]) * 1000
            for s in subscribers
            for seq, received in s.received.items()
        ]
        print(
            f"steady rate: {total} events in {elapsed:.1f} s ({total / elapsed:.0f}/s), each to "
            f"{per_tenant} of {len(subscribers)} subscribers; "
            f"{len(latencies)}/{expected} delivered; "
            f"commit->receipt p50 {percentile(latencies, 0.5):.1f} ms, "
            f"p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms"
        )
        for s in subscribers:
            await s.close()
        subscribers = []
        await asyncio.sleep(1)

        # 3. Throughput: every event to all 1,000 subscribers.
        subscribers = await open_all(address, [(crowd_token, "crowd")] * args.subscribers)
        await asyncio.sleep(2)
        producer.committed.clear()
        started = time.time()
        for _ in range(args.burst // 10):
            await producer.emit(crowd_pool, "crowd", 10)
        expected = len(producer.committed) and args.burst * len(subscribers)
        await received_all(subscribers, expected, within_s=120)
        done = max(max(s.received.values(), default=started) for s in subscribers)
        delivered = sum(len(s.received) for s in subscribers)
        took = done - started
        print(
            f"throughput: {args.burst} events x {len(subscribers)} subscribers = {delivered} "
            f"deliveries in {took:.1f} s: {delivered / took:.0f} deliveries/s "
            f"({args.burst / took:.0f} events/s to every one of {len(subscribers)})"
        )
    finally:
        for s in subscribers:
            await s.close()
        await bus.disconnect()
        if server is not None:
            server.terminate()
            server.wait(10)
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
