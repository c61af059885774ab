"""The floors for bench/graphql_pools.py: bare Starlette endpoints answering each measured
query with one hand-written SQL statement that builds the whole JSON answer in the
database (the same data as the service's answer: same fields, order and cursors). No
authentication, no IAM, no validation: the least work that answers the same data.

- `/dashboard?tenant&first&after`: the GraphQL dashboard page (`data.pools`)
- `/pool?tenant&pool`: the GraphQL one-pool query (`data.pool` with its quotas)
- `/rest/pools/get?tenant&pool`: REST `pools/get` as a guest tenant sees the pool
  (`offers` is null: they are the owner's), the shape of app/rest/render.py
- `/rest/pools/list?tenant`: REST `pools/list`, every pool the guest sees, each as `get`
- `/quotas?tenant`: the GraphQL `quotas` query, the guest's rows in every pool it sees
- `/capacity?tenant&pool`, `/rest/pools/capacity?tenant&pool`: one pool's rollup as the
  guest sees it (no lender's values: those are the owner's), by GraphQL and by REST

The routes are written once here (`floor_app`); each dialect gives its statements
and how to run one: PostgreSQL's below (asyncpg, `json_build_object`/`json_agg`), SQLite's
in bench/floor_sqlite.py (aiosqlite, `json_object`/`json_group_array`).

    BENCH_FLOOR_DSN=postgresql://... uvicorn bench.floor:app
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_CURSOR = "translate(encode(convert_to('v1:' || {id}, 'UTF8'), 'base64'), '+/', '-_')"

DASHBOARD_PAGE = f"""
WITH page AS (
  SELECT p.* FROM pools p
  JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1
  WHERE (NOT p.archived OR p.tenant_id = $1) AND ($2::text IS NULL OR p.id > $2)
  ORDER BY p.id LIMIT $3 + 1
), shown AS (
  SELECT * FROM page ORDER BY id LIMIT $3
)
SELECT json_build_object('data', json_build_object('pools', json_build_object(
  'pageInfo', json_build_object(
    'hasNextPage', (SELECT count(*) FROM page) > $3,
    'endCursor', (SELECT {_CURSOR.format(id="max(id)")} FROM shown)),
  'nodes', COALESCE((SELECT json_agg(json_build_object(
      'id', p.id, 'class', upper(replace(p.class, '-', '_')), 'gpuModel', p.gpu_model,
      'sharing', upper(p.sharing), 'region', p.region, 'owned', p.tenant_id = $1,
      'archived', p.archived, 'version', p.version,
      'quotas', COALESCE((SELECT json_agg(json_build_object(
          'resource', q.resource, 'max', q.max, 'used', q.used) ORDER BY q.resource)
        FROM quota_rows q WHERE q.pool_id = p.id AND q.tenant_id = $1), '[]'),
      'capacity', COALESCE((SELECT json_agg(json_build_object(
          'resource', c.resource, 'available', c.allocatable - c.booked) ORDER BY c.resource)
        FROM capacity_rows c WHERE c.pool_id = p.id), '[]')
    ) ORDER BY p.id) FROM shown p), '[]')
)))::text
"""

ONE_POOL = """
SELECT json_build_object('data', json_build_object('pool', json_build_object(
  'id', p.id,
  'quotas', COALESCE((SELECT json_agg(json_build_object(
      'resource', q.resource, 'max', q.max, 'used', q.used) ORDER BY q.resource)
    FROM quota_rows q WHERE q.pool_id = p.id AND q.tenant_id = $1), '[]'))))::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1 WHERE p.id = $2
