"""The relay reads the visibility of a batch's events only for the events some subscription
of this process may receive (a process with no subscriber in an event's audience reads
none for it), and a subscription that joins while such a load runs still receives what
that read took."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette

from app.capacity.inputs import PoolEventsInput, parse_input
from app.capacity.service import Capacity
from app.db.engine import Executor
from app.events.cursor import encode_cursor
from app.events.outbox import PendingEvent
from app.events.reader import OutboxEvent
from app.events.relay import Relay
from app.iam.callers import authenticate
from tests.events.support import Collector, emit_updates, settle, subscribe, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet


class CountedLoads:
    """The relay's own visibility, each load's pools recorded; `during_next` runs inside
    the next load, before the real one (the moment a subscription may join)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.loads: list[list[str]] = []
        self.during_next: Callable[[], Awaitable[None]] | None = None

    async def load(self, executor: Executor, events: Sequence[OutboxEvent]) -> Any:
        if events:  # (a subscription's replay loads for none when level with the relay)
            self.loads.append([e.pool_id for e in events])
        hook, self.during_next = self.during_next, None
        if hook is not None:
            await hook()
        return await self.real.load(executor, events)

    async def load_usage(self, executor: Executor, changes: Mapping[str, Any]) -> Any:
        return await self.real.load_usage(executor, changes)


def counted(app: Starlette) -> CountedLoads:
    relay: Relay[Any] = app.state.relay
    loads = CountedLoads(relay._visibility)
    relay._visibility = loads
    return loads


async def test_events_nobody_here_may_receive_are_read_without_visibility(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    loads = counted(app)
    pool_id = (await s.pool())["id"]
    await emit_updates(capacity, pool_id, "acme", 3)
    await settle(app)
    assert loads.loads == []  # no subscriber: the relay moved past them all the same

    watching = await subscribe(app, s.token, "acme")
    await emit_updates(capacity, pool_id, "acme", 1, start=3)
    await settle(app, watching)
    assert [e.data for e in watching.events] == [{"n": 3}]
    assert loads.loads == [[pool_id]]
    await watching.close()


async def test_a_subscription_joining_during_a_load_receives_what_that_read_took(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    acme = await Scene.start(api, fleet)
    zeta = await Scene.start(api, fleet, owner="zeta")
    capacity: Capacity = app.state.capacity
    relay: Relay[Any] = app.state.relay
    acme_pool = (await acme.pool())["id"]
    zeta_pool = (await zeta.pool())["id"]
    watching = await subscribe(app, acme.token, "acme")
    # The pools' own created events must be behind the relay first: on a busy machine its
    # read of them could otherwise be the first load counted below.
    await settle(app, watching)
    # Zeta resumes from the relay's state as it is now: its pool's next event is after it.
    principal = await authenticate(capacity.db, f"Bearer {zeta.token}")
    after = {"tenantId": "zeta", "after": encode_cursor(relay.state.settled)}
    opened = await capacity.open_pool_events(principal, parse_input(PoolEventsInput, after))
    loads = counted(app)
    resumed: list[Collector] = []

    async def zeta_resumes() -> None:
        # It starts reading while the relay's read of both events waits in this load: the
        # relay has not moved, so the subscription joins at once (its replay then waits
        # for a connection on SQLite, where this load holds the only one), and from then
        # on is owed every event that read took.
        resumed.append(Collector(opened))
        await wait_until(lambda: opened.joining or opened.live)

    loads.during_next = zeta_resumes
    # One transaction, so one relay read takes both events: acme's, which the open
    # subscription wants, and zeta's, which nobody here wants until zeta resumes.
    async with capacity.unit_of_work() as uow:
        assert await uow.lock_pool(acme_pool)
        assert await uow.lock_pool(zeta_pool)
        for pool_id, tenant in ((acme_pool, "acme"), (zeta_pool, "zeta")):
            uow.emit(
                PendingEvent(
                    type="pool.updated",
                    pool_id=pool_id,
                    tenant_id=tenant,
                    data={"n": 1},
                    audience=frozenset({tenant}),
                )
            )
    await wait_until(lambda: len(resumed) == 1)
    [zeta_watching] = resumed
    await settle(app, watching, zeta_watching)
    assert [(e.pool_id, e.data) for e in watching.events] == [(acme_pool, {"n": 1})]
    assert [(e.pool_id, e.data) for e in zeta_watching.events] == [(zeta_pool, {"n": 1})]
    # The first load was for acme's event alone; once zeta had joined, both were loaded.
    assert loads.loads[0] == [acme_pool]
    assert sorted(loads.loads[1]) == sorted([acme_pool, zeta_pool])
    for collector in (watching, zeta_watching):
        await collector.close()
