"""Read models: plain frozen records built from Core rows (no ORM objects on reads)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from app.errors import PermissionDenied
from app.iam.decisions import PoolAttributes


@dataclass(frozen=True, slots=True)
class QuotaView:
    resource: str
    max: int
    used: int
    pool_id: str
    # The offer that gives the row, on the rows a tenant books against (CONTRACT section
    # 10); None on an offer's rows in the owner's `offers`, where the offer says it.
    grant: GrantView | None = None


@dataclass(frozen=True, slots=True)
class CapacityView:
    resource: str
    total: int
    allocatable: int
    booked: int
    # The lender's view (CONTRACT section 10), for a caller that reads the pool's offers;
    # None for everyone else.
    offered: int | None = None  # the sum of the guests' quota maxima
    guest_used: int | None = None  # what the guests' reservations hold

    @property
    def available(self) -> int:
        return self.allocatable - self.booked

    @property
    def overcommit(self) -> float | None:
        return overcommit(self.offered, self.allocatable)


def overcommit(offered: int | None, allocatable: int) -> float | None:
    """offered / allocatable: above 1, guests were promised more than the pool has. The
    value both reads show; `lending` ranks by the same quotient taken in SQL
    (read_rules.capacity_lent's `overcommit`, as exact as this one)."""
    if offered is None or allocatable <= 0:
        return None
    return offered / allocatable


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
class StoredPool:
    """A pool's stored columns (the model's, tests/capacity/test_fields.py holds them to
    it): the part of `PoolView` read from its row, and the row a write locks, reads and
    changes (access.LockedPool). A column is added here once, for both."""

    id: str
    tenant_id: str
    site_id: str
    pool_class: str
    gpu_model: str | None
    sharing: str
    agent: str
    # Stored, secrets and all, on a write's row; readable on a PoolView (secrets shown as
    # `<name>Set: true`, policy.readable_policy).
    policy: dict[str, Any]
    provider_account_id: str | None
    region: str
    display_name: str | None
    labels: dict[str, str]
    archived: bool
    version: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PoolView(StoredPool):
    """A pool as one tenant sees it; its nested parts are loaded for many pools at once."""

    owned: bool
    grant: Grant


# The parts of a pool a read may ask for, beyond the pool itself.
PoolPart = Literal["quotas", "capacity", "offers", "lending"]
POOL_PARTS: frozenset[PoolPart] = frozenset(get_args(PoolPart))
# What REST shows of a pool, and what every write returns.
DETAIL_PARTS: frozenset[PoolPart] = frozenset({"quotas", "offers"})


@dataclass(frozen=True, slots=True)
class PoolDetail:
    """A pool as one caller acting for one tenant reads it, with the parts the read asked
    for (pool_reads.py): REST and every write ask for quotas and offers, GraphQL for what
    its query selects. A part not asked for is empty (quotas) or None; offers and lending
    are None on a pool the tenant does not own (nothing to show). A part the caller may
    not read holds the PermissionDenied that withholds it: REST shows null, GraphQL null
    with that error."""

    pool: PoolView
    quotas: tuple[QuotaView, ...]
    offers: tuple[OfferView, ...] | PermissionDenied | None
    capacity: tuple[CapacityView, ...] | PermissionDenied | None = None
    # The owner's offers to guests (its own left out): the lender's view of `Pool.lending`.
    lending: tuple[OfferView, ...] | PermissionDenied | None = None


@dataclass(frozen=True, slots=True)
class ReservationView:
    id: str
    pool_id: str
    tenant_id: str
    resources: dict[str, int]
    state: str
    created_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class GrantView:
    """The offer that lets a tenant see a pool (CONTRACT section 10): `via` is `owner`, `offer`
    (the tenant's own) or `ancestorOffer` (an ancestor's with includeDescendants)."""

    via: str | None  # None on quota rows
    tenant_id: str
    include_descendants: bool
    priority: int
    offered_at: datetime | None


@dataclass(frozen=True, slots=True)
class BindingView:
    """The caller's one role binding, and the tenant it acts for."""

    caller_id: str
    tenant_id: str
    role: str
    where: dict[str, str]
    acting_for: str
    fleet_admin: bool  # acting for another tenant as the fleet's admin


@dataclass(frozen=True, slots=True)
class Denial:
    """The first check that fails: `owner`, `role` or `where` (a binding condition)."""

    check: str
    message: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class AccessExplanation:
    allowed: bool
    permission: str
    binding: BindingView
    grant: GrantView | None  # None when the caller may not read the pool
    denied_by: Denial | None


@dataclass(frozen=True, slots=True)
class ImpactView:
    """What an unoffer or archive would change (a dry run)."""

    tenants_losing_access: tuple[str, ...]
    quota_kept: dict[str, dict[str, int]]  # per tenant whose offer ends: {resource: used}
    reservations: tuple[ReservationView, ...]  # active, and affected
    offers_ended: tuple[str, ...]
    # More tenants or reservations than MAX_IMPACT_ITEMS were affected; the lists stop there.
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class LendingRowView:
    """One capacity row of a pool, with the lender's columns, for the owner's ranking."""

    pool_id: str
    capacity: CapacityView

    # Flat, as the GraphQL LendingRow and the REST row show it.
    @property
    def resource(self) -> str:
        return self.capacity.resource

    @property
    def total(self) -> int:
        return self.capacity.total

    @property
    def allocatable(self) -> int:
        return self.capacity.allocatable

    @property
    def booked(self) -> int:
        return self.capacity.booked

    @property
    def available(self) -> int:
        return self.capacity.available

    @property
    def offered(self) -> int:
        return self.capacity.offered or 0

    @property
    def guest_used(self) -> int:
        return self.capacity.guest_used or 0

    @property
    def overcommit(self) -> float | None:
        return self.capacity.overcommit
