"""Round trips per write: a booking and a release each send a constant number of
statements, whatever the lineage's offers and the resources booked (as
tests/graphql/test_statements.py counts them per read), over REST and GraphQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from prometheus_client import REGISTRY
from sqlalchemy import insert
from starlette.applications import Starlette

from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import Database
from app.db.models import CapacityRow
from app.server import create_app
from tests.events.support import settle
from tests.rest.scene import Scene
from tests.support import Api, Fleet

GRAPHQL = ("graphql booking", "graphql release")
DEPTH = 20  # tenants in the deep lineage, each ancestor holding an offer of the pool


@pytest_asyncio.fixture(loop_scope="session")
async def app(database_url: str) -> AsyncIterator[Starlette]:
    """The app with its outbox and revocation pollers quiet: a poll during a request would
    be counted with it."""
    quiet = Settings(
        database_url=database_url, event_poll_interval_s=3600, revocation_poll_interval_s=3600
    )
    application = create_app(quiet)
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture(loop_scope="session")
async def api(app: Starlette) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield Api(client)


def _statements(transport: str = "rest") -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": transport})
    return found or 0.0


BOOK = """mutation($input: CreateReservationInput!) { createReservation(input: $input) {
  reservation { id poolId tenantId resources { resource amount } state createdAt endedAt } } }"""
RELEASE = """mutation($input: ReleaseReservationInput!) { releaseReservation(input: $input) {
  reservation { id state endedAt } } }"""


async def test_writes_take_a_constant_number_of_statements(
    app: Starlette, api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    resources = ["gpu", "nvme", "ram", "cpu", "disk"]
    pool = (await s.pool(ownerQuota=dict.fromkeys(resources, 1000)))["id"]
    await fleet.node(pool, 8)
    # One guest with one offer; a tenant DEPTH deep whose every ancestor holds an offer.
    near = await s.guest("near")
    await s.offer(pool, "near", dict.fromkeys(resources, 100))
    parent = None
    for depth in range(DEPTH):
        tenant = f"deep-{depth}"
        deep = await s.guest(tenant, parent=parent)
        await s.offer(pool, tenant, dict.fromkeys(resources, 100), includeDescendants=True)
        parent = tenant
    callers = {"1 offer": (near, "near"), f"{DEPTH} offers": (deep, f"deep-{DEPTH - 1}")}
    # A rollup row for each resource (the rollup itself knows only gpu's), so a booking
    # of all five fits.
    async with db.writer.begin() as conn:
        await conn.execute(
            insert(CapacityRow),
            [
                {"pool_id": pool, "resource": r, "total": 8, "allocatable": 8, "booked": 0}
                for r in resources[1:]
            ],
        )
    capacity: Capacity = app.state.capacity
    await settle(app)

    async def counted(path: str, token: str, body: dict[str, object]) -> tuple[int, object]:
        before = _statements()
        response = await api.post(token, path, body)
        return int(_statements() - before), response.json()

    async def graphql(token: str, query: str, given: dict[str, object]) -> tuple[int, object]:
        before = _statements("graphql")
        answer = await api.graphql(token, query, {"input": given})
        assert "errors" not in answer, answer
        return int(_statements("graphql") - before), answer["data"]

    counts: dict[str, int] = {}
    for name, (token, tenant) in callers.items():
        for booked_resources in (["gpu"], resources):
            label = f"{len(booked_resources)} resources, {name}"
            body = {
                "tenantId": tenant,
                "poolId": pool,
                "resources": dict.fromkeys(booked_resources, 1),
            }
            await api.ok(token, "reservations/create", body)  # once first: the caller is known
            counts[f"booking, {label}"], booked = await counted("reservations/create", token, body)
            rsv = booked["reservation"]["id"]  # type: ignore[index]
            release = {"tenantId": tenant, "reservationId": rsv}
            counts[f"release, {label}"], ended = await counted(
                "reservations/release", token, release
            )
            counts[f"release again, {label}"], again = await counted(
                "reservations/release", token, release
            )
            assert ended["reservation"]["state"] == "ended", ended  # type: ignore[index]
            assert again == ended, again
            body["resources"] = dict.fromkeys(booked_resources, 1000)  # past the quota
            counts[f"refused, {label}"], refused = await counted("reservations/create", token, body)
            assert refused["error"]["code"] == "RESOURCE_EXHAUSTED", refused  # type: ignore[index]
            # The same over GraphQL, each text run once first (it is planned after a run).
            given = {**body, "resources": [{"resource": r, "amount": 1} for r in booked_resources]}
            _, first = await graphql(token, BOOK, given)
            first_id = first["createReservation"]["reservation"]["id"]  # type: ignore[index]
            await graphql(token, RELEASE, {"tenantId": tenant, "reservationId": first_id})
            counts[f"graphql booking, {label}"], made = await graphql(token, BOOK, given)
            made_id = made["createReservation"]["reservation"]["id"]  # type: ignore[index]
            counts[f"graphql release, {label}"], _ = await graphql(
                token, RELEASE, {"tenantId": tenant, "reservationId": made_id}
            )
    print(f"statements per write ({capacity.db.dialect}): {counts}")
    fast = capacity.compiles_writes and app.state.settings.fast_path
    for kind in ("booking", "release", "release again", "refused", *GRAPHQL):
        found = {k: v for k, v in counts.items() if k.startswith(kind + ",")}
        # Constant in the lineage's offers; in the resources too on the fast path (the
        # plain path, SQLite's, sends one guarded UPDATE per row).
        same = set(found.values()) if fast else {v for k, v in found.items() if "1 resource" in k}
        assert len(same) == 1, counts
    if fast:
        # The one statement; behind PgBouncer, in a transaction with its SET LOCAL.
        one = 1 if capacity.db.direct is not None else 2
        assert counts[f"booking, 1 resources, {DEPTH} offers"] == one, counts
        # GraphQL too (schema/compiled_writes.py): the caller is not looked up.
        for kind in GRAPHQL:
            assert counts[f"{kind}, 5 resources, {DEPTH} offers"] == one, counts


def _writes(write: str, outcome: str) -> float:
    labels = {"write": write, "outcome": outcome}
    return REGISTRY.get_sample_value("bettercompute_compiled_writes_total", labels) or 0.0


async def test_one_statement_writes_are_counted_by_outcome(
    api: Api, fleet: Fleet, dialect: str
) -> None:
    """`bettercompute_compiled_writes_total` tells bookings and releases the one statement
    answered, refused or declined to the plain path; SQLite has no such statement."""
    s = await Scene.start(api, fleet)
    pool = (await s.pool(ownerQuota={"gpu": 4}))["id"]
    await fleet.node(pool, 8)
    outcomes = [(w, o) for w in ("booking", "release") for o in ("answered", "refused", "declined")]
    before = {k: _writes(*k) for k in outcomes}
    booked = await s.reserve(pool, {"gpu": 3})
    status, body = await api.fails(
        s.token, "reservations/create", s.body(pool, resources={"gpu": 2})
    )
    assert body["code"] == "RESOURCE_EXHAUSTED", (status, body)
    await s.release(booked["id"])
    moved = {k: _writes(*k) - before[k] for k in outcomes}
    counted = dict.fromkeys(outcomes, 0.0)
    if dialect == "postgresql":
        counted |= {
            ("booking", "answered"): 1.0,
            ("booking", "refused"): 1.0,
            ("release", "answered"): 1.0,
        }
    assert moved == counted
