"""An event shows a subscriber nothing a query by the same caller would not (CONTRACT
section 7): no secret of a pool's policy, no other tenant's offer. Real websocket
subscribers (graphql-transport-ws through a real uvicorn server), on both dialects."""

from __future__ import annotations

import json
import time
from typing import Any

from gql.transport.websockets import WebsocketsTransport
from starlette.applications import Starlette

from app.config import Settings
from app.events.cursor import encode_cursor
from app.events.reader import outbox_bounds
from app.events.relay import Relay
from tests.events.conftest import served
from tests.events.support import settle, subscribe, wait_until
from tests.events.test_websocket import Stream, http_api, ws_client
from tests.rest.scene import Scene
from tests.support import Api, Fleet

Json = dict[str, Any]
PROTOCOL = WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL
TOKEN = "s3cr3t.w3bs0ck3tt0k3n"
HASH = "sha256:" + "ab" * 32
JOIN_SET: Json = {"apiServer": "https://k8s.example.com:6443", "token": TOKEN, "caCertHash": HASH}
SHOWN: Json = {"apiServer": "https://k8s.example.com:6443", "tokenSet": True, "caCertHash": HASH}

WITH_POOL = """
subscription($tenantId: String!, $after: String) {
  poolEvents(tenantId: $tenantId, after: $after) {
    cursor type poolId data pool { id policy }
  }
}
"""
LIGHT = """
subscription($tenantId: String!) {
  poolEvents(tenantId: $tenantId) { cursor type poolId data }
}
"""


async def subscribed(app: Starlette, count: int) -> None:
    relay: Relay = app.state.relay
    await wait_until(lambda: relay.subscriptions >= count)


async def test_no_event_carries_a_policy_secret(database_url: str, fleet: Fleet) -> None:
    """`PoolEvent.pool` and `PoolEvent.data`, live and replayed, to the owner and a guest."""
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        beta_token = await s.guest("beta", role="viewer")
        pool_id = (await s.pool())["id"]
        await s.offer(pool_id, "beta", {"gpu": 1})
        owner = Stream(ws_client(address, s.token, PROTOCOL), WITH_POOL, tenantId="acme")
        beta = Stream(ws_client(address, beta_token, PROTOCOL), WITH_POOL, tenantId="beta")
        await subscribed(app, 2)

        policy = {"kubernetes": {**JOIN_SET, "labels": {"team": "ml"}}}
        await api.ok(s.token, "pools/update", s.body(pool_id, policy=policy))
        seen = [await owner.next(), await beta.next()]
        # Sent back as read: the stored token is kept, and still shown to no one.
        read = {"kubernetes": {**SHOWN, "labels": {"team": "infra"}}}
        await api.ok(s.token, "pools/update", s.body(pool_id, policy=read))
        seen += [await owner.next(), await beta.next()]
        replayed = Stream(
            ws_client(address, s.token, PROTOCOL),
            WITH_POOL,
            tenantId="acme",
            after=seen[0]["cursor"],
        )
        seen.append(await replayed.next())
        for stream in (owner, beta, replayed):
            await stream.close()

    assert [(e["type"], e["poolId"], e["pool"]["id"]) for e in seen] == [
        ("pool.updated", pool_id, pool_id)
    ] * 5
    assert [e["data"]["version"] for e in seen] == [3, 3, 4, 4, 4]  # after one offer
    # `pool` is read when the event is sent, so either policy may show; neither has a token.
    assert all(e["pool"]["policy"]["kubernetes"]["tokenSet"] is True for e in seen)
    assert seen[-1]["pool"]["policy"] == read
    assert TOKEN not in json.dumps(seen)


