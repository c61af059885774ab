"""Benchmark: what unauthenticated random paths do to `/metrics`, and what scraping it
then does to another tenant's reads (issue 19, item 1).

    .venv/bin/python -m bench.metrics_labels                      # about 2 minutes
    .venv/bin/python -m bench.metrics_labels --checkout /tmp/old  # the same against
        # other code, with this tree's virtualenv: the figures before the fix
        # (`git clone -q . /tmp/old && git -C /tmp/old checkout -q 1db009e`)

Needs PostgreSQL at 127.0.0.1:5432 (BENCH_POSTGRES_URL); installs `wrk` with apt-get on
first use (bench/native_load.py). Creates a fresh database (dropped at the end), a tenant
`acme` with 20 pools and a viewer, and starts the real service (`bettercompute serve`,
one process, from `--checkout`). Then:

1. `/metrics` size, scrape time (median and max of 5 scrapes) and the service's RSS;
2. wrk sends `--paths` requests `POST /api/compute/x/<random>` with no token (a Lua
   `request()` making each path, 4 connections, stopped once that many answers came);
3. the same figures again;
4. acme's `pools/list` (one connection, sequential, `--seconds` per phase) with 0, 1
   and 4 scraping loops (wrk, one connection per loop, `GET /metrics` closed-loop): its
   p50 and max, and the scrapes done, with each process's CPU over the phase.

The acceptance: after the random paths `/metrics` under 1 MB and a scrape under 100 ms;
with 1 and 4 loops acme's p50 within 2x and its max under 1 s of the 0-loop figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import insert

from app.db.engine import create_database
from app.db.models import Site, Tenant
from app.iam.callers import create_caller
from app.ids import new_id
from bench.database import bench_database
from bench.native_load import ensure_wrk
from bench.proc import cpu_s

REPO = Path(__file__).resolve().parent.parent
POOLS = 20
SCRAPES = 5

# Each request a path never seen before; once `limit` answers came the thread stops and
# says so in a file (wrk itself runs its whole duration: it is then stopped by SIGINT).
RANDOM_PATHS_LUA = """
local limit = tonumber(os.getenv("BENCH_LIMIT"))
local sent, answered = 0, 0
math.randomseed(os.time())

function request()
  sent = sent + 1
  local path = string.format("/api/compute/x/%08x%08x", sent, math.random(0, 2147483647))
  return wrk.format("POST", path, {["content-type"] = "application/json"}, "{}")
end

function response(status, headers, body)
  answered = answered + 1
  if answered == limit then
    wrk.thread:stop()
    local f = io.open(os.getenv("BENCH_DONE"), "w")
    f:write("done")
    f:close()
  end
end

function done(summary, latency, requests)
  io.write(string.format("BENCH_WRK %d %d %d\\n", summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout))
end
"""
SCRAPE_LUA = """
function done(summary, latency, requests)
  io.write(string.format("BENCH_WRK %d %d %d\\n", summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout))
