"""Issuing callers and tokens: a caller's one role binding is checked here, and a token
is random, shown once, stored only as a hash.

The rows are written through `InventoryRows` (app/db/inventory_rows.py), so the same
rules hold in a unit of work and in the embedded file `bettercompute caller create`
writes without SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.errors import InvalidInput, NotFound
from app.iam.roles import BINDING_ATTRIBUTES, FLEET_ADMIN, FLEET_TENANT, ROLE_PERMISSIONS
from app.ids import new_id, new_token, token_hash

if TYPE_CHECKING:
    from app.db.inventory_rows import InventoryRows


def check_binding(tenant_id: str, role: str, conditions: dict[str, str] | None) -> None:
    if role not in ROLE_PERMISSIONS:
        raise InvalidInput(f"unknown role {role}; one of {sorted(ROLE_PERMISSIONS)}", field="role")
    if role == FLEET_ADMIN and tenant_id != FLEET_TENANT:
        raise InvalidInput(f"{FLEET_ADMIN} is only held in tenant {FLEET_TENANT}", field="role")
    for key in conditions or {}:
        if key not in BINDING_ATTRIBUTES:
            raise InvalidInput(
                f"cannot narrow by {key}; one of {BINDING_ATTRIBUTES}", field="where"
            )


async def add_caller(
    rows: InventoryRows, tenant_id: str, role: str, conditions: dict[str, str] | None = None
) -> tuple[str, str]:
    """A caller of `tenant_id` holding `role`, and its first token: (caller id, token)."""
    check_binding(tenant_id, role, conditions)
    if not await rows.has_tenant(tenant_id):
        raise NotFound(f"tenant {tenant_id} not found", field="tenant")
    caller_id = new_id("caller")
    await rows.add_caller(caller_id, tenant_id, role, dict(conditions or {}))
    return caller_id, await _add_token(rows, caller_id)


async def add_token(rows: InventoryRows, caller_id: str) -> str:
    """Another token for an existing caller."""
    if not await rows.has_caller(caller_id):
        raise NotFound(f"caller {caller_id} not found", field="caller")
    return await _add_token(rows, caller_id)


async def _add_token(rows: InventoryRows, caller_id: str) -> str:
    token = new_token()
    await rows.add_token(token_hash(token), caller_id)
    return token
