"""IAM decisions: the coarse one on the tenant, then one per pool over its authz row.

Pure functions over already-loaded data, so a list checks every item without a query each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.errors import PermissionDenied
from app.iam.principal import Principal


@dataclass(frozen=True, slots=True)
class PoolAttributes:
    """What an authz row says of a pool, as seen by one tenant."""

    gpu_model: str | None
    pool_class: str
    sharing: str
    region: str
    owned: bool

    def as_binding_values(self) -> Mapping[str, str]:
        return {
            "gpuModel": self.gpu_model or "",
            "class": self.pool_class,
            "sharing": self.sharing,
            "region": self.region,
            "owned": "true" if self.owned else "false",
        }


def decide_acting_for(principal: Principal, tenant_id: str) -> None:
    """May this caller act for the tenant: its own, or any tenant for a fleet-admin."""
    if principal.tenant_id != tenant_id and not principal.is_fleet_admin:
        raise PermissionDenied(f"caller may not act for tenant {tenant_id}", field="tenantId")


def may_act(principal: Principal, tenant_id: str, permission: str) -> bool:
    """decide_tenant's rule as a test, for a decision made again per event."""
    return (principal.tenant_id == tenant_id or principal.is_fleet_admin) and principal.has(
        permission
    )


def decide_tenant(principal: Principal, tenant_id: str, permission: str) -> None:
    """The coarse decision of a method decided on the tenant (compute-tenant): may this
    caller act for the tenant, with a role that has the permission at all."""
    decide_acting_for(principal, tenant_id)
    if not principal.has(permission):
        raise PermissionDenied(f"role {principal.role} lacks {permission}")


def binding_matches(principal: Principal, attributes: PoolAttributes) -> bool:
    values = attributes.as_binding_values()
    return all(values.get(key) == want for key, want in principal.conditions.items())


def allows_pool(principal: Principal, permission: str, attributes: PoolAttributes) -> bool:
    return principal.has(permission) and binding_matches(principal, attributes)


def pool_denial(
    principal: Principal, permission: str, attributes: PoolAttributes
) -> PermissionDenied | None:
    """The error that withholds the pool, or None when the permission is granted on it."""
    if allows_pool(principal, permission, attributes):
        return None
    return PermissionDenied(f"{permission} is not granted on this pool")


def decide_pool(principal: Principal, permission: str, attributes: PoolAttributes) -> None:
    denied = pool_denial(principal, permission, attributes)
    if denied is not None:
        raise denied