end
"""


@dataclass
class Scrapes:
    size_bytes: int
    median_ms: float
    max_ms: float
    rss_mib: float


@dataclass
class Phase:
    loops: int
    reads: int
    p50_ms: float
    max_ms: float
    scrapes: int
    service_cpu_s: float
    wrk_cpu_s: float
    machine_busy_s: float
    seconds: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_busy_s() -> float:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def start_service(checkout: Path, url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`bettercompute serve` with `checkout`'s code (first on the path) and this venv."""
    port = free_port()
    command = [
        sys.executable,
        "-c",
        "import sys; from app.cli import main; sys.exit(main())",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {**os.environ, "PYTHONPATH": str(checkout), "BETTERCOMPUTE_DATABASE_URL": url}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if httpx.get(f"http://{address}/livez", timeout=1).status_code == 200:
                return process, address
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the service did not start:\n{log.read_text()[-3000:]}")


def stop_service(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def seed(url: str) -> tuple[str, str, str]:
    """Tenant acme with a site: the site, its admin's token (to create pools), its
    viewer's."""
    db = create_database(url)
    try:
        async with db.writer.begin() as conn:
            await conn.execute(insert(Tenant), [{"id": "acme"}])
            site = new_id("site")
            await conn.execute(
                insert(Site),
                [{"id": site, "tenant_id": "acme", "kind": "custom", "region": "eu-west"}],
            )
        _, admin = await create_caller(db, "acme", "admin")
        _, viewer = await create_caller(db, "acme", "viewer")
    finally:
        await db.dispose()
    return site, admin, viewer


def scrape_figures(client: httpx.Client, pid: int) -> Scrapes:
    times, size = [], 0
    for _ in range(SCRAPES):
        started = time.perf_counter()
        answer = client.get("/metrics")
        times.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        size = len(answer.content)
    return Scrapes(size, statistics.median(times), max(times), rss_mib(pid))


@dataclass
class WrkRun:
    process: subprocess.Popen[str]
    script: str
    done_file: str

    def stop_when_done(self, timeout_s: float) -> None:
        """Once the script wrote its file (or `timeout_s` passed), wrk's results now."""
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.done_file) and time.monotonic() < deadline:
            if self.process.poll() is not None:
                return
            time.sleep(0.05)
        self.process.send_signal(signal.SIGINT)  # wrk prints its summary and ends

    def result(self, timeout_s: float) -> tuple[int, float, int]:
        """(requests, seconds, socket errors) once wrk ends."""
        try:
            out, err = self.process.communicate(timeout=timeout_s)
        finally:
            os.unlink(self.script)
            if os.path.exists(self.done_file):
                os.unlink(self.done_file)
        for line in out.splitlines():
            if line.startswith("BENCH_WRK "):
                requests, duration_us, errors = (int(x) for x in line.split()[1:])
                return requests, duration_us / 1e6, errors
        raise RuntimeError(f"wrk failed ({self.process.returncode}): {err or out}")


def run_wrk(
    wrk: str, script: str, url: str, *, connections: int, seconds: float, limit: int = 0
) -> WrkRun:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as file:
        file.write(script)
    command = [
        wrk,
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout=30s",
        "-s",
        file.name,
        url,
    ]
    done_file = file.name + ".done"
    env = {**os.environ, "BENCH_LIMIT": str(limit), "BENCH_DONE": done_file}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    return WrkRun(process, file.name, done_file)


def children_cpu_s() -> float:
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def phase(
    wrk: str, address: str, pid: int, viewer: str, loops: int, seconds: float, path: str
) -> Phase:
    """acme's pools/list, one at a time for `seconds`, while `loops` connections GET
    `path` (`/metrics`: they scrape) closed-loop."""
    before_cpu, before_busy, before_children = cpu_s(pid), machine_busy_s(), children_cpu_s()
    scrapers = (
        run_wrk(wrk, SCRAPE_LUA, f"http://{address}{path}", connections=loops, seconds=seconds + 1)
        if loops
        else None
    )
    latencies: list[float] = []
    started = time.monotonic()
    headers = {"authorization": f"Bearer {viewer}"}
    with httpx.Client(base_url=f"http://{address}", timeout=60) as client:
        time.sleep(0.5 if loops else 0)  # the loops under way first
        while time.monotonic() - started < seconds:
            sent = time.perf_counter()
            answer = client.post(
                "/api/compute/pools/list", json={"tenantId": "acme"}, headers=headers
            )
            latencies.append((time.perf_counter() - sent) * 1000)
            if answer.status_code != 200 or len(answer.json()["pools"]) != POOLS:
                raise RuntimeError(f"pools/list: {answer.status_code} {answer.text[:300]}")
    elapsed = time.monotonic() - started
    scrapes = 0
    if scrapers is not None:
        scrapes, _, _ = scrapers.result(seconds + 120)
    return Phase(
        loops=loops,
        reads=len(latencies),
        p50_ms=statistics.median(latencies),
        max_ms=max(latencies),
        scrapes=scrapes,
        service_cpu_s=cpu_s(pid) - before_cpu,
        wrk_cpu_s=children_cpu_s() - before_children,
        machine_busy_s=machine_busy_s() - before_busy,
        seconds=elapsed,
    )


def show_scrapes(when: str, s: Scrapes) -> None:
    print(
        f"/metrics {when}: {s.size_bytes / 1e6:.3f} MB, scrape median {s.median_ms:.1f} ms, "
        f"max {s.max_ms:.1f} ms (of {SCRAPES}); service RSS {s.rss_mib:.1f} MiB",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=REPO, help="the code to serve")
    parser.add_argument("--paths", type=int, default=5000, help="random-path requests")
    parser.add_argument("--seconds", type=float, default=15.0, help="per pools/list phase")
    args = parser.parse_args()
    async with bench_database() as url:
        site, admin, viewer = await seed(url)
        await asyncio.to_thread(measure, args, url, site, admin, viewer)


def measure(args: argparse.Namespace, url: str, site: str, admin: str, viewer: str) -> None:
    wrk = ensure_wrk()
    if wrk is None:
        raise SystemExit("wrk could not be installed (apt-get)")
    commit = subprocess.run(
        ["git", "-C", str(args.checkout), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    print(f"code served: {args.checkout} ({commit[:90]})", flush=True)
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]} on {os.cpu_count()} cores")
    log = Path(tempfile.mkstemp(prefix="bench-metrics-labels-", suffix=".log")[1])
    process, address = start_service(args.checkout, url, log)
    try:
        with httpx.Client(base_url=f"http://{address}", timeout=120) as client:
            pool = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
            for _ in range(POOLS):
                made = client.post(
                    "/api/compute/pools/create",
                    json=pool,
                    headers={"authorization": f"Bearer {admin}"},
                )
                made.raise_for_status()
            show_scrapes("before", scrape_figures(client, process.pid))
            before_cpu, before_children = cpu_s(process.pid), children_cpu_s()
            sent = run_wrk(
                wrk.executable,
                RANDOM_PATHS_LUA,
                f"http://{address}",
                connections=4,
                seconds=600,
                limit=args.paths,
            )
            sent.stop_when_done(600)
            requests, seconds, errors = sent.result(60)
            print(
                f"random paths: {requests} requests in {seconds:.1f} s "
                f"({requests / seconds:.0f}/s achieved, asked: saturate with 4 "
                f"connections), {errors} socket errors; service CPU "
                f"{cpu_s(process.pid) - before_cpu:.1f} s, wrk CPU "
                f"{children_cpu_s() - before_children:.1f} s",
                flush=True,
            )
            after = scrape_figures(client, process.pid)
            show_scrapes(f"after {requests} random paths", after)
        phases = []
        # Last, a control: the same 4 loops on /livez (the cheapest unauthenticated path),
        # what any flood of that rate costs the others, whatever it asks for.
        for loops, path in ((0, ""), (1, "/metrics"), (4, "/metrics"), (4, "/livez")):
            done = phase(wrk.executable, address, process.pid, viewer, loops, args.seconds, path)
            if path != "/livez":
                phases.append(done)
            cores = os.cpu_count() or 1
            what = f"{loops} loop(s) on {path or '-'}"
            print(
                f"acme pools/list with {what}: p50 {done.p50_ms:.1f} ms, "
                f"max {done.max_ms:.1f} ms over {done.reads} reads in {done.seconds:.1f} s "
                f"(sequential: asked as fast as answered); {done.scrapes} GETs "
                f"({done.scrapes / done.seconds:.1f}/s) of {path or '-'}; CPU: service "
                f"{done.service_cpu_s:.1f} s, wrk {done.wrk_cpu_s:.1f} s, machine "
                f"{done.machine_busy_s:.1f} s of {done.seconds * cores:.0f}",
                flush=True,
            )
        base = phases[0]
        ok = after.size_bytes < 1_000_000 and after.max_ms < 100
        print(
            f"acceptance: /metrics {after.size_bytes / 1e6:.3f} MB (< 1 MB), scrape max "
            f"{after.max_ms:.1f} ms (< 100 ms): {'met' if ok else 'NOT MET'}"
        )
        for done in phases[1:]:
            ok = done.p50_ms <= 2 * base.p50_ms and done.max_ms < 1000
            print(
                f"acceptance, {done.loops} loop(s): p50 {done.p50_ms / base.p50_ms:.2f}x "
                f"the 0-loop p50 (<= 2x), max {done.max_ms:.0f} ms (< 1 s; 0 loops: "
                f"{base.max_ms:.0f} ms): {'met' if ok else 'NOT MET'}"
            )
        with httpx.Client(base_url=f"http://{address}", timeout=120) as client:
            show_scrapes("at the end", scrape_figures(client, process.pid))
    finally:
        stop_service(process)
        os.unlink(log)


if __name__ == "__main__":
    asyncio.run(main())
