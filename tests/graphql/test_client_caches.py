"""Normalized client caches and Relay (CONTRACT section 10, "Client caches and Relay"):
web/clients.mjs drives @apollo/client's InMemoryCache, urql's Graphcache and relay-runtime
(operations compiled by the pinned relay-compiler) against a real `bettercompute serve`:
with default settings offerPool's answer never replaces the owner's cached view; with the
setting docs/graphql.md shows, a fleet admin acting for two tenants reads each one's view;
node(id:) refetches a pool and an offer (null for a fleet admin); Apollo's
relayStylePagination keeps all 5 pools paged 2 at a time."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.databases import service_unavailable
from tests.support import Fleet
from tests.test_browser import Served

WEB = Path(__file__).resolve().parents[2] / "web"
CHECKS = 19  # web/clients.mjs: every check it makes, all ok
PACKAGES = ("@apollo/client", "@urql/exchange-graphcache", "relay-runtime", "relay-compiler")


def _node() -> str:
    node = shutil.which("node")
    if node is None or not all((WEB / "node_modules" / p).is_dir() for p in PACKAGES):
        service_unavailable("node and web/node_modules (scripts/web-assets) are needed")
    return node


def test_relay_compiler_accepts_the_operations() -> None:
    """relay-compiler (pinned) validates web/relay against schema/schema.graphql, with
    `@refetchable` on Pool, and finds the committed artifacts current."""
    _node()
    compiler = WEB / "node_modules" / ".bin" / "relay-compiler"
    done = subprocess.run(
        [str(compiler), "--validate"], cwd=WEB, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def _run_clients(node: str, base: str, config: dict[str, object]) -> tuple[int, str, str]:
    clients = await asyncio.create_subprocess_exec(
        node,
        str(WEB / "clients.mjs"),
        f"{base}/graphql",
        json.dumps(config),
        cwd=WEB,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(clients.communicate(), timeout=180)
    return clients.returncode or 0, stdout.decode(), stderr.decode()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_client_caches_keep_each_tenants_view(database_url: str, fleet: Fleet) -> None:
    node = _node()
    await fleet.tenant("acme")
    await fleet.tenant("globex")
    site = await fleet.site("acme")
    owner = await fleet.caller("acme", "admin")
    admin = await fleet.caller("fleet", "fleet-admin")
    server = Served(database_url)
    server.start()  # a real `bettercompute serve` process
    try:
        pools: list[str] = []
        headers = {"authorization": f"Bearer {owner}"}
        async with httpx.AsyncClient(base_url=server.base, timeout=30) as client:
            for _ in range(5):
                body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
                created = await client.post("/api/compute/pools/create", json=body, headers=headers)
                assert created.status_code == 200, created.text
                pools.append(created.json()["pool"]["id"])
        await fleet.node(pools[0], 4)
        config = {"owner": owner, "admin": admin, "poolId": pools[0], "pools": pools}
        code, stdout, stderr = await _run_clients(node, server.base, {**config, "guest": "globex"})
    finally:
        server.stop()
    assert code == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    summary = lines[-1]["summary"]
    print("client caches:", json.dumps(summary))
    failed = [line for line in lines[:-1] if not line["ok"]]
    assert not failed, json.dumps(failed, indent=1)
    assert not summary["crashed"] and summary["ok"] == CHECKS
