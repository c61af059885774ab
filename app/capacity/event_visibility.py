"""Who receives an event, and what of it: one rule for live delivery and for replay.
The relay (app/events/relay.py) asks it through `POOL_EVENTS` for each batch it reads.

An event's audience (written in the event's own transaction, CONTRACT section 7) is
exactly the set of tenants entitled to it when it committed: the owner, the tenant an
offer concerns, every offered tenant of an update, the removed tenants of an archive.
So a subscriber's tenant in the audience receives it, live or replayed, whatever
happened since: an unoffered tenant gets its `pool.unoffered`, and no later event
names it. Two things are decided on current state instead, from one load per batch:

- a descendant of an audience tenant receives the event while it sees the pool
  through that tenant's offer with `includeDescendants` (the audience names only the
  offered tenant, not its subtree);
- the caller's role binding, when narrowed by pool attributes, must allow
  `compute:pools:read` on the pool (the per-pool IAM decision). The binding is the
  caller's current one: a rebinding re-scopes the open subscriptions, read on the
  batch's own connection before it is decided (app/iam/bindings.py).

`pool.usage` (CONTRACT section 10) is not in the outbox and has no audience: each relay
round hands `load_usage` the pools whose usage moved, with the tenants whose quota rows
moved. A subscriber receives one when its tenant owns the pool (every row its query
shows), or when a row its own queries show moved: the rows it books against (its own, or
those of the ancestor whose offer it sees the pool through, `World.grant`), or the
pool's capacity rows where it may read them (a guest with capacity reads sees every
booking move `booked`; without that its applied state would differ from a refetch, which
CONTRACT section 10 rules out); and what it receives
is what its own `pools/get` shows of quotas, offers and capacity right then, read by
`pool_reads` itself (once per pool and view, shared by every subscriber of that view), so
no rule of what a read shows is restated here.

Then an event shows the subscriber nothing a query by the same caller would not
(CONTRACT section 7): offer details (`toTenantId`, `quota`, `priority`,
`includeDescendants`) and the removed tenants of an archive are whole only for a caller
that reads the pool's offers (the owner's, with compute:pools:share on the pool). Any
other caller receives offer events about its own offer, and about the ancestor's offer
it sees the pool through (that tenant's id only); of an archive, only its own lineage
among the removed tenants; no event about another tenant's offer at all.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from app.capacity.access import reads_offers
from app.capacity.event_reads import view_of
from app.capacity.pool_reads import read_parts
from app.capacity.reads import Actor, grant_for, nearest_grant, visible_pool
from app.capacity.views import Grant, PoolDetail, PoolPart
from app.catalog import GET_POOL, LIST_POOLS
from app.db.engine import Executor
from app.db.models import AuthzRow, Pool, utcnow
from app.errors import NotFound
from app.events.reader import OutboxEvent
from app.events.usage import USAGE_EVENT
from app.iam.bindings import LiveBinding, LiveBindings
from app.iam.decisions import PoolAttributes, allows_pool, may_act


@dataclass(frozen=True, slots=True)
class PoolState:
    owner: str
    archived: bool
    gpu_model: str | None
    pool_class: str
    sharing: str
    region: str

    def attributes_for(self, tenant_id: str) -> PoolAttributes:
        return PoolAttributes(
            self.gpu_model, self.pool_class, self.sharing, self.region, self.owner == tenant_id
        )


@dataclass(frozen=True, slots=True)
class AuthzEntry:
    tenant_id: str
    include_descendants: bool
    attributes: PoolAttributes


@dataclass(slots=True)
class World:
    """The current pools and authz rows behind one batch of events."""

    pools: dict[str, PoolState]
    authz: dict[str, list[AuthzEntry]]
    _grants: dict[tuple[str, str], Grant | None] = field(default_factory=dict)

    def grant(self, actor: Actor, pool_id: str) -> Grant | None:
        """The row that lets the actor see the pool, by the plain reads' rule
        (`reads.nearest_grant`: its own row first, else the nearest ancestor's that
        includes descendants)."""
        key = (actor.tenant_id, pool_id)
        if key in self._grants:
            return self._grants[key]
        best = nearest_grant(actor, self.authz.get(pool_id, ()))
        grant = None if best is None else grant_for(actor, best.tenant_id, best.attributes)
        self._grants[key] = grant
        return grant

    def readable(self, event: OutboxEvent, subscription: PoolEventFilter) -> OutboxEvent | None:
        return readable_event(event, subscription, self)


async def load_world(executor: Executor, pool_ids: Collection[str]) -> World:
    ids = sorted(set(pool_ids))
    if not ids:
        return World({}, {})
    pools = {
        r.id: PoolState(r.tenant_id, r.archived, r.gpu_model, r.pool_class, r.sharing, r.region)
        for r in (
            await executor.execute(
                select(
                    Pool.id,
                    Pool.tenant_id,
                    Pool.archived,
                    Pool.gpu_model,
                    Pool.pool_class,
                    Pool.sharing,
                    Pool.region,
                ).where(Pool.id.in_(ids))
            )
        ).all()
    }
    authz: dict[str, list[AuthzEntry]] = defaultdict(list)
    rows = await executor.execute(select(AuthzRow.__table__).where(AuthzRow.pool_id.in_(ids)))
    for r in rows:
        authz[r.pool_id].append(
            AuthzEntry(
                r.tenant_id,
                r.include_descendants,
                PoolAttributes(r.gpu_model, r.pool_class, r.sharing, r.region, r.owned),
            )
        )
    return World(pools, dict(authz))


class PoolEventVisibility:
    """The relay's view of this rule (app/events/delivery.py): one load per batch. The
    open subscriptions' bindings are brought up to date first, on the same connection and
    after the batch's events were read, so a rebinding committed before them decides them."""

    def __init__(self, bindings: LiveBindings | None = None) -> None:
        self.bindings = bindings or LiveBindings()

    async def load(self, executor: Executor, events: Sequence[OutboxEvent]) -> World:
        await self.bindings.refresh(executor)
        return await load_world(executor, {e.pool_id for e in events})

    async def load_usage(
        self, executor: Executor, changes: Mapping[str, frozenset[str | None]]
    ) -> UsageWorld:
        await self.bindings.refresh(executor)
        return UsageWorld(executor, await load_world(executor, changes))


