"""Query root: one field per read method of the seed (list, get, capacity) plus quotas
and the catalog. Resolvers translate to domain calls and back; nothing else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import strawberry

from app.capacity.inputs import (
    CapacityInput,
    ExplainAccessInput,
    GetPoolInput,
    LendingInput,
    ListPoolsInput,
    ListQuotasInput,
    parse_input,
)
from app.capacity.node_ids import PoolOffer
from app.capacity.paging import pools_page_request
from app.capacity.views import AccessExplanation, CapacityView, LendingRowView, QuotaView
from app.catalog import POOL_METHODS
from schema.context import Context
from schema.lookahead import selected_below
from schema.pool_nodes import pool_from_detail, pool_parts
from schema.types.access import Access
from schema.types.capacity_row import CapacityRow
from schema.types.lending import LendingRow
from schema.types.method import Method
from schema.types.node import Node
from schema.types.offer import Offer
from schema.types.pool import Pool
from schema.types.pool_connection import PoolConnection
from schema.types.quota import Quota
from schema.types.reservation import page_info

Info = strawberry.Info[Context, None]

# The seed's input tables are validated by the domain (parse_input), so a script gets the
# same INVALID_INPUT, with the same field, as on REST.
_TENANT = "The tenant the caller acts for (CONTRACT section 2)."
_POOL = "The pool, `pool_<ulid>`."


@strawberry.type(description="Reads of the pools method group.")
class Query:
    @strawberry.field(
        description="The seed's `list`: the pools the tenant owns or is offered, each with "
        "owned, archived and the tenant's own quota rows; archived pools only for their "
        "owner. Each pool is checked as compute:pools:read. Keyset-paged: `first` 0 to 100."
    )
    async def pools(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        first: Annotated[
            int | None, strawberry.argument(description="How many pools, 0 to 100.")
        ] = 50,
        after: Annotated[
            str | None, strawberry.argument(description="The endCursor of the previous page.")
        ] = None,
        label_selector: Annotated[
            str | None,
            strawberry.argument(
                description="Only the pools whose labels match: Kubernetes' syntax, "
                "requirements joined by commas (`a=b`, `a==b`, `a!=b`, `a in (x,y)`, "
                "`a notin (x)`, `a`, `!a`); a malformed one is INVALID_INPUT."
            ),
        ] = None,
    ) -> PoolConnection:
        ctx = info.context
        principal = await ctx.principal()
        given = {"tenantId": tenant_id}
        if label_selector is not None:
            given["labelSelector"] = label_selector
        inp = parse_input(ListPoolsInput, given)
        request = pools_page_request(first, after)
        selected = selected_below(info, ("nodes",), ("edges", "node"))
        page = await ctx.capacity.list_pools(
            principal, inp, page=request, parts=pool_parts(selected), reads=ctx.reads
        )
        nodes = [pool_from_detail(detail, inp.tenant_id) for detail in page.items]
        return PoolConnection(nodes=nodes, page_info=page_info(page, [p.id for p in nodes]))

    @strawberry.field(
        description="The seed's `get`: one pool as the tenant sees it. NOT_FOUND when it is "
        "not owned by or offered to the tenant, or archived and the tenant is not its owner."
    )
    async def pool(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        pool_id: Annotated[strawberry.ID, strawberry.argument(description=_POOL)],
    ) -> Pool:
        ctx = info.context
        principal = await ctx.principal()
        inp = parse_input(GetPoolInput, {"tenantId": tenant_id, "poolId": pool_id})
        parts = pool_parts(selected_below(info, ()))
        detail = await ctx.capacity.get_pool(principal, inp, parts=parts, reads=ctx.reads)
        return pool_from_detail(detail, inp.tenant_id)

    @strawberry.field(
        description="Relay's global object identification: the Pool or Offer with this id, "
        "as the caller's OWN tenant sees it (a pool as `pool` shows it to that tenant, an "
        "offer as the pool's owner sees it in `Pool.offers`); null when that tenant cannot "
        "see it, or for an id the service never gives out. A fleet admin's own tenant is "
        "`fleet`, so its `node` answers null: it reads other tenants' pools with `pool`."
    )
    async def node(
        self,
        info: Info,
        id: Annotated[
            strawberry.ID,
            strawberry.argument(
                description="`pool_<ulid>` (Pool.id) or `offer:<poolId>:<tenantId>` (Offer.id)."
            ),
        ],
    ) -> Node | None:
        ctx = info.context
        principal = await ctx.principal()
        parts = pool_parts(selected_below(info, ()))
        found = await ctx.capacity.node(principal, id, parts=parts, reads=ctx.reads)
        if found is None:
            return None
        if isinstance(found, PoolOffer):
            return Offer.from_view(found.pool_id, found.offer)
        return pool_from_detail(found, principal.tenant_id)

    @strawberry.field(
        graphql_type=list[CapacityRow],
        description="The seed's `capacity`: one pool's rollup rows, one per resource. "
        "Needs compute:capacity:read on the pool; NOT_FOUND when it is not visible.",
    )
    async def capacity(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        pool_id: Annotated[strawberry.ID, strawberry.argument(description=_POOL)],
    ) -> Sequence[CapacityView]:
        ctx = info.context
        principal = await ctx.principal()
        inp = parse_input(CapacityInput, {"tenantId": tenant_id, "poolId": pool_id})
        return await ctx.capacity.capacity(principal, inp, reads=ctx.reads)

    @strawberry.field(
        graphql_type=list[Quota],
        description="The quota rows the tenant books against, each with its `grant` (its "
        "own offer, or an ancestor's with includeDescendants), in every pool it may read or "
        "in one (NOT_FOUND, as `pool`, when that one is not visible).",
    )
    async def quotas(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        pool_id: Annotated[
            strawberry.ID | None, strawberry.argument(description="Only this pool's rows.")
        ] = None,
    ) -> Sequence[QuotaView]:
        ctx = info.context
        principal = await ctx.principal()
        payload: dict[str, object] = {"tenantId": tenant_id}
        if pool_id is not None:
            payload["poolId"] = pool_id
        inp = parse_input(ListQuotasInput, payload)
        return await ctx.capacity.list_quotas(principal, inp, reads=ctx.reads)

    @strawberry.field(
        graphql_type=Access,
        description="Why can I see this (REST `pools/explain`): whether the calling principal "
        "holds `permission` on the pool as the tenant, with its binding, the offer that "
        "grants the pool, or the first check that fails. A pool the tenant cannot see is "
        "answered exactly as `pool` answers it.",
    )
    async def access(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        pool_id: Annotated[strawberry.ID, strawberry.argument(description=_POOL)],
        permission: Annotated[
            str,
            strawberry.argument(
                description="A permission decided on a pool: compute:pools:read, "
                "compute:capacity:read, compute:pools:manage, compute:pools:share, "
                "compute:reservations:read or compute:reservations:write."
            ),
        ],
    ) -> AccessExplanation:
        ctx = info.context
        principal = await ctx.principal()
        payload = {"tenantId": tenant_id, "poolId": pool_id, "permission": permission}
        inp = parse_input(ExplainAccessInput, payload)
        return await ctx.capacity.explain_access(principal, inp, reads=ctx.reads)

    @strawberry.field(
        graphql_type=list[LendingRow],
        description="The lender's view of the tenant's fleet (REST `pools/lending`): every "
        "capacity row of the live pools it owns and may share (compute:pools:share), with "
        "what it offered to guests, their use and the overcommit, the most overcommitted "
        "first (lent capacity on a pool with none allocatable ranks first of all). At most "
        "`first` rows, 0 to 100.",
    )
    async def lending(
        self,
        info: Info,
        tenant_id: Annotated[str, strawberry.argument(description=_TENANT)],
        first: Annotated[int | None, strawberry.argument(description="How many rows.")] = 50,
    ) -> list[LendingRowView]:
        ctx = info.context
        principal = await ctx.principal()
        payload: dict[str, object] = {"tenantId": tenant_id}
        if first is not None:
            payload["first"] = first
        inp = parse_input(LendingInput, payload)
        return await ctx.capacity.lending(principal, inp, reads=ctx.reads)

    @strawberry.field(description="The seed's method table for the pools group.")
    async def catalog(self, info: Info) -> list[Method]:
        await info.context.principal()
        return [Method.from_catalog(m) for m in POOL_METHODS]