async def test_each_subscriber_reads_only_the_offers_it_may_query(
    database_url: str, fleet: Fleet
) -> None:
    """Offer details go whole only to the owner's callers with compute:pools:share, and to
    the tenant whose offer it is; a tenant seeing the pool through an ancestor's offer gets
    that offer's events with its id only, and nothing of another tenant's offer; an
    archive's removed tenants are each subscriber's own lineage. A caller narrowed to
    H100 pools hears nothing of an A100 pool (docs/events.md)."""
    async with (
        served(Settings(database_url=database_url)) as (app, address),
        http_api(address) as api,
    ):
        s = await Scene.start(api, fleet)
        tokens = {
            "owner admin": s.token,
            "owner admin of H100 pools": await fleet.caller("acme", "admin", gpuModel="H100"),
            "owner viewer": await fleet.caller("acme", "viewer"),
            "owner's descendant": await s.guest("acme-dev", parent="acme"),
            "guest": await s.guest("beta"),
            "guest with descendants": await s.guest("gamma", role="viewer"),
            "that guest's descendant": await s.guest("gamma-dev", parent="gamma"),
        }
        tenants = {
            "owner admin": "acme",
            "owner admin of H100 pools": "acme",
            "owner viewer": "acme",
            "owner's descendant": "acme-dev",
            "guest": "beta",
            "guest with descendants": "gamma",
            "that guest's descendant": "gamma-dev",
        }
        # A last event every subscriber receives: once it arrives, all before it did.
        sentinel = (await s.pool(gpuModel="H100"))["id"]
        await s.offer(sentinel, "acme", {"gpu": 1}, includeDescendants=True)
        await s.offer(sentinel, "beta", {"gpu": 1})
        await s.offer(sentinel, "gamma", {"gpu": 1}, includeDescendants=True)
        streams = {
            who: Stream(ws_client(address, token, PROTOCOL), LIGHT, tenantId=tenants[who])
            for who, token in tokens.items()
        }
        await subscribed(app, len(streams))
        owner = streams["owner admin"]
        owner_received: list[Json] = []

        async def step(path: str, body: Json) -> Json:
            """One change, then wait until the relay fanned its event out to everyone
            (the owner's admin receives every event), so the next change comes after."""
            answer: Json = await api.ok(s.token, path, body)
            owner_received.append(await owner.next())
            return answer

        pool = (await step("pools/create", _create(s)))["pool"]["id"]
        await step("pools/offer", s.body(pool, toTenantId="acme", quota={"gpu": 8}) | _desc())
        await step("pools/offer", s.body(pool, toTenantId="beta", quota={"gpu": 2}, priority=5))
        await step("pools/offer", s.body(pool, toTenantId="gamma", quota={"gpu": 3}) | _desc())
        await step("pools/update", s.body(pool, policy={"kubernetes": JOIN_SET}))
        await step("pools/unoffer", s.body(pool, toTenantId="beta"))
        other = (await step("pools/create", _create(s, "A100")))["pool"]["id"]
        await step("pools/archive", s.body(pool))
        await api.ok(s.token, "pools/update", s.body(sentinel, policy={}))

        received: dict[str, list[tuple[str, str, Json]]] = {}
        deadline = time.monotonic() + 30
        for who, stream in streams.items():
            events = owner_received if stream is owner else []
            while not (events and events[-1]["poolId"] == sentinel):
                assert time.monotonic() < deadline, (who, events)
                events.append(await stream.next())
            assert events[-1]["type"] == "pool.updated"
            names = {pool: "pool", other: "other"}
            received[who] = [(e["type"], names[e["poolId"]], e["data"]) for e in events[:-1]]
        for stream in streams.values():
            await stream.close()

    created = ("pool.created", "pool", _created_data(s.site))
    # The owner's own offer resizes the rows it already had: the changes name the moves.
    own_changes = [
        {"path": "/offers/acme/includeDescendants", "before": False, "after": True},
        {"path": "/offers/acme/quota/gpu", "before": 2_147_483_647, "after": 8},
    ]
    own = ("pool.offered", "pool", _offer("acme", 8, True, 0, 2) | {"changes": own_changes})
    to_beta = ("pool.offered", "pool", _offer("beta", 2, False, 5, 3))
    to_gamma = ("pool.offered", "pool", _offer("gamma", 3, True, 0, 4))
    updated = ("pool.updated", "pool", _updated(5))  # after 3 offers
    unoffered = ("pool.unoffered", "pool", _unoffered("beta", 2, False, 5, 6))
    created_a100 = ("pool.created", "other", _created_data(s.site, "A100"))

    def archived(*removed: str) -> tuple[str, str, Json]:
        return ("pool.archived", "pool", {"removedTenantIds": list(removed), "version": 7})

    assert received == {
        "owner admin": [
            created,
            own,
            to_beta,
            to_gamma,
            updated,
            unoffered,
            created_a100,
            archived("gamma"),
        ],
        "owner admin of H100 pools": [
            created,
            own,
            to_beta,
            to_gamma,
            updated,
            unoffered,
            archived("gamma"),
        ],
        # Its own offer, the pool itself; no guest's offer (`offers` is null for it).
        "owner viewer": [created, own, updated, created_a100, archived()],
        # Through acme's offer (from its own offer on): that offer's id, the pool's update.
        "owner's descendant": [
            ("pool.offered", "pool", {"toTenantId": "acme", "version": 2}),
            updated,
        ],
        "guest": [to_beta, updated, unoffered],
        "guest with descendants": [to_gamma, updated, archived("gamma")],
        "that guest's descendant": [
            ("pool.offered", "pool", {"toTenantId": "gamma", "version": 4}),
            updated,
        ],
    }


