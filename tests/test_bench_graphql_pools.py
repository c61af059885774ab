"""The read-path benchmark's machinery: bench/native_load.py drives a server with wrk
(installed by the benchmark itself), and `bench.graphql_pools --quick` prints its table,
on PostgreSQL and on the embedded SQLite default. Figures are not checked (this machine
is shared); what is printed and sent is."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.native_load import (
    GeneratorMissing,
    HttpRequest,
    LoadGenerator,
    ensure_autocannon,
    ensure_generator,
    ensure_wrk,
)
from tests.databases import POSTGRES_URL, service_unavailable
from tests.support import bench_output


def installed(ensure: Callable[[], LoadGenerator | None], name: str) -> LoadGenerator:
    found = ensure()
    if found is None:
        service_unavailable(f"{name} could not be installed")
    return found


@pytest.fixture(scope="module")
def generator() -> LoadGenerator:
    """The benchmark's own choice: wrk, else autocannon."""
    try:
        return ensure_generator()
    except GeneratorMissing as exc:
        service_unavailable(str(exc))


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as wrk expects
    received: Counter[tuple[str, str, str, str]] = Counter()
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"])).decode()
        with self.lock:
            self.received[(self.command, self.path, self.headers["x-token"] or "", body)] += 1
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.received.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("name", ["wrk", "autocannon"])
def test_the_generator_sends_each_request_in_turn(name: str, recorder: str) -> None:
    generator = installed(ensure_wrk if name == "wrk" else ensure_autocannon, name)
    # Bodies that a careless Lua quoting would break: long brackets, quotes, newlines.
    bodies = ['{"page": 1}', 'a]]b]=]c "quoted" \\ back', "\nline one\nline two"]
    requests = [
        HttpRequest("POST", f"/page/{n}", {"x-token": f"t{n}"}, body)
        for n, body in enumerate(bodies)
    ]
    result = generator.run(recorder, requests, connections=2, threads=1, seconds=1)
    received = dict(Recorder.received)
    assert set(received) == {("POST", f"/page/{n}", f"t{n}", b) for n, b in enumerate(bodies)}
    # Turn by turn: no request sent much more often than another.
    assert max(received.values()) - min(received.values()) <= 2, received
    # The answers counted are those received, bar the ones in flight when it stopped.
    assert sum(received.values()) - 2 <= result.requests <= sum(received.values())
    assert result.errors == 0
    assert 0 < result.p50_ms <= result.p99_ms
    assert result.seconds >= 0.9 and result.cpu_s > 0


@pytest.mark.soak
@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
async def test_the_quick_run_prints_every_row(
    dialect: str, generator: LoadGenerator, database_url_for: Callable[[str], Awaitable[str]]
) -> None:
    if dialect == "postgresql":
        await database_url_for("postgresql")  # PostgreSQL is there (or the test is skipped)
    printed = await bench_output(
        *("bench.graphql_pools", "--quick", "--generator", generator.name),
        *("--dialect", dialect),
        BENCH_POSTGRES_URL=POSTGRES_URL,
    )
    assert "floor and service answer the same data for every request measured" in printed
    assert "asked: saturate, 16 connections" in printed
    title = {"postgresql": "PostgreSQL", "sqlite": "SQLite, the embedded default"}[dialect]
    assert f"\n== {title} (" in printed
    assert f"\n{title}: floor and service, one run each of every query\n" in printed
    assert printed.count("uptime at start") == printed.count("uptime at end") == 1
    lines = printed.splitlines()
    for name in (
        "dashboard, 100 pools",
        "one pool with its quotas (GraphQL)",
        "one pool, REST pools/get",
        "every pool, REST pools/list (100 pools)",
        "quota rows, GraphQL quotas (100 pools)",
        "one pool's rollup (GraphQL capacity)",
        "one pool's rollup, REST pools/capacity",
        "why it may read a pool (GraphQL access)",
        "why it may read a pool, REST pools/explain",
        "the owner's lending, GraphQL (100 pools)",
        "the owner's lending, REST pools/lending (100 pools)",
        "reservations, REST reservations/list (40)",
        "a pool's reservations (GraphQL, 20 of 40)",
        "dashboard, 10 pools",
    ):
        # query, floor/s, service/s, ratio, p50/p99 of each, stmts/req, sequential, x
        (row,) = (line for line in lines if line.startswith(name) and line.endswith("x"))
        floor, service, ratio, *_, statements, sequential, times = row[len(name) :].split()
        assert float(floor) > 0 and float(service) > 0, row
        assert float(ratio) == pytest.approx(float(service) / float(floor), abs=0.002), row
        assert float(statements) >= 1, row
        seq_floor, seq_service = (float(ms) for ms in sequential.split("/"))
        # `times` is printed to 0.1 and the two means to 0.01: 0.66 shows as 0.7.
        worst = 0.05 + 0.005 * (1 + seq_service / seq_floor) / seq_floor
        assert float(times[:-1]) == pytest.approx(seq_service / seq_floor, abs=worst), row
        # What limits it: a CPU line for each target, under load and one at a time: the
        # service, the floor, the main thread of the one measured (part of its process's
        # CPU), wrk, the database's own CPU on PostgreSQL ("in proc" on SQLite).
        database = r"\d+%" if dialect == "postgresql" else "in proc"
        for target in ("floor", "service"):
            for asked in ("saturate, 16 conns", "saturate, 1 conn "):
                cpu = (
                    rf"{re.escape(name)} +{target} +{asked} +[\d.]+ +[\d.]+ +(\d+)% +(\d+)%"
                    rf" +(\d+)% +\d+% +{database} +\d+% +-?\d+%$"
                )
                found = [m for m in map(re.compile(cpu).match, lines) if m]
                assert found, (name, target, asked)
                service_cpu, floor_cpu, loop = (int(found[0][n]) for n in (1, 2, 3))
                ours = service_cpu if target == "service" else floor_cpu
                assert 0 < loop <= ours + 1, found[0].string  # each rounded to 1%
