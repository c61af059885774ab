"""DataLoaders, created fresh per request (and after every write in it).

Each batches one kind of row across every pool a query touches: quota rows, capacity
rows, offers (with their quota rows), pools with their authz rows, and reservation pages.
All run on the request's one read connection (ReadScope), so a query holds at most one
connection however wide it fans out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection
from strawberry.dataloader import DataLoader

from app.capacity import listing
from app.capacity.lending import GuestTotals, guest_totals
from app.capacity.paging import Page, PageRequest
from app.capacity.reads import capacity_of, offers_of, quotas_of
from app.capacity.views import CapacityView, OfferView, PoolView, QuotaView, ReservationView
from app.iam.principal import Principal
from schema.read_scope import ReadScope

K = TypeVar("K", bound=Hashable)
G = TypeVar("G", bound=Hashable)
V = TypeVar("V")

# (tenant id, pool id): rows are the tenant's own.
TenantPool = tuple[str, str]
# (tenant id, pool id, first, after id): one page of a pool's reservations.
ReservationPageKey = tuple[str, str, int, str | None]


def _grouped(
    keys: Sequence[K],
    group_of: Callable[[K], G],
    load_group: Callable[[G, list[K]], Awaitable[dict[K, V]]],
) -> Callable[[], Awaitable[list[V]]]:
    """Load keys that share a group (e.g. a tenant) with one call per group."""

    async def load() -> list[V]:
        groups: dict[G, list[K]] = defaultdict(list)
        for key in keys:
            groups[group_of(key)].append(key)
        found: dict[K, V] = {}
        for group, members in groups.items():
            found.update(await load_group(group, members))
        return [found[key] for key in keys]

    return load


@dataclass
class Loaders:
    quotas: DataLoader[TenantPool, tuple[QuotaView, ...]]
    capacity: DataLoader[str, tuple[CapacityView, ...]]
    offers: DataLoader[str, tuple[OfferView, ...]]
    pools: DataLoader[TenantPool, PoolView | None]
    reservations: DataLoader[ReservationPageKey, Page[ReservationView]]
    guest_totals: DataLoader[str, dict[str, tuple[int, int]]]


def create_loaders(reads: ReadScope, principal: Callable[[], Awaitable[Principal]]) -> Loaders:
    async def load_quotas(keys: list[TenantPool]) -> list[tuple[QuotaView, ...]]:
        async def by_tenant(
            tenant_id: str, members: list[TenantPool]
        ) -> dict[TenantPool, tuple[QuotaView, ...]]:
            async def work(conn: AsyncConnection) -> dict[str, tuple[QuotaView, ...]]:
                return await quotas_of(conn, tenant_id, [pool_id for _, pool_id in members])

            rows = await reads.run(work)
            return {key: rows[key[1]] for key in members}

        return await _grouped(keys, lambda key: key[0], by_tenant)()

    async def load_capacity(keys: list[str]) -> list[tuple[CapacityView, ...]]:
        async def work(conn: AsyncConnection) -> dict[str, tuple[CapacityView, ...]]:
            return await capacity_of(conn, keys)

        rows = await reads.run(work)
        return [rows[key] for key in keys]

    async def load_guest_totals(keys: list[str]) -> list[dict[str, tuple[int, int]]]:
        async def work(conn: AsyncConnection) -> GuestTotals:
            return await guest_totals(conn, keys)

        rows = await reads.run(work)
        return [rows[key] for key in keys]

    async def load_offers(keys: list[str]) -> list[tuple[OfferView, ...]]:
        async def work(conn: AsyncConnection) -> dict[str, tuple[OfferView, ...]]:
            return await offers_of(conn, keys)

        rows = await reads.run(work)
        return [rows[key] for key in keys]

    async def load_pools(keys: list[TenantPool]) -> list[PoolView | None]:
        caller = await principal()

        async def by_tenant(
            tenant_id: str, members: list[TenantPool]
        ) -> dict[TenantPool, PoolView | None]:
            async def work(conn: AsyncConnection) -> dict[str, PoolView]:
                return await listing.pools_by_id(
                    conn, caller, tenant_id, [pool_id for _, pool_id in members]
                )

            found = await reads.run(work)
            return {key: found.get(key[1]) for key in members}

        return await _grouped(keys, lambda key: key[0], by_tenant)()

    async def load_reservations(keys: list[ReservationPageKey]) -> list[Page[ReservationView]]:
        async def by_page(
            group: tuple[str, int, str | None], members: list[ReservationPageKey]
        ) -> dict[ReservationPageKey, Page[ReservationView]]:
            tenant_id, first, after = group

            async def work(conn: AsyncConnection) -> dict[str, Page[ReservationView]]:
                return await listing.pages_of_reservations(
                    conn, tenant_id, [key[1] for key in members], PageRequest(first, after)
                )

            pages = await reads.run(work)
            return {key: pages[key[1]] for key in members}

        return await _grouped(keys, lambda key: (key[0], key[2], key[3]), by_page)()

    return Loaders(
        quotas=DataLoader(load_quotas),
        capacity=DataLoader(load_capacity),
        offers=DataLoader(load_offers),
        pools=DataLoader(load_pools),
        reservations=DataLoader(load_reservations),
        guest_totals=DataLoader(load_guest_totals),
    )
