"""Mutation root: one field per write of the seed, plus reservations. Each resolver
authenticates, converts its input to the seed's JSON shape, lets the domain validate it
(parse_input: the same codes and fields as REST) and calls one `Capacity` method, which
opens exactly one unit of work."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

import strawberry

from app.capacity.inputs import CreateReservationInput as DomainCreateReservationInput
from app.capacity.inputs import GetPoolInput, parse_input
from app.capacity.inputs import ReleaseReservationInput as DomainReleaseReservationInput
from app.capacity.views import ImpactView, PoolDetail, ReservationView
from app.catalog import method
from schema.context import Context
from schema.lookahead import selected_below
from schema.pool_nodes import offered_pool_from_detail, pool_from_detail, pool_parts
from schema.types.inputs import (
    ArchivePoolInput,
    CreatePoolInput,
    CreateReservationInput,
    LabelPoolInput,
    OfferPoolInput,
    ReleaseReservationInput,
    UnofferPoolInput,
    UpdatePoolInput,
)
from schema.types.payloads import (
    ArchivePoolPayload,
    Impact,
    OfferPoolPayload,
    PoolPayload,
    ReservationPayload,
    UnofferPoolPayload,
)
from schema.types.reservation import Reservation

Info = strawberry.Info[Context, None]

# Each mutation's `input` argument, described (GraphiQL and the SDL show it).
CreatePoolArgument = Annotated[
    CreatePoolInput,
    strawberry.argument(
        description=(
            "The seed's `create` input (CONTRACT section 5): the tenant, site, class, GPU "
            "model, policy and the owner's quota rows."
        )
    ),
]
OfferPoolArgument = Annotated[
    OfferPoolInput,
    strawberry.argument(
        description=(
            "The seed's `offer` input: the pool, the tenant it goes to and that tenant's "
            "quota rows."
        )
    ),
]
UnofferPoolArgument = Annotated[
    UnofferPoolInput,
    strawberry.argument(
        description=(
            "The seed's `unoffer` input: the pool and the tenant whose offer is withdrawn."
        )
    ),
]
UpdatePoolArgument = Annotated[
    UpdatePoolInput,
    strawberry.argument(
        description="The seed's `update` input: the pool, and a new policy, GPU model or both."
    ),
]
LabelPoolArgument = Annotated[
    LabelPoolInput,
    strawberry.argument(description="The pool, and its new display name, labels or both."),
]
ArchivePoolArgument = Annotated[
    ArchivePoolInput,
    strawberry.argument(description="The seed's `archive` input: the pool to archive."),
]
CreateReservationArgument = Annotated[
    CreateReservationInput,
    strawberry.argument(description="The pool and the resources to book for the acting tenant."),
]
ReleaseReservationArgument = Annotated[
    ReleaseReservationInput,
    strawberry.argument(description="The reservation to end."),
]


class SeedInput(Protocol):
    def to_seed(self) -> dict[str, Any]: ...


async def _call(info: Info, group: str, name: str, graphql_input: SeedInput) -> Any:
    """The catalog row's call: validated as on REST, one unit of work in the domain."""
    ctx = info.context
    row = method(group, name)
    principal = await ctx.principal()
    inp = parse_input(row.input, graphql_input.to_seed())
    return await ctx.write(lambda: row.call(ctx.capacity, principal, inp))


def _reservation(view: ReservationView) -> ReservationPayload:
    return ReservationPayload(reservation=Reservation.from_view(view))


async def _with_parts(info: Info, detail: PoolDetail) -> PoolDetail:
    """The pool a write returned, with the parts the payload selects read after it."""
    ctx = info.context
    parts = pool_parts(selected_below(info, ("pool",)))
    return await ctx.capacity.pool_parts(await ctx.principal(), detail, parts, reads=ctx.reads)


async def _pool_payload(info: Info, tenant_id: str, detail: PoolDetail) -> PoolPayload:
    return PoolPayload(pool=pool_from_detail(await _with_parts(info, detail), tenant_id))


