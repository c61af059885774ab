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
- `/access?tenant&pool&permission&caller&role`, `/rest/pools/explain?...`: why the
  guest's viewer may read the pool (allowed, nothing denied: the one request measured),
  its binding (the caller id and role given, as the service knows them from the token)
  and the offer that grants it, by GraphQL `access` and REST `pools/explain`
- `/lending?tenant&first`, `/rest/pools/lending?tenant&first`: the owner's capacity rows
  with what its guests were offered and use, the most overcommitted first (lent capacity
  on a row with none allocatable first of all), the first `first`, by GraphQL and REST
- `/rest/reservations/list?tenant`: REST `reservations/list`, the tenant's own
  reservations in every pool, in id order
- `/reservations?tenant&pool&first&after`: the GraphQL one-pool query with a page of the
  tenant's own reservations in the pool (`pool { id reservations(first) }`: pageInfo, and
  edges with their cursors), the pool as the one-pool query finds it

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

# Why the guest $1's viewer ($4, role $5) may read pool $2 ($3: a permission its role
# holds, with no condition on its binding): its own offer grants it.
_ACCESS = f"""
SELECT {{wrap}}json_build_object('access', json_build_object(
  'allowed', true, 'permission', $3::text,
  'binding', json_build_object('callerId', $4::text, 'tenantId', $1::text, 'role', $5::text,
    'where', '{{{{}}}}'::json, 'actingFor', $1::text, 'fleetAdmin', false),
  'grant', json_build_object(
    'via', CASE WHEN p.tenant_id = $1 THEN 'owner' ELSE 'offer' END, 'tenantId', a.tenant_id,
    'includeDescendants', o.include_descendants, 'priority', o.priority,
    'offeredAt', {_TIMESTAMP.format(col="o.created_at")}),
  'deniedBy', NULL)){{unwrap}}::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1
JOIN offers o ON o.pool_id = p.id AND o.tenant_id = a.tenant_id
WHERE p.id = $2 AND (NOT p.archived OR p.tenant_id = $1)
"""
ACCESS = _ACCESS.format(wrap="json_build_object('data', ", unwrap=")")
REST_EXPLAIN = _ACCESS.format(wrap="", unwrap="")

# The owner $1's capacity rows of its live pools with the sums of its guests' quota rows
# (every offer holder's but its own), ranked by offered / allocatable, lent capacity on a
# row with none allocatable first, then in pool and resource order; the first $2. (The
# overcommit of the rows measured is null: a float PostgreSQL writes as `8` where the
# service writes `8.0` is not among them.)
_LENDING = """
WITH lent AS (
  SELECT c.pool_id, c.resource, c.total, c.allocatable, c.booked,
    COALESCE(sum(q.max), 0) AS offered, COALESCE(sum(q.used), 0) AS guest_used
  FROM pools p JOIN capacity_rows c ON c.pool_id = p.id
  LEFT JOIN (quota_rows q JOIN offers o ON o.pool_id = q.pool_id AND o.tenant_id = q.tenant_id)
    ON q.pool_id = c.pool_id AND q.resource = c.resource AND q.tenant_id <> $1
  WHERE p.tenant_id = $1 AND NOT p.archived
  GROUP BY c.pool_id, c.resource, c.total, c.allocatable, c.booked
), ranked AS (
  SELECT *, CASE WHEN allocatable > 0 THEN offered::float8 / allocatable END AS overcommit,
    CASE WHEN allocatable > 0 THEN offered::float8 / allocatable
      WHEN offered > 0 THEN 'Infinity'::float8 ELSE -1 END AS by
  FROM lent ORDER BY by DESC, pool_id COLLATE "C", resource COLLATE "C" LIMIT $2
)
SELECT {wrap}json_build_object('lending', COALESCE(json_agg(json_build_object(
    'poolId', pool_id, 'resource', resource, 'total', total, 'allocatable', allocatable,
    'booked', booked, 'available', allocatable - booked, 'offered', offered,
    'guestUsed', guest_used, 'overcommit', overcommit)
  ORDER BY by DESC, pool_id COLLATE "C", resource COLLATE "C"), '[]')){unwrap}::text
FROM ranked
"""
LENDING = _LENDING.format(wrap="json_build_object('data', ", unwrap=")")
REST_LENDING = _LENDING.format(wrap="", unwrap="")

# The tenant $1's own reservations in every pool, in id order, as REST shows each
# (app/rest/render.py's reservation_json: `resources` the stored object).
REST_RESERVATIONS = f"""
SELECT json_build_object('reservations', COALESCE(json_agg(json_build_object(
    'id', r.id, 'poolId', r.pool_id, 'tenantId', r.tenant_id, 'resources', r.resources,
    'state', r.state, 'createdAt', {_TIMESTAMP.format(col="r.created_at")},
    'endedAt', {_TIMESTAMP.format(col="r.ended_at")}) ORDER BY r.id), '[]'))::text
FROM reservations r WHERE r.tenant_id = $1
"""