# What a `pool.usage` event shows: the parts of `pools/get` that carry usage.
USAGE_PARTS: frozenset[PoolPart] = frozenset({"quotas", "offers", "capacity"})


def usage_data(detail: PoolDetail) -> dict[str, Any]:
    """`data` of a `pool.usage` event (CONTRACT section 10) from a pool as read: every quota
    row the read shows (the rows the tenant books against, and for a caller that reads the
    offers each offer's rows), and the capacity rows when it shows them."""
    pool = detail.pool
    rows = {(pool.grant.tenant_id, q.resource): q for q in detail.quotas}
    if isinstance(detail.offers, tuple):
        for offer in detail.offers:
            rows.update({(offer.tenant_id, q.resource): q for q in offer.quotas})
    data: dict[str, Any] = {
        "version": pool.version,
        "quotas": [
            {"tenantId": tenant, "resource": resource, "max": q.max, "used": q.used}
            for (tenant, resource), q in sorted(rows.items())
        ],
    }
    if isinstance(detail.capacity, tuple):
        data["capacity"] = [
            {"resource": c.resource, "booked": c.booked, "available": c.available}
            for c in detail.capacity
        ]
    return data


class UsageWorld:
    """One usage round's changed pools (app/events/delivery.py: ShownUsage)."""

    def __init__(self, executor: Executor, world: World) -> None:
        self._executor = executor
        self._world = world
        self._shown: dict[tuple[Any, ...], OutboxEvent | None] = {}
        self._now = utcnow()

    async def readable(
        self, pool_id: str, moved: frozenset[str | None], subscription: PoolEventFilter
    ) -> OutboxEvent | None:
        if not subscription.wants_type(USAGE_EVENT, pool_id):
            return None
        actor = subscription.actor
        if not may_act(actor.principal, actor.tenant_id, LIST_POOLS.permission):
            return None
        pool = self._world.pools.get(pool_id)
        if pool is None:
            return None
        own_rows_moved = True
        if pool.owner != actor.tenant_id:
            grant = self._world.grant(actor, pool_id)
            if grant is None:
                return None
            own_rows_moved = grant.tenant_id in moved
            if not own_rows_moved and None not in moved:
                return None  # neither the rows it books against nor the capacity moved
        key = (pool_id, view_of(actor))
        if key not in self._shown:
            self._shown[key] = await self._read(pool_id, pool.owner, actor)
        shown = self._shown[key]
        if shown is not None and not own_rows_moved and "capacity" not in shown.data:
            return None  # only the capacity moved, which its query does not show
        return shown

    async def _read(self, pool_id: str, owner: str, actor: Actor) -> OutboxEvent | None:
        """The pool as the actor's `pools/get` shows it now, as an event; None where that
        answers NOT_FOUND or PERMISSION_DENIED."""
        try:
            view = await visible_pool(self._executor, actor, pool_id)
        except NotFound:
            return None
        if not allows_pool(actor.principal, GET_POOL.permission, view.grant.attributes):
            return None
        (detail,) = await read_parts(self._executor, actor.principal, [view], USAGE_PARTS)
        return OutboxEvent(
            seq=0,
            type=USAGE_EVENT,
            pool_id=pool_id,
            tenant_id=owner,  # a merged event has no one actor: the pool's owner
            occurred_at=self._now,
            data=usage_data(detail),
            audience=frozenset(),
            usage=0,  # the relay sets the horizon its cursor carries
        )


