"""Mutation root: one field per write of the seed, plus reservations. Each resolver
authenticates, converts its input to the seed's JSON shape, lets the domain validate it
(parse_input: the same codes and fields as REST) and calls one `Capacity` method, which
opens exactly one unit of work."""

from __future__ import annotations

import strawberry

from app.capacity import inputs
from app.capacity.views import PoolDetail
from schema.context import Context
from schema.lookahead import selected_below
from schema.pool_nodes import pool_from_detail
from schema.types.inputs import (
    ArchivePoolInput,
    CreatePoolInput,
    CreateReservationInput,
    OfferPoolInput,
    ReleaseReservationInput,
    UnofferPoolInput,
    UpdatePoolInput,
)
from schema.types.payloads import PoolPayload, ReservationPayload, UnofferPoolPayload
from schema.types.reservation import Reservation

Info = strawberry.Info[Context, None]


async def _pool_payload(info: Info, tenant_id: str, detail: PoolDetail) -> PoolPayload:
    ctx = info.context
    pool = await pool_from_detail(
        ctx, await ctx.principal(), tenant_id, detail, selected_below(info, ("pool",))
    )
    return PoolPayload(pool=pool)


@strawberry.type(description="Writes of the pools method group, and reservations.")
class Mutation:
    @strawberry.mutation(
        description="The seed's `create`: a pool on a site the tenant owns, with the owner's "
        "quota rows and an empty rollup, at version 1. Emits pool.created."
    )
    async def create_pool(self, info: Info, input: CreatePoolInput) -> PoolPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.CreatePoolInput, input.to_seed())
        detail = await ctx.write(lambda: ctx.capacity.create_pool(principal, inp))
        return await _pool_payload(info, inp.tenant_id, detail)

    @strawberry.mutation(
        description="The seed's `offer`: offers a pool the tenant owns to another tenant with "
        "a quota, or updates the offer; returns the pool as that tenant sees it. "
        "Emits pool.offered."
    )
    async def offer_pool(self, info: Info, input: OfferPoolInput) -> PoolPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.OfferPoolInput, input.to_seed())
        detail = await ctx.write(lambda: ctx.capacity.offer_pool(principal, inp))
        return await _pool_payload(info, inp.tenant_id, detail)

    @strawberry.mutation(
        description="The seed's `unoffer`: withdraws a pool's offer from a tenant, whose rows "
        "drop to what is in use. Emits pool.unoffered only when an offer was removed."
    )
    async def unoffer_pool(self, info: Info, input: UnofferPoolInput) -> UnofferPoolPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.UnofferPoolInput, input.to_seed())
        removed = await ctx.write(lambda: ctx.capacity.unoffer_pool(principal, inp))
        return UnofferPoolPayload(removed=removed)

    @strawberry.mutation(
        description="The seed's `update`: replaces the policy, the GPU model or both, and "
        "returns the pool with its version incremented. Emits pool.updated."
    )
    async def update_pool(self, info: Info, input: UpdatePoolInput) -> PoolPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.UpdatePoolInput, input.to_seed())
        detail = await ctx.write(lambda: ctx.capacity.update_pool(principal, inp))
        return await _pool_payload(info, inp.tenant_id, detail)

    @strawberry.mutation(
        description="The seed's `archive`: removes every offer and stops new work; live "
        "reservations keep their bookings. Emits pool.archived."
    )
    async def archive_pool(self, info: Info, input: ArchivePoolInput) -> PoolPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.ArchivePoolInput, input.to_seed())
        detail = await ctx.write(lambda: ctx.capacity.archive_pool(principal, inp))
        return await _pool_payload(info, inp.tenant_id, detail)

    @strawberry.mutation(
        description="Books resources in a visible pool against the tenant's quota and the "
        "pool's available capacity (RESOURCE_EXHAUSTED when either would be exceeded)."
    )
    async def create_reservation(
        self, info: Info, input: CreateReservationInput
    ) -> ReservationPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.CreateReservationInput, input.to_seed())
        view = await ctx.write(lambda: ctx.capacity.create_reservation(principal, inp))
        return ReservationPayload(reservation=Reservation.from_view(view))

    @strawberry.mutation(
        description="Ends a reservation and returns its bookings; releasing twice is a no-op."
    )
    async def release_reservation(
        self, info: Info, input: ReleaseReservationInput
    ) -> ReservationPayload:
        ctx = info.context
        principal = await ctx.principal()
        inp = inputs.parse_input(inputs.ReleaseReservationInput, input.to_seed())
        view = await ctx.write(lambda: ctx.capacity.release_reservation(principal, inp))
        return ReservationPayload(reservation=Reservation.from_view(view))
