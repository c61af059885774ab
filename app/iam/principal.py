"""Who is calling: an authenticated caller with its one role binding."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.iam.roles import FLEET_ADMIN, FLEET_TENANT, ROLE_PERMISSIONS


@dataclass(frozen=True, slots=True)
class Principal:
    caller_id: str
    tenant_id: str
    role: str
    conditions: dict[str, str] = field(default_factory=dict)

    @property
    def is_fleet_admin(self) -> bool:
        return self.tenant_id == FLEET_TENANT and self.role == FLEET_ADMIN

    def has(self, permission: str) -> bool:
        return permission in ROLE_PERMISSIONS.get(self.role, frozenset())