def _create(s: Scene, gpu_model: str = "H100") -> Json:
    return {"tenantId": "acme", "siteId": s.site, "class": "metal-host", "gpuModel": gpu_model}


def _desc() -> Json:
    return {"includeDescendants": True}


def _created_data(site: str, gpu_model: str = "H100") -> Json:
    return {
        "siteId": site,
        "class": "metal-host",
        "sharing": "exclusive",
        "gpuModel": gpu_model,
        "displayName": None,
        "labels": {},
        "version": 1,
    }


def _offer(tenant: str, gpus: int, descendants: bool, priority: int, version: int) -> Json:
    """A new offer's event: its data, the pool's version, the offer added (CONTRACT 10)."""
    entry = {"includeDescendants": descendants, "priority": priority, "quota": {"gpu": gpus}}
    return {
        "toTenantId": tenant,
        "quota": {"gpu": gpus},
        "includeDescendants": descendants,
        "priority": priority,
        "version": version,
        "changes": [{"path": f"/offers/{tenant}", "before": None, "after": entry}],
    }


def _unoffered(tenant: str, gpus: int, descendants: bool, priority: int, version: int) -> Json:
    entry = {"includeDescendants": descendants, "priority": priority, "quota": {"gpu": gpus}}
    return {
        "toTenantId": tenant,
        "version": version,
        "changes": [{"path": f"/offers/{tenant}", "before": entry, "after": None}],
    }


def _updated(version: int) -> Json:
    """The update to JOIN_SET: the change shows the policy as read, never the token."""
    change = {"path": "/policy/kubernetes", "before": None, "after": SHOWN}
    return {"version": version, "changed": ["policy"], "changes": [change]}


async def test_a_replay_from_a_cursor_shows_the_same(
    app: Starlette, api: Api, fleet: Fleet
) -> None:
    """The same rule decides events replayed from the outbox (`after`) as live ones."""
    s = await Scene.start(api, fleet)
    tokens = {
        "owner admin": (s.token, "acme"),
        "owner viewer": (await fleet.caller("acme", "viewer"), "acme"),
        "guest": (await s.guest("beta"), "beta"),
        "that guest's descendant": (await s.guest("beta-dev", parent="beta"), "beta-dev"),
    }
    async with app.state.capacity.db.reader.connect() as conn:
        start = encode_cursor((await outbox_bounds(conn)).newest)
    pool = (await s.pool(gpuModel="H100"))["id"]
    await s.offer(pool, "beta", {"gpu": 2}, includeDescendants=True, priority=5)
    await s.guest("gamma")
    await s.offer(pool, "gamma", {"gpu": 3})
    await s.unoffer(pool, "gamma")
    await api.ok(s.token, "pools/update", s.body(pool, policy={"kubernetes": JOIN_SET}))

    replays = {
        who: await subscribe(app, token, tenant, after=start)
        for who, (token, tenant) in tokens.items()
    }
    await settle(app, *replays.values())
    received = {who: [(e.type, e.data) for e in c.events] for who, c in replays.items()}
    for collector in replays.values():
        await collector.close()

    created = ("pool.created", _created_data(s.site))
    to_beta = ("pool.offered", _offer("beta", 2, True, 5, 2))
    to_gamma = ("pool.offered", _offer("gamma", 3, False, 0, 3))
    unoffered = ("pool.unoffered", _unoffered("gamma", 3, False, 0, 4))
    updated = ("pool.updated", _updated(5))  # after 3 (un)offers
    assert received == {
        "owner admin": [created, to_beta, to_gamma, unoffered, updated],
        "owner viewer": [created, updated],
        "guest": [to_beta, updated],
        "that guest's descendant": [
            ("pool.offered", {"toTenantId": "beta", "version": 2}),
            updated,
        ],
    }
    assert TOKEN not in repr(received)
