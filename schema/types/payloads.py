"""Mutation payloads."""

from __future__ import annotations

import strawberry

from schema.types.pool import Pool
from schema.types.reservation import Reservation


@strawberry.type(description="The pool a mutation returns, as the seed says it is seen.")
class PoolPayload:
    pool: Pool = strawberry.field(description="The pool after the change.")


@strawberry.type(description="What `unofferPool` did.")
class UnofferPoolPayload:
    removed: bool = strawberry.field(
        description="Whether an offer was removed; false when there was none (a no-op)."
    )


@strawberry.type(description="The reservation after the change.")
class ReservationPayload:
    reservation: Reservation = strawberry.field(description="The reservation.")
