"""The floor of bench/graphql_pools.py on the embedded SQLite default: bench/floor.py's
routes, each request ONE statement through aiosqlite that builds the whole JSON answer
with SQLite's `json_object`/`json_group_array` (the same data as the service's answer:
same fields, order, types and cursors).

The file is opened as the service opens it (app/db/embedded.py's pragmas: WAL, foreign
keys, the busy timeout), by a few connections, each its own aiosqlite thread, as many as
the service's reader pool keeps (app/db/engine.py); a statement takes a free one.

SQLite has no base64: the page's `endCursor` is `bench_cursor(id)`, the service's own
encoder (app/capacity/paging.py) registered on each connection, called once a page.
SQLite's aggregates keep the order of the rows they read (its ORDER BY inside an
aggregate comes with 3.44), so each list is aggregated over a subquery in its order, and
the values a list holds are built outside that subquery (a value that leaves a subquery
loses its JSON subtype, and would be embedded as a string).

    BENCH_FLOOR_SQLITE=/path/to/file.db uvicorn bench.floor_sqlite:app
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiosqlite

from app.capacity.paging import encode_cursor
from app.config_env import DEFAULT_DB_STATEMENT_TIMEOUT_S
from app.db.embedded import busy_timeout_ms, connection_pragmas
from bench.floor import Fetch, Statements, floor_app

# Python's True and False as JSON (an SQLite boolean is the integer 0 or 1).
_BOOLEAN = "CASE WHEN {} THEN json('true') ELSE json('false') END"
# Python's isoformat() with "Z" (app/capacity/fields.py's `timestamp`) of SQLAlchemy's
# SQLite text, 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC: no fraction when it is zero.
_TIMESTAMP = "replace(replace({col}, '.000000', ''), ' ', 'T') || 'Z'"

DASHBOARD_PAGE = f"""
WITH page AS (
  SELECT p.* FROM pools p
  JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1
  WHERE (NOT p.archived OR p.tenant_id = ?1) AND (?2 IS NULL OR p.id > ?2)
  ORDER BY p.id LIMIT ?3 + 1
), shown AS (
  SELECT * FROM page ORDER BY id LIMIT ?3
)
SELECT json_object('data', json_object('pools', json_object(
  'pageInfo', json_object(
    'hasNextPage', {_BOOLEAN.format("(SELECT count(*) FROM page) > ?3")},
    'endCursor', (SELECT bench_cursor(max(id)) FROM shown)),
  'nodes', (SELECT json_group_array(json_object(
      'id', p.id, 'class', upper(replace(p.class, '-', '_')), 'gpuModel', p.gpu_model,
      'sharing', upper(p.sharing), 'region', p.region,
      'owned', {_BOOLEAN.format("p.tenant_id = ?1")}, 'archived', {_BOOLEAN.format("p.archived")},
      'version', p.version,
      'quotas', (SELECT json_group_array(json_object(
          'resource', q.resource, 'max', q.max, 'used', q.used))
        FROM (SELECT * FROM quota_rows WHERE pool_id = p.id AND tenant_id = ?1
              ORDER BY resource) q),
      'capacity', (SELECT json_group_array(json_object(
          'resource', c.resource, 'available', c.allocatable - c.booked))
        FROM (SELECT * FROM capacity_rows WHERE pool_id = p.id ORDER BY resource) c)
    )) FROM (SELECT * FROM shown ORDER BY id) p)
)))
"""

ONE_POOL = """
SELECT json_object('data', json_object('pool', json_object(
  'id', p.id,
  'quotas', (SELECT json_group_array(json_object(
      'resource', q.resource, 'max', q.max, 'used', q.used))
    FROM (SELECT * FROM quota_rows WHERE pool_id = p.id AND tenant_id = ?1
          ORDER BY resource) q))))
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1 WHERE p.id = ?2
"""

# REST's pool object (app/rest/render.py's pool_json), as a guest tenant ?1 sees pool `p`.
_REST_POOL = f"""json_object(
  'id', p.id, 'tenantId', p.tenant_id, 'siteId', p.site_id, 'class', p.class,
  'gpuModel', p.gpu_model, 'sharing', p.sharing, 'agent', p.agent, 'policy', json(p.policy),
  'providerAccountId', p.provider_account_id, 'region', p.region,
  'displayName', p.display_name, 'labels', json(p.labels),
  'owned', {_BOOLEAN.format("p.tenant_id = ?1")}, 'archived', {_BOOLEAN.format("p.archived")},
  'version', p.version,
  'quotas', (SELECT json_group_array(json_object(
      'resource', q.resource, 'max', q.max, 'used', q.used,
      'grant', CASE WHEN q.offered_to IS NULL THEN NULL ELSE json_object(
        'tenantId', q.tenant_id,
        'includeDescendants', {_BOOLEAN.format("q.include_descendants")},
        'priority', q.priority, 'offeredAt', {_TIMESTAMP.format(col="q.offered_at")}) END))
    FROM (SELECT q.resource, q.max, q.used, q.tenant_id, o.tenant_id AS offered_to,
            o.include_descendants, o.priority, o.created_at AS offered_at
          FROM quota_rows q
          LEFT JOIN offers o ON o.pool_id = q.pool_id AND o.tenant_id = q.tenant_id
          WHERE q.pool_id = p.id AND q.tenant_id = ?1 ORDER BY q.resource) q),
  'offers', NULL,
  'createdAt', {_TIMESTAMP.format(col="p.created_at")},
  'updatedAt', {_TIMESTAMP.format(col="p.updated_at")})"""

REST_GET = f"""
SELECT json_object('pool', {_REST_POOL})
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1 WHERE p.id = ?2
"""

# json_group_array over an ordered subquery (3.40 has no ORDER BY in an aggregate); json()
# keeps each object JSON rather than a string once it has passed through the subquery.
REST_LIST = f"""
SELECT json_object('pools', (SELECT json_group_array(json(pool)) FROM (
  SELECT {_REST_POOL} AS pool
  FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1
  WHERE NOT p.archived OR p.tenant_id = ?1 ORDER BY p.id)))
