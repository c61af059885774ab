"""The `bettercompute` console script, run as an operator would run it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.server import create_app
from tests.support import Api

BIN = Path(sys.executable).with_name("bettercompute")


def run(
    url: str, *args: str, ok: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": url}
    done = subprocess.run(
        [str(BIN), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def out(url: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(run(url, *args).stdout)
    return result


async def test_operator_walkthrough(fresh_database_url: str) -> None:
    url = fresh_database_url
    assert out(url, "db", "upgrade")["revision"]
    assert out(url, "tenant", "create", "acme") == {"tenantId": "acme"}
    assert out(url, "tenant", "create", "acme-lab", "--parent", "acme") == {"tenantId": "acme-lab"}
    site = out(url, "site", "create", "--tenant", "acme", "--kind", "platform", "--region", "eu")
    assert site["siteId"].startswith("site_")
    account = out(url, "provider-account", "create", "--tenant", "acme")
    assert account["providerAccountId"].startswith("pacct_")
    caller = out(
        url, "caller", "create", "--tenant", "acme", "--role", "admin", "--where", "region=eu"
    )
    assert caller["callerId"].startswith("caller_") and caller["token"]
    token = out(url, "token", "create", "--caller", caller["callerId"])["token"]
    assert token != caller["token"]
    assert out(url, "token", "revoke", "--token", token) == {"revoked": True}


async def test_failures_exit_non_zero_with_one_line(fresh_database_url: str) -> None:
    url = fresh_database_url
    run(url, "db", "upgrade")
    cases = [
        ("tenant", "create", "no spaces allowed"),
        ("site", "create", "--tenant", "ghost", "--kind", "custom", "--region", "eu"),
        ("caller", "create", "--tenant", "ghost", "--role", "admin"),
        ("node", "add", "--pool", "pool_01m8k80w4x6ye1p6jrgt9p57kb", "--gpus", "4"),
    ]
    for args in cases:
        done = run(url, *args, ok=False)
        assert done.returncode != 0 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("bettercompute: ")


async def test_a_fleet_admin_on_a_fresh_database_acts_for_any_tenant(
    fresh_database_url: str,
) -> None:
    """CONTRACT 2, exactly as an operator runs it: the fleet tenant comes with the schema."""
    url = fresh_database_url
    run(url, "db", "upgrade")
    admin = out(url, "caller", "create", "--tenant", "fleet", "--role", "fleet-admin")
    assert admin["callerId"].startswith("caller_") and admin["token"].startswith("bct_")
    out(url, "tenant", "create", "acme")
    site = out(url, "site", "create", "--tenant", "acme", "--kind", "custom", "--region", "eu")

    application = create_app(Settings(database_url=url))
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://testserver"
        ) as client,
    ):
        api = Api(client)
        body = {"tenantId": "acme", "siteId": site["siteId"], "class": "metal-host"}
        created = (await api.ok(admin["token"], "pools/create", body))["pool"]
        listed = await api.ok(admin["token"], "pools/list", {"tenantId": "acme"})
    assert [(p["id"], p["owned"]) for p in listed["pools"]] == [(created["id"], True)]


async def test_the_fleet_tenant_cannot_be_created_again_or_given_a_parent(
    fresh_database_url: str,
) -> None:
    url = fresh_database_url
    run(url, "db", "upgrade")
    out(url, "tenant", "create", "acme")
    for args in (("tenant", "create", "fleet"), ("tenant", "create", "fleet", "--parent", "acme")):
        done = run(url, *args, ok=False)
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr == (
            "bettercompute: CONFLICT: tenant fleet is built in: it exists on every database,"
            " with no parent\n"
        )
    # Fleet may still be a parent: its children are ordinary tenants.
    assert out(url, "tenant", "create", "ops", "--parent", "fleet") == {"tenantId": "ops"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_demo_then_serve_answers_the_printed_curl(tmp_path: Path, dialect: str) -> None:
    """The README's first command: demo seeds the embedded default, serve answers."""
    url = f"sqlite+aiosqlite:///{tmp_path}/demo.db"
    demo = out(url, "demo")
    assert demo["seeded"] is True and set(demo["tokens"]) >= {"globex-admin", "fleet-admin"}
    again = out(url, "demo")  # a second run keeps the data and issues fresh tokens
    assert (
        again["seeded"] is False
        and again["tokens"]["globex-admin"] != demo["tokens"]["globex-admin"]
    )

    port = _free_port()
    env = {**os.environ, "BETTERCOMPUTE_DATABASE_URL": url}
    server = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        token = again["tokens"]["globex-admin"]
        assert token in again["try"]
        listed = httpx.post(
            f"{base}/api/compute/pools/list",
            json={"tenantId": "globex"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert listed.status_code == 200
        pools = listed.json()["pools"]
        assert [p["gpuModel"] for p in pools] == ["H100"]
        assert pools[0]["owned"] is False and pools[0]["quotas"][0]["max"] == 16
    finally:
        server.terminate()
        server.wait(timeout=10)
