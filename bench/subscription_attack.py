"""Benchmark: does one tenant's subscription fan-out slow another tenant's reads (issue 19,
item 2)?

    .venv/bin/python -m bench.subscription_attack                # 50 x 20, 40 s a phase
    .venv/bin/python -m bench.subscription_attack --quick        # a smoke run, no targets

Needs PostgreSQL and Redis on 127.0.0.1 (BENCH_POSTGRES_URL, BENCH_REDIS_URL). A fresh
database (dropped at the end); one `bettercompute serve` process. Two phases of the same
length, each measuring the other tenant (`victim`, a viewer listing its 10 pools over
REST, `--readers` requests at a time, back to back):

1. unattacked: nothing else runs;
2. attacked: one viewer of tenant `attacker` holds `--sockets` x `--per-socket`
   subscriptions that select `pool { … }` (1,000 by default, as 50 websockets x 20, in a
   process of their own that reads everything), and an operator of that tenant updates
   its own pool every `--update-every` seconds.

The server's bounds per caller and tenant are set to let the attack in (printed): what
is measured is the fan-out's cost, not the refusal. Prints the victim's p50/p99/max and
its non-200 answers for both phases, the attacker's deliveries (expected vs received)
and its closes (4413 is a bug), the server's reads of `PoolEvent.pool` per event (from
/metrics), and the CPU of the server, the attacker's process and PostgreSQL's backends.
Targets (full size only): attacked p50 within 2x and max under 1 s above the unattacked
figures, no 503. Exit 0 when met, 2 when missed, 1 when the run is invalid (the attack's
subscriptions did not all open, or deliveries were lost).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import orjson
from sqlalchemy import text

from app.capacity import inventory
from app.capacity.inputs import CreatePoolInput
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import Database, create_database
from app.iam.callers import authenticate, create_caller
from bench.database import bench_database
from bench.events_fanout import load_average, percentile, start_server, wait_healthy
from bench.proc import cpu_s

WITH_POOL = (
    'subscription { poolEvents(tenantId: "attacker") { cursor type '
    "pool { id version gpuModel quotas { resource max used } } } }"
)
OPEN = "bettercompute_subscriptions_open"
P50_RATIO = 2.0
MAX_EXTRA_S = 1.0


# --- the attacker's process ------------------------------------------------------------


def attacker_main(conn: Connection, address: str, token: str, sockets: int, per: int) -> None:
    import uvloop

    uvloop.run(_attack(conn, address, token, sockets, per))


async def _attack(conn: Connection, address: str, token: str, sockets: int, per: int) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    received = 0
    codes: list[int | None] = []
    errors: list[Any] = []
    refused: list[Any] = []  # subscribes refused, each sent again

    async def one() -> None:
        try:
            await reading()
        except Exception as exc:  # reported to the orchestrator
            errors.append(repr(exc))

    async def reading() -> None:
        nonlocal received
        async with connect(
            f"ws://{address}/graphql",
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
            max_queue=None,
            open_timeout=60,
        ) as ws:
            init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
            await ws.send(orjson.dumps(init).decode())
            assert orjson.loads(await ws.recv())["type"] == "connection_ack"

            async def subscribe(operation_id: str) -> None:
                message = {"id": operation_id, "type": "subscribe", "payload": {"query": WITH_POOL}}
                await ws.send(orjson.dumps(message).decode())

            async def again(operation_id: str) -> None:
                await asyncio.sleep(1.0)
                await subscribe(operation_id)

            retries: set[asyncio.Task[None]] = set()
            for n in range(per):
                await subscribe(str(n))
            try:
                async for raw in ws:  # a client that reads everything, at once
                    message = orjson.loads(raw)
                    if message["type"] == "next":
                        received += 1
                    elif message["type"] == "error":  # refused (UNAVAILABLE): again, later
                        refused.append(message["payload"])
                        retries.add(asyncio.create_task(again(message["id"])))
            except ConnectionClosed as closed:
                codes.append(closed.rcvd.code if closed.rcvd else None)

    tasks = []
    for _ in range(sockets):  # paced: a storm of subscribes waits for the server's pool
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, conn.recv)  # "stop"
    state = {"received": received, "closed": codes, "errors": errors[:3], "refused": refused[:2]}
    conn.send({**state, "failed": len(errors)})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# --- the victim and the operator -------------------------------------------------------


@dataclass
class Reads:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)

    def line(self) -> str:
        if not self.latencies:
            return "no request answered"
        ms = [1000 * s for s in self.latencies]
        other = {k: v for k, v in self.statuses.items() if k != 200}
        return (
            f"{len(ms)} requests, p50 {percentile(ms, 0.5):.1f} ms, p99 "
            f"{percentile(ms, 0.99):.1f} ms, max {max(ms):.1f} ms; non-200: {other or 'none'}"
        )


async def victim_reads(address: str, token: str, readers: int, seconds: float) -> Reads:
    reads = Reads()
    body = {"tenantId": "victim"}
    headers = {"authorization": f"Bearer {token}"}
    deadline = time.monotonic() + seconds

    async def reader(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                response = await client.post("/api/compute/pools/list", json=body, headers=headers)
                status = response.status_code
            except httpx.HTTPError:
                status = 0  # no answer within the client's timeout
            reads.latencies.append(time.monotonic() - started)
            reads.statuses[status] = reads.statuses.get(status, 0) + 1

    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client:
        await asyncio.gather(*(reader(client) for _ in range(readers)))
    return reads


async def operator_updates(
    address: str, token: str, pool_id: str, every_s: float, seconds: float
) -> int:
    """The attacker's operator updates its own pool every `every_s`; returns how many."""
    done = 0
    models = ("H100", "H200")
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as client:
        while time.monotonic() < deadline:
            body = {"tenantId": "attacker", "poolId": pool_id, "gpuModel": models[done % 2]}
            response = await client.post(
                "/api/compute/pools/update", json=body, headers={"authorization": f"Bearer {token}"}
            )
            response.raise_for_status()
            done += 1
            await asyncio.sleep(max(0.0, min(every_s, deadline - time.monotonic())))
    return done


