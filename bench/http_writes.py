"""Benchmark: one write per HTTP response (app/http_protocol.py) against uvicorn's own
protocol, the same service otherwise, on PostgreSQL (where `serve` runs it).

Two `bettercompute serve` processes on one fresh PostgreSQL database, the demo fleet
seeded on it (app/demo.py, as `serve --demo` does): one with
BETTERCOMPUTE_ONE_WRITE_RESPONSES on (what one turn of the event loop writes to a socket
leaves in one write at the turn's end), one with it off (uvicorn's
httptools protocol: a response's head, then its body). For each request below, wrk (16
connections, one thread) runs against each in turn, alternating which goes first over the
rounds, after a warm-up of each. Printed per round: the rate, p50, and the CPU per request
of the server and of wrk; then per request the ratios of the means, one write over
uvicorn's.

What limits it: each server is one Python process, its CPU printed beside its rate (near
100% of a core: the server is the limit; well under it: wrk or the machine).

    .venv/bin/python -m bench.http_writes [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.compat import http_protocol
from app.config import Settings
from app.db.engine import create_database
from app.demo import seed
from bench.database import bench_database
from bench.graphql_pools import uptime
from bench.native_load import HttpRequest, LoadGenerator, ensure_generator
from bench.proc import cpu_s
from bench.writes import start_serve

CONNECTIONS = 16
SIDES = ("one write", "uvicorn's")


@dataclass(frozen=True)
class Served:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _serve(database: str, one_write: bool, log: Path) -> Served:
    process, port = start_serve(
        database,
        1,
        log,
        broadcast=False,
        settings={"BETTERCOMPUTE_ONE_WRITE_RESPONSES": "true" if one_write else "false"},
    )
    return Served(process, port)


async def _demo_tokens(database: str) -> dict[str, str]:
    """The demo fleet seeded on `database` (as `serve --demo` does), and its tokens."""
    db = create_database(database)
    try:
        return dict((await seed(db))["tokens"])
    finally:
        await db.dispose()


@dataclass(frozen=True)
class Run:
    rate: float
    p50_ms: float
    server_ms: float  # the server's CPU per request
    wrk_ms: float  # wrk's CPU per request
    server_pct: float  # the server's CPU, % of one core


def _run(generator: LoadGenerator, served: Served, request: HttpRequest, seconds: float) -> Run:
    before, started = cpu_s(served.process.pid), time.perf_counter()
    load = generator.run(served.url, [request], connections=CONNECTIONS, threads=1, seconds=seconds)
    wall = time.perf_counter() - started
    server = cpu_s(served.process.pid) - before
    if load.errors or not load.requests:
        raise RuntimeError(f"{request.path}: {load.errors} errors, {load.requests} answers")
    return Run(
        rate=load.per_second,
        p50_ms=load.p50_ms,
        server_ms=server / load.requests * 1000,
        wrk_ms=load.cpu_s / load.requests * 1000,
        server_pct=server / wall * 100,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each round (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = parser.parse_args()
    generator = ensure_generator()
    print(
        f"load: {generator.name}, {CONNECTIONS} connections on 1 thread, closed loop;"
        f" {args.rounds} rounds of {args.seconds:g} s each after a 2 s warm-up of each,"
        " alternating which server goes first"
    )
    asyncio.run(_measure(generator, args.rounds, args.seconds))


async def _measure(generator: LoadGenerator, rounds: int, seconds: float) -> None:
    async with bench_database() as database:
        with tempfile.TemporaryDirectory(prefix="bc-http-writes-") as logs:
            one_write = _serve(database, True, Path(logs) / "one-write.log")
            stock = _serve(database, False, Path(logs) / "stock.log")
            try:
                tokens = await _demo_tokens(database)
                protocols = [
                    http_protocol(Settings(database_url=database, one_write_responses=on))
                    for on in (True, False)
                ]
                print(
                    f"\nbettercompute serve on {database} (the demo fleet seeded), one"
                    " process each, BETTERCOMPUTE_ONE_WRITE_RESPONSES=true / false: HTTP protocols"
                    f" {protocols[0]} / {protocols[1]}"
                )
                print(f"uptime at start: {uptime()}")
                _compare(generator, (one_write, stock), _requests(tokens), rounds, seconds)
                print(f"uptime at end: {uptime()}")
            finally:
                for served in (one_write, stock):
                    served.process.terminate()
                    served.process.wait(30)


def _requests(tokens: dict[str, str]) -> dict[str, HttpRequest]:
    token = tokens["globex-admin"]
    auth = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    one_pool = 'query { pools(tenantId: "globex", first: 1) { nodes { id quotas { max } } } }'
    return {
        "GET /livez (every middleware, 2-byte body)": HttpRequest("GET", "/livez", {}),
        "REST pools/list as globex (compiled read)": HttpRequest(
            "POST", "/api/compute/pools/list", auth, json.dumps({"tenantId": "globex"})
        ),
        "GraphQL, one pool with its quotas (compiled read)": HttpRequest(
            "POST", "/graphql", auth, json.dumps({"query": one_pool})
        ),
    }


def _compare(
    generator: LoadGenerator,
    servers: tuple[Served, Served],
    requests: dict[str, HttpRequest],
    rounds: int,
    seconds: float,
) -> None:
    by_side = dict(zip(SIDES, servers, strict=True))
    for name, request in requests.items():
        runs: dict[str, list[Run]] = {side: [] for side in SIDES}
        for side in SIDES:
            _run(generator, by_side[side], request, 2)
        for round_ in range(rounds):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                runs[side].append(_run(generator, by_side[side], request, seconds))
        print(f"\n{name}")
        print(
            f"  {'server':<10} {'req/s':>9} {'p50 ms':>7} {'server CPU':>10}"
            f" {'ms/req':>7} {'wrk ms/req':>10}"
        )
        for side in SIDES:
            for run in runs[side]:
                print(
                    f"  {side:<10} {run.rate:9.1f} {run.p50_ms:7.2f}"
                    f" {run.server_pct:9.0f}% {run.server_ms:7.3f} {run.wrk_ms:10.4f}"
                )
        ours, theirs = (
            [statistics.fmean(getattr(r, f) for r in runs[side]) for f in _MEANS] for side in SIDES
        )
        print(
            f"  one write / uvicorn's: rate {ours[0] / theirs[0]:.3f},"
            f" server CPU per request {ours[1] / theirs[1]:.3f},"
            f" wrk CPU per request {ours[2] / theirs[2]:.3f}"
        )


_MEANS = ("rate", "server_ms", "wrk_ms")


if __name__ == "__main__":
    main()
