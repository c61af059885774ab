"""Domain read models to the REST JSON shapes of CONTRACT section 4."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.capacity.views import (
    CapacityView,
    OfferView,
    PoolDetail,
    QuotaView,
    ReservationView,
)


def timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def quota_json(q: QuotaView) -> dict[str, Any]:
    return {"resource": q.resource, "max": q.max, "used": q.used}


def capacity_json(c: CapacityView) -> dict[str, Any]:
    return {
        "resource": c.resource,
        "total": c.total,
        "allocatable": c.allocatable,
        "booked": c.booked,
        "available": c.available,
    }


def offer_json(o: OfferView) -> dict[str, Any]:
    return {
        "tenantId": o.tenant_id,
        "includeDescendants": o.include_descendants,
        "priority": o.priority,
        "quotas": [quota_json(q) for q in o.quotas],
    }


def pool_json(detail: PoolDetail) -> dict[str, Any]:
    p = detail.pool
    return {
        "id": p.id,
        "tenantId": p.tenant_id,
        "siteId": p.site_id,
        "class": p.pool_class,
        "gpuModel": p.gpu_model,
        "sharing": p.sharing,
        "agent": p.agent,
        "policy": p.policy,
        "providerAccountId": p.provider_account_id,
        "region": p.region,
        "owned": p.owned,
        "archived": p.archived,
        "version": p.version,
        "quotas": [quota_json(q) for q in detail.quotas],
        "offers": None if detail.offers is None else [offer_json(o) for o in detail.offers],
        "createdAt": timestamp(p.created_at),
        "updatedAt": timestamp(p.updated_at),
    }


def reservation_json(r: ReservationView) -> dict[str, Any]:
    return {
        "id": r.id,
        "poolId": r.pool_id,
        "tenantId": r.tenant_id,
        "resources": r.resources,
        "state": r.state,
        "createdAt": timestamp(r.created_at),
        "endedAt": timestamp(r.ended_at),
    }


def render(result: object) -> Any:
    """Any method's result, by its type."""
    if isinstance(result, PoolDetail):
        return pool_json(result)
    if isinstance(result, CapacityView):
        return capacity_json(result)
    if isinstance(result, ReservationView):
        return reservation_json(result)
    if isinstance(result, bool):
        return result
    if isinstance(result, Sequence):
        return [render(item) for item in result]
    raise TypeError(f"cannot render {type(result).__name__}")
