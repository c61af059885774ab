"""How many subscriptions each caller and each tenant holds open, in this process.

A subscription costs memory and a share of every event's fan-out, so one caller must
not open thousands (issue 19): `take` refuses one past `per_caller` open subscriptions
of the caller or `per_tenant` of its tenant (0: no bound). Counted per process: each
serve process holds its own counts, so over P processes a caller may hold up to P times
the bound (a load balancer that spreads one caller's sockets over them multiplies it).
That keeps the check free of any shared store; the counts are two dictionaries whose
entries go with a caller's (or tenant's) last subscription.
"""

from __future__ import annotations

from typing import Final, Literal

Bound = Literal["caller", "tenant"]
CALLER: Final = "caller"
TENANT: Final = "tenant"


class SubscriptionBounds:
    def __init__(self, per_caller: int, per_tenant: int) -> None:
        self.per_caller = per_caller
        self.per_tenant = per_tenant
        self._callers: dict[str, int] = {}
        self._tenants: dict[str, int] = {}

    def take(self, caller_id: str, tenant_id: str) -> Bound | None:
        """Count one more subscription, or the bound it would exceed (nothing counted)."""
        if self.per_caller and self._callers.get(caller_id, 0) >= self.per_caller:
            return "caller"
        if self.per_tenant and self._tenants.get(tenant_id, 0) >= self.per_tenant:
            return "tenant"
        self._callers[caller_id] = self._callers.get(caller_id, 0) + 1
        self._tenants[tenant_id] = self._tenants.get(tenant_id, 0) + 1
        return None

    def give_back(self, caller_id: str, tenant_id: str) -> None:
        _decrement(self._callers, caller_id)
        _decrement(self._tenants, tenant_id)

    def held(self, caller_id: str) -> int:
        return self._callers.get(caller_id, 0)


def _decrement(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
