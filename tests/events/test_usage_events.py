"""`pool.usage` (CONTRACT section 10 "Usage events"; docs/decisions/0012, "`pool.usage`"):
state, not history. Real websocket subscribers (graphql-transport-ws through a real
uvicorn server), real bookings and releases over REST, on both dialects: a client that
applies the usage events it receives holds what a refetch answers, for the owner, a
guest and a descendant booking through its ancestor's offer, live and after a resume."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from gql.transport.websockets import WebsocketsTransport
from sqlalchemy import select, update

from app.capacity import booking, booking_release
from app.config import Settings
from app.db.engine import Database
from app.db.models import CapacityRow, QuotaRow
from app.events.usage import UsageStamp
from tests.events.conftest import served
from tests.events.support import wait_until
from tests.events.test_websocket import Stream, http_api, subscribed, ws_client
from tests.rest.scene import Scene
from tests.support import Api, Fleet

Json = dict[str, Any]
PROTOCOL = WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL
EVENTS = """
subscription($tenantId: String!, $after: String, $types: [String!]) {
  poolEvents(tenantId: $tenantId, after: $after, types: $types) {
    cursor type poolId tenantId data
  }
}
"""
WAIT_S = 60.0  # as test_websocket: the horizon is the shared server's


async def refetch(api: Api, token: str, tenant: str, pool_id: str) -> Json:
    """What the tenant's own queries show of the pool's usage: `pools/get` (its rows, and
    for the owner every offer's) and `pools/capacity` (None where it may not read it)."""
    body = {"tenantId": tenant, "poolId": pool_id}
    pool = (await api.ok(token, "pools/get", body))["pool"]
    quotas = {
        ((q.get("grant") or {}).get("tenantId", tenant), q["resource"]): (q["max"], q["used"])
        for q in pool["quotas"]
    }
    for offer in pool.get("offers") or []:
        for q in offer["quotas"]:
            quotas[(offer["tenantId"], q["resource"])] = (q["max"], q["used"])
    answer = await api.post(token, "pools/capacity", body)
    capacity = None
    if answer.status_code == 200:
        capacity = {c["resource"]: (c["booked"], c["available"]) for c in answer.json()["capacity"]}
    return {"quotas": quotas, "capacity": capacity, "version": pool["version"]}


def apply(state: Json, data: Json) -> None:
    """Patches a held state with a `pool.usage` event's rows."""
    for q in data["quotas"]:
        state["quotas"][(q["tenantId"], q["resource"])] = (q["max"], q["used"])
    if "capacity" in data and state["capacity"] is not None:
        capacity = dict(state["capacity"])
        for c in data["capacity"]:
            capacity[c["resource"]] = (c["booked"], c["available"])
        state["capacity"] = capacity


class Client:
    """A live client: the state it fetched, patched with every `pool.usage` it receives."""

    def __init__(self, stream: Stream, state: Json, pool_id: str) -> None:
        self.stream = stream
        self.state = {"quotas": dict(state["quotas"]), "capacity": state["capacity"]}
        self.pool_id = pool_id
        self.events: list[Json] = []
        self.received: list[float] = []  # loop time each usage event arrived
        self.states: list[Json] = []  # the state after each usage event
        self.cursor: str | None = None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            event = await self.stream.next()
            self.events.append(event)
            self.cursor = event["cursor"]
            if event["type"] != "pool.usage" or event["poolId"] != self.pool_id:
                continue
            self.received.append(time.monotonic())
            apply(self.state, event["data"])
            self.states.append(
                {"quotas": dict(self.state["quotas"]), "capacity": self.state["capacity"]}
            )

    def usage(self) -> list[Json]:
        return [e for e in self.events if e["type"] == "pool.usage"]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.stream.close()


class PoolsClient:
    """A live client of several pools: the state it fetched of each, patched with every
    `pool.usage` it receives."""

    def __init__(self, stream: Stream, states: dict[str, Json]) -> None:
        self.stream = stream
        self.states = {
            p: {"quotas": dict(x["quotas"]), "capacity": x["capacity"]} for p, x in states.items()
        }
        self.events: list[Json] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            event = await self.stream.next()
            self.events.append(event)
            if event["type"] == "pool.usage" and event["poolId"] in self.states:
                apply(self.states[event["poolId"]], event["data"])

    def usage(self) -> list[Json]:
        return [e for e in self.events if e["type"] == "pool.usage"]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.stream.close()


async def refetch_all(api: Api, token: str, tenant: str, pools: list[str]) -> dict[str, Json]:
    return {pool_id: held(await refetch(api, token, tenant, pool_id)) for pool_id in pools}


async def until_all_equal(client: PoolsClient, expected: dict[str, Json]) -> None:
    try:
        await wait_until(lambda: client.states == expected, within_s=WAIT_S)
    except AssertionError:
        raise AssertionError(f"held {client.states}, refetched {expected}") from None


def held(expected: Json) -> Json:
    return {"quotas": expected["quotas"], "capacity": expected["capacity"]}


async def until_equal(client: Client, expected: Json) -> None:
    try:
        await wait_until(lambda: client.state == held(expected), within_s=WAIT_S)
    except AssertionError:
        raise AssertionError(f"held {client.state}, refetched {held(expected)}") from None


async def test_a_client_applying_usage_events_equals_a_refetch(
    database_url: str, fleet: Fleet
) -> None:
    """After every booking and release, each subscriber's applied state equals its own
    refetch: the owner (every row), a guest, and a descendant that books through the
    guest's offer; bookings leave `version` alone; a resume after a usage cursor, and one
    after an outbox event's cursor, gets the latest values."""
    async with (
        served(Settings(database_url=database_url, usage_coalesce_ms=50)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        tokens = {
            "acme": s.token,
            "beta": await s.guest("beta"),
            "beta-dev": await s.guest("beta-dev", parent="beta"),
        }
        pool_id = (await s.pool())["id"]
        await fleet.node(pool_id, 8)
        await s.offer(pool_id, "acme", {"gpu": 8})
        await s.offer(pool_id, "beta", {"gpu": 4}, includeDescendants=True)
        version = (await s.get(pool_id))["version"]
        clients: dict[str, Client] = {}
        for tenant, token in tokens.items():
            stream = Stream(ws_client(address, token, PROTOCOL), EVENTS, tenantId=tenant)
            await subscribed(app, len(clients) + 1)
            clients[tenant] = Client(stream, await refetch(api, token, tenant, pool_id), pool_id)

        async def check() -> None:
            for tenant, client in clients.items():
                expected = await refetch(api, tokens[tenant], tenant, pool_id)
                assert expected["version"] == version  # bookings do not move it
                await until_equal(client, expected)

        beta = await s.reserve(pool_id, {"gpu": 2}, tokens["beta"], "beta")
        await check()
        dev = await s.reserve(pool_id, {"gpu": 1}, tokens["beta-dev"], "beta-dev")
        await check()
        own = await s.reserve(pool_id, {"gpu": 3})
        await check()
        await s.release(beta["id"], tokens["beta"], "beta")
        await check()
        assert all(client.usage() for client in clients.values())
        # The descendant books against its ancestor's rows and sees only those.
        assert {
            q["tenantId"] for e in clients["beta-dev"].usage() for q in e["data"]["quotas"]
        } == {"beta"}

        # Away, then back after its last usage cursor: the latest values, not each change.
        away = clients.pop("beta-dev")
        await away.close()
        last = away.usage()[-1]["cursor"]
        assert base64.urlsafe_b64decode(last + "==").startswith(b"ev3:")
        await s.release(dev["id"], tokens["beta-dev"], "beta-dev")
        again = await s.reserve(pool_id, {"gpu": 2}, tokens["beta-dev"], "beta-dev")
        resumed = Stream(
            ws_client(address, tokens["beta-dev"], PROTOCOL),
            EVENTS,
            tenantId="beta-dev",
            after=last,
        )
        clients["beta-dev"] = Client(resumed, away.state, pool_id)
        await check()
        # Two changes while away; the first event after the resume is already the latest.
        expected = await refetch(api, tokens["beta-dev"], "beta-dev", pool_id)
        assert clients["beta-dev"].states[0] == held(expected)

        # Back after an outbox event's cursor (it says nothing of usage): the latest values
        # of every pool booked that it may see, and no outbox event twice.
        owner = clients["acme"]
        version = (await s.offer(pool_id, "beta", {"gpu": 5}, includeDescendants=True))["version"]
        await wait_until(lambda: owner.events[-1]["type"] == "pool.offered", WAIT_S)
        clients.pop("acme")
        await owner.close()
        plain = owner.events[-1]["cursor"]
        await s.release(own["id"])
        await s.release(again["id"], tokens["beta-dev"], "beta-dev")
        resumed = Stream(
            ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", after=plain
        )
        clients["acme"] = Client(resumed, owner.state, pool_id)
        await check()
        assert [e["type"] for e in clients["acme"].events] == ["pool.usage"]
        for client in clients.values():
            await client.close()


async def test_a_subscriber_sees_only_the_rows_its_query_shows(
    database_url: str, fleet: Fleet
) -> None:
    """A guest never receives another guest's quota row: of another guest's booking it
    hears only what its own queries show (the pool's capacity), its own rows unchanged."""
    async with (
        served(Settings(database_url=database_url, usage_coalesce_ms=50)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        tokens = {"beta": await s.guest("beta"), "gamma": await s.guest("gamma")}
        pool_id = (await s.pool())["id"]
        await fleet.node(pool_id, 8)
        await s.offer(pool_id, "beta", {"gpu": 2})
        await s.offer(pool_id, "gamma", {"gpu": 2})
        clients: dict[str, Client] = {}
        for tenant, token in tokens.items():
            stream = Stream(
                ws_client(address, token, PROTOCOL), EVENTS, tenantId=tenant, types=["pool.usage"]
            )
            await subscribed(app, len(clients) + 1)
            clients[tenant] = Client(stream, await refetch(api, token, tenant, pool_id), pool_id)

        await s.reserve(pool_id, {"gpu": 1}, tokens["beta"], "beta")
        await until_equal(clients["beta"], await refetch(api, tokens["beta"], "beta", pool_id))
        await s.reserve(pool_id, {"gpu": 2}, tokens["gamma"], "gamma")
        await until_equal(clients["gamma"], await refetch(api, tokens["gamma"], "gamma", pool_id))
        await s.reserve(pool_id, {"gpu": 1}, tokens["beta"], "beta")
        await until_equal(clients["beta"], await refetch(api, tokens["beta"], "beta", pool_id))
        for tenant, client in clients.items():
            shown = {q["tenantId"] for e in client.usage() for q in e["data"]["quotas"]}
            assert shown == {tenant}, (tenant, client.usage())
        # The capacity rows each guest reads move with every booking: each guest hears of
        # all three, with its own rows only.
        assert len(clients["gamma"].usage()) >= 2 and len(clients["beta"].usage()) >= 2
        for client in clients.values():
            await client.close()


async def test_a_burst_is_coalesced_and_ends_with_the_final_values(
    database_url: str, fleet: Fleet
) -> None:
    """Many bookings on one pool within a few windows: at most one event per window, far
    fewer than bookings, and the last one carries the final values."""
    window_ms = 250
    async with (
        served(Settings(database_url=database_url, usage_coalesce_ms=window_ms)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        beta_token = await s.guest("beta")
        pool_id = (await s.pool())["id"]
        await fleet.node(pool_id, 64)
        await s.offer(pool_id, "beta", {"gpu": 64})
        stream = Stream(
            ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", types=["pool.usage"]
        )
        await subscribed(app, 1)
        owner = Client(stream, await refetch(api, s.token, "acme", pool_id), pool_id)
        bookings = 40
        began = time.monotonic()
        for batch in range(0, bookings, 8):
            await asyncio.gather(
                *(
                    s.reserve(pool_id, {"gpu": 1}, beta_token, "beta")
                    for _ in range(batch, batch + 8)
                )
            )
        final = await refetch(api, s.token, "acme", pool_id)
        assert final["quotas"][("beta", "gpu")] == (64, bookings)
        await until_equal(owner, final)
        events = owner.usage()
        assert len(events) < bookings / 2, len(events)
        last = events[-1]["data"]
        assert {(q["tenantId"], q["resource"]): (q["max"], q["used"]) for q in last["quotas"]}[
            ("beta", "gpu")
        ] == (64, bookings)
        assert {c["resource"]: c["booked"] for c in last["capacity"]} == {"gpu": bookings}
        # One round per window at most, each one event for the pool: no more events than
        # windows between the first booking and the last arrival (and one started early).
        windows = (owner.received[-1] - began) / (window_ms / 1000)
        assert len(events) <= windows + 1, (len(events), windows)
        await owner.close()


async def test_resuming_after_any_usage_event_misses_no_pool_of_its_window(
    database_url: str, fleet: Fleet
) -> None:
    """Two pools booked in (most likely) one window: two events, one per pool. Resuming
    after the first one's cursor still gets the second pool's latest values."""
    async with (
        served(Settings(database_url=database_url, usage_coalesce_ms=1000)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        first, second = (await s.pool())["id"], (await s.pool())["id"]
        for pool_id in (first, second):
            await fleet.node(pool_id, 4)
            await s.offer(pool_id, "acme", {"gpu": 4})
        stream = Stream(
            ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", types=["pool.usage"]
        )
        await subscribed(app, 1)
        owner = Client(stream, await refetch(api, s.token, "acme", first), first)
        await asyncio.gather(s.reserve(first, {"gpu": 1}), s.reserve(second, {"gpu": 2}))
        await wait_until(lambda: len(owner.usage()) >= 2, WAIT_S)
        await owner.close()
        by_pool = [e["poolId"] for e in owner.usage()]
        assert sorted(by_pool[:2]) == sorted([first, second])
        earlier = owner.usage()[0]
        later_pool = by_pool[1]
        resumed = Stream(
            ws_client(address, s.token, PROTOCOL),
            EVENTS,
            tenantId="acme",
            types=["pool.usage"],
            after=earlier["cursor"],
        )
        again = Client(resumed, await refetch(api, s.token, "acme", later_pool), later_pool)
        expected = await refetch(api, s.token, "acme", later_pool)
        await wait_until(lambda: later_pool in [e["poolId"] for e in again.usage()], WAIT_S)
        assert again.state == held(expected)
        await again.close()


async def test_types_filters_take_pool_usage_and_other_types_stay_exactly_once(
    database_url: str, fleet: Fleet
) -> None:
    async with (
        served(Settings(database_url=database_url, usage_coalesce_ms=50)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        beta_token = await s.guest("beta")
        pool_id = (await s.pool())["id"]
        await fleet.node(pool_id, 8)

        def stream(**arguments: Any) -> Stream:
            return Stream(
                ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", **arguments
            )

        usage_only, offers_only, everything = (
            stream(types=["pool.usage"]),
            stream(types=["pool.offered"]),
            stream(),
        )
        await subscribed(app, 3)
        start = await refetch(api, s.token, "acme", pool_id)
        clients = [Client(x, start, pool_id) for x in (usage_only, offers_only, everything)]
        steps: list[Callable[[], Awaitable[object]]] = [
            lambda: s.offer(pool_id, "beta", {"gpu": 4}),
            lambda: s.reserve(pool_id, {"gpu": 2}, beta_token, "beta"),
            lambda: s.offer(pool_id, "beta", {"gpu": 3}),
            lambda: s.reserve(pool_id, {"gpu": 1}, beta_token, "beta"),
        ]
        for i, step in enumerate(steps):
            await step()
            if i % 2:  # a booking: the usage-only client holds the rows as they are now
                await until_equal(clients[0], await refetch(api, s.token, "acme", pool_id))
        await until_equal(clients[2], await refetch(api, s.token, "acme", pool_id))
        await wait_until(lambda: len(clients[1].events) >= 2, WAIT_S)
        for client in clients:
            await client.close()

    assert {e["type"] for e in clients[0].events} == {"pool.usage"}
    assert [e["type"] for e in clients[1].events] == ["pool.offered"] * 2
    # "From now" may include the create that committed just before, still above the
    # horizon (docs/decisions/0012): what follows it is exactly once.
    outbox = [
        e
        for e in clients[2].events
        if e["type"] != "pool.usage" and e["data"]["version"] > start["version"]
    ]
    versions = [start["version"] + 1, start["version"] + 2]
    assert [(e["type"], e["data"]["version"]) for e in outbox] == [
        ("pool.offered", v) for v in versions
    ]
    assert [e["data"]["version"] for e in clients[1].events] == versions
    assert {"pool.offered", "pool.usage"} <= {e["type"] for e in clients[2].events}


async def stamps(db: Database, pool_id: str, tenant_id: str) -> list[int]:
    """The stamps of the tenant's quota rows and the pool's capacity rows."""
    async with db.reader.connect() as conn:
        quota = await conn.execute(
            select(QuotaRow.usage_tx).where(
                QuotaRow.pool_id == pool_id, QuotaRow.tenant_id == tenant_id
            )
        )
        capacity = await conn.execute(
            select(CapacityRow.usage_tx).where(CapacityRow.pool_id == pool_id)
        )
        return [*quota.scalars(), *capacity.scalars()]


async def test_both_booking_paths_stamp_the_rows_they_move(
    api: Api, fleet: Fleet, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement booking and release (PostgreSQL, an unnarrowed caller) and the
    plain path (a caller narrowed by pool attributes; every call on SQLite) both stamp
    `usage_tx`, each stamp above the ones before: they share the builders."""
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool(gpuModel="H100"))["id"]
    await fleet.node(pool_id, 8)
    await s.offer(pool_id, "beta", {"gpu": 4})
    await s.guest("beta")
    callers = {
        "one statement": await fleet.caller("beta", "admin"),
        "plain": await fleet.caller("beta", "admin", gpuModel="H100"),
    }
    assert set(await stamps(db, pool_id, "beta")) == {0}  # no booking yet
    answered: list[bool] = []  # whether the one statement answered each call

    def spy(real: Any) -> Any:
        async def call(*args: Any) -> Any:
            answer = await real(*args)
            answered.append(answer is not None)
            return answer

        return call

    monkeypatch.setattr(booking, "book", spy(booking.book))
    monkeypatch.setattr(booking_release, "release", spy(booking_release.release))
    newest = 0
    for token in callers.values():
        booked = await s.reserve(pool_id, {"gpu": 1}, token, "beta")
        after_booking = await stamps(db, pool_id, "beta")
        assert min(after_booking) > newest, after_booking  # beta's row and the capacity row
        newest = max(after_booking)
        await s.release(booked["id"], token, "beta")
        after_release = await stamps(db, pool_id, "beta")
        assert min(after_release) > newest, after_release
        newest = max(after_release)
    if db.dialect == "postgresql" and Settings().compiled_reads:
        assert answered == [True, True, False, False]
    else:  # SQLite, or the plain path (BETTERCOMPUTE_FAST_PATH=false): never attempted
        assert not any(answered)


BOUND = 3  # usage_round_rows in the tests below: fewer than the rows they stamp


async def test_a_resume_after_an_outbox_cursor_is_read_a_bounded_batch_per_round(
    database_url: str, fleet: Fleet
) -> None:
    """Resumed after an outbox event's cursor (usage from stamp 1: every pool ever booked),
    a subscriber gets the latest usage of all eight booked pools over several rounds, each
    reading at most `usage_round_rows` rows, and what it applied equals a refetch."""
    settings = Settings(database_url=database_url, usage_coalesce_ms=50, usage_round_rows=BOUND)
    async with served(settings) as (app, address), http_api(address) as api:
        relay = app.state.relay
        s = await Scene.start(api, fleet)
        pools = [(await s.pool())["id"] for _ in range(8)]
        for pool_id in pools:
            await fleet.node(pool_id, 4)
            await s.offer(pool_id, "acme", {"gpu": 4})
        stream = Stream(ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme")
        await subscribed(app, 1)
        away = PoolsClient(stream, {})
        await s.offer(pools[0], "acme", {"gpu": 3})
        await wait_until(lambda: any(e["type"] == "pool.offered" for e in away.events), WAIT_S)
        await away.close()
        plain = [e for e in away.events if e["type"] == "pool.offered"][-1]["cursor"]
        fetched = await refetch_all(api, s.token, "acme", pools)
        for i, pool_id in enumerate(pools):
            await s.reserve(pool_id, {"gpu": 1 + i % 3})
        expected = await refetch_all(api, s.token, "acme", pools)
        assert all(expected[p] != fetched[p] for p in pools)
        rounds = relay.usage_rounds

        resumed = Stream(
            ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", after=plain
        )
        client = PoolsClient(resumed, fetched)
        await until_all_equal(client, expected)
        assert {e["poolId"] for e in client.usage()} == set(pools)
        assert [e["type"] for e in client.events] == ["pool.usage"] * len(client.events)
        # Every pool stamped at least one row: more rows than one round may read.
        assert relay.usage_rows_most <= BOUND, relay.usage_rows_most
        assert relay.usage_rounds - rounds >= -(-len(pools) // BOUND)
        assert relay.usage_rows_read >= len(pools)
        await client.close()


async def test_one_statement_stamping_more_rows_than_the_bound_is_delivered(
    database_url: str, fleet: Fleet
) -> None:
    """One statement (one transaction, so one stamp on either dialect) moves the owner's
    quota row of eight pools: more rows of one stamp than a round reads. The rounds still
    move on through them (no livelock), every pool is delivered, and resuming after the
    first of those events misses none of the pools after it."""
    settings = Settings(database_url=database_url, usage_coalesce_ms=50, usage_round_rows=BOUND)
    async with served(settings) as (app, address), http_api(address) as api:
        relay = app.state.relay
        db: Database = app.state.db
        s = await Scene.start(api, fleet)
        pools = [(await s.pool())["id"] for _ in range(8)]
        for pool_id in pools:
            await fleet.node(pool_id, 4)
            await s.offer(pool_id, "acme", {"gpu": 4})
        stream = Stream(
            ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", types=["pool.usage"]
        )
        await subscribed(app, 1)
        client = PoolsClient(stream, await refetch_all(api, s.token, "acme", pools))
        async with db.writer.begin() as conn:
            await conn.execute(
                update(QuotaRow)
                .where(QuotaRow.pool_id.in_(pools), QuotaRow.tenant_id == "acme")
                .values(used=QuotaRow.used + 1, usage_tx=UsageStamp())
            )
        async with db.reader.connect() as conn:
            stamped = (
                (await conn.execute(select(QuotaRow.usage_tx).where(QuotaRow.pool_id.in_(pools))))
                .scalars()
                .all()
            )
        assert len(stamped) == len(pools) > BOUND and len(set(stamped)) == 1, stamped
        expected = await refetch_all(api, s.token, "acme", pools)
        await until_all_equal(client, expected)
        assert relay.usage_rows_most <= BOUND, relay.usage_rows_most
        await client.close()
        order = [e["poolId"] for e in client.usage()]
        assert sorted(order) == sorted(pools), order

        first = client.usage()[0]
        resumed = Stream(
            ws_client(address, s.token, PROTOCOL),
            EVENTS,
            tenantId="acme",
            types=["pool.usage"],
            after=first["cursor"],
        )
        later = {p: expected[p] for p in order[1:]}
        again = PoolsClient(resumed, await refetch_all(api, s.token, "acme", pools))
        await wait_until(lambda: set(later) <= {e["poolId"] for e in again.usage()}, WAIT_S)
        assert {p: again.states[p] for p in later} == later
        assert relay.usage_rows_most <= BOUND, relay.usage_rows_most
        await again.close()


async def test_a_subscriber_catching_up_does_not_hold_back_one_that_is_level(
    database_url: str, fleet: Fleet
) -> None:
    """While one subscriber resumed after an outbox cursor works through a backlog (rounds
    of at most `usage_round_rows` rows), one level with the horizon still gets a new
    booking's usage in the next rounds, not after the backlog."""
    settings = Settings(database_url=database_url, usage_coalesce_ms=300, usage_round_rows=BOUND)
    async with served(settings) as (app, address), http_api(address) as api:
        relay = app.state.relay
        s = await Scene.start(api, fleet)
        pools = [(await s.pool())["id"] for _ in range(13)]
        for pool_id in pools:
            await fleet.node(pool_id, 4)
            await s.offer(pool_id, "acme", {"gpu": 4})
        backlog, fresh = pools[:-1], pools[-1]
        stream = Stream(ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme")
        await subscribed(app, 1)
        away = PoolsClient(stream, {})
        await s.offer(pools[0], "acme", {"gpu": 3})
        await wait_until(lambda: any(e["type"] == "pool.offered" for e in away.events), WAIT_S)
        await away.close()
        plain = [e for e in away.events if e["type"] == "pool.offered"][-1]["cursor"]
        for pool_id in backlog:
            await s.reserve(pool_id, {"gpu": 1})

        level = PoolsClient(
            Stream(
                ws_client(address, s.token, PROTOCOL),
                EVENTS,
                tenantId="acme",
                types=["pool.usage"],
            ),
            await refetch_all(api, s.token, "acme", [fresh]),
        )
        await subscribed(app, 1)
        behind = PoolsClient(
            Stream(ws_client(address, s.token, PROTOCOL), EVENTS, tenantId="acme", after=plain),
            await refetch_all(api, s.token, "acme", backlog),
        )
        await wait_until(lambda: bool(behind.usage()), WAIT_S)  # live and catching up
        await s.reserve(fresh, {"gpu": 2})
        expected = await refetch_all(api, s.token, "acme", [fresh])
        await until_all_equal(level, expected)
        caught_up = {e["poolId"] for e in behind.usage()}
        assert not set(backlog) <= caught_up, caught_up  # the backlog was not through yet
        await until_all_equal(behind, await refetch_all(api, s.token, "acme", backlog))
        assert relay.usage_rows_most <= BOUND, relay.usage_rows_most
        for client in (level, behind):
            await client.close()