"""

# The guest's quota rows in every pool it sees, in pool and resource order.
QUOTAS = """
SELECT json_object('data', json_object('quotas', (SELECT json_group_array(json_object(
    'poolId', q.pool_id, 'resource', q.resource, 'max', q.max, 'used', q.used))
  FROM (SELECT q.* FROM quota_rows q JOIN pools p ON p.id = q.pool_id
        JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1
        WHERE q.tenant_id = ?1 AND (NOT p.archived OR p.tenant_id = ?1)
        ORDER BY q.pool_id, q.resource) q)))
"""

# One pool's rollup rows as a guest sees them (GraphQL's data, or REST's).
_CAPACITY = """
SELECT {wrap}json_object('capacity', (SELECT json_group_array(json_object(
    'resource', c.resource, 'total', c.total, 'allocatable', c.allocatable,
    'booked', c.booked, 'available', c.allocatable - c.booked))
  FROM (SELECT * FROM capacity_rows WHERE pool_id = p.id ORDER BY resource) c)){unwrap}
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1 WHERE p.id = ?2
"""
CAPACITY = _CAPACITY.format(wrap="json_object('data', ", unwrap=")")
REST_CAPACITY = _CAPACITY.format(wrap="", unwrap="")

# Why the guest ?1's viewer (?4, role ?5) may read pool ?2 (?3: a permission its role
# holds, with no condition on its binding): its own offer grants it.
_ACCESS = f"""
SELECT {{wrap}}json_object('access', json_object(
  'allowed', json('true'), 'permission', ?3,
  'binding', json_object('callerId', ?4, 'tenantId', ?1, 'role', ?5,
    'where', json_object(), 'actingFor', ?1, 'fleetAdmin', json('false')),
  'grant', json_object(
    'via', CASE WHEN p.tenant_id = ?1 THEN 'owner' ELSE 'offer' END, 'tenantId', a.tenant_id,
    'includeDescendants', {_BOOLEAN.format("o.include_descendants")}, 'priority', o.priority,
    'offeredAt', {_TIMESTAMP.format(col="o.created_at")}),
  'deniedBy', NULL)){{unwrap}}
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1
JOIN offers o ON o.pool_id = p.id AND o.tenant_id = a.tenant_id
WHERE p.id = ?2 AND (NOT p.archived OR p.tenant_id = ?1)
"""
ACCESS = _ACCESS.format(wrap="json_object('data', ", unwrap=")")
REST_EXPLAIN = _ACCESS.format(wrap="", unwrap="")

# The owner ?1's capacity rows of its live pools with the sums of its guests' quota rows
# (every offer holder's but its own), ranked by offered / allocatable, lent capacity on a
# row with none allocatable first (9e999: infinity), then in pool and resource order; the
# first ?2, aggregated over them in that order.
_LENDING = """
WITH lent AS (
  SELECT c.pool_id, c.resource, c.total, c.allocatable, c.booked,
    COALESCE(sum(q.max), 0) AS offered, COALESCE(sum(q.used), 0) AS guest_used
  FROM pools p JOIN capacity_rows c ON c.pool_id = p.id
  LEFT JOIN (quota_rows q JOIN offers o ON o.pool_id = q.pool_id AND o.tenant_id = q.tenant_id)
    ON q.pool_id = c.pool_id AND q.resource = c.resource AND q.tenant_id <> ?1
  WHERE p.tenant_id = ?1 AND NOT p.archived
  GROUP BY c.pool_id, c.resource, c.total, c.allocatable, c.booked
)
SELECT {wrap}json_object('lending', (SELECT json_group_array(json_object(
    'poolId', pool_id, 'resource', resource, 'total', total, 'allocatable', allocatable,
    'booked', booked, 'available', allocatable - booked, 'offered', offered,
    'guestUsed', guest_used, 'overcommit', overcommit))
  FROM (SELECT *, CASE WHEN allocatable > 0 THEN CAST(offered AS REAL) / allocatable END
          AS overcommit
        FROM lent ORDER BY CASE WHEN allocatable > 0 THEN CAST(offered AS REAL) / allocatable
          WHEN offered > 0 THEN 9e999 ELSE -1 END DESC, pool_id, resource LIMIT ?2))){unwrap}
