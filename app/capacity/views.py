"""Read models: plain frozen records built from Core rows (no ORM objects on reads)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.iam.decisions import PoolAttributes


@dataclass(frozen=True, slots=True)
class QuotaView:
    resource: str
    max: int
    used: int
    pool_id: str


@dataclass(frozen=True, slots=True)
class CapacityView:
    resource: str
    total: int
    allocatable: int
    booked: int

    @property
    def available(self) -> int:
        return self.allocatable - self.booked


@dataclass(frozen=True, slots=True)
class OfferView:
    tenant_id: str
    include_descendants: bool
    priority: int
    quotas: tuple[QuotaView, ...]


@dataclass(frozen=True, slots=True)
class Grant:
    """Why a tenant sees a pool: its own authz row or an ancestor's that includes descendants."""

    tenant_id: str  # the tenant whose row grants it, and whose quota rows bookings use
    attributes: PoolAttributes


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool as one tenant sees it; nested data comes from the batch loaders."""

    id: str
    tenant_id: str
    site_id: str
    pool_class: str
    gpu_model: str | None
    sharing: str
    agent: str
    policy: dict[str, Any]  # readable: secrets shown as `<name>Set: true` (policy.readable_policy)
    provider_account_id: str | None
    region: str
    owned: bool
    archived: bool
    version: int
    created_at: datetime
    updated_at: datetime
    grant: Grant


@dataclass(frozen=True, slots=True)
class PoolDetail:
    """A pool with the acting tenant's quota rows and, for the owner with share, the offers."""

    pool: PoolView
    quotas: tuple[QuotaView, ...]
    offers: tuple[OfferView, ...] | None


@dataclass(frozen=True, slots=True)
class ReservationView:
    id: str
    pool_id: str
    tenant_id: str
    resources: dict[str, int]
    state: str
    created_at: datetime
    ended_at: datetime | None
