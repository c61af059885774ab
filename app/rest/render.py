"""Domain read models to the REST JSON shapes of CONTRACT section 4."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.capacity.paging import Page
from app.capacity.shapes import Nested, PoolShape, Read, Rows
from app.capacity.views import (
    AccessExplanation,
    CapacityView,
    GrantView,
    ImpactView,
    LendingRowView,
    OfferView,
    PoolDetail,
    QuotaView,
    ReservationView,
)


def timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def quota_json(q: QuotaView) -> dict[str, Any]:
    """An offer's row in the owner's `offers`: no grant, the offer beside it says it."""
    return {"resource": q.resource, "max": q.max, "used": q.used}


def own_quota_json(q: QuotaView) -> dict[str, Any]:
    """A row the viewing tenant books against, with the offer that gives it."""
    return quota_json(q) | {"grant": None if q.grant is None else grant_json(q.grant)}


def capacity_json(c: CapacityView) -> dict[str, Any]:
    row: dict[str, Any] = {
        "resource": c.resource,
        "total": c.total,
        "allocatable": c.allocatable,
        "booked": c.booked,
        "available": c.available,
    }
    if c.offered is not None:  # the lender's view: the owner with share only
        row |= {"offered": c.offered, "guestUsed": c.guest_used, "overcommit": c.overcommit}
    return row


def lending_json(r: LendingRowView) -> dict[str, Any]:
    return {"poolId": r.pool_id, **capacity_json(r.capacity)}


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
        "quotas": [own_quota_json(q) for q in detail.quotas],
        # Withheld (no compute:pools:share) or not the owner's: null, as CONTRACT 4 shows it.
        "offers": [offer_json(o) for o in detail.offers]
        if isinstance(detail.offers, tuple)
        else None,
        "createdAt": timestamp(p.created_at),
        "updatedAt": timestamp(p.updated_at),
    }


def _reads(*pairs: str) -> tuple[Read, ...]:
    """(key, value) pairs as reads: `_reads("tenantId", "tenant_id", ...)`."""
    return tuple(Read(k, v) for k, v in zip(pairs[::2], pairs[1::2], strict=True))  # type: ignore[arg-type]


# `get`'s answer, {"pool": pool_json(...)}, as a shape: the compiled read builds it in
# one statement (app/capacity/json_reads.py). tests/rest/test_compiled_get.py holds the
# two to the same bytes.
GET_SHAPE = PoolShape(
    "pool",
    (
        *_reads("id", "id", "tenantId", "tenant_id", "siteId", "site_id", "class", "class"),
        *_reads("gpuModel", "gpu_model", "sharing", "sharing", "agent", "agent"),
        *_reads("policy", "policy", "providerAccountId", "provider_account_id"),
        *_reads("region", "region", "owned", "owned", "archived", "archived"),
        *_reads("version", "version"),
        Rows(
            "quotas",
            "quotas",
            (
                *_reads("resource", "resource", "max", "max", "used", "used"),
                Nested(
                    "grant",
                    "grant",
                    _reads(
                        "tenantId",
                        "tenant_id",
                        "includeDescendants",
                        "include_descendants",
                        "priority",
                        "priority",
                        "offeredAt",
                        "offered_at",
                    ),
                ),
            ),
        ),
        Rows(
            "offers",
            "offers",
            (
                *_reads(
                    "tenantId",
                    "tenant_id",
                    "includeDescendants",
                    "include_descendants",
                    "priority",
                    "priority",
                ),
                Rows(
                    "quotas",
                    "offer_quotas",
                    _reads("resource", "resource", "max", "max", "used", "used"),
                ),
            ),
            if_denied="null",
        ),
        *_reads("createdAt", "created_at", "updatedAt", "updated_at"),
    ),
)


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


def grant_json(g: GrantView) -> dict[str, Any]:
    return {
        "tenantId": g.tenant_id,
        "includeDescendants": g.include_descendants,
        "priority": g.priority,
        "offeredAt": timestamp(g.offered_at),
    }


def access_json(a: AccessExplanation) -> dict[str, Any]:
    b, d = a.binding, a.denied_by
    return {
        "allowed": a.allowed,
        "permission": a.permission,
        "binding": {
            "callerId": b.caller_id,
            "tenantId": b.tenant_id,
            "role": b.role,
            "where": b.where,
            "actingFor": b.acting_for,
            "fleetAdmin": b.fleet_admin,
        },
        "grant": None if a.grant is None else {"via": a.grant.via, **grant_json(a.grant)},
        "deniedBy": None
        if d is None
        else {"check": d.check, "message": d.message, **({"key": d.key} if d.key else {})},
    }


def impact_json(i: ImpactView) -> dict[str, Any]:
    return {
        "tenantsLosingAccess": list(i.tenants_losing_access),
        "quotaKept": i.quota_kept,
        "reservations": [reservation_json(r) for r in i.reservations],
        "offersEnded": list(i.offers_ended),
        "truncated": i.truncated,
    }


def render(result: object) -> Any:
    """Any method's result, by its type."""
    if isinstance(result, PoolDetail):
        return pool_json(result)
    if isinstance(result, Page):  # `list`: every pool, one page
        return [render(item) for item in result.items]
    if isinstance(result, CapacityView):
        return capacity_json(result)
    if isinstance(result, ReservationView):
        return reservation_json(result)
    if isinstance(result, LendingRowView):
        return lending_json(result)
    if isinstance(result, ImpactView):
        return impact_json(result)
    if isinstance(result, AccessExplanation):
        return access_json(result)
    if isinstance(result, bool):
        return result
    if isinstance(result, Sequence):
        return [render(item) for item in result]
    raise TypeError(f"cannot render {type(result).__name__}")
