"""Benchmark: the compiled-read plan cache under many distinct query texts (issue 19, item 7).

    .venv/bin/python -m bench.plan_cache                       # 1,000 distinct queries
    .venv/bin/python -m bench.plan_cache --queries 200         # quicker
    .venv/bin/python -m bench.plan_cache --repo /tmp/old-clone # the server of another tree

Needs PostgreSQL at 127.0.0.1:5432 (BENCH_POSTGRES_URL). Creates a fresh database
(dropped at the end) where an owner offers 10 pools to a guest tenant, starts one real
`bettercompute serve` process on it (from `--repo`, default this tree: `python -m
app.cli serve` with that tree first on PYTHONPATH), warms it up with a fixed dashboard
query, then sends `--queries` distinct query texts of about 3 KB (30 aliases, nested
rows) as the guest's viewer, each twice (the first teaches the text, the second is
answered by its compiled statement), `--concurrency` at a time so that every direct
connection prepares statements. Prints the service's RSS before and after, the plan
count and bytes from /metrics (when the server exports them), the compiled reads
answered, and the memory of each PostgreSQL backend serving the bench database (VmRSS
and RssAnon from /proc/<pid>/status of the pids in pg_stat_activity: the backends run
on this machine, as root they are readable).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from app.capacity import inventory
from app.capacity.inputs import OfferPoolInput
from app.capacity.service import Capacity
from app.db.engine import create_database
from app.iam.callers import authenticate, create_caller
from bench.database import bench_database
from bench.events_fanout import seed_tenant
from bench.proc import cpu_s

HERE = Path(__file__).resolve().parents[1]
POOLS = 10
OWNER, GUEST = "owner", "guest"

WARM_UP = """query Dashboard($t: String!) { pools(tenantId: $t, first: 100) {
  pageInfo { hasNextPage endCursor }
  nodes { id class gpuModel sharing region owned archived version
          quotas { resource max used } capacity { resource available } } } }"""
_POOL_FIELDS = [
    *("id", "tenantId", "siteId", "class", "gpuModel", "sharing", "agent"),
    *("providerAccountId", "region", "owned", "archived", "version", "createdAt", "updatedAt"),
]


def distinct_query(n: int, name: str | None = "Dashboard") -> str:
    """The n-th query text: about 3 KB, 30 aliases whose names make its statement
    distinct too (json_build_object keys), rows nested two deep. One operation name for
    all (None: a distinct one each, which also grows /metrics' operation label, issue 19
    item 1, not the plans)."""
    tag = f"q{n:05d}_{secrets.token_hex(28)}"
    aliased = [f"{tag}_{f}_{i}: {f}" for i, f in enumerate(_POOL_FIELDS)]
    node = (
        " ".join(aliased[:10])
        + " "
        + " ".join(_POOL_FIELDS)
        + f" {tag}_quotas: quotas {{ resource max used poolId"
        " grant { via tenantId includeDescendants priority offeredAt } }"
        f" {tag}_capacity: capacity {{ resource total allocatable booked available }}"
    )
    edge = " ".join(aliased[10:]) + " " + " ".join(_POOL_FIELDS) + " quotas { resource max }"
    return (
        f"query {name or 'Q' + tag}($t: String!) {{\n"
        f"  {tag}_page: pools(tenantId: $t, first: 100) {{\n"
        f"  {tag}_info: pageInfo {{ hasNextPage hasPreviousPage startCursor endCursor }}\n"
        f"  {tag}_nodes: nodes {{ {node} }}\n"
        f"  {tag}_edges: edges {{ {tag}_cursor: cursor node {{ {edge} }} }}\n"
        f"  {tag}_more: nodes {{ {' '.join(f'{tag}_{f}_x: {f}' for f in _POOL_FIELDS[:5])}"
        f" {' '.join(_POOL_FIELDS)} }} }} }}"
    )


async def seed(url: str) -> str:
    """The owner's pools offered to the guest; the guest viewer's token."""
    db = create_database(url)
    try:
        capacity = Capacity(db)
        await seed_tenant(db, capacity, OWNER)
        await inventory.create_tenant(db, GUEST, None)
        site = await inventory.create_site(db, OWNER, "custom", "eu-west")
        _, admin = await create_caller(db, OWNER, "admin")
        principal = await authenticate(db, f"Bearer {admin}")
        from app.capacity.inputs import CreatePoolInput

        for i in range(POOLS):
            created = await capacity.create_pool(
                principal,
                CreatePoolInput.model_validate(
                    {
                        "tenantId": OWNER,
                        "siteId": site,
                        "class": "metal-host",
                        "gpuModel": "H100",
                        "ownerQuota": {"gpu": 8, "gpu.mig": 56},
                    }
                ),
            )
            await capacity.offer_pool(
                principal,
                OfferPoolInput.model_validate(
                    {
                        "tenantId": OWNER,
                        "poolId": created.pool.id,
                        "toTenantId": GUEST,
                        "quota": {"gpu": 1 + i % 4},
                        "priority": i,
                    }
                ),
            )
        _, viewer = await create_caller(db, GUEST, "viewer")
        return viewer
    finally:
        await db.dispose()


def start_server(repo: Path, url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "BETTERCOMPUTE_DATABASE_URL": url,
        "BETTERCOMPUTE_LOG_LEVEL": "warning",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            cwd=repo,
            env=env,
            stdout=out,
            stderr=out,
        )


def status_kb(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon... of a process, in KiB (empty once it is gone)."""
    found: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                found[name] = int(value.split()[0])
    return found


