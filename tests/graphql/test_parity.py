"""REST and GraphQL give the same answer and the same error code (CONTRACT section 9).

Each case is one scenario. A read is asked through both on the same state; a write runs
twice, once through each, each on its own freshly made pools. The answers must agree once
pool ids and timestamps are set aside; failures must carry the same code and field.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.graphql.documents import METHODS, to_rest, to_variables
from tests.support import Api, Fleet

Json = dict[str, Any]
_POOL_ID = re.compile(r"pool_[0-9a-hjkmnp-tv-z]{26,52}")


@dataclass
class World:
    api: Api
    fleet: Fleet
    site: str
    beta_site: str
    admin: str  # acme's admin
    viewer: str  # acme's viewer
    beta: str  # beta's admin

    async def pool(self, **fields: Any) -> str:
        body = {"tenantId": "acme", "siteId": self.site, "class": "metal-host", **fields}
        pool_id: str = (await self.api.ok(self.admin, "pools/create", body))["pool"]["id"]
        return pool_id

    async def offered(self, quota: dict[str, int] | None = None) -> str:
        pool_id = await self.pool(gpuModel="H100")
        await self.fleet.node(pool_id, 4)
        body = {
            "tenantId": "acme",
            "poolId": pool_id,
            "toTenantId": "beta",
            "quota": quota or {"gpu": 2},
        }
        await self.api.ok(self.admin, "pools/offer", body)
        return pool_id


@pytest.fixture
async def world(api: Api, fleet: Fleet) -> World:
    await fleet.tenant("acme")
    await fleet.tenant("beta")
    return World(
        api,
        fleet,
        site=await fleet.site("acme"),
        beta_site=await fleet.site("beta"),
        admin=await fleet.caller("acme", "admin"),
        viewer=await fleet.caller("acme", "viewer"),
        beta=await fleet.caller("beta", "admin"),
    )


Setup = Callable[[World], Awaitable[tuple[str, Json]]]


async def list_ok(w: World) -> tuple[str, Json]:
    await w.offered()
    return w.beta, {"tenantId": "beta"}


async def list_other_tenant(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "beta"}


async def get_owner(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.offered()}


async def get_guest(w: World) -> tuple[str, Json]:
    return w.beta, {"tenantId": "beta", "poolId": await w.offered()}


async def get_hidden(w: World) -> tuple[str, Json]:
    return w.beta, {"tenantId": "beta", "poolId": await w.pool()}


async def capacity_ok(w: World) -> tuple[str, Json]:
    return w.beta, {"tenantId": "beta", "poolId": await w.offered()}


async def capacity_hidden(w: World) -> tuple[str, Json]:
    return w.beta, {"tenantId": "beta", "poolId": await w.pool()}


async def create_ok(w: World) -> tuple[str, Json]:
    body = {
        "tenantId": "acme",
        "siteId": w.site,
        "class": "metal-host",
        "sharing": "mig",
        "gpuModel": "A100",
        "policy": {"migLayout": ["1g.10gb"]},
        "ownerQuota": {"gpu": 8, "gpu.mig": 56},
    }
    return w.admin, body


async def create_provider_without_account(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "siteId": w.site, "class": "provider"}


async def create_foreign_site(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "siteId": w.beta_site, "class": "vps-host"}


async def create_bad_quota(w: World) -> tuple[str, Json]:
    body = {"tenantId": "acme", "siteId": w.site, "class": "vps-host", "ownerQuota": {"gpu": -1}}
    return w.admin, body


async def offer_ok(w: World) -> tuple[str, Json]:
    body = {
        "tenantId": "acme",
        "poolId": await w.pool(),
        "toTenantId": "beta",
        "quota": {"gpu": 3},
        "includeDescendants": True,
        "priority": 7,
    }
    return w.admin, body


async def offer_bad_priority(w: World) -> tuple[str, Json]:
    body = {
        "tenantId": "acme",
        "poolId": await w.pool(),
        "toTenantId": "beta",
        "quota": {"gpu": 3},
        "priority": 5000,
    }
    return w.admin, body


async def offer_not_owner(w: World) -> tuple[str, Json]:
    body = {"tenantId": "beta", "poolId": await w.offered(), "toTenantId": "beta", "quota": {}}
    return w.beta, body


async def unoffer_ok(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.offered(), "toTenantId": "beta"}


async def unoffer_nothing(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.pool(), "toTenantId": "beta"}


async def unoffer_owner(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.pool(), "toTenantId": "acme"}


async def update_ok(w: World) -> tuple[str, Json]:
    body = {"tenantId": "acme", "poolId": await w.offered(), "gpuModel": "H200", "policy": {}}
    return w.admin, body


async def update_neither(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.pool()}


async def archive_ok(w: World) -> tuple[str, Json]:
    return w.admin, {"tenantId": "acme", "poolId": await w.offered()}


async def archive_by_viewer(w: World) -> tuple[str, Json]:
    return w.viewer, {"tenantId": "acme", "poolId": await w.pool()}


CASES: list[tuple[str, Setup]] = [
    ("list", list_ok),
    ("list", list_other_tenant),
    ("get", get_owner),
    ("get", get_guest),
    ("get", get_hidden),
    ("capacity", capacity_ok),
    ("capacity", capacity_hidden),
    ("create", create_ok),
    ("create", create_provider_without_account),
    ("create", create_foreign_site),
    ("create", create_bad_quota),
    ("offer", offer_ok),
    ("offer", offer_bad_priority),
    ("offer", offer_not_owner),
    ("unoffer", unoffer_ok),
    ("unoffer", unoffer_nothing),
    ("unoffer", unoffer_owner),
    ("update", update_ok),
    ("update", update_neither),
    ("archive", archive_ok),
    ("archive", archive_by_viewer),
]


def normalized(value: Any) -> Any:
    """Pool ids and timestamps differ between the two runs; everything else must not."""
    if isinstance(value, dict):
        return {
            k: "<time>" if k in ("createdAt", "updatedAt", "offeredAt") else normalized(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, str):
        return _POOL_ID.sub("<pool>", value)
    return value


async def through_rest(api: Api, method: str, token: str, body: Json) -> Json:
    response = await api.post(token, f"pools/{method}", body)
    if response.status_code == 200:
        return {"data": response.json()}
    error = response.json()["error"]
    return {"error": (error["code"], error["details"].get("field"))}


async def through_graphql(api: Api, method: str, token: str, body: Json) -> Json:
    document = METHODS[method][0]
    answer = await api.graphql(token, document, to_variables(method, body))
    errors = answer.get("errors", [])
    if errors:
        extensions = errors[0]["extensions"]
        return {"error": (extensions["code"], extensions.get("field"))}
    return {"data": to_rest(method, answer["data"])}


@pytest.mark.parametrize(("method", "setup"), CASES, ids=[f"{m}-{s.__name__}" for m, s in CASES])
async def test_rest_and_graphql_agree(world: World, api: Api, method: str, setup: Setup) -> None:
    token, body = await setup(world)
    rest = await through_rest(api, method, token, body)
    if METHODS[method][3]:  # a write: the same scenario again, on its own pools
        token, body = await setup(world)
    graphql = await through_graphql(api, method, token, body)
    assert normalized(graphql) == normalized(rest)
    if "data" in rest and method != "unoffer":
        assert rest["data"][METHODS[method][2]], "an empty answer proves nothing"
