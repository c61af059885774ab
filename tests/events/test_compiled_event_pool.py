"""`PoolEvent.pool` answered by the statement that answers `Query.pool` for the same
selection (docs/decisions/0008), spliced into the event's rendering: the same statement,
the same bytes on the wire as the plain path on both protocols, one read per event and
view. Real uvicorn servers and raw websocket clients, on both dialects."""

from __future__ import annotations

from typing import Any

import pytest
from graphql import FieldNode, OperationDefinitionNode, parse
from prometheus_client import REGISTRY

from app.compat import graphql_core_schema
from app.config import Settings
from schema.app import build_schema
from schema.compiled_reads import CompiledReads
from tests.events.conftest import running, served
from tests.events.event_pool_pair import (
    MARKER,
    Side,
    Subscriber,
    comparable,
    emit,
    frames_until,
    is_marker,
    marked,
    subscribed,
    two_servers,
)
from tests.events.test_websocket import http_api
from tests.rest.scene import Scene
from tests.support import Fleet

PROTOCOLS = ["graphql-transport-ws", "graphql-ws"]
AUDIENCE = frozenset({"acme", "beta"})  # the markers': every subscriber below gets them
# Outbox events only: `pool.usage` is each relay's own, per coalescing window.
TYPES = ["pool.created", "pool.offered", "pool.unoffered", "pool.updated", "pool.archived"]
SUBSCRIPTION = """subscription Events($tenantId: String!, $types: [String!]%s) {
  poolEvents(tenantId: $tenantId, types: $types) { cursor type data %s }
}"""
SELECTIONS = {
    "values": "pool { id name: displayName version archived owned labels policy __typename }",
    "nested": (
        "pool { id quotas { resource max used poolId grant { via tenantId priority "
        "includeDescendants offeredAt } } capacity { resource total allocatable booked "
        "available } }"
    ),
    "offers": (
        "pool { id offers { tenantId includeDescendants priority quotas { resource max used "
        "grant { tenantId } } } }"
    ),
    "fragments": (
        "p: pool { ...Shown quotas @include(if: $quotas) { resource max } } "
        "again: pool { __typename id }"
    ),
    "reservations": (
        "pool { id reservations(first: 1) { nodes { id state resources { resource amount } } "
        "pageInfo { hasNextPage endCursor } } }"
    ),
}
FRAGMENT = "fragment Shown on Pool { id version sharing }"


def document(selection: str) -> str:
    if selection != "fragments":
        return SUBSCRIPTION % ("", SELECTIONS[selection])
    return f"{SUBSCRIPTION % (', $quotas: Boolean!', SELECTIONS[selection])}\n{FRAGMENT}"


def variables(selection: str, tenant: str, quotas: bool) -> dict[str, Any]:
    given: dict[str, Any] = {"tenantId": tenant, "types": TYPES}
    return given | {"quotas": quotas} if selection == "fragments" else given


def _pool_nodes(operation: OperationDefinitionNode, key: str) -> list[FieldNode]:
    (events,) = operation.selection_set.selections
    assert isinstance(events, FieldNode) and events.selection_set is not None
    return [
        n
        for n in events.selection_set.selections
        if isinstance(n, FieldNode) and (n.alias or n.name).value == key
    ]


@pytest.mark.parametrize("selection", ["values", "nested", "offers", "reservations"])
async def test_the_event_pool_is_query_pools_statement(database_url: str, selection: str) -> None:
    """Planned from the subscription, `pool`'s statement is the one `Query.pool` is
    answered by for the same selection: the same SQL text, built by the same planner."""
    settings = Settings(database_url=database_url)
    schema = graphql_core_schema(build_schema(settings, fast_executor=True))
    async with running(settings) as (app, _):
        capacity = app.state.capacity
        plans = CompiledReads(schema, settings.max_query_cost)
        below = SELECTIONS[selection].removeprefix("pool ")
        query = f'query {{ pool(tenantId: "acme", poolId: "p") {below} }}'
        plans.learn(query, None)
        plan = plans.plan(query, None)
        assert plan is not None
        prepared = plans.prepare(plan, {}, capacity)
        assert prepared is not None, selection
        text = document(selection)
        operation = parse(text).definitions[0]
        assert isinstance(operation, OperationDefinitionNode)
        coerced = plans.variables(operation, {"tenantId": "acme", "types": None})
        assert coerced is not None
        found = plans.event_pool(
            text, None, "pool", _pool_nodes(operation, "pool"), coerced, capacity
        )
    assert found is not None, selection
    read, _ = found
    assert read.sql == prepared.read.sql


