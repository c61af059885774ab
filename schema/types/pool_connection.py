"""PoolConnection: a keyset page of pools."""

from __future__ import annotations

import strawberry

from app.capacity.paging import encode_cursor
from schema.types.page_info import PageInfo
from schema.types.pool import Pool


@strawberry.type(description="A pool and its cursor.")
class PoolEdge:
    cursor: str = strawberry.field(description="Pass as `after` to page past this pool.")
    node: Pool = strawberry.field(description="The pool.")


@strawberry.type(
    description="A keyset page of the pools the tenant owns or is offered, in id (creation) "
    "order: the seed's `list`, a page at a time."
)
class PoolConnection:
    nodes: list[Pool] = strawberry.field(description="The page's pools.")
    page_info: PageInfo = strawberry.field(description="Where the page sits in the list.")

    @strawberry.field(description="The page's pools with their cursors.")
    def edges(self) -> list[PoolEdge]:
        return [PoolEdge(cursor=encode_cursor(p.id), node=p) for p in self.nodes]
