"""Reservation: a booking by one tenant in one pool (an extension beyond the seed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import strawberry

from app.capacity.paging import Page, encode_cursor
from app.capacity.views import ReservationView
from schema.scalars import Long
from schema.types.enums import ReservationState
from schema.types.page_info import PageInfo


@strawberry.type(description="An amount of one resource.")
class ResourceAmount:
    resource: str = strawberry.field(description="The resource, e.g. `gpu`.")
    amount: Long = strawberry.field(description="How much of it.")


@strawberry.type(
    description="A booking by one tenant in one pool: it holds its resources against the "
    "tenant's quota rows and the pool's capacity until it is released."
)
class Reservation:
    id: strawberry.ID = strawberry.field(description="`rsv_<ulid>`.")
    pool_id: strawberry.ID = strawberry.field(description="The pool it books in.")
    tenant_id: str = strawberry.field(description="The tenant that booked it.")
    resources: list[ResourceAmount] = strawberry.field(description="What it books.")
    state: ReservationState = strawberry.field(description="ACTIVE until released, then ENDED.")
    created_at: datetime = strawberry.field(description="When it was booked.")
    ended_at: datetime | None = strawberry.field(description="When it was released, if it was.")

    @classmethod
    def from_view(cls, view: ReservationView) -> Reservation:
        return cls(
            id=strawberry.ID(view.id),
            pool_id=strawberry.ID(view.pool_id),
            tenant_id=view.tenant_id,
            resources=[
                ResourceAmount(resource=r, amount=Long(a)) for r, a in view.resources.items()
            ],
            state=ReservationState(view.state),
            created_at=view.created_at,
            ended_at=view.ended_at,
        )


@strawberry.type(description="A reservation and its cursor.")
class ReservationEdge:
    cursor: str = strawberry.field(description="Pass as `after` to page past this item.")
    node: Reservation = strawberry.field(description="The reservation.")


@strawberry.type(description="A keyset page of reservations, in id (creation) order.")
class ReservationConnection:
    nodes: list[Reservation] = strawberry.field(description="The page's reservations.")
    page_info: PageInfo = strawberry.field(description="Where the page sits in the list.")

    @strawberry.field(description="The page's reservations with their cursors.")
    def edges(self) -> list[ReservationEdge]:
        return [ReservationEdge(cursor=encode_cursor(r.id), node=r) for r in self.nodes]

    @classmethod
    def from_page(cls, page: Page[ReservationView]) -> ReservationConnection:
        nodes = [Reservation.from_view(r) for r in page.items]
        return cls(nodes=nodes, page_info=page_info(page, [r.id for r in nodes]))


def page_info(page: Page[Any], ids: list[str]) -> PageInfo:
    return PageInfo(
        has_next_page=page.has_next,
        has_previous_page=page.has_previous,
        start_cursor=encode_cursor(ids[0]) if ids else None,
        end_cursor=encode_cursor(ids[-1]) if ids else None,
    )
