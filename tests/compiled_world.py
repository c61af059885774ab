"""Two apps over one database, the compiled read path on (`fast`, the default
settings) and off (`plain`, BETTERCOMPUTE_FAST_PATH=false), and a fleet with callers of
every kind: what the compiled path's parity tests run against."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio

from app.config import Settings
from app.iam.callers import revoke_token
from app.server import create_app
from tests.support import Fleet

JOIN_SET = {
    "apiServer": "https://k8s.example.com:6443",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "a" * 64,
}


@dataclass
class World:
    tokens: dict[str, str]
    pools: dict[str, str]


@dataclass
class Pair:
    fast: httpx.AsyncClient
    plain: httpx.AsyncClient


@pytest_asyncio.fixture(loop_scope="session")
async def pair(database_url: str) -> AsyncIterator[Pair]:
    # No allowance per client address (app/http/address_budget.py): the world's revoked
    # and nonsense tokens are sent hundreds of times from one address.
    fast_app = create_app(Settings(database_url=database_url, unauthenticated_burst=0))
    plain_app = create_app(
        Settings(database_url=database_url, fast_path=False, unauthenticated_burst=0)
    )
    async with (
        fast_app.router.lifespan_context(fast_app),
        plain_app.router.lifespan_context(plain_app),
    ):
        fast = httpx.AsyncClient(transport=httpx.ASGITransport(app=fast_app), base_url="http://t")
        plain = httpx.AsyncClient(transport=httpx.ASGITransport(app=plain_app), base_url="http://t")
        async with fast, plain:
            yield Pair(fast, plain)


async def _rest(client: httpx.AsyncClient, token: str, method: str, body: Any) -> Any:
    path = method if "/" in method else f"pools/{method}"
    response = await client.post(
        f"/api/compute/{path}", json=body, headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest_asyncio.fixture(loop_scope="session")
async def world(pair: Pair, fleet: Fleet) -> World:
    """acme owns five pools (one archived, one with a kubernetes join secret) and offers
    two to globex, one with includeDescendants (globex-dev sees it through that offer);
    initech sees nothing. Callers of every kind."""
    await fleet.tenant("acme")
    await fleet.tenant("globex")
    await fleet.tenant("globex-dev", parent="globex")
    await fleet.tenant("initech")
    site = await fleet.site("acme")
    tokens = {
        "acme-admin": await fleet.caller("acme", "admin"),
        "acme-viewer": await fleet.caller("acme", "viewer"),
        "acme-operator": await fleet.caller("acme", "operator"),
        "acme-narrowed": await fleet.caller("acme", "admin", gpuModel="H100"),
        "globex-viewer": await fleet.caller("globex", "viewer"),
        "globex-admin": await fleet.caller("globex", "admin"),
        "dev-viewer": await fleet.caller("globex-dev", "viewer"),
        "initech-admin": await fleet.caller("initech", "admin"),
        "fleet-admin": await fleet.caller("fleet", "fleet-admin"),
        "revoked": await fleet.caller("acme", "admin"),
        "nonsense": "not-a-token",
    }
    admin = tokens["acme-admin"]
    specs = [
        {
            "gpuModel": "H100",
            "sharing": "mig",
            "ownerQuota": {"gpu": 8, "gpu.mig": 56},
            "displayName": "Training H100s",
            "labels": {"team": "ml", "example.com/tier": "gold"},
        },
        {
            "gpuModel": "A100",
            "class": "vps-host",
            "ownerQuota": {"gpu": 4},
            "labels": {"team": "web", "env": ""},
        },
        {"policy": {"kubernetes": JOIN_SET}, "gpuModel": "L4"},
        {"sharing": "timeslice", "ownerQuota": {"gpu.slot": 16}},
        {"gpuModel": "H100"},
    ]
    pools: dict[str, str] = {}
    for i, spec in enumerate(specs):
        body = {"tenantId": "acme", "siteId": site, "class": "metal-host", **spec}
        created = await _rest(pair.plain, admin, "create", body)
        pools[f"p{i}"] = created["pool"]["id"]
    for name in ("p0", "p1", "p2"):
        await fleet.node(pools[name], 4)
    await _rest(
        pair.plain,
        admin,
        "offer",
        {
            "tenantId": "acme",
            "poolId": pools["p0"],
            "toTenantId": "globex",
            "quota": {"gpu": 2, "gpu.mig": 7},
            "includeDescendants": True,
            "priority": 5,
        },
    )
    await _rest(
        pair.plain,
        admin,
        "offer",
        {"tenantId": "acme", "poolId": pools["p1"], "toTenantId": "globex", "quota": {"gpu": 1}},
    )
    await _rest(
        pair.plain,
        tokens["globex-admin"],
        "reservations/create",
        {"tenantId": "globex", "poolId": pools["p1"], "resources": {"gpu": 1}},
    )
    await _rest(pair.plain, admin, "archive", {"tenantId": "acme", "poolId": pools["p4"]})
    await revoke_token(fleet.db, tokens["revoked"])
    return World(tokens, pools)


# caller -> the tenant it acts for
CALLERS = {
    "acme-admin": "acme",
    "acme-viewer": "acme",
    "acme-operator": "acme",
    "acme-narrowed": "acme",
    "globex-viewer": "globex",
    "dev-viewer": "globex-dev",
    "initech-admin": "initech",
    "fleet-admin": "acme",
    "revoked": "acme",
    "nonsense": "acme",
}
