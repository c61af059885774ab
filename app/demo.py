"""`bettercompute demo`: a small realistic fleet, built through the domain like any client."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.capacity import inventory
from app.capacity.inputs import (
    CreatePoolInput,
    CreateReservationInput,
    OfferPoolInput,
    parse_input,
)
from app.capacity.service import Capacity
from app.db.engine import Database
from app.db.models import Caller, RoleBinding, Tenant
from app.iam.callers import create_caller, create_token
from app.iam.principal import Principal

# (tenant, parent); the built-in `fleet` tenant comes with the schema (migration 0002).
TENANTS = (
    ("acme", None),
    ("globex", None),
    ("globex-research", "globex"),
    ("initech", None),
)
# (label, tenant, role)
CALLERS = (
    ("fleet-admin", "fleet", "fleet-admin"),
    ("acme-admin", "acme", "admin"),
    ("acme-viewer", "acme", "viewer"),
    ("globex-admin", "globex", "admin"),
    ("globex-research-operator", "globex-research", "operator"),
    ("initech-admin", "initech", "admin"),
)


async def _existing_tokens(db: Database) -> dict[str, str]:
    """Demo data is already there: tokens are shown only once, so issue fresh ones."""
    async with db.reader.connect() as conn:
        rows = (
            await conn.execute(
                select(Caller.id, Caller.tenant_id, RoleBinding.role)
                .join(RoleBinding, RoleBinding.caller_id == Caller.id)
                .order_by(Caller.created_at)
            )
        ).all()
    tokens: dict[str, str] = {}
    for label, tenant, role in CALLERS:
        caller = next((r for r in rows if r.tenant_id == tenant and r.role == role), None)
        if caller is not None:
            tokens[label] = await create_token(db, caller.id)
    return tokens


async def seed(db: Database) -> dict[str, Any]:
    async with db.reader.connect() as conn:
        seeded = await conn.scalar(select(Tenant.id).where(Tenant.id == "acme"))
    if seeded:
        fresh = await _existing_tokens(db)
        return {"seeded": False, "tokens": fresh, **_hints(fresh)}

    for tenant, parent in TENANTS:
        async with db.reader.connect() as conn:
            exists = await conn.scalar(select(Tenant.id).where(Tenant.id == tenant))
        if not exists:
            await inventory.create_tenant(db, tenant, parent)
    tokens: dict[str, str] = {}
    principals: dict[str, Principal] = {}
    for label, tenant, role in CALLERS:
        caller_id, tokens[label] = await create_caller(db, tenant, role)
        principals[label] = Principal(caller_id, tenant, role)

    platform = await inventory.create_site(db, "acme", "platform", "eu-west")
    custom = await inventory.create_site(db, "acme", "custom", "us-east")
    account = await inventory.create_provider_account(db, "acme")
    capacity = Capacity(db)
    acme = principals["acme-admin"]

    async def pool(body: dict[str, Any], gpus: list[int]) -> str:
        created = await capacity.create_pool(acme, parse_input(CreatePoolInput, body))
        for count in gpus:
            await inventory.add_node(db, created.pool.id, count)
        return created.pool.id

    h100 = await pool(
        {
            "tenantId": "acme",
            "siteId": platform,
            "class": "metal-host",
            "gpuModel": "H100",
            "policy": {"hugepages": {"1Gi": 64}, "kernelModules": ["nvidia_peermem"]},
        },
        [8, 8, 8, 8],
    )
    a100 = await pool(
        {
            "tenantId": "acme",
            "siteId": platform,
            "class": "metal-dedicated",
            "gpuModel": "A100",
            "sharing": "mig",
            "policy": {"migLayout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
            "ownerQuota": {"gpu": 16, "gpu.mig": 64},
        },
        [8, 8],
    )
    l4 = await pool(
        {
            "tenantId": "acme",
            "siteId": custom,
            "class": "vps-host",
            "gpuModel": "L4",
            "sharing": "timeslice",
            "policy": {"sharing": {"replicas": 4}},
            "ownerQuota": {"gpu": 8, "gpu.slot": 32},
        },
        [4, 4],
    )
    mps = await pool(
        {
            "tenantId": "acme",
            "siteId": custom,
            "class": "metal-host",
            "gpuModel": "L40S",
            "sharing": "mps",
            "policy": {"sharing": {"replicas": 8}},
            "ownerQuota": {"gpu": 4, "gpu.slot": 32},
        },
        [4],
    )
    provider = await pool(
        {
            "tenantId": "acme",
            "siteId": custom,
            "class": "provider",
            "gpuModel": "H200",
            "providerAccountId": account,
        },
        [8],
    )
    await capacity.offer_pool(
        acme,
        parse_input(
            OfferPoolInput,
            {
                "tenantId": "acme",
                "poolId": h100,
                "toTenantId": "globex",
                "quota": {"gpu": 16},
                "includeDescendants": True,
                "priority": 10,
            },
        ),
    )
    await capacity.offer_pool(
        acme,
        parse_input(
            OfferPoolInput,
            {
                "tenantId": "acme",
                "poolId": a100,
                "toTenantId": "initech",
                "quota": {"gpu": 4, "gpu.mig": 16},
            },
        ),
    )
    await capacity.create_reservation(
        principals["globex-research-operator"],
        parse_input(
            CreateReservationInput,
            {"tenantId": "globex-research", "poolId": h100, "resources": {"gpu": 4}},
        ),
    )
    await capacity.create_reservation(
        principals["initech-admin"],
        parse_input(
            CreateReservationInput,
            {"tenantId": "initech", "poolId": a100, "resources": {"gpu.mig": 6}},
        ),
    )
    return {
        "seeded": True,
        "tokens": tokens,
        "pools": {
            "h100": h100,
            "a100-mig": a100,
            "l4-timeslice": l4,
            "l40s-mps": mps,
            "h200-provider": provider,
        },
        "sites": {"platform": platform, "custom": custom},
        **_hints(tokens),
    }


def _hints(tokens: dict[str, str]) -> dict[str, Any]:
    return {
        "try": "curl -s -X POST http://127.0.0.1:8000/api/compute/pools/list "
        f"-H 'authorization: Bearer {tokens.get('globex-admin', '<token>')}' "
        "-H 'content-type: application/json' -d '{\"tenantId\": \"globex\"}'",
        "graphiql": "http://127.0.0.1:8000/graphql",
    }