"""
LENDING = _LENDING.format(wrap="json_object('data', ", unwrap=")")
REST_LENDING = _LENDING.format(wrap="", unwrap="")

# The tenant ?1's own reservations in every pool, in id order, as REST shows each
# (`resources` the stored object, its text read as JSON).
REST_RESERVATIONS = f"""
SELECT json_object('reservations', (SELECT json_group_array(json_object(
    'id', r.id, 'poolId', r.pool_id, 'tenantId', r.tenant_id, 'resources', json(r.resources),
    'state', r.state, 'createdAt', {_TIMESTAMP.format(col="r.created_at")},
    'endedAt', {_TIMESTAMP.format(col="r.ended_at")}))
  FROM (SELECT * FROM reservations WHERE tenant_id = ?1 ORDER BY id) r))
"""

# Pool ?2 as the guest ?1 sees it with a page of its own reservations there: the first ?3
# after the id ?4 (NULL: the first page), one more read to know a next page follows; each
# an edge with its cursor, `resources` as GraphQL's list in the stored object's order
# (json_each's rows in `id` order are its keys in the text's order).
POOL_RESERVATIONS = f"""
WITH page AS (
  SELECT * FROM reservations
  WHERE tenant_id = ?1 AND pool_id = ?2 AND (?4 IS NULL OR id > ?4)
  ORDER BY id LIMIT ?3 + 1
), shown AS (
  SELECT * FROM page ORDER BY id LIMIT ?3
)
SELECT json_object('data', json_object('pool', json_object(
  'id', p.id,
  'reservations', json_object(
    'pageInfo', json_object(
      'hasNextPage', {_BOOLEAN.format("(SELECT count(*) FROM page) > ?3")},
      'hasPreviousPage', {_BOOLEAN.format("?4 IS NOT NULL")},
      'startCursor', (SELECT bench_cursor(min(id)) FROM shown),
      'endCursor', (SELECT bench_cursor(max(id)) FROM shown)),
    'edges', (SELECT json_group_array(json_object(
        'cursor', bench_cursor(r.id),
        'node', json_object(
          'id', r.id, 'poolId', r.pool_id, 'tenantId', r.tenant_id, 'state', upper(r.state),
          'createdAt', {_TIMESTAMP.format(col="r.created_at")},
          'endedAt', {_TIMESTAMP.format(col="r.ended_at")},
          'resources', (SELECT json_group_array(json_object(
              'resource', e.key, 'amount', e.value))
            FROM (SELECT key, value FROM json_each(r.resources) ORDER BY id) e))))
      FROM (SELECT * FROM shown ORDER BY id) r)))))
FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = ?1 WHERE p.id = ?2
"""

SQLITE = Statements(
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
# The service's reader engine keeps 4 connections (app/db/engine.py, `create_database`).
CONNECTIONS = int(os.environ.get("BENCH_FLOOR_SQLITE_CONNECTIONS", "4"))


def _cursor(pool_id: str | None) -> str | None:
    return None if pool_id is None else encode_cursor(pool_id)


async def _connect(path: str) -> aiosqlite.Connection:
    # isolation_level=None: no transaction opened by the driver, each statement its own.
    conn = await aiosqlite.connect(path, isolation_level=None)
    for pragma in connection_pragmas(busy_timeout_ms(DEFAULT_DB_STATEMENT_TIMEOUT_S)):
        await conn.execute(pragma)
    await conn.create_function("bench_cursor", 1, _cursor, deterministic=True)
    return conn


@asynccontextmanager
async def sqlite_connections(path: str | None = None) -> AsyncIterator[Fetch]:
    """CONNECTIONS connections to the file at `path` (default: BENCH_FLOOR_SQLITE), and
    the fetch that runs a statement on a free one."""
    connections = [
        await _connect(path or os.environ["BENCH_FLOOR_SQLITE"]) for _ in range(CONNECTIONS)
    ]
    free: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
    for conn in connections:
        free.put_nowait(conn)

    async def fetch(statement: str, *args: object) -> str | None:
        conn = await free.get()
        try:
            rows = list(await conn.execute_fetchall(statement, args))
        finally:
            free.put_nowait(conn)
        return str(rows[0][0]) if rows else None

    try:
        yield fetch
    finally:
        for conn in connections:
            await conn.close()


app = floor_app(SQLITE, sqlite_connections)
