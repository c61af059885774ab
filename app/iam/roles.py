"""Roles and the permissions they grant (CONTRACT section 2)."""

from __future__ import annotations

from typing import Final

FLEET_TENANT: Final = "fleet"
FLEET_ADMIN: Final = "fleet-admin"

POOLS_READ: Final = "compute:pools:read"
CAPACITY_READ: Final = "compute:capacity:read"
POOLS_CREATE: Final = "compute:pools:create"
POOLS_MANAGE: Final = "compute:pools:manage"
POOLS_SHARE: Final = "compute:pools:share"
# Reservations extend the seed: booking is an operator's act, seeing one a viewer's.
RESERVATIONS_READ: Final = "compute:reservations:read"
RESERVATIONS_WRITE: Final = "compute:reservations:write"

_VIEWER = frozenset({POOLS_READ, CAPACITY_READ, RESERVATIONS_READ})
_OPERATOR = _VIEWER | {POOLS_CREATE, POOLS_MANAGE, RESERVATIONS_WRITE}
_ADMIN = _OPERATOR | {POOLS_SHARE}

ROLE_PERMISSIONS: Final[dict[str, frozenset[str]]] = {
    "viewer": _VIEWER,
    "operator": _OPERATOR,
    "admin": _ADMIN,
    FLEET_ADMIN: _ADMIN,
}

# Pool attributes a role binding may be narrowed by; each authz row carries them.
BINDING_ATTRIBUTES: Final = ("gpuModel", "class", "sharing", "region", "owned")