# --- setup and measures ----------------------------------------------------------------


async def seed(db: Database, tenant: str, pools: int) -> tuple[list[str], str, str]:
    """A tenant with `pools` pools; returns (pool ids, a viewer token, an operator token)."""
    capacity = Capacity(db)
    await inventory.create_tenant(db, tenant, None)
    site = await inventory.create_site(db, tenant, "custom", "eu-west")
    _, admin = await create_caller(db, tenant, "admin")
    principal = await authenticate(db, f"Bearer {admin}")
    ids = []
    for _ in range(pools):
        inp = CreatePoolInput.model_validate(
            {"tenantId": tenant, "siteId": site, "class": "metal-host", "gpuModel": "H100"}
        )
        ids.append((await capacity.create_pool(principal, inp)).pool.id)
    _, viewer = await create_caller(db, tenant, "viewer")
    _, operator = await create_caller(db, tenant, "operator")
    return ids, viewer, operator


async def metric(address: str, name: str) -> float:
    async with httpx.AsyncClient(timeout=30) as client:
        body = (await client.get(f"http://{address}/metrics")).text
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def postgres_cpu(db: Database) -> float:
    async with db.reader.connect() as conn:
        pids = (
            await conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            )
        ).scalars()
        return sum(cpu_s(pid) for pid in pids)