# Pool $2 as the guest $1 sees it with a page of its own reservations there: the first $3
# after the id $4 (NULL: the first page), one more read to know a next page follows; each
# an edge with its cursor, `resources` as GraphQL's list in the stored object's order.
POOL_RESERVATIONS = f"""
WITH page AS (
  SELECT * FROM reservations
  WHERE tenant_id = $1 AND pool_id = $2 AND ($4::text IS NULL OR id > $4)
  ORDER BY id LIMIT $3 + 1
), shown AS (
  SELECT * FROM page ORDER BY id LIMIT $3
)
SELECT json_build_object('data', json_build_object('pool', json_build_object(
  'id', p.id,
  'reservations', json_build_object(
    'pageInfo', json_build_object(
      'hasNextPage', (SELECT count(*) FROM page) > $3,
      'hasPreviousPage', $4::text IS NOT NULL,
      'startCursor', (SELECT {_CURSOR.format(id="min(id)")} FROM shown),
      'endCursor', (SELECT {_CURSOR.format(id="max(id)")} FROM shown)),
    'edges', COALESCE((SELECT json_agg(json_build_object(
        'cursor', {_CURSOR.format(id="r.id")},
        'node', json_build_object(
          'id', r.id, 'poolId', r.pool_id, 'tenantId', r.tenant_id, 'state', upper(r.state),
          'createdAt', {_TIMESTAMP.format(col="r.created_at")},
          'endedAt', {_TIMESTAMP.format(col="r.ended_at")},
          'resources', COALESCE((SELECT json_agg(json_build_object(
              'resource', e.key, 'amount', e.value) ORDER BY e.n)
            FROM jsonb_each(r.resources) WITH ORDINALITY AS e(key, value, n)), '[]')))
      ORDER BY r.id) FROM shown r), '[]')))))::text
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1 WHERE p.id = $2
"""


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
    access: str  # tenant, pool, permission, caller, role
    rest_explain: str  # tenant, pool, permission, caller, role
    lending: str  # tenant, first
    rest_lending: str  # tenant, first
    rest_reservations: str  # tenant
    pool_reservations: str  # tenant, pool, first, the id the page starts after (None: first)


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

    async def rest_reservations(request: Request) -> Response:
        tenant = request.query_params["tenant"]
        body = await request.app.state.fetch(statements.rest_reservations, tenant)
        return Response(body, media_type="application/json")

    async def pool_reservations(request: Request) -> Response:
        q = request.query_params
        after = q.get("after")
        after_id = None
        if after:
            after_id = base64.urlsafe_b64decode(after).decode().removeprefix("v1:")
        body = await request.app.state.fetch(
            statements.pool_reservations, q["tenant"], q["pool"], int(q["first"]), after_id
        )
        return Response(body, media_type="application/json")

    def one_pool_statement(statement: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            q = request.query_params
            body = await request.app.state.fetch(statement, q["tenant"], q["pool"])
            return Response(body, media_type="application/json")

        return endpoint

    def access_statement(statement: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            q = request.query_params
            asked = (q["tenant"], q["pool"], q["permission"], q["caller"], q["role"])
            body = await request.app.state.fetch(statement, *asked)
            return Response(body, media_type="application/json")

        return endpoint

    def lending_statement(statement: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            q = request.query_params
            body = await request.app.state.fetch(statement, q["tenant"], int(q["first"]))
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
            Route("/access", access_statement(statements.access)),
            Route("/rest/pools/explain", access_statement(statements.rest_explain)),
            Route("/lending", lending_statement(statements.lending)),
            Route("/rest/pools/lending", lending_statement(statements.rest_lending)),
            Route("/rest/reservations/list", rest_reservations),
            Route("/reservations", pool_reservations),
        ],
        lifespan=lifespan,
    )


POSTGRESQL = Statements(
    DASHBOARD_PAGE,
    ONE_POOL,
    REST_GET,
    REST_LIST,
    QUOTAS,
    CAPACITY,
    REST_CAPACITY,
    ACCESS,
    REST_EXPLAIN,
    LENDING,
    REST_LENDING,
    REST_RESERVATIONS,
    POOL_RESERVATIONS,
)
POOL_SIZE = 16


@asynccontextmanager
async def postgresql_pool() -> AsyncIterator[Fetch]:
    pool = await asyncpg.create_pool(
        os.environ["BENCH_FLOOR_DSN"],
        max_size=POOL_SIZE,
        # As the service's connections (app/db/direct.py NO_JIT): a floor slowed by JIT
        # compiling a large statement would flatter the service.
        server_settings={"jit": "off"},
    )
    try:
        yield pool.fetchval
    finally:
        await pool.close()


app = floor_app(POSTGRESQL, postgresql_pool)
