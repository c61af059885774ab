"""Pool: a pool as the acting tenant sees it (the REST Pool, plus nested reads); and
OfferedPool, the same fields as an offered tenant sees the pool (what `offerPool` answers),
under an id of its own so that no normalized client cache files it under the acting
tenant's `Pool` (docs/decisions/0011-client-caches-and-relay.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, cast

import strawberry
from strawberry.scalars import JSON

from app.capacity.node_ids import offered_pool_id
from app.capacity.paging import reservations_page_request
from app.capacity.views import CapacityView, OfferView, PoolView, QuotaView
from app.errors import DomainError
from schema.context import Context
from schema.types.capacity_row import CapacityRow
from schema.types.enums import Agent, PoolClass, Sharing
from schema.types.lending import GuestLending
from schema.types.node import Node
from schema.types.offer import Offer
from schema.types.quota import Quota
from schema.types.reservation import ReservationConnection

# Nested lists are read by the domain for a whole page at once (Capacity.list_pools) and
# stored on each Pool, so every field here but `reservations` is a plain attribute: no
# resolver, no future, no per-field hook inside large lists. A field its caller may not
# see holds the domain's error instead; graphql-core raises it at that field, which
# resolves to null with its own error while the rest of the query answers.
Denied = DomainError


@strawberry.type(name="PoolFields", description="The fields Pool and OfferedPool share.")
class PoolFields:
    id: strawberry.ID = strawberry.field(description="`pool_<ulid>`.")
    viewer_tenant_id: str = strawberry.field(
        description="The tenant whose view this is: the acting tenant (`tenantId` of the "
        "read), for an OfferedPool the offered tenant. A client acting for several tenants "
        'keys pools by `id` and `viewerTenantId` (docs/graphql.md, "Client caches").'
    )
    tenant_id: str = strawberry.field(description="The owner: the tenant that created it.")
    site_id: strawberry.ID = strawberry.field(description="The site whose nodes it groups.")
    pool_class: PoolClass = strawberry.field(name="class", description="The pool's class.")
    gpu_model: str | None = strawberry.field(description="The GPU model of its nodes.")
    sharing: Sharing = strawberry.field(description="How its GPUs are shared.")
    agent: Agent = strawberry.field(description="The node agent its machines run.")
    policy: JSON = strawberry.field(
        description="The pool policy (v1.1): hugepages, kernelModules, kubernetes, "
        "platformOperated, sharing, migLayout, singleTenant, prewarmImages. Secrets are "
        "write-only: `kubernetes.token` reads as `kubernetes.tokenSet: true`."
    )
    provider_account_id: strawberry.ID | None = strawberry.field(
        description="The provider account of a PROVIDER pool; null for other classes."
    )
    region: str = strawberry.field(description="The region of its site.")
    display_name: str | None = strawberry.field(
        description="Its name for people, at most 128 characters (a fleet file's `name` "
        "stays the file's handle); null when it has none. Set on create or with labelPool."
    )
    labels: JSON = strawberry.field(
        description="Its labels, {key: value} (at most 32, Kubernetes' key and value "
        "syntax); `pools(labelSelector:)` selects by them. Set on create or with labelPool."
    )
    owned: bool = strawberry.field(description="Whether the acting tenant owns it.")
    archived: bool = strawberry.field(
        description="Whether it is retired; only the owner sees an archived pool."
    )
    version: int = strawberry.field(
        description="Starts at 1; every write that changes what the pool shows (offer, "
        "a removing unoffer, update, a changing labelPool, archive) adds 1. Pass it back "
        "as `version` on a write to refuse the write if the pool has moved on."
    )
    created_at: datetime = strawberry.field(description="When it was created.")
    updated_at: datetime = strawberry.field(description="When it last changed.")
    quotas: Sequence[QuotaView] = strawberry.field(
        graphql_type=list[Quota],
        description="The quota rows the acting tenant books against on the pool, each with "
        "its `grant`: its own, or for a descendant that sees the pool through an ancestor's "
        "offer with includeDescendants, the ancestor's (read-only to it). Never another "
        "guest's rows.",
    )
    capacity: Sequence[CapacityView] | Denied | None = strawberry.field(
        graphql_type=list[CapacityRow] | None,
        description="The pool's rollup, one row per resource. Needs compute:capacity:read "
        "on the pool; otherwise null with a PERMISSION_DENIED error.",
    )
    offers: Sequence[Offer] | Denied | None = strawberry.field(
        graphql_type=list[Offer] | None,
        description="Every offer of the pool, the owner's own included. Shown to the owner "
        "with compute:pools:share; null for a tenant that does not own the pool (nothing to "
        "show), and null with a PERMISSION_DENIED error for an owner's caller without "
        "compute:pools:share.",
    )
    lending: Sequence[OfferView] | Denied | None = strawberry.field(
        graphql_type=list[GuestLending] | None,
        description="The lender's view: per guest tenant (the owner's own offer left out), "
        "its offer, quota and use; at most 99 entries. Shown as `offers` is: to the owner "
        "with compute:pools:share only, otherwise null with a PERMISSION_DENIED error.",
    )
    view: strawberry.Private[PoolView]
    view_tenant: strawberry.Private[str]  # the acting tenant the pool was read for

    @strawberry.field(description="The acting tenant's own reservations in the pool.")
    async def reservations(
        self,
        info: strawberry.Info[Context, None],
        first: Annotated[
            int | None, strawberry.argument(description="How many reservations, 0 to 100.")
        ] = 50,
        after: Annotated[
            str | None, strawberry.argument(description="The endCursor of the previous page.")
        ] = None,
    ) -> ReservationConnection:
        page = reservations_page_request(first, after)
        # The acting tenant: the one the pool was read for (`owned` etc. are its view).
        loaded = await info.context.loaders.reservations.load(
            (self.view_tenant, self.view.id, self.view.grant, page.first, page.after)
        )
        if isinstance(loaded, Denied):
            raise loaded
        return ReservationConnection.from_page(loaded)


@strawberry.type(
    description="A pool groups the nodes of one site under one GPU model, one sharing mode "
    "and one policy; every reservation and quota belongs to exactly one pool. Shown as the "
    "acting tenant sees it: its own quota rows, and offers for the owner. Its id is the "
    "pool id REST uses, and its node id: `node(id:)` refetches it as the caller's own "
    "tenant sees it."
)
class Pool(PoolFields, Node):
    id: strawberry.ID = strawberry.field(description="`pool_<ulid>`: the REST id, and the node id.")


@strawberry.type(
    description="A pool as the OFFERED tenant sees it (its quota rows, `owned` false): what "
    "`offerPool` answers, the seed's rule. Its `id` is `offered:<poolId>:<tenantId>`, not the "
    "pool id, so that Apollo's, urql's and Relay's normalized caches keep it apart from the "
    "acting tenant's `Pool`; `poolId` is the pool id REST uses. Not refetchable by `node`."
)
class OfferedPool(PoolFields):
    id: strawberry.ID = strawberry.field(
        description="`offered:<poolId>:<tenantId>`: this view's own id (cache identity)."
    )
    pool_id: strawberry.ID = strawberry.field(description="The pool id REST uses, `pool_<ulid>`.")


def pool_from_view(
    view: PoolView,
    tenant_id: str,
    *,
    quotas: Sequence[QuotaView],
    capacity: Sequence[CapacityView] | Denied | None,
    offers: Sequence[OfferView] | Denied | None,
    lending: Sequence[OfferView] | Denied | None = None,
) -> Pool:
    """`view` as the acting tenant `tenant_id` sees it."""
    return Pool(
        id=strawberry.ID(view.id),
        viewer_tenant_id=tenant_id,
        **_fields(view, tenant_id, quotas, capacity, offers, lending),
    )


def offered_pool_from_view(
    view: PoolView,
    tenant_id: str,
    offered_to: str,
    *,
    quotas: Sequence[QuotaView],
    capacity: Sequence[CapacityView] | Denied | None,
    offers: Sequence[OfferView] | Denied | None,
    lending: Sequence[OfferView] | Denied | None = None,
) -> OfferedPool:
    """`view` as the offered tenant `offered_to` sees it, read by `tenant_id` (whose
    reservations `reservations` lists, as before)."""
    return OfferedPool(
        id=strawberry.ID(offered_pool_id(view.id, offered_to)),
        pool_id=strawberry.ID(view.id),
        viewer_tenant_id=offered_to,
        **_fields(view, tenant_id, quotas, capacity, offers, lending),
    )


def _fields(
    view: PoolView,
    tenant_id: str,
    quotas: Sequence[QuotaView],
    capacity: Sequence[CapacityView] | Denied | None,
    offers: Sequence[OfferView] | Denied | None,
    lending: Sequence[OfferView] | Denied | None,
) -> dict[str, Any]:
    shown: Sequence[Offer] | Denied | None
    if offers is None or isinstance(offers, Denied):
        shown = offers
    else:
        shown = [Offer.from_view(view.id, offer) for offer in offers]  # with their node ids
    return dict(
        tenant_id=view.tenant_id,
        site_id=strawberry.ID(view.site_id),
        pool_class=PoolClass(view.pool_class),
        gpu_model=view.gpu_model,
        sharing=Sharing(view.sharing),
        agent=Agent(view.agent),
        policy=cast(JSON, view.policy),
        provider_account_id=(
            None if view.provider_account_id is None else strawberry.ID(view.provider_account_id)
        ),
        region=view.region,
        display_name=view.display_name,
        labels=cast(JSON, view.labels),
        owned=view.owned,
        archived=view.archived,
        version=view.version,
        created_at=view.created_at,
        updated_at=view.updated_at,
        quotas=quotas,
        capacity=capacity,
        offers=shown,
        lending=lending,
        view=view,
        view_tenant=tenant_id,
    )