async def backends(url: str) -> dict[int, dict[str, int]]:
    """Memory of each PostgreSQL backend connected to the bench database (not ours)."""
    parsed = make_url(url)
    conn = await asyncpg.connect(
        host=parsed.host, port=parsed.port, user=parsed.username, database=parsed.database
    )
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
    finally:
        await conn.close()
    return {r["pid"]: status_kb(r["pid"]) for r in rows}


async def scrape(client: httpx.AsyncClient, base: str) -> dict[str, float]:
    text = (await client.get(f"{base}/metrics")).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("bettercompute_compiled_"):
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                found[sample.name + (f"{{{label}}}" if label else "")] = sample.value
    return found


async def wait_ready(
    client: httpx.AsyncClient, base: str, process: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the server exited")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(f"{base}/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the server did not become ready")


def _mib(kb: int) -> str:
    return f"{kb / 1024:.1f} MiB"


def _print_backends(title: str, found: dict[int, dict[str, int]]) -> None:
    print(f"{title}: {len(found)} backends")
    for pid, status in sorted(found.items()):
        print(
            f"  pid {pid}: VmRSS {_mib(status.get('VmRSS', 0))}, "
            f"RssAnon {_mib(status.get('RssAnon', 0))}"
        )
    if found:
        anon = [s.get("RssAnon", 0) for s in found.values()]
        print(f"  RssAnon max {_mib(max(anon))}, sum {_mib(sum(anon))}")


async def run(
    repo: Path, queries: int, concurrency: int, time_limit_s: float, distinct_names: bool
) -> int:
    async with bench_database() as url:
        token = await seed(url)
        port = 18000 + secrets.randbelow(4000)
        base = f"http://127.0.0.1:{port}"
        log = Path(tempfile.mkdtemp(prefix="plan_cache_")) / "server.log"
        process = start_server(repo, url, port, log)
        headers = {"authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=concurrency)
        failures = 0
        try:
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                await wait_ready(client, base, process)

                async def ask(query: str) -> None:
                    nonlocal failures
                    body = {"query": query, "variables": {"t": GUEST}}
                    response = await client.post(f"{base}/graphql", json=body, headers=headers)
                    data = response.json()
                    if response.status_code != 200 or data.get("errors"):
                        failures += 1
                        if failures <= 3:
                            print(f"failed: {response.status_code} {response.text[:300]}")

                # Warm-up: the same dashboard, plain then compiled, on every connection.
                for _ in range(5):
                    await asyncio.gather(*(ask(WARM_UP) for _ in range(concurrency * 2)))
                print(
                    f"server: {repo} (pid {process.pid}); {queries} distinct queries of "
                    f"{len(distinct_query(0))} chars, each twice, {concurrency} at a time, "
                    f"{'distinct operation names' if distinct_names else 'one operation name'}"
                )
                before = status_kb(process.pid)
                metrics_before = await scrape(client, base)
                backends_before = await backends(url)
                cpu_before = cpu_s(process.pid)
                texts = [
                    distinct_query(n, None if distinct_names else "Dashboard")
                    for n in range(queries)
                ]
                started = time.monotonic()
                sent = 0
                for i in range(0, queries, concurrency):
                    if time.monotonic() - started > time_limit_s:
                        print(f"time limit reached after {sent} queries")
                        break
                    batch = texts[i : i + concurrency]
                    for _ in range(2):  # learnt, then compiled
                        await asyncio.gather(*(ask(q) for q in batch))
                    sent += len(batch)
                elapsed = time.monotonic() - started
                after = status_kb(process.pid)
                metrics_after = await scrape(client, base)
                backends_after = await backends(url)
                cpu = cpu_s(process.pid) - cpu_before
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
    print(
        f"sent {sent} distinct queries ({2 * sent} requests) in {elapsed:.1f} s, "
        f"{failures} failed; server CPU {cpu:.1f} s"
    )
    grown = after.get("VmRSS", 0) - before.get("VmRSS", 0)
    print(
        f"service RSS: before {_mib(before.get('VmRSS', 0))}, after {_mib(after.get('VmRSS', 0))}"
        f" (grew {_mib(grown)}; RssAnon {_mib(before.get('RssAnon', 0))} -> "
        f"{_mib(after.get('RssAnon', 0))})"
    )
    for name in sorted(set(metrics_before) | set(metrics_after)):
        print(f"  {name}: {metrics_before.get(name, 0):g} -> {metrics_after.get(name, 0):g}")
    if not any("plan" in name for name in metrics_after):
        print("  (no plan gauges exported by this server)")
    _print_backends("PostgreSQL backends before", backends_before)
    _print_backends("PostgreSQL backends after", backends_after)
    print(f"server log: {log}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repo", type=Path, default=HERE, help="the tree whose server runs")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds, at most")
    parser.add_argument(
        "--distinct-names", action="store_true", help="a distinct operation name per text"
    )
    args = parser.parse_args()
    return asyncio.run(
        run(
            args.repo.resolve(),
            args.queries,
            args.concurrency,
            args.time_limit,
            args.distinct_names,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