@strawberry.type(description="Writes of the pools method group, and reservations.")
class Mutation:
    @strawberry.mutation(
        description="The seed's `create`: a pool on a site the tenant owns, with the owner's "
        "quota rows and an empty rollup, at version 1. Emits pool.created."
    )
    async def create_pool(self, info: Info, input: CreatePoolArgument) -> PoolPayload:
        detail = await _call(info, "pools", "create", input)
        return await _pool_payload(info, input.tenant_id, detail)

    @strawberry.mutation(
        description="The seed's `offer`: offers a pool the tenant owns to another tenant with "
        "a quota, or updates the offer; returns the pool as that tenant sees it, as an "
        "OfferedPool (its own cache identity: docs/graphql.md). Emits pool.offered."
    )
    async def offer_pool(self, info: Info, input: OfferPoolArgument) -> OfferPoolPayload:
        detail = await _with_parts(info, await _call(info, "pools", "offer", input))
        pool = offered_pool_from_detail(detail, input.tenant_id, input.to_tenant_id)
        return OfferPoolPayload(pool=pool)

    @strawberry.mutation(
        description="The seed's `unoffer`: withdraws a pool's offer from a tenant, whose rows "
        "drop to what is in use. Emits pool.unoffered only when an offer was removed."
    )
    async def unoffer_pool(self, info: Info, input: UnofferPoolArgument) -> UnofferPoolPayload:
        result = await _call(info, "pools", "unoffer", input)
        if isinstance(result, ImpactView):
            return UnofferPoolPayload(removed=False, impact=Impact.from_view(result))
        return UnofferPoolPayload(removed=result)

    @strawberry.mutation(
        description="The seed's `update`: replaces the policy, the GPU model or both, and "
        "returns the pool with its version incremented. Emits pool.updated."
    )
    async def update_pool(self, info: Info, input: UpdatePoolArgument) -> PoolPayload:
        detail = await _call(info, "pools", "update", input)
        return await _pool_payload(info, input.tenant_id, detail)

    @strawberry.mutation(
        description="Names and labels (CONTRACT section 10, GCE's setLabels): sets the "
        "display name, the labels (the whole map) or both of a pool the tenant owns. A "
        "change increments the version and emits pool.updated with its changes."
    )
    async def label_pool(self, info: Info, input: LabelPoolArgument) -> PoolPayload:
        detail = await _call(info, "pools", "label", input)
        return await _pool_payload(info, input.tenant_id, detail)

    @strawberry.mutation(
        description="The seed's `archive`: removes every offer and stops new work; live "
        "reservations keep their bookings. Emits pool.archived. With dryRun: the impact, "
        "nothing written."
    )
    async def archive_pool(self, info: Info, input: ArchivePoolArgument) -> ArchivePoolPayload:
        result = await _call(info, "pools", "archive", input)
        impact = None
        if isinstance(result, ImpactView):
            # A dry run wrote nothing: the pool as it is, read as `pool` reads it.
            impact = Impact.from_view(result)
            principal = await info.context.principal()
            inp = parse_input(GetPoolInput, {"tenantId": input.tenant_id, "poolId": input.pool_id})
            result = await info.context.capacity.get_pool(principal, inp)
        payload = await _pool_payload(info, input.tenant_id, result)
        return ArchivePoolPayload(pool=payload.pool, impact=impact)

    @strawberry.mutation(
        description="Books resources in a visible pool against the tenant's quota and the "
        "pool's available capacity (RESOURCE_EXHAUSTED when either would be exceeded)."
    )
    async def create_reservation(
        self, info: Info, input: CreateReservationArgument
    ) -> ReservationPayload:
        ctx = info.context
        if not (ctx.settings.compiled_reads and ctx.capacity.compiles_writes):
            return _reservation(await _call(info, "reservations", "create", input))
        principal = await ctx.principal()
        inp = parse_input(DomainCreateReservationInput, input.to_seed())

        async def booking() -> ReservationView:
            # One statement (app/capacity/booking.py), else the plain path's answer.
            booked = await ctx.capacity.book(principal, inp, None)
            return booked or await ctx.capacity.create_reservation(principal, inp)

        return _reservation(await ctx.write(booking))

    @strawberry.mutation(
        description="Ends a reservation and returns its bookings; releasing twice is a no-op."
    )
    async def release_reservation(
        self, info: Info, input: ReleaseReservationArgument
    ) -> ReservationPayload:
        ctx = info.context
        if not (ctx.settings.compiled_reads and ctx.capacity.compiles_writes):
            return _reservation(await _call(info, "reservations", "release", input))
        principal = await ctx.principal()
        inp = parse_input(DomainReleaseReservationInput, input.to_seed())

        async def release() -> ReservationView:
            released = await ctx.capacity.release(principal, inp, None)
            return released or await ctx.capacity.release_reservation(principal, inp)

        return _reservation(await ctx.write(release))
