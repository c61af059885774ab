"""Benchmark: what admission costs when it is attacked or its rate-limit store is silent
(issue 19, items 15 and 16). Printed figures, no assertion.

    .venv/bin/python -m bench.admission_faults      # about half a minute

Needs PostgreSQL at 127.0.0.1:5432 (BENCH_POSTGRES_URL) and Redis at 127.0.0.1:6379
(BENCH_REDIS_URL; only for the healthy-store baseline, a caller's key of its own). The
real app runs in this process behind uvicorn on a free port; the client is httpx over TCP.

1. Bad tokens: 60 requests with an unknown, well-formed token, one after another, from
   one address: answers by status, the time they took, and the SQL statements the
   service sent for them (its /metrics).
2. A silent store: the rate-limit store is a local TCP listener that accepts and never
   answers; 40 requests of a valid caller one after another: latency p50 and max, what
   /readyz says, the enforced gauge. Then the same with the store answering (Redis).
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.db.engine import create_database
from app.ids import new_id
from app.server import create_app
from bench.database import bench_database

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BAD = "Bearer bct_" + "x" * 43


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=_free_port(), log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            await asyncio.sleep(0.02)
        base = f"http://127.0.0.1:{config.port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def silent_listener() -> AsyncIterator[int]:
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def _sample(client: httpx.AsyncClient, name: str, labels: dict[str, str]) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return float("nan")


def _get_body() -> dict[str, Any]:
    return {"tenantId": "acme", "poolId": new_id("pool")}


async def bad_tokens(url: str) -> None:
    async with serving(Settings(database_url=url)) as client:
        statements = "bettercompute_db_statements_total"
        before = await _sample(client, statements, {"transport": "rest"})
        statuses: dict[int, int] = {}
        began = time.perf_counter()
        for _ in range(60):
            response = await client.post(
                "/api/compute/pools/get", json=_get_body(), headers={"authorization": BAD}
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        elapsed = time.perf_counter() - began
        sent = await _sample(client, statements, {"transport": "rest"}) - before
    print(
        f"bad tokens: 60 requests in {elapsed:.2f} s, answers {dict(sorted(statuses.items()))}, "
        f"{sent:.0f} SQL statements"
    )


async def latencies(url: str, store: str, token: str, label: str) -> None:
    settings = Settings(database_url=url, rate_limit_requests=1000, rate_limit_storage_url=store)
    async with serving(settings) as client:
        took: list[float] = []
        for _ in range(40):
            began = time.perf_counter()
            response = await client.post(
                "/api/compute/pools/get",
                json=_get_body(),
                headers={"authorization": f"Bearer {token}"},
            )
            took.append(time.perf_counter() - began)
            assert response.status_code == 404, response.text
        ready = await client.get("/readyz")
        gauge = await _sample(client, "bettercompute_rate_limits_enforced", {})
    print(
        f"{label}: 40 requests, p50 {statistics.median(took) * 1000:.1f} ms, "
        f"max {max(took) * 1000:.1f} ms, total {sum(took):.2f} s; /readyz {ready.status_code} "
        f"rateLimits={ready.json().get('rateLimits', '(not reported)')}, "
        f"bettercompute_rate_limits_enforced={gauge}"
    )


async def main() -> None:
    async with bench_database() as url:
        db = create_database(url)
        try:
            from tests.support import Fleet  # the same fixtures as the tests

            fleet = Fleet(db)
            await fleet.tenant("acme")
            tokens = [await fleet.caller("acme", "viewer") for _ in range(2)]
        finally:
            await db.dispose()
        await bad_tokens(url)
        async with silent_listener() as port:
            await latencies(url, f"redis://127.0.0.1:{port}/0", tokens[0], "silent store")
        await latencies(url, REDIS_URL, tokens[1], "answering store (Redis)")


if __name__ == "__main__":
    asyncio.run(main())