async def _scene(side: Side, fleet: Fleet) -> tuple[Scene, str, dict[str, str]]:
    """acme's pool offered to beta, with nodes and a reservation of beta's; the tokens of
    acme's admin and viewer, beta's admin and a viewer of beta's narrowed to metal-host."""
    async with http_api(side.address) as api:
        s = await Scene.start(api, fleet)
        pool_id = (await s.pool(ownerQuota={"gpu": 8, "cpu": 64}, labels={"team": "ml"}))["id"]
        await fleet.node(pool_id, 4)
        tokens = {
            "acme-admin": s.token,
            "acme-viewer": await fleet.caller("acme", "viewer"),
            "beta-admin": await s.guest("beta"),
            "beta-narrowed": await fleet.caller("beta", "viewer", **{"class": "metal-host"}),
        }
        await s.offer(pool_id, "beta", {"gpu": 2, "cpu": 8}, priority=3)
        await s.reserve(pool_id, {"gpu": 1}, tokens["beta-admin"], "beta")
    return s, pool_id, tokens


def _subscribers(tokens: dict[str, str], protocol: str) -> list[Subscriber]:
    plan = [("acme-admin", "acme", selection) for selection in SELECTIONS] + [
        ("acme-viewer", "acme", "offers"),  # PERMISSION_DENIED on `offers`: the plain path's
        ("acme-viewer", "acme", "values"),
        ("beta-admin", "beta", "nested"),
        ("beta-admin", "beta", "reservations"),
        ("beta-admin", "beta", "fragments"),
        ("beta-narrowed", "beta", "nested"),  # a narrowed binding: the plain read answers
    ]
    return [
        Subscriber(
            f"{who}/{selection}",
            tokens[who],
            protocol,
            document(selection),
            variables(selection, tenant, n % 2 == 0),
        )
        for n, (who, tenant, selection) in enumerate(plan)
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_compiled_and_plain_event_frames_are_the_same_bytes(
    database_url: str, fleet: Fleet, protocol: str
) -> None:
    """Subscribers of many selections (values, nested quotas and capacity, offers, a
    page of reservations, fragments, aliases and directives) get byte for byte the
    frames the plain path sends, through an update, the unoffer that takes the pool out
    of beta's sight, and an event beta receives without seeing the pool (`pool: null`)."""
    async with two_servers(database_url) as (fast, plain):
        s, pool_id, tokens = await _scene(fast, fleet)
        subscribers = _subscribers(tokens, protocol)
        compiled = fast.capacity.event_reads.compiled
        updated = s.body(pool_id, policy={"singleTenant": False})
        steps = [("pools/update", updated), ("pools/unoffer", s.body(pool_id, toTenantId="beta"))]
        async with subscribed((fast, plain), subscribers) as sockets, http_api(fast.address) as api:
            received: dict[tuple[str, str], list[str]] = {key: [] for key in sockets}
            for n, (method, body) in enumerate(steps):
                await api.ok(s.token, method, body)
                # Both servers read each pool before anything changes it again.
                await emit(fast.capacity, pool_id, "acme", AUDIENCE, {MARKER: n})
                for key, ws in sockets.items():
                    try:
                        received[key] += await frames_until(ws, protocol, marked(n))
                    except TimeoutError:
                        raise AssertionError(f"{key} got no marker {n}: {received[key]}") from None
        compiled = fast.capacity.event_reads.compiled - compiled
        plain_compiled = plain.capacity.event_reads.compiled

    for sub in subscribers:
        ours, reference = received[("fast", sub.name)], received[("plain", sub.name)]
        for got, want in zip(ours, reference, strict=True):
            assert comparable(got) == comparable(want), f"{sub.name}:\nfast:  {got}\nplain: {want}"
    # What the frames hold: acme sees its pool throughout; beta's last two show none.
    kinds = ["pool.updated", "pool.updated", "pool.unoffered", "pool.updated"]
    owner = [_event(f) for f in received[("fast", "acme-admin/values")]]
    assert [e["type"] for e in owner] == kinds
    assert all(e["pool"]["id"] == pool_id for e in owner)
    guest = [_event(f) for f in received[("fast", "beta-admin/nested")]]
    assert [e["type"] for e in guest] == kinds
    assert guest[1]["pool"]["quotas"] and [e["pool"] for e in guest[2:]] == [None, None]
    denied = received[("fast", "acme-viewer/offers")][0]
    assert '"PERMISSION_DENIED"' in denied
    # The compiled statement answered the events its path covers (and never on `plain`).
    assert compiled > 0 and plain_compiled == 0


def _event(frame: str) -> dict[str, Any]:
    import json

    event: dict[str, Any] = json.loads(frame)["payload"]["data"]["poolEvents"]
    return event


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


WITH_POOL = """subscription($tenantId: String!) {
  poolEvents(tenantId: $tenantId, types: ["pool.updated"]) {
    cursor data pool { id version quotas { resource max } }
  }
}"""


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "compiled-off"])
async def test_one_read_per_event_and_view(database_url: str, fleet: Fleet, compiled: bool) -> None:
    """Three sockets of one viewer, two of another viewer (the same view) and the owner's
    admin (another view): two reads per event, each one statement where reads compile,
    counted by `reads` and by the metrics; with compiled reads off (its setting), the
    same reads on the plain path, and the same frames."""
    settings = Settings(database_url=database_url, fast_path=True, compiled_reads=compiled)
    async with served(settings) as (app, address):
        side = Side("fast", app, address)
        async with http_api(address) as api:
            s = await Scene.start(api, fleet)
            pool_id = (await s.pool(ownerQuota={"gpu": 4}))["id"]
        viewer, other = [await fleet.caller("acme", "viewer") for _ in range(2)]
        tokens = [viewer] * 3 + [other] * 2 + [s.token]
        subscribers = [
            Subscriber(f"s{n}", t, PROTOCOLS[n % 2], WITH_POOL, {"tenantId": "acme"})
            for n, t in enumerate(tokens)
        ]
        reads = side.capacity.event_reads
        before = (reads.reads, reads.compiled)
        metrics_before = (
            _metric("bettercompute_event_pool_reads_total"),
            _metric("bettercompute_event_pool_compiled_total", outcome="answered"),
        )
        async with subscribed((side,), subscribers) as sockets:
            await emit(side.capacity, pool_id, "acme", frozenset({"acme"}), {"n": 1})
            await emit(side.capacity, pool_id, "acme", frozenset({"acme"}), {"marker": True})
            received = {
                key: await frames_until(ws, sub.protocol, is_marker)
                for (key, ws), sub in zip(sockets.items(), subscribers, strict=True)
            }
        made = (reads.reads - before[0], reads.compiled - before[1])
        metered = (
            _metric("bettercompute_event_pool_reads_total") - metrics_before[0],
            _metric("bettercompute_event_pool_compiled_total", outcome="answered")
            - metrics_before[1],
        )

    for frames in received.values():
        events = [_event(f) for f in frames]
        assert [e["pool"] for e in events] == [
            {"id": pool_id, "version": 1, "quotas": [{"resource": "gpu", "max": 4}]}
        ] * 2
    assert made == (4, 4 if compiled else 0)
    assert metered == made