class PoolEventFilter:
    """What one subscription asked for: its actor, and optionally one pool and some types.
    The actor's principal is the caller's current binding (`LiveBinding`), not the one it
    subscribed with."""

    __slots__ = ("_actor", "_binding", "pool_id", "types")

    def __init__(
        self,
        actor: Actor,
        pool_id: str | None = None,
        types: frozenset[str] | None = None,
        *,
        binding: LiveBinding | None = None,
    ) -> None:
        self._actor = actor
        self._binding = binding or LiveBinding(actor.principal)
        self.pool_id = pool_id
        self.types = types

    @property
    def actor(self) -> Actor:
        principal = self._binding.principal
        if self._actor.principal is not principal:  # rebound since: the new one decides
            self._actor = dataclasses.replace(self._actor, principal=principal)
        return self._actor

    @property
    def tenants(self) -> tuple[str, ...]:
        return self._actor.lineage

    def wants(self, event: OutboxEvent) -> bool:
        return self.wants_type(event.type, event.pool_id)

    def wants_type(self, event_type: str, pool_id: str) -> bool:
        return (self.pool_id is None or pool_id == self.pool_id) and (
            self.types is None or event_type in self.types
        )


OFFER_EVENTS = frozenset({"pool.offered", "pool.unoffered"})
# What a tenant that sees the pool through an ancestor's offer reads of an event about
# that offer: whose offer it is (its own lineage), not its quota or priority.
THROUGH_OFFER_KEYS = ("toTenantId", "version")


def readable_event(
    event: OutboxEvent, subscription: PoolEventFilter, world: World
) -> OutboxEvent | None:
    """The event as this subscription may read it, or None when it is not delivered.
    Not delivering is the same as a filtered-out event: the cursor still moves past it."""
    if not subscription.wants(event):
        return None
    actor = subscription.actor
    if not may_act(actor.principal, actor.tenant_id, LIST_POOLS.permission):
        return None  # rebound to a role that may no longer act for the tenant
    pool = world.pools.get(event.pool_id)
    if pool is None:  # pools are never deleted; nothing to show without one
        return None
    grant = world.grant(actor, event.pool_id)
    through: str | None = None  # the ancestor whose offer the actor sees the pool through
    if actor.tenant_id in event.audience:
        attributes = grant.attributes if grant is not None else pool.attributes_for(actor.tenant_id)
    elif (
        grant is not None
        and grant.tenant_id != actor.tenant_id
        and grant.tenant_id in event.audience
        and not pool.archived
    ):
        attributes, through = grant.attributes, grant.tenant_id
    else:
        return None
    if not allows_pool(actor.principal, LIST_POOLS.permission, attributes):  # as `list`
        return None
    if reads_offers(actor.principal, pool.owner == actor.tenant_id, attributes):
        return event  # the owner's sharer reads every offer, as `offers` shows it
    if event.type in OFFER_EVENTS:
        concerned = event.data.get("toTenantId")
        if concerned == actor.tenant_id:
            return event  # its own offer
        if through is not None and concerned == through:
            data = {key: event.data[key] for key in THROUGH_OFFER_KEYS if key in event.data}
            return dataclasses.replace(event, data=data)
        return None  # another tenant's offer, which no query of this caller shows
    if event.type == "pool.archived":
        lineage = set(actor.lineage)
        removed = event.data.get("removedTenantIds", [])
        data = {**event.data, "removedTenantIds": [t for t in removed if t in lineage]}
        return dataclasses.replace(event, data=data)
    return event