"""

# Python's isoformat() with "Z" (app/rest/render.py): no fraction when it is zero.
_TIMESTAMP = """to_char({col} AT TIME ZONE 'UTC', CASE WHEN extract(microseconds FROM {col})::int
  % 1000000 = 0 THEN 'YYYY-MM-DD"T"HH24:MI:SS"Z"' ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"' END)"""

# REST's pool object (app/rest/render.py's pool_json), as a guest tenant $1 sees pool `p`.
_REST_POOL = f"""json_build_object(
  'id', p.id, 'tenantId', p.tenant_id, 'siteId', p.site_id, 'class', p.class,
  'gpuModel', p.gpu_model, 'sharing', p.sharing, 'agent', p.agent, 'policy', p.policy,
  'providerAccountId', p.provider_account_id, 'region', p.region,
  'displayName', p.display_name, 'labels', p.labels,
  'owned', p.tenant_id = $1, 'archived', p.archived, 'version', p.version,
  'quotas', COALESCE((SELECT json_agg(json_build_object(
      'resource', q.resource, 'max', q.max, 'used', q.used,
      'grant', CASE WHEN o.tenant_id IS NULL THEN NULL ELSE json_build_object(
        'tenantId', q.tenant_id, 'includeDescendants', o.include_descendants,
        'priority', o.priority, 'offeredAt', {_TIMESTAMP.format(col="o.created_at")}) END)
      ORDER BY q.resource)
    FROM quota_rows q LEFT JOIN offers o ON o.pool_id = q.pool_id AND o.tenant_id = q.tenant_id
    WHERE q.pool_id = p.id AND q.tenant_id = $1), '[]'),
  'offers', NULL,
  'createdAt', {_TIMESTAMP.format(col="p.created_at")},
  'updatedAt', {_TIMESTAMP.format(col="p.updated_at")})"""

REST_GET = f"""
SELECT json_build_object('pool', {_REST_POOL})::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1 WHERE p.id = $2
"""

REST_LIST = f"""
SELECT json_build_object('pools', COALESCE(json_agg({_REST_POOL} ORDER BY p.id), '[]'))::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1
WHERE NOT p.archived OR p.tenant_id = $1
"""

# The guest's quota rows in every pool it sees, in pool and resource order.
QUOTAS = """
SELECT json_build_object('data', json_build_object('quotas', COALESCE((SELECT json_agg(
    json_build_object('poolId', q.pool_id, 'resource', q.resource, 'max', q.max, 'used', q.used)
    ORDER BY q.pool_id, q.resource)
  FROM quota_rows q JOIN pools p ON p.id = q.pool_id
  JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1
  WHERE q.tenant_id = $1 AND (NOT p.archived OR p.tenant_id = $1)), '[]')))::text
"""

# One pool's rollup rows as a guest sees them, under `{key}` (GraphQL's data, or REST's).
_CAPACITY = """
SELECT {wrap}json_build_object('capacity', COALESCE((SELECT json_agg(json_build_object(
    'resource', c.resource, 'total', c.total, 'allocatable', c.allocatable,
    'booked', c.booked, 'available', c.allocatable - c.booked) ORDER BY c.resource)
  FROM capacity_rows c WHERE c.pool_id = p.id), '[]')){unwrap}::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1 WHERE p.id = $2
"""
CAPACITY = _CAPACITY.format(wrap="json_build_object('data', ", unwrap=")")
REST_CAPACITY = _CAPACITY.format(wrap="", unwrap="")


# A statement's one value (the JSON text), or None when it returns no row.
Fetch = Callable[..., Awaitable[str | None]]


@dataclass(frozen=True)
class Statements:
    """One dialect's statements. Each takes its parameters in this order, positionally."""

    dashboard: str  # tenant, the id the page starts after (None: the first page), first
    one_pool: str  # tenant, pool
    rest_get: str  # tenant, pool
    rest_list: str  # tenant
    quotas: str  # tenant
    capacity: str  # tenant, pool
    rest_capacity: str  # tenant, pool


def floor_app(
    statements: Statements, connect: Callable[[], AbstractAsyncContextManager[Fetch]]
) -> Starlette:
    """The floor's routes over one dialect: each request one `fetch` of one statement.
    `connect` opens the connections for the app's lifetime and gives the fetch."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with connect() as fetch:
            app.state.fetch = fetch
            yield

    async def dashboard(request: Request) -> Response:
        q = request.query_params
        after = q.get("after")
        after_id = None
        if after:
            after_id = base64.urlsafe_b64decode(after).decode().removeprefix("v1:")
        body = await request.app.state.fetch(
            statements.dashboard, q["tenant"], after_id, int(q.get("first", "100"))
        )
        return Response(body, media_type="application/json")

    async def one_pool(request: Request) -> Response:
        q = request.query_params
        body = await request.app.state.fetch(statements.one_pool, q["tenant"], q["pool"])
        return Response(body, media_type="application/json")

    async def rest_get(request: Request) -> Response:
        q = request.query_params
        body = await request.app.state.fetch(statements.rest_get, q["tenant"], q["pool"])
        return Response(body, media_type="application/json")

    async def rest_list(request: Request) -> Response:
        body = await request.app.state.fetch(statements.rest_list, request.query_params["tenant"])
        return Response(body, media_type="application/json")

    async def quotas(request: Request) -> Response:
        body = await request.app.state.fetch(statements.quotas, request.query_params["tenant"])
        return Response(body, media_type="application/json")

    def one_pool_statement(statement: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            q = request.query_params
            body = await request.app.state.fetch(statement, q["tenant"], q["pool"])
            return Response(body, media_type="application/json")

        return endpoint

    return Starlette(
        routes=[
            Route("/dashboard", dashboard),
            Route("/pool", one_pool),
            Route("/rest/pools/get", rest_get),
            Route("/rest/pools/list", rest_list),
            Route("/quotas", quotas),
            Route("/capacity", one_pool_statement(statements.capacity)),
            Route("/rest/pools/capacity", one_pool_statement(statements.rest_capacity)),
        ],
        lifespan=lifespan,
    )


POSTGRESQL = Statements(
    DASHBOARD_PAGE, ONE_POOL, REST_GET, REST_LIST, QUOTAS, CAPACITY, REST_CAPACITY
)
POOL_SIZE = 16


@asynccontextmanager
async def postgresql_pool() -> AsyncIterator[Fetch]:
    pool = await asyncpg.create_pool(os.environ["BENCH_FLOOR_DSN"], max_size=POOL_SIZE)
    try:
        yield pool.fetchval
    finally:
        await pool.close()


app = floor_app(POSTGRESQL, postgresql_pool)
