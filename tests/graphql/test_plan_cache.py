"""The compiled-read plans are bounded by the bytes they hold, and each PostgreSQL
connection by the statements it keeps prepared (issue 19, item 7): many distinct query
texts from one caller neither grow the process past BETTERCOMPUTE_COMPILED_PLAN_CACHE_BYTES
nor leave a prepared statement (and its plan in the backend) per text on a connection.
bench/plan_cache.py measures the memory; this asserts the bounds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.routing import Route

from app.config import Settings
from app.server import create_app
from schema.compiled_reads import CompiledReads, held
from schema.view import GraphQLView
from tests.databases import pgbouncer_requested
from tests.support import Api, Fleet

# The compiled path's own work: nothing to bound on the plain path.
pytestmark = pytest.mark.fast_path

BOUND = 400_000  # bytes: a few plans of the texts below
STATEMENTS = 3  # per connection
DIRECT = 2  # connections
QUERIES = 24


@pytest_asyncio.fixture(loop_scope="session", params=[DIRECT, 0], ids=["direct", "engine"])
async def app(database_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Starlette]:
    """The app with small bounds; the compiled statements on their own pool, or on the
    engine's (BETTERCOMPUTE_DB_DIRECT_POOL_SIZE=0)."""
    settings = Settings(
        database_url=database_url,
        compiled_plan_cache_bytes=BOUND,
        db_prepared_statements_per_connection=STATEMENTS,
        db_direct_pool_size=request.param,
        db_pool_size=2,
        db_max_overflow=0,
    )
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


def _compiled(app: Starlette) -> CompiledReads:
    for route in app.routes:
        if isinstance(route, Route) and isinstance(route.endpoint, GraphQLView):
            assert route.endpoint.compiled is not None
            return route.endpoint.compiled
    raise AssertionError("no /graphql view")


def _query(n: int) -> str:
    """The n-th distinct text (and statement: its aliases are the answer's keys), ~3 KB."""
    tag = f"q{n:04d}_" + "x" * 40
    fields = "id tenantId siteId class gpuModel sharing agent region owned archived version"
    aliased = " ".join(f"{tag}_{f}: {f}" for f in fields.split())
    return (
        f"query Q{n}($t: String!) {{ {tag}: pools(tenantId: $t, first: 100) {{\n"
        f"  {tag}_info: pageInfo {{ hasNextPage endCursor }}\n"
        f"  {tag}_nodes: nodes {{ {aliased} {fields} createdAt updatedAt\n"
        f"    {tag}_quotas: quotas {{ resource max used grant {{ via tenantId priority }} }}\n"
        f"    {tag}_capacity: capacity {{ resource total allocatable booked available }} }}\n"
        f"  {tag}_edges: edges {{ cursor node {{ {fields} quotas {{ resource max }} }} }} }} }}"
    )


def _gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def _prepared_per_connection(app: Starlette) -> list[int]:
    """pg_prepared_statements of every connection the compiled reads use (each session
    sees only its own: ask on each)."""
    db = app.state.db
    sql = "SELECT count(*) FROM pg_prepared_statements"
    if db.direct is not None:
        pool = await db.direct._opened()
        held_connections = [await pool.acquire() for _ in range(DIRECT)]
        try:
            return [await c.fetchval(sql) for c in held_connections]
        finally:
            for c in held_connections:
                await pool.release(c)
    found: list[int] = []
    async with db.reader.connect() as a, db.reader.connect() as b:
        for conn in (a, b):
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            # asyncpg's cache, not SQLAlchemy's: the statements SQLAlchemy prepares for
            # the plain reads are its own, a set bounded by the code.
            found.append(len(list(driver._stmt_cache.iter_statements())))
    return found


async def test_distinct_queries_stay_within_the_bounds(
    app: Starlette, api: Api, fleet: Fleet, dialect: str
) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    admin = await fleet.caller("acme", "admin")
    viewer = await fleet.caller("acme", "viewer")
    for gpu in ("H100", "A100"):
        await api.ok(
            admin,
            "pools/create",
            {
                "tenantId": "acme",
                "siteId": site,
                "class": "metal-host",
                "gpuModel": gpu,
                "ownerQuota": {"gpu": 8},
            },
        )
    compiled = _compiled(app)
    plans, plan_bytes = (
        _gauge("bettercompute_compiled_plans"),
        _gauge("bettercompute_compiled_plan_bytes"),
    )
    answered = (
        REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
        or 0.0
    )
    for n in range(0, QUERIES, 2):
        for _ in range(2):  # learnt, then answered by its statement (on PostgreSQL)
            replies = await asyncio.gather(
                *(api.graphql(viewer, _query(n + i), {"t": "acme"}) for i in range(2))
            )
            for reply in replies:
                assert "errors" not in reply, reply
        assert compiled.bytes <= BOUND, compiled.bytes
        # What the plans reach is counted (an overestimate: shapes share their nodes).
        reached = sum(held((key, plan)) for key, plan in compiled._plans.items())
        assert reached <= compiled.bytes
    # /metrics says what this app's plans hold.
    assert _gauge("bettercompute_compiled_plans") - plans == len(compiled)
    assert _gauge("bettercompute_compiled_plan_bytes") - plan_bytes == compiled.bytes
    metrics = (await api.client.get("/metrics")).text
    assert "bettercompute_compiled_plan_bytes " in metrics
    assert "bettercompute_compiled_plans " in metrics
    assert 2 <= len(compiled) < QUERIES  # the oldest plans were dropped
    now = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
    assert (now or 0.0) - answered >= QUERIES  # each text's second request
    if dialect != "postgresql":
        return  # SQLite prepares nothing on a server
    prepared = await _prepared_per_connection(app)
    if pgbouncer_requested():  # no statement is kept beyond a transaction there
        assert max(prepared) == 0, prepared
    else:
        assert 1 <= max(prepared) <= STATEMENTS, prepared


async def test_a_plan_larger_than_the_bound_is_not_kept(app: Starlette) -> None:
    """The bound holds for one plan too: a plan alone past it is dropped at once."""
    small = CompiledReads(_compiled(app)._schema, 600_000, max_bytes=10_000)
    small.learn(_query(1), None)
    assert small.bytes == 0 and len(small) == 0
    small.learn('query { pools(tenantId: "a") { nodes { id } } }', None)
    assert 0 < small.bytes <= 10_000 and len(small) == 1


def test_held_counts_what_is_reached() -> None:
    text = "x" * 10_000
    assert held([text, text, {"k": text}]) < 2 * len(text)  # each object once
    assert held((text, "y" * 10_000)) > 20_000
