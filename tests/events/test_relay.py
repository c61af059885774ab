"""The relay and subscriptions, below any transport: who receives which event, resume
from a cursor, slow subscribers, retention. Mutations go through the real REST app."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.applications import Starlette

from app.capacity.service import Capacity
from app.errors import DomainError, InvalidInput, InvalidState, PermissionDenied
from app.events.cursor import START, Position, encode_cursor
from app.events.reader import outbox_bounds, read_events
from app.events.relay import Relay
from tests.events.conftest import AppFactory
from tests.events.support import emit_updates, settle, subscribe, visible_outbox, wait_until
from tests.rest.scene import Scene
from tests.support import Api, Fleet


async def test_each_tenant_receives_the_events_it_may_see(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    beta_dev = await s.guest("beta-dev", parent="beta")
    gamma = await s.guest("gamma")
    delta = await s.guest("delta")
    beta_h100 = await fleet.caller("beta", "viewer", gpuModel="H100")
    beta_a100 = await fleet.caller("beta", "viewer", gpuModel="A100")
    seen = {
        "acme": await subscribe(app, s.token, "acme"),
        "beta": await subscribe(app, beta, "beta"),
        "beta-dev": await subscribe(app, beta_dev, "beta-dev"),
        "gamma": await subscribe(app, gamma, "gamma"),
        "delta": await subscribe(app, delta, "delta"),
        "beta viewer of H100 pools": await subscribe(app, beta_h100, "beta"),
        "beta viewer of A100 pools": await subscribe(app, beta_a100, "beta"),
    }

    pool_id = (await s.pool(gpuModel="H100"))["id"]
    await s.offer(pool_id, "beta", {"gpu": 2}, includeDescendants=True)
    await s.offer(pool_id, "gamma", {"gpu": 1})
    await s.unoffer(pool_id, "gamma")
    await api.ok(s.token, "pools/update", s.body(pool_id, policy={"singleTenant": False}))
    await settle(app, *seen.values())

    assert {who: c.types() for who, c in seen.items()} == {
        "acme": ["pool.created", "pool.offered", "pool.offered", "pool.unoffered", "pool.updated"],
        "beta": ["pool.offered", "pool.updated"],
        # through beta's offer, which includes descendants
        "beta-dev": ["pool.offered", "pool.updated"],
        # its unoffer, then nothing more of the pool
        "gamma": ["pool.offered", "pool.unoffered"],
        "delta": [],
        "beta viewer of H100 pools": ["pool.offered", "pool.updated"],
        "beta viewer of A100 pools": [],
    }
    assert all(e.pool_id == pool_id for c in seen.values() for e in c.events)
    for collector in seen.values():
        await collector.close()


async def test_an_archive_reaches_the_removed_tenants_and_nothing_follows(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    beta = await subscribe(app, await s.guest("beta"), "beta")
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "beta", {"gpu": 1})
    await s.archive(pool_id)
    other = (await s.pool())["id"]
    await s.offer(other, "beta", {"gpu": 1})
    await settle(app, beta)
    assert [(e.type, e.pool_id) for e in beta.events] == [
        ("pool.offered", pool_id),
        ("pool.archived", pool_id),
        ("pool.offered", other),
    ]
    await beta.close()


async def test_pool_and_type_filters(app: Starlette, api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    first = (await s.pool())["id"]
    second = (await s.pool())["id"]
    only_first = await subscribe(app, s.token, "acme", poolId=first)
    only_offers = await subscribe(app, s.token, "acme", types=["pool.offered", "pool.unoffered"])
    for pool_id in (first, second):
        await s.offer(pool_id, "beta", {"gpu": 1})
        await api.ok(s.token, "pools/update", s.body(pool_id, policy={}))
        await s.unoffer(pool_id, "beta")
    await settle(app, only_first, only_offers)
    assert [e.type for e in only_first.events] == ["pool.offered", "pool.updated", "pool.unoffered"]
    assert {e.pool_id for e in only_first.events} == {first}
    assert [(e.type, e.pool_id) for e in only_offers.events] == [
        ("pool.offered", first),
        ("pool.unoffered", first),
        ("pool.offered", second),
        ("pool.unoffered", second),
    ]
    await only_first.close()
    await only_offers.close()


async def test_resume_after_a_cursor_replays_then_continues_live(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    capacity: Capacity = app.state.capacity
    pool_id = (await s.pool())["id"]
    await emit_updates(capacity, pool_id, "acme", 10)
    watching = await subscribe(app, s.token, "acme")
    await emit_updates(capacity, pool_id, "acme", 1, start=10)
    await settle(app, watching)
    [eleventh] = watching.events
    assert eleventh.data == {"n": 10}

    # Resume after the 3rd update: the 4th..11th from the outbox, then live.
    async with visible_outbox(capacity.db) as conn:
        stored = await read_events(conn, START, limit=100)
    (third,) = [e.position for e in stored if e.data == {"n": 2}]
    resumed = await subscribe(app, s.token, "acme", after=encode_cursor(third))
    await emit_updates(capacity, pool_id, "acme", 5, start=11)
    await settle(app, resumed)
    assert [e.data["n"] for e in resumed.events] == list(range(3, 16))
    assert resumed.positions == sorted(set(resumed.positions))
    # From the very beginning: the created event first, the same rule as live.
    everything = await subscribe(app, s.token, "acme", after=encode_cursor(0))
    await settle(app, everything)
    assert everything.types() == ["pool.created"] + ["pool.updated"] * 16
    for collector in (watching, resumed, everything):
        await collector.close()


async def test_a_slow_subscriber_is_resynced_from_the_outbox_exactly_once(
    app_with: AppFactory, api: Api, fleet: Fleet
) -> None:
    async with app_with(subscriber_queue_size=5) as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        slow = await subscribe(app, s.token, "acme", delay_s=0.0005)
        fast = await subscribe(app, s.token, "acme")
        for batch in range(3):
            await emit_updates(capacity, pool_id, "acme", 100, start=batch * 100)
        await settle(app, slow, fast)
        for collector in (slow, fast):
            assert [e.data["n"] for e in collector.events] == list(range(300))
        assert slow.subscription.resyncs > 0  # it did fall behind, and caught up
        await slow.close()
        await fast.close()


async def test_a_client_that_stops_taking_events_is_evicted(
    app_with: AppFactory, api: Api, fleet: Fleet
) -> None:
    async with app_with(subscriber_stall_timeout_s=0.3) as app:
        s = await Scene.start(api, fleet)
        relay: Relay = app.state.relay
        pool_id = (await s.pool())["id"]
        stuck = await subscribe(app, s.token, "acme", delay_s=3600)  # never comes back
        evicted = asyncio.Event()
        stuck.subscription.on_evict = evicted.set
        healthy = await subscribe(app, s.token, "acme")
        await emit_updates(app.state.capacity, pool_id, "acme", 3)
        await asyncio.wait_for(evicted.wait(), 60)  # a bound on a hang, not the speed
        await wait_until(stuck.task.done)
        assert stuck.task.cancelled() and len(stuck.events) == 1
        await settle(app, healthy)
        assert len(healthy.events) == 3 and relay.subscriptions == 1
        await healthy.close()


@pytest.mark.parametrize(
    ("arguments", "error", "field"),
    [
        ({"after": "not-a-cursor"}, InvalidInput, "after"),
        ({"after": encode_cursor(Position(2**62, 1))}, InvalidInput, "after"),  # never issued
        ({"types": ["pool.deleted"]}, InvalidInput, "types[0]"),
        ({"poolId": "site_01"}, InvalidInput, "poolId"),
        ({"tenantId": "beta"}, PermissionDenied, "tenantId"),
    ],
)
async def test_refused_subscriptions(
    app: Starlette,
    api: Api,
    fleet: Fleet,
    arguments: dict[str, object],
    error: type[DomainError],
    field: str,
) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    rest = dict(arguments)
    tenant_id = str(rest.pop("tenantId", "acme"))
    with pytest.raises(error) as refused:
        await subscribe(app, s.token, tenant_id, **rest)
    assert refused.value.field == field


async def test_a_cursor_older_than_the_retention_window_is_expired(
    app_with: AppFactory, api: Api, fleet: Fleet
) -> None:
    async with app_with(event_retention_s=1) as app:
        s = await Scene.start(api, fleet)
        capacity: Capacity = app.state.capacity
        pool_id = (await s.pool())["id"]
        await emit_updates(capacity, pool_id, "acme", 5)
        async with visible_outbox(capacity.db) as conn:
            bounds = await outbox_bounds(conn)
        first, newest = bounds.oldest, bounds.newest
        assert first is not None

        async def oldest() -> Position | None:
            async with capacity.db.reader.connect() as conn:
                return (await outbox_bounds(conn)).oldest

        deadline = time.monotonic() + 60  # the pruner runs every second; a busy machine lags
        while time.monotonic() < deadline:
            if await oldest() == newest:  # the newest event is always kept
                break
            await asyncio.sleep(0.1)
        assert await oldest() == newest
        with pytest.raises(InvalidState) as expired:
            await subscribe(app, s.token, "acme", after=encode_cursor(first))
        assert expired.value.details == {"field": "after", "reason": "CURSOR_EXPIRED"}
        # The position pruned through misses nothing: still valid, exactly.
        async with capacity.db.reader.connect() as conn:
            pruned = (await outbox_bounds(conn)).pruned
        assert first <= pruned < newest
        resumed = await subscribe(app, s.token, "acme", after=encode_cursor(pruned))
        await settle(app, resumed)
        assert [e.data["n"] for e in resumed.events] == [4]
        await resumed.close()


async def test_an_archive_tells_each_guest_only_of_itself(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """No event tells a tenant who else held an offer: the owner reads every removed
    tenant, each guest only itself."""
    s = await Scene.start(api, fleet)
    owner = await subscribe(app, s.token, "acme")
    beta = await subscribe(app, await s.guest("beta"), "beta")
    gamma = await subscribe(app, await s.guest("gamma"), "gamma")
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "beta", {"gpu": 1})
    await s.offer(pool_id, "gamma", {"gpu": 1})
    await s.archive(pool_id)
    await settle(app, owner, beta, gamma)

    def removed(collector: object) -> list[str]:
        archived = [e for e in collector.events if e.type == "pool.archived"]  # type: ignore[attr-defined]
        assert len(archived) == 1
        return list(archived[0].data["removedTenantIds"])

    assert sorted(removed(owner)) == ["beta", "gamma"]
    assert removed(beta) == ["beta"]
    assert removed(gamma) == ["gamma"]
    for collector in (owner, beta, gamma):
        await collector.close()
