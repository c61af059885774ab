"""REST calls and checks the pool tests repeat: create, offer, row counts, response shapes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import func, select

from app.db.engine import Database
from app.db.models import Base
from tests.support import Api

# CONTRACT section 4: the exact key sets of the REST shapes.
POOL_KEYS = frozenset(
    {
        "id",
        "displayName",
        "labels",
        "tenantId",
        "siteId",
        "class",
        "gpuModel",
        "sharing",
        "agent",
        "policy",
        "providerAccountId",
        "region",
        "owned",
        "archived",
        "version",
        "quotas",
        "offers",
        "createdAt",
        "updatedAt",
    }
)
QUOTA_KEYS = frozenset({"resource", "max", "used"})
CAPACITY_KEYS = frozenset({"resource", "total", "allocatable", "booked", "available"})
OFFER_KEYS = frozenset({"tenantId", "includeDescendants", "priority", "quotas"})
DEFAULT_OWNER_MAX = 2_147_483_647
# Pattern-valid ids that no row will ever have.
MISSING_POOL = "pool_" + "0" * 26
MISSING_SITE = "site_" + "0" * 26
MISSING_ACCOUNT = "pacct_" + "0" * 26


async def create_pool(
    api: Api, token: str, tenant_id: str, site_id: str, **fields: Any
) -> dict[str, Any]:
    """Create a pool (class metal-host unless given) and return its REST Pool."""
    body = {"tenantId": tenant_id, "siteId": site_id, "class": "metal-host", **fields}
    created = await api.ok(token, "pools/create", body)
    assert set(created) == {"pool"}  # CONTRACT 4: {"pool": Pool}
    pool: dict[str, Any] = created["pool"]
    assert_pool_shape(pool)
    return pool


async def offer(
    api: Api, token: str, owner: str, pool_id: str, to_tenant: str, quota: dict[str, int]
) -> dict[str, Any]:
    body = {"tenantId": owner, "poolId": pool_id, "toTenantId": to_tenant, "quota": quota}
    pool: dict[str, Any] = (await api.ok(token, "pools/offer", body))["pool"]
    return pool


async def row_count(db: Database, table: str) -> int:
    async with db.reader.connect() as conn:
        count = await conn.scalar(select(func.count()).select_from(Base.metadata.tables[table]))
    return int(count or 0)


async def row_counts(db: Database) -> dict[str, int]:
    """Rows per table, to show a refused call wrote nothing anywhere."""
    return {name: await row_count(db, name) for name in Base.metadata.tables}


def without_grants(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A pool's quota rows without their provenance (CONTRACT section 10), for tests of
    the rows themselves (tests/rest/test_quota_provenance.py checks the grants)."""
    return [{k: v for k, v in row.items() if k != "grant"} for row in rows]


def assert_pool_shape(pool: dict[str, Any]) -> None:
    assert set(pool) == POOL_KEYS, sorted(set(pool) ^ POOL_KEYS)
    for quota in pool["quotas"]:
        assert set(quota) == QUOTA_KEYS | {"grant"}  # CONTRACT section 10: provenance
    for item in pool["offers"] or []:
        assert set(item) == OFFER_KEYS
        for quota in item["quotas"]:
            assert set(quota) == QUOTA_KEYS


# The ways a pool can be hidden from a guest; each must answer as a missing pool does.
HIDDEN_BY = ("never-offered", "unoffered", "archived", "missing")


async def hide_from_guest(
    api: Api,
    owner_token: str,
    owner: str,
    pool_id: str,
    guest: str,
    hidden_by: str,
    seen_by_guest: Callable[[], Awaitable[object]],
) -> str:
    """Leave the pool hidden from `guest` as `hidden_by` says (offered first, and checked
    visible through `seen_by_guest`, where it is then withdrawn); returns the id to ask for."""
    if hidden_by in ("unoffered", "archived"):
        await offer(api, owner_token, owner, pool_id, guest, {"gpu": 1})
        await seen_by_guest()  # visible until then
    if hidden_by == "unoffered":
        body = {"tenantId": owner, "poolId": pool_id, "toTenantId": guest}
        await api.ok(owner_token, "pools/unoffer", body)
    elif hidden_by == "archived":
        await api.ok(owner_token, "pools/archive", {"tenantId": owner, "poolId": pool_id})
    elif hidden_by == "missing":
        return MISSING_POOL
    return pool_id
