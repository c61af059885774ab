"""DataLoaders, created fresh per request (and after every write in it).

`Pool.reservations` takes its own arguments on each pool, so its pages are batched here
across every pool of a query: one domain call (`Capacity.reservation_pages`, one
statement) per tenant and page arguments, on the request's one read connection.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from strawberry.dataloader import DataLoader

from app.capacity.paging import Page, PageRequest
from app.capacity.service import Capacity
from app.capacity.views import Grant, ReservationView
from app.db.read_scope import ReadScope
from app.errors import PermissionDenied
from app.iam.principal import Principal

# (tenant id, pool id, the grant the tenant sees the pool through, first, after id).
ReservationPageKey = tuple[str, str, Grant, int, str | None]
ReservationPage = Page[ReservationView] | PermissionDenied


@dataclass
class Loaders:
    reservations: DataLoader[ReservationPageKey, ReservationPage]


def create_loaders(
    capacity: Capacity, reads: ReadScope, principal: Callable[[], Awaitable[Principal]]
) -> Loaders:
    async def load_reservations(keys: list[ReservationPageKey]) -> list[ReservationPage]:
        caller = await principal()
        groups: dict[tuple[str, int, str | None], list[ReservationPageKey]] = defaultdict(list)
        for key in keys:
            groups[(key[0], key[3], key[4])].append(key)
        found: dict[ReservationPageKey, ReservationPage] = {}
        for (tenant_id, first, after), members in groups.items():
            pages = await capacity.reservation_pages(
                caller,
                tenant_id,
                [(pool_id, grant) for _, pool_id, grant, _, _ in members],
                PageRequest(first, after),
                reads=reads,
            )
            found.update({key: pages[key[1]] for key in members})
        return [found[key] for key in keys]

    return Loaders(reservations=DataLoader(load_reservations))
