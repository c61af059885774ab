"""The capacity domain's one entry point. Every transport (REST, GraphQL, CLI) calls this.

Reads run on a read connection; each write runs in exactly one unit of work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.capacity import explain, lending, offers, pool_events, pools, reservations
from app.capacity.event_visibility import PoolEventFilter
from app.capacity.inputs import (
    ArchivePoolInput,
    CapacityInput,
    CreatePoolInput,
    CreateReservationInput,
    ExplainAccessInput,
    GetPoolInput,
    LendingInput,
    ListPoolsInput,
    ListReservationsInput,
    OfferPoolInput,
    PoolEventsInput,
    ReleaseReservationInput,
    UnofferPoolInput,
    UpdatePoolInput,
)
from app.capacity.views import (
    AccessExplanation,
    CapacityView,
    ImpactView,
    LendingRowView,
    PoolDetail,
    ReservationView,
)
from app.db.engine import Database
from app.db.uow import Notify, UnitOfWork
from app.events.relay import Relay, Subscription
from app.iam.principal import Principal

T = TypeVar("T")


class Capacity:
    def __init__(
        self,
        db: Database,
        notify: Notify | None = None,
        *,
        relay: Relay[PoolEventFilter] | None = None,
    ) -> None:
        self.db = db
        self._notify = notify
        self._relay = relay  # this process's event relay; only a server has one

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self.db, self._notify)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncConnection]:
        async with self.db.reader.connect() as conn:
            yield conn

    async def _write(self, work: Callable[[UnitOfWork], Awaitable[T]], *, retry: bool) -> T:
        """Run `work` in one unit of work. With an idempotency key, a concurrent twin that
        won the insert makes ours fail on the key; running again then reads its result."""
        attempts = 3 if retry else 1
        for attempt in range(attempts):
            try:
                async with self.unit_of_work() as uow:
                    return await work(uow)
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- pools ---------------------------------------------------------------------------

    async def list_pools(self, principal: Principal, inp: ListPoolsInput) -> list[PoolDetail]:
        async with self.reading() as conn:
            return await pools.list_pools(conn, principal, inp)

    async def get_pool(self, principal: Principal, inp: GetPoolInput) -> PoolDetail:
        async with self.reading() as conn:
            return await pools.get_pool(conn, principal, inp)

    async def capacity(self, principal: Principal, inp: CapacityInput) -> tuple[CapacityView, ...]:
        async with self.reading() as conn:
            return await pools.pool_capacity(conn, principal, inp)

    async def create_pool(self, principal: Principal, inp: CreatePoolInput) -> PoolDetail:
        return await self._write(
            lambda uow: pools.create_pool(uow, principal, inp),
            retry=inp.idempotency_key is not None,
        )

    async def offer_pool(self, principal: Principal, inp: OfferPoolInput) -> PoolDetail:
        return await self._write(lambda uow: offers.offer_pool(uow, principal, inp), retry=False)

    async def unoffer_pool(self, principal: Principal, inp: UnofferPoolInput) -> bool | ImpactView:
        return await self._write(lambda uow: offers.unoffer_pool(uow, principal, inp), retry=False)

    async def update_pool(self, principal: Principal, inp: UpdatePoolInput) -> PoolDetail:
        return await self._write(lambda uow: pools.update_pool(uow, principal, inp), retry=False)

    async def archive_pool(
        self, principal: Principal, inp: ArchivePoolInput
    ) -> PoolDetail | ImpactView:
        return await self._write(lambda uow: pools.archive_pool(uow, principal, inp), retry=False)

    async def explain_access(
        self, principal: Principal, inp: ExplainAccessInput
    ) -> AccessExplanation:
        async with self.reading() as conn:
            return await explain.explain_access(conn, principal, inp)

    async def lending(self, principal: Principal, inp: LendingInput) -> list[LendingRowView]:
        async with self.reading() as conn:
            return await lending.lending(conn, principal, inp)

    # -- reservations --------------------------------------------------------------------

    async def create_reservation(
        self, principal: Principal, inp: CreateReservationInput
    ) -> ReservationView:
        return await self._write(
            lambda uow: reservations.create_reservation(uow, principal, inp),
            retry=inp.idempotency_key is not None,
        )

    async def release_reservation(
        self, principal: Principal, inp: ReleaseReservationInput
    ) -> ReservationView:
        return await self._write(
            lambda uow: reservations.release_reservation(uow, principal, inp), retry=False
        )

    async def list_reservations(
        self, principal: Principal, inp: ListReservationsInput
    ) -> list[ReservationView]:
        async with self.reading() as conn:
            return await reservations.list_reservations(conn, principal, inp)

    # -- events --------------------------------------------------------------------------

    async def open_pool_events(
        self, principal: Principal, inp: PoolEventsInput
    ) -> Subscription[PoolEventFilter]:
        if self._relay is None:
            raise RuntimeError("pool events need a server's relay (Capacity(relay=...))")
        return await pool_events.open_pool_events(self._relay, self.db, principal, inp)