async def measure(args: argparse.Namespace, url: str) -> int:
    print(f"bench.subscription_attack: {vars(args)}; {load_average()}", flush=True)
    db = create_database(url, Settings(db_pool_size=2))
    server: subprocess.Popen[bytes] | None = None
    attacker: multiprocessing.Process | None = None
    try:
        victim_pools, victim_token, _ = await seed(db, "victim", 10)
        (attacker_pool,), attacker_viewer, attacker_operator = await seed(db, "attacker", 1)
        subscriptions = args.sockets * args.per_socket
        bounds = {
            "BETTERCOMPUTE_MAX_SUBSCRIPTIONS_PER_CALLER": str(subscriptions),
            "BETTERCOMPUTE_MAX_SUBSCRIPTIONS_PER_TENANT": str(subscriptions),
            "BETTERCOMPUTE_MAX_SUBSCRIPTIONS": str(args.per_socket),  # per connection
        }
        print("server settings: " + ", ".join(f"{k}={v}" for k, v in bounds.items()))
        port = 18000 + secrets.randbelow(2000)
        address = f"127.0.0.1:{port}"
        log = Path(f"/tmp/bench_attack_server_{port}.log")
        server = start_server(url, port, log, bounds)
        await wait_healthy(address)
        print(f"server {server.pid} (log {log}); victim: {len(victim_pools)} pools", flush=True)
        await victim_reads(address, victim_token, args.readers, 2.0)  # warm up

        # 1. Unattacked.
        cpu0 = cpu_s(server.pid)
        base = await victim_reads(address, victim_token, args.readers, args.seconds)
        print(f"1. unattacked, {args.seconds:.0f} s: victim {base.line()}", flush=True)
        print(f"   server CPU {100 * (cpu_s(server.pid) - cpu0) / args.seconds:.0f}%")

        # 2. Attacked.
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        attacker = context.Process(
            target=attacker_main,
            args=(theirs, address, attacker_viewer, args.sockets, args.per_socket),
            daemon=True,
        )
        attacker.start()
        deadline = time.monotonic() + 120
        while (opened := await metric(address, OPEN)) < subscriptions:
            if time.monotonic() > deadline:
                ours.send("stop")
                state = ours.recv()
                print(f"INVALID RUN: {opened:.0f} of {subscriptions} subscriptions open; {state}")
                return 1
            await asyncio.sleep(0.5)
        print(f"   attack: {subscriptions} subscriptions open ({args.sockets} x {args.per_socket})")
        reads0 = await metric(address, "bettercompute_event_pool_reads_total")
        cpu0, pg0, att0 = cpu_s(server.pid), await postgres_cpu(db), cpu_s(attacker.pid or 0)
        attacked, updates = await asyncio.gather(
            victim_reads(address, victim_token, args.readers, args.seconds),
            operator_updates(
                address, attacker_operator, attacker_pool, args.update_every, args.seconds
            ),
        )
        await asyncio.sleep(2.0)  # the last update's deliveries
        cpu1, pg1, att1 = cpu_s(server.pid), await postgres_cpu(db), cpu_s(attacker.pid or 0)
        reads = await metric(address, "bettercompute_event_pool_reads_total") - reads0
        ours.send("stop")
        result = ours.recv()
        expected = updates * subscriptions
        print(f"2. attacked, {args.seconds:.0f} s: victim {attacked.line()}")
        print(
            f"   attacker: {updates} updates, {result['received']} of {expected} deliveries "
            f"received; closes {result['closed'] or 'none'}; errors {result['errors'] or 'none'}; "
            f"subscribes refused and sent again: {result['refused'] or 'none'}"
        )
        print(
            f"   server reads of PoolEvent.pool: {reads:.0f} for {updates} events "
            f"({reads / max(updates, 1):.1f} per event, {subscriptions} subscribers, one view)"
        )
        print(
            f"   CPU: server {100 * (cpu1 - cpu0) / args.seconds:.0f}%, attacker's clients "
            f"{100 * (att1 - att0) / args.seconds:.0f}%, PostgreSQL "
            f"{100 * (pg1 - pg0) / args.seconds:.0f}% of a core; {load_average()}"
        )
        if result["received"] < expected:
            print("INVALID RUN: deliveries lost")
            return 1
        if args.quick:
            return 0
        b50, a50 = percentile(base.latencies, 0.5), percentile(attacked.latencies, 0.5)
        missed = []
        if a50 > P50_RATIO * b50:
            missed.append(f"p50 {1000 * a50:.1f} ms > {P50_RATIO:.0f} x {1000 * b50:.1f} ms")
        if max(attacked.latencies) > max(base.latencies) + MAX_EXTRA_S:
            missed.append(f"max {1000 * max(attacked.latencies):.0f} ms > unattacked + 1 s")
        if set(attacked.statuses) != {200}:
            missed.append(f"non-200 answers {attacked.statuses}")
        if result["closed"]:
            missed.append(f"attacker's sockets closed {result['closed']}")
        print("TARGET MISSED: " + "; ".join(missed) if missed else "targets met")
        return 2 if missed else 0
    finally:
        if attacker is not None and attacker.is_alive():
            attacker.kill()
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        await db.dispose()


async def run(args: argparse.Namespace) -> int:
    async with bench_database() as url:
        return await measure(args, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", type=int, default=50)
    parser.add_argument("--per-socket", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each phase")
    parser.add_argument("--update-every", type=float, default=3.0)
    parser.add_argument("--readers", type=int, default=2, help="victim requests at a time")
    parser.add_argument("--quick", action="store_true", help="5 x 4, 8 s phases, no targets")
    args = parser.parse_args()
    if args.quick:
        args.sockets, args.per_socket, args.seconds = 5, 4, 8.0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
