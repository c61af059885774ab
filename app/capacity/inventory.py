"""Operator inventory: tenants, sites and provider accounts (nodes: app/capacity/nodes.py).

Tenants, sites and provider accounts are checked and added through `InventoryRows`
(app/db/inventory_rows.py): in a unit of work for REST, GraphQL and fleet files, or in
the embedded SQLite file for `bettercompute ... create` at the shell. So this module
imports no SQLAlchemy until a function opens a unit of work.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from app.errors import Conflict, InvalidInput, NotFound
from app.iam.roles import FLEET_TENANT
from app.ids import new_id

if TYPE_CHECKING:
    from app.db.engine import Database
    from app.db.inventory_rows import InventoryRows

SITE_KINDS = ("platform", "custom")
T = TypeVar("T")


# inputs.TenantId's pattern (a test keeps them equal), matched without loading pydantic's
# input models: `tenant create` is a shell command that should answer at once.
TENANT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _check_tenant_id(tenant_id: str, field: str) -> None:
    if TENANT_ID.fullmatch(tenant_id) is None:
        raise InvalidInput(f"invalid tenant id {tenant_id!r}", field=field)


async def require_tenant(rows: InventoryRows, tenant_id: str, field: str) -> None:
    if not await rows.has_tenant(tenant_id):
        raise NotFound(f"tenant {tenant_id} not found", field=field)


async def _in_unit_of_work(db: Database, write: Callable[[InventoryRows], Awaitable[T]]) -> T:
    """`write` on the rows of a unit of work of its own."""
    from app.db.uow import UnitOfWork

    async with UnitOfWork(db) as uow:
        return await write(uow.rows)


async def create_tenant(db: Database, tenant_id: str, parent_id: str | None = None) -> str:
    return await _in_unit_of_work(db, lambda rows: add_tenant(rows, tenant_id, parent_id))


async def add_tenant(rows: InventoryRows, tenant_id: str, parent_id: str | None = None) -> str:
    _check_tenant_id(tenant_id, "tenantId")
    if tenant_id == FLEET_TENANT:  # made by the schema (migration 0002), a root for good
        raise Conflict(
            f"tenant {FLEET_TENANT} is built in: it exists on every database, with no parent",
            field="tenantId",
        )
    if parent_id is not None:
        await require_tenant(rows, parent_id, "parent")
    if await rows.has_tenant(tenant_id):
        raise Conflict(f"tenant {tenant_id} already exists", field="tenantId")
    await rows.add_tenant(tenant_id, parent_id)
    return tenant_id


async def create_site(db: Database, tenant_id: str, kind: str, region: str) -> str:
    return await _in_unit_of_work(db, lambda rows: add_site(rows, tenant_id, kind, region))


async def add_site(rows: InventoryRows, tenant_id: str, kind: str, region: str) -> str:
    if kind not in SITE_KINDS:
        raise InvalidInput(f"site kind must be one of {SITE_KINDS}", field="kind")
    if not region or len(region) > 64:
        raise InvalidInput("region must be 1 to 64 characters", field="region")
    await require_tenant(rows, tenant_id, "tenant")
    site_id = new_id("site")
    await rows.add_site(site_id, tenant_id, kind, region)
    return site_id


async def create_provider_account(db: Database, tenant_id: str) -> str:
    return await _in_unit_of_work(db, lambda rows: add_provider_account(rows, tenant_id))


async def add_provider_account(rows: InventoryRows, tenant_id: str) -> str:
    await require_tenant(rows, tenant_id, "tenant")
    account_id = new_id("pacct")
    await rows.add_provider_account(account_id, tenant_id)
    return account_id
