"""Operator inventory: tenants, sites, provider accounts and nodes (the CLI's writes)."""

from __future__ import annotations

import re

from sqlalchemy import select

from app.db.engine import Database
from app.db.models import Node, Pool, ProviderAccount, Site, Tenant
from app.db.uow import UnitOfWork
from app.errors import Conflict, InvalidInput, InvalidState, NotFound
from app.iam.roles import FLEET_TENANT
from app.ids import new_id

SITE_KINDS = ("platform", "custom")


# inputs.TenantId's pattern (a test keeps them equal), matched without loading pydantic's
# input models: `tenant create` is a shell command that should answer at once.
TENANT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _check_tenant_id(tenant_id: str, field: str) -> None:
    if TENANT_ID.fullmatch(tenant_id) is None:
        raise InvalidInput(f"invalid tenant id {tenant_id!r}", field=field)


async def _require_tenant(uow: UnitOfWork, tenant_id: str, field: str) -> None:
    if await uow.session.get(Tenant, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} not found", field=field)


async def create_tenant(db: Database, tenant_id: str, parent_id: str | None = None) -> str:
    async with UnitOfWork(db) as uow:
        return await add_tenant(uow, tenant_id, parent_id)


async def add_tenant(uow: UnitOfWork, tenant_id: str, parent_id: str | None = None) -> str:
    """`create_tenant` inside a caller's unit of work (fleet files apply many at once)."""
    _check_tenant_id(tenant_id, "tenantId")
    if tenant_id == FLEET_TENANT:  # made by the schema (migration 0002), a root for good
        raise Conflict(
            f"tenant {FLEET_TENANT} is built in: it exists on every database, with no parent",
            field="tenantId",
        )
    if parent_id is not None:
        await _require_tenant(uow, parent_id, "parent")
    if await uow.session.get(Tenant, tenant_id) is not None:
        raise Conflict(f"tenant {tenant_id} already exists", field="tenantId")
    uow.session.add(Tenant(id=tenant_id, parent_id=parent_id))
    await uow.session.flush()
    return tenant_id


async def create_site(db: Database, tenant_id: str, kind: str, region: str) -> str:
    async with UnitOfWork(db) as uow:
        return await add_site(uow, tenant_id, kind, region)


async def add_site(uow: UnitOfWork, tenant_id: str, kind: str, region: str) -> str:
    if kind not in SITE_KINDS:
        raise InvalidInput(f"site kind must be one of {SITE_KINDS}", field="kind")
    if not region or len(region) > 64:
        raise InvalidInput("region must be 1 to 64 characters", field="region")
    await _require_tenant(uow, tenant_id, "tenant")
    site_id = new_id("site")
    uow.session.add(Site(id=site_id, tenant_id=tenant_id, kind=kind, region=region))
    await uow.session.flush()
    return site_id


async def create_provider_account(db: Database, tenant_id: str) -> str:
    async with UnitOfWork(db) as uow:
        return await add_provider_account(uow, tenant_id)


async def add_provider_account(uow: UnitOfWork, tenant_id: str) -> str:
    await _require_tenant(uow, tenant_id, "tenant")
    account_id = new_id("pacct")
    uow.session.add(ProviderAccount(id=account_id, tenant_id=tenant_id))
    await uow.session.flush()
    return account_id


async def add_node(
    db: Database, pool_id: str, gpus: int, owner_tenant_id: str | None = None
) -> str:
    """A node joins a pool; the rollup follows. A tenant-owned node pins the pool to its owner."""
    if gpus < 1 or gpus > 1024:
        raise InvalidInput("gpus must be 1 to 1024", field="gpus")
    async with UnitOfWork(db) as uow:
        pool = (
            # As owner writes lock it (access.lock_owned_pool): no wait on bookings' FK locks.
            await uow.session.execute(
                select(Pool).where(Pool.id == pool_id).with_for_update(key_share=True)
            )
        ).scalar_one_or_none()
        if pool is None:
            raise NotFound(f"pool {pool_id} not found", field="pool")
        if pool.archived:
            raise InvalidState(f"pool {pool_id} is archived", field="pool")
        if owner_tenant_id is not None:
            await _require_tenant(uow, owner_tenant_id, "ownerTenant")
        node_id = new_id("node")
        uow.session.add(
            Node(id=node_id, pool_id=pool_id, gpus=gpus, owner_tenant_id=owner_tenant_id)
        )
        await uow.session.flush()
        from app.capacity.rollup import refresh_rollup  # the policy modules: node add only

        await refresh_rollup(uow.session, pool)
    return node_id
