"""A small fleet for the sharing tests: one owner with a site and an admin, guests on demand.

Calls go through the real HTTP app (`Api`); table reads go through `db`, for what no
REST answer shows (events, authz rows, agent revisions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, select

from app.db.engine import Database
from app.db.models import AuthzRow, Event, EventAudience, Offer, QuotaRow
from tests.support import Api, Fleet

Json = dict[str, Any]


@dataclass
class Scene:
    api: Api
    fleet: Fleet
    owner: str
    token: str  # the owner's admin
    site: str

    @classmethod
    async def start(
        cls, api: Api, fleet: Fleet, owner: str = "acme", site_kind: str = "custom"
    ) -> Scene:
        await fleet.tenant(owner)
        site = await fleet.site(owner, kind=site_kind)
        return cls(api, fleet, owner, await fleet.caller(owner, "admin"), site)

    async def pool(self, **fields: Any) -> Json:
        """A pool the owner creates: metal-host by default, any create field overrides."""
        body = {"tenantId": self.owner, "siteId": self.site, "class": "metal-host", **fields}
        pool: Json = (await self.api.ok(self.token, "pools/create", body))["pool"]
        return pool

    async def guest(
        self, tenant_id: str, parent: str | None = None, role: str = "admin", **where: str
    ) -> str:
        """A new tenant and a caller of it; returns the caller's token."""
        await self.fleet.tenant(tenant_id, parent)
        return await self.fleet.caller(tenant_id, role, **where)

    def body(self, pool_id: str, **fields: Any) -> Json:
        return {"tenantId": self.owner, "poolId": pool_id, **fields}

    async def offer(self, pool_id: str, to: str, quota: dict[str, int], **fields: Any) -> Json:
        body = self.body(pool_id, toTenantId=to, quota=quota, **fields)
        pool: Json = (await self.api.ok(self.token, "pools/offer", body))["pool"]
        return pool

    async def unoffer(self, pool_id: str, to: str) -> bool:
        body = self.body(pool_id, toTenantId=to)
        removed: bool = (await self.api.ok(self.token, "pools/unoffer", body))["removed"]
        return removed

    async def archive(self, pool_id: str) -> Json:
        pool: Json = (await self.api.ok(self.token, "pools/archive", self.body(pool_id)))["pool"]
        return pool

    async def get(self, pool_id: str, token: str | None = None, tenant: str | None = None) -> Json:
        body = {"tenantId": tenant or self.owner, "poolId": pool_id}
        pool: Json = (await self.api.ok(token or self.token, "pools/get", body))["pool"]
        return pool

    async def capacity(self, pool_id: str) -> dict[str, Json]:
        rows = await self.api.ok(self.token, "pools/capacity", self.body(pool_id))
        return {row["resource"]: row for row in rows["capacity"]}

    async def reserve(
        self,
        pool_id: str,
        resources: dict[str, int],
        token: str | None = None,
        tenant: str | None = None,
        **fields: Any,
    ) -> Json:
        body = {"tenantId": tenant or self.owner, "poolId": pool_id, "resources": resources}
        answer = await self.api.ok(token or self.token, "reservations/create", body | fields)
        reservation: Json = answer["reservation"]
        return reservation

    async def release(
        self, reservation_id: str, token: str | None = None, tenant: str | None = None
    ) -> Json:
        body = {"tenantId": tenant or self.owner, "reservationId": reservation_id}
        answer = await self.api.ok(token or self.token, "reservations/release", body)
        reservation: Json = answer["reservation"]
        return reservation


def quotas(pool: Json) -> dict[str, tuple[int, int]]:
    """A pool's `quotas` as {resource: (max, used)}."""
    return {q["resource"]: (q["max"], q["used"]) for q in pool["quotas"]}


def offers(pool: Json) -> dict[str, Json]:
    """The owner's view of a pool's offers, by tenant."""
    return {o["tenantId"]: o for o in pool["offers"]}


# -- table reads ---------------------------------------------------------------------------


async def fetch(db: Database, query: Any) -> list[Row[Any]]:
    async with db.reader.connect() as conn:
        return list((await conn.execute(query)).all())


async def quota_rows(db: Database, pool_id: str, tenant_id: str) -> dict[str, tuple[int, int]]:
    rows = await fetch(
        db,
        select(QuotaRow.resource, QuotaRow.max, QuotaRow.used).where(
            QuotaRow.pool_id == pool_id, QuotaRow.tenant_id == tenant_id
        ),
    )
    return {r.resource: (r.max, r.used) for r in rows}


async def offer_tenants(db: Database, pool_id: str) -> set[str]:
    return {
        r.tenant_id
        for r in await fetch(db, select(Offer.tenant_id).where(Offer.pool_id == pool_id))
    }


async def authz_tenants(db: Database, pool_id: str) -> set[str]:
    rows = await fetch(db, select(AuthzRow.tenant_id).where(AuthzRow.pool_id == pool_id))
    return {r.tenant_id for r in rows}


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    type: str
    pool_id: str
    tenant_id: str
    occurred_at: Any
    data: Json
    audience: frozenset[str]


async def events(db: Database, pool_id: str | None = None) -> list[StoredEvent]:
    """The outbox rows in seq order, each with its audience."""
    query = select(Event.__table__).order_by(Event.seq)
    if pool_id is not None:
        query = query.where(Event.pool_id == pool_id)
    rows = await fetch(db, query)
    audience: dict[int, set[str]] = {}
    for a in await fetch(db, select(EventAudience.seq, EventAudience.tenant_id)):
        audience.setdefault(a.seq, set()).add(a.tenant_id)
    return [
        StoredEvent(
            r.seq,
            r.type,
            r.pool_id,
            r.tenant_id,
            r.occurred_at,
            dict(r.data),
            frozenset(audience.get(r.seq, ())),
        )
        for r in rows
    ]
