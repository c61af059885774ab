"""Mutation payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import strawberry
from strawberry.scalars import JSON

from app.capacity.views import ImpactView, ReservationView
from schema.types.pool import OfferedPool, Pool
from schema.types.reservation import Reservation


@strawberry.type(description="What an unoffer or archive would change (a dry run).")
class Impact:
    tenants_losing_access: list[str] = strawberry.field(
        description="Tenants that would no longer see the pool: the tenant(s) whose offer "
        "ends, and each descendant that sees the pool only through such an offer."
    )
    quota_kept: JSON = strawberry.field(
        description="Per tenant whose offer ends, {resource: used}: the amounts its rows "
        "keep as their floor (max drops to used)."
    )
    reservations: list[Reservation] = strawberry.field(
        description="Active reservations affected: those of tenants losing access (unoffer), "
        "or every active one in the pool (archive). They stay live until released."
    )
    offers_ended: list[str] = strawberry.field(description="The tenants whose offers end.")
    truncated: bool = strawberry.field(
        description="More than 100 tenants or reservations were affected: "
        "tenantsLosingAccess and reservations list the first 100."
    )

    @classmethod
    def from_view(cls, view: ImpactView) -> Impact:
        reservations: Sequence[ReservationView] = view.reservations
        return cls(
            tenants_losing_access=list(view.tenants_losing_access),
            quota_kept=cast(JSON, view.quota_kept),
            reservations=[Reservation.from_view(r) for r in reservations],
            offers_ended=list(view.offers_ended),
            truncated=view.truncated,
        )


@strawberry.type(description="The pool a mutation returns, as the seed says it is seen.")
class PoolPayload:
    pool: Pool = strawberry.field(description="The pool after the change.")


@strawberry.type(description="What `offerPool` returns.")
class OfferPoolPayload:
    pool: OfferedPool = strawberry.field(
        description="The pool after the change as the offered tenant sees it (the seed's "
        "rule), as an OfferedPool: its own cache identity, `poolId` the REST id."
    )


@strawberry.type(description="What `unofferPool` did.")
class UnofferPoolPayload:
    removed: bool = strawberry.field(
        description="Whether an offer was removed; false when there was none (a no-op) "
        "and on a dry run."
    )
    impact: Impact | None = strawberry.field(
        default=None, description="With dryRun: what the call would change; null otherwise."
    )


@strawberry.type(description="What `archivePool` did, or with dryRun would do.")
class ArchivePoolPayload:
    pool: Pool = strawberry.field(
        description="The pool after the change (on a dry run, as it is: unchanged)."
    )
    impact: Impact | None = strawberry.field(
        default=None, description="With dryRun: what the call would change; null otherwise."
    )


@strawberry.type(description="The reservation after the change.")
class ReservationPayload:
    reservation: Reservation = strawberry.field(description="The reservation.")
