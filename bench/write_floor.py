"""The floor for bench/writes.py: a bare Starlette + asyncpg app doing each write as ONE
SQL statement over the service's own tables (a database migrated by its migrations).

What each statement does, with the service's guards:

- `/book` (REST `reservations/create`) and `/book-graphql` (GraphQL `createReservation`,
  the same statement, a GraphQL-shaped answer): the pool must be visible to the tenant
  (its authz row) and not archived; the committed-headroom pre-check (`max - used` and
  `allocatable - booked` read before any row lock, as `_refuse_if_full_now`); the
  idempotency record (the service's derived id, app/ids.py); the guarded quota UPDATE
  (`used <= max - n`) then the guarded capacity UPDATE (`booked <= allocatable - n`),
  in that order as the service takes them; the reservation row. A booking that does not
  fit aborts the whole statement (a cast that fails at run time), so nothing is left
  half-booked; the floor answers 409.
- `/release`: ends the reservation (`state = 'active'` guard) and gives back its quota
  and capacity rows, `allocatable` following `booked` back to `total` as the service does.
- `/pools/create`: idempotency record, pool, owner offer, owner quota row, owner authz row,
  the `pool.created` event and its audience row.
- `/pools/offer` (an existing offer resized): pool version bumped (unless archived), offer
  and quota row upserted (`max` never below `used`), authz row upserted, `pool.offered`
  event with its `changes` and two audience rows.
- `/pools/unoffer`: offer and authz row deleted, quota rows' `max` dropped to `used`,
  version bumped, `pool.unoffered` event and audience.
- `/pools/update` (`gpuModel`): pool and its authz rows updated, the rollup refreshed from
  the nodes (`total`, `allocatable = greatest(total, booked)`: exclusive pools, the `gpu`
  row), `pool.updated` event, an audience row per offer.
- `/pools/archive`: guest offers, their authz rows withdrawn and quota rows dropped to
  `used`, the pool archived under its row's lock (which every booking takes first, ADR
  0004), `pool.archived` event and audience.

What it skips: authentication, IAM decisions, input validation (the body is parsed as
JSON and its fields taken as they are), the outbox's advisory lock (the ordering step:
the issue's target compares against writes without it), the policy validators, change
diffs computed in Python (the SQL writes the same `changes` entries for these writes),
and a booking's lock on the pool's row: the statement reads the archived state once,
from its own snapshot (ADR 0004's guarantee needs more against a concurrent archive;
the bench runs none during a booking round). Every statement goes
through asyncpg's prepared-statement cache; the pool has the service's size
(`db_pool_size` kept open, up to `db_pool_size + db_max_overflow`) and sends nothing when
a connection goes back to it (one statement, one round trip per write).

The answer is the service's own answer to the same write (taken once by the bench, a
template in BENCH_WRITE_FLOOR_TEMPLATES) with this write's ids, version, timestamps,
`gpuModel` and quota `max` filled in from the statement and the request: the same bytes
in shape and size. The other values (another pool's `used`, say) stay the template's: the
floor does not read back the rows it did not write.

    BENCH_FLOOR_DSN=postgresql://... BENCH_WRITE_FLOOR_TEMPLATES=file.json \\
        BENCH_FLOOR_CALLERS='{"<tenant>": "<caller id>"}' uvicorn bench.write_floor:app
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.config import Settings
from app.ids import derived_id, new_id
from bench.floor import _TIMESTAMP

OUTBOX_AUDIENCE = "INSERT INTO event_audience (seq, tenant_id)"


def _ts(column: str) -> str:
    return _TIMESTAMP.format(col=column)


# $1 tenant, $2 pool, $3 resource, $4 amount, $5 reservation id, $6 caller, $7 key (or
# NULL: no idempotency record), $8 fingerprint
BOOK = f"""
WITH visible AS (
  SELECT p.id FROM pools p JOIN authz_rows a ON a.pool_id = p.id AND a.tenant_id = $1
  WHERE p.id = $2 AND NOT p.archived
), headroom AS (
  SELECT v.id FROM visible v
  WHERE (SELECT q.max - q.used FROM quota_rows q
         WHERE q.pool_id = $2 AND q.tenant_id = $1 AND q.resource = $3) >= $4
    AND (SELECT c.allocatable - c.booked FROM capacity_rows c
         WHERE c.pool_id = $2 AND c.resource = $3) >= $4
), remembered AS (
  INSERT INTO idempotency_records
    (resource_id, method, tenant_id, caller_id, key, fingerprint, created_at)
  SELECT $5, 'reservations.create', $1, $6, $7::text, $8::jsonb, now() FROM headroom
  WHERE $7::text IS NOT NULL
  RETURNING 1
), quota AS (
  UPDATE quota_rows SET used = used + $4
  WHERE pool_id = $2 AND tenant_id = $1 AND resource = $3 AND used <= max - $4
    AND EXISTS (SELECT 1 FROM headroom) AND (SELECT count(*) FROM remembered) >= 0
  RETURNING 1
), capacity AS (
  UPDATE capacity_rows SET booked = booked + $4
  WHERE pool_id = $2 AND resource = $3 AND booked <= allocatable - $4
    AND EXISTS (SELECT 1 FROM quota)
  RETURNING 1
), booked AS (
  INSERT INTO reservations
    (id, pool_id, tenant_id, quota_tenant_id, resources, state, created_at, ended_at)
  SELECT $5, $2, $1, $1, jsonb_build_object($3::text, $4::bigint), 'active', now(), NULL
  FROM capacity
  RETURNING id, created_at
)
SELECT CASE WHEN b.id IS NOT NULL THEN {_ts("b.created_at")}
  ELSE (SELECT 'refused:' || count(*) FROM quota)::int::text END AS created_at
FROM (SELECT 1) one LEFT JOIN booked b ON true
"""

# $1 tenant, $2 reservation id
RELEASE = f"""
WITH ended AS (
  UPDATE reservations SET state = 'ended', ended_at = now()
  WHERE id = $2 AND tenant_id = $1 AND state = 'active'
  RETURNING id, pool_id, quota_tenant_id, resources, created_at, ended_at
), amounts AS (
  SELECT e.pool_id, e.quota_tenant_id, r.key AS resource, r.value::bigint AS amount
  FROM ended e, jsonb_each_text(e.resources) r
), quota AS (
  UPDATE quota_rows q SET used = q.used - a.amount FROM amounts a
  WHERE q.pool_id = a.pool_id AND q.tenant_id = a.quota_tenant_id AND q.resource = a.resource
  RETURNING 1
), capacity AS (
  UPDATE capacity_rows c SET booked = c.booked - a.amount,
    allocatable = greatest(c.total, c.booked - a.amount)
  FROM amounts a
  WHERE c.pool_id = a.pool_id AND c.resource = a.resource
    AND (SELECT count(*) FROM quota) >= 0
  RETURNING 1
)
SELECT e.pool_id, {_ts("e.created_at")} AS created_at, {_ts("e.ended_at")} AS ended_at,
  (SELECT count(*) FROM capacity) AS rows
FROM ended e
"""

# $1 owner tenant, $2 site, $3 pool id, $4 class, $5 caller, $6 key, $7 fingerprint
CREATE_POOL = f"""
WITH site AS (
  SELECT id, region FROM sites WHERE id = $2 AND tenant_id = $1
), remembered AS (
  INSERT INTO idempotency_records
    (resource_id, method, tenant_id, caller_id, key, fingerprint, created_at)
  SELECT $3, 'pools.create', $1, $5, $6::text, $7::jsonb, now() FROM site
  WHERE $6::text IS NOT NULL
  RETURNING 1
), pool AS (
  INSERT INTO pools (id, tenant_id, site_id, class, gpu_model, sharing, agent, policy,
    provider_account_id, region, archived, version, created_at, updated_at)
  SELECT $3, $1, s.id, $4, NULL, 'exclusive', 'bcd', '{{}}'::jsonb, NULL, s.region, false,
    1, now(), now()
  FROM site s WHERE (SELECT count(*) FROM remembered) >= 0
  RETURNING id, class, region, created_at, updated_at
), offer AS (
  INSERT INTO offers (pool_id, tenant_id, include_descendants, priority, created_at)
  SELECT id, $1, false, 0, created_at FROM pool RETURNING 1
), quota AS (
  INSERT INTO quota_rows (pool_id, tenant_id, resource, max, used)
  SELECT id, $1, 'gpu', 2147483647, 0 FROM pool WHERE EXISTS (SELECT 1 FROM offer)
  RETURNING 1
), authz AS (
  INSERT INTO authz_rows
    (tenant_id, pool_id, gpu_model, class, sharing, region, owned, include_descendants)
  SELECT $1, id, NULL, class, 'exclusive', region, true, false FROM pool
  WHERE EXISTS (SELECT 1 FROM offer)
  RETURNING 1
), event AS (
  INSERT INTO events (type, pool_id, tenant_id, occurred_at, data)
  SELECT 'pool.created', id, $1, now(), jsonb_build_object('siteId', $2::text,
    'class', class, 'sharing', 'exclusive', 'gpuModel', NULL, 'version', 1)
  FROM pool RETURNING seq
), audience AS (
  {OUTBOX_AUDIENCE} SELECT seq, $1 FROM event RETURNING 1
)
SELECT {_ts("p.created_at")} AS created_at, {_ts("p.updated_at")} AS updated_at,
  (SELECT count(*) FROM quota) + (SELECT count(*) FROM authz) + (SELECT count(*) FROM audience)
  AS rows
FROM pool p
"""

# $1 owner tenant, $2 pool, $3 to tenant, $4 resource, $5 max
OFFER = f"""
WITH pool AS (
  UPDATE pools SET version = version + 1, updated_at = now()
  WHERE id = $2 AND tenant_id = $1 AND NOT archived
  RETURNING id, version, class, gpu_model, sharing, region, updated_at
), before AS (
  SELECT q.max FROM quota_rows q
  WHERE q.pool_id = $2 AND q.tenant_id = $3 AND q.resource = $4 FOR UPDATE
), offer AS (
  INSERT INTO offers (pool_id, tenant_id, include_descendants, priority, created_at)
  SELECT id, $3, false, 0, now() FROM pool
  ON CONFLICT (pool_id, tenant_id) DO UPDATE
    SET include_descendants = excluded.include_descendants, priority = excluded.priority
  RETURNING 1
), quota AS (
  INSERT INTO quota_rows (pool_id, tenant_id, resource, max, used)
  SELECT id, $3, $4, $5, 0 FROM pool WHERE (SELECT count(*) FROM before) >= 0
  ON CONFLICT (pool_id, tenant_id, resource) DO UPDATE
    SET max = greatest(excluded.max, quota_rows.used)
  RETURNING max
), authz AS (
  INSERT INTO authz_rows
    (tenant_id, pool_id, gpu_model, class, sharing, region, owned, include_descendants)
  SELECT $3, id, gpu_model, class, sharing, region, false, false FROM pool
  ON CONFLICT (tenant_id, pool_id) DO UPDATE SET gpu_model = excluded.gpu_model,
    class = excluded.class, sharing = excluded.sharing, region = excluded.region,
    include_descendants = excluded.include_descendants
  RETURNING 1
), event AS (
  INSERT INTO events (type, pool_id, tenant_id, occurred_at, data)
  SELECT 'pool.offered', p.id, $1, now(), jsonb_build_object('toTenantId', $3::text,
    'quota', jsonb_build_object($4::text, $5::bigint), 'includeDescendants', false,
    'priority', 0, 'version', p.version,
    'changes', CASE WHEN (SELECT max FROM before) IS DISTINCT FROM (SELECT max FROM quota)
      THEN jsonb_build_array(jsonb_build_object('path', '/offers/' || $3 || '/quota/' || $4,
        'before', (SELECT max FROM before), 'after', (SELECT max FROM quota)))
      ELSE '[]'::jsonb END)
  FROM pool p WHERE (SELECT count(*) FROM offer) >= 0
  RETURNING seq
), audience AS (
  {OUTBOX_AUDIENCE} SELECT DISTINCT seq, t FROM event, (VALUES ($1), ($3)) v(t) RETURNING 1
)
SELECT p.version, p.gpu_model, {_ts("p.updated_at")} AS updated_at,
  (SELECT count(*) FROM authz) + (SELECT count(*) FROM audience) AS rows
FROM pool p
"""

# $1 owner tenant, $2 pool, $3 to tenant
UNOFFER = """
WITH offer AS (
  DELETE FROM offers o USING pools p
  WHERE o.pool_id = $2 AND o.tenant_id = $3 AND p.id = o.pool_id AND p.tenant_id = $1
    AND $3 <> $1
  RETURNING o.pool_id, o.include_descendants, o.priority
), authz AS (
  DELETE FROM authz_rows WHERE pool_id IN (SELECT pool_id FROM offer) AND tenant_id = $3
  RETURNING 1
), quota AS (
  UPDATE quota_rows SET max = used
  WHERE pool_id IN (SELECT pool_id FROM offer) AND tenant_id = $3
  RETURNING resource, (SELECT max FROM quota_rows b WHERE b.pool_id = quota_rows.pool_id
    AND b.tenant_id = quota_rows.tenant_id AND b.resource = quota_rows.resource) AS before
), pool AS (
  UPDATE pools SET version = version + 1, updated_at = now()
  WHERE id IN (SELECT pool_id FROM offer)
  RETURNING id, version
), event AS (
  INSERT INTO events (type, pool_id, tenant_id, occurred_at, data)
  SELECT 'pool.unoffered', p.id, $1, now(), jsonb_build_object('toTenantId', $3::text,
    'version', p.version, 'changes', jsonb_build_array(jsonb_build_object(
      'path', '/offers/' || $3, 'before', jsonb_build_object(
        'includeDescendants', o.include_descendants, 'priority', o.priority,
        'quota', (SELECT jsonb_object_agg(resource, before) FROM quota)), 'after', NULL)))
  FROM pool p, offer o
  RETURNING seq
), audience AS (
  INSERT INTO event_audience (seq, tenant_id)
  SELECT seq, t FROM event, (VALUES ($1), ($3)) v(t) RETURNING 1
)
SELECT (SELECT count(*) FROM authz) + (SELECT count(*) FROM audience) AS rows FROM pool
"""

# $1 owner tenant, $2 pool, $3 gpu model
UPDATE_POOL = f"""
WITH old AS (
  SELECT gpu_model FROM pools WHERE id = $2 AND tenant_id = $1 AND NOT archived FOR UPDATE
), pool AS (
  UPDATE pools SET gpu_model = $3, version = version + 1, updated_at = now()
  WHERE id = $2 AND EXISTS (SELECT 1 FROM old)
  RETURNING id, version, gpu_model, updated_at
), authz AS (
  UPDATE authz_rows SET gpu_model = $3 WHERE pool_id IN (SELECT id FROM pool) RETURNING 1
), rollup AS (
  UPDATE capacity_rows c SET total = n.gpus, allocatable = greatest(n.gpus, c.booked)
  FROM (SELECT coalesce(sum(gpus), 0) AS gpus FROM nodes WHERE pool_id = $2) n
  WHERE c.pool_id IN (SELECT id FROM pool) AND c.resource = 'gpu'
  RETURNING 1
), event AS (
  INSERT INTO events (type, pool_id, tenant_id, occurred_at, data)
  SELECT 'pool.updated', p.id, $1, now(), jsonb_build_object('version', p.version,
    'changed', jsonb_build_array('gpuModel'), 'changes', CASE WHEN o.gpu_model
      IS DISTINCT FROM $3 THEN jsonb_build_array(jsonb_build_object('path', '/gpuModel',
      'before', o.gpu_model, 'after', $3::text)) ELSE '[]'::jsonb END)
  FROM pool p, old o
  RETURNING seq
), audience AS (
  {OUTBOX_AUDIENCE}
  SELECT e.seq, o.tenant_id FROM event e, offers o WHERE o.pool_id = $2
  UNION SELECT seq, $1 FROM event
  RETURNING 1
)
SELECT p.version, {_ts("p.updated_at")} AS updated_at,
  (SELECT count(*) FROM authz) + (SELECT count(*) FROM rollup)
  + (SELECT count(*) FROM audience) AS rows
FROM pool p
"""

# $1 owner tenant, $2 pool
ARCHIVE = f"""
WITH owned AS (
  SELECT id FROM pools WHERE id = $2 AND tenant_id = $1 AND NOT archived FOR UPDATE
), removed AS (
  DELETE FROM offers WHERE pool_id IN (SELECT id FROM owned) AND tenant_id <> $1
  RETURNING tenant_id
), authz AS (
  DELETE FROM authz_rows WHERE pool_id IN (SELECT id FROM owned) AND tenant_id <> $1
  RETURNING 1
), quota AS (
  UPDATE quota_rows SET max = used
  WHERE pool_id IN (SELECT id FROM owned) AND tenant_id <> $1
  RETURNING 1
), pool AS (
  UPDATE pools SET archived = true, version = version + 1, updated_at = now()
  WHERE id IN (SELECT id FROM owned)
  RETURNING id, version, updated_at
), event AS (
  INSERT INTO events (type, pool_id, tenant_id, occurred_at, data)
  SELECT 'pool.archived', p.id, $1, now(), jsonb_build_object('removedTenantIds',
    coalesce((SELECT jsonb_agg(tenant_id ORDER BY tenant_id) FROM removed), '[]'::jsonb),
    'version', p.version)
  FROM pool p
  RETURNING seq
), audience AS (
  {OUTBOX_AUDIENCE}
  SELECT e.seq, r.tenant_id FROM event e, removed r UNION SELECT seq, $1 FROM event
  RETURNING 1
)
SELECT p.version, {_ts("p.updated_at")} AS updated_at,
  (SELECT count(*) FROM authz) + (SELECT count(*) FROM quota)
  + (SELECT count(*) FROM audience) AS rows
FROM pool p
"""


def fill(template: str, values: dict[str, str]) -> str:
    """The service's answer with this write's values in place of its own (`@NAME@`)."""
    for name, value in values.items():
        template = template.replace(f"@{name}@", value)
    return template


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Each write is one autocommit statement: no transaction, lock or setting is left to
    reset when a connection goes back to the pool (asyncpg's default reset sends four
    statements: `SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`)."""


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    settings = Settings.from_env()
    templates = Path(os.environ["BENCH_WRITE_FLOOR_TEMPLATES"])
    app.state.templates = json.loads(await asyncio.to_thread(templates.read_text))
    app.state.callers = json.loads(os.environ["BENCH_FLOOR_CALLERS"])
    app.state.pool = await asyncpg.create_pool(
        os.environ["BENCH_FLOOR_DSN"],
        min_size=settings.db_pool_size,
        max_size=settings.db_pool_size + settings.db_max_overflow,
        reset=_no_reset,
        server_settings={"jit": "off"},  # as the service's (app/db/direct.py NO_JIT)
    )
    try:
        yield
    finally:
        await app.state.pool.close()


def _answer(request: Request, name: str, values: dict[str, str]) -> Response:
    body = fill(request.app.state.templates[name], values)
    return Response(body, media_type="application/json")


def _refused(message: str) -> Response:
    return Response(_json({"error": {"code": "CONFLICT", "message": message}}), 409)


async def _book(request: Request, template: str, inp: dict[str, Any]) -> Response:
    tenant, pool_id, key = inp["tenantId"], inp["poolId"], inp.get("idempotencyKey")
    ((resource, amount),) = inp["resources"].items()
    caller = request.app.state.callers[tenant]
    rsv = new_id("rsv") if key is None else derived_id("rsv", tenant, caller, key)
    fingerprint = _json({"poolId": pool_id, "resources": inp["resources"]})
    try:
        created = await request.app.state.pool.fetchval(
            BOOK, tenant, pool_id, resource, amount, rsv, caller, key, fingerprint
        )
    except (asyncpg.InvalidTextRepresentationError, asyncpg.UniqueViolationError) as exc:
        return _refused(str(exc))
    values = {"ID": rsv, "POOL": pool_id, "CREATED": created}
    return _answer(request, template, values)


async def book(request: Request) -> Response:
    return await _book(request, "book", json.loads(await request.body()))


async def book_graphql(request: Request) -> Response:
    inp = json.loads(await request.body())["variables"]["input"]
    inp["resources"] = {r["resource"]: r["amount"] for r in inp["resources"]}
    return await _book(request, "book-graphql", inp)


async def release(request: Request) -> Response:
    inp = json.loads(await request.body())
    row = await request.app.state.pool.fetchrow(RELEASE, inp["tenantId"], inp["reservationId"])
    if row is None:
        return _refused("no active reservation")
    values = {
        "ID": inp["reservationId"],
        "POOL": row["pool_id"],
        "CREATED": row["created_at"],
        "ENDED": row["ended_at"],
    }
    return _answer(request, "release", values)


async def create_pool(request: Request) -> Response:
    inp = json.loads(await request.body())
    tenant, key = inp["tenantId"], inp.get("idempotencyKey")
    caller = request.app.state.callers[tenant]
    pool_id = new_id("pool") if key is None else derived_id("pool", tenant, caller, key)
    fingerprint = {
        "siteId": inp["siteId"],
        "class": inp["class"],
        "sharing": "exclusive",
        "agent": "bcd",
        "providerAccountId": None,
    }
    row = await request.app.state.pool.fetchrow(
        CREATE_POOL, tenant, inp["siteId"], pool_id, inp["class"], caller, key, _json(fingerprint)
    )
    if row is None:
        return _refused("no such site")
    values = {"POOL": pool_id, "CREATED": row["created_at"], "UPDATED": row["updated_at"]}
    return _answer(request, "create", values)


async def offer(request: Request) -> Response:
    inp = json.loads(await request.body())
    ((resource, maximum),) = inp["quota"].items()
    row = await request.app.state.pool.fetchrow(
        OFFER, inp["tenantId"], inp["poolId"], inp["toTenantId"], resource, maximum
    )
    if row is None:
        return _refused("not offered")
    values = {
        "POOL": inp["poolId"],
        "VERSION": str(row["version"]),
        "MAX": str(maximum),
        "UPDATED": row["updated_at"],
    }
    return _answer(request, "offer", values)


async def unoffer(request: Request) -> Response:
    inp = json.loads(await request.body())
    rows = await request.app.state.pool.fetchval(
        UNOFFER, inp["tenantId"], inp["poolId"], inp["toTenantId"]
    )
    if rows is None:
        return _refused("no such offer")
    return _answer(request, "unoffer", {})


async def update_pool(request: Request) -> Response:
    inp = json.loads(await request.body())
    row = await request.app.state.pool.fetchrow(
        UPDATE_POOL, inp["tenantId"], inp["poolId"], inp["gpuModel"]
    )
    if row is None:
        return _refused("not updated")
    values = {
        "POOL": inp["poolId"],
        "VERSION": str(row["version"]),
        "GPU": _json(inp["gpuModel"]),
        "UPDATED": row["updated_at"],
    }
    return _answer(request, "update", values)


async def archive_pool(request: Request) -> Response:
    inp = json.loads(await request.body())
    row = await request.app.state.pool.fetchrow(ARCHIVE, inp["tenantId"], inp["poolId"])
    if row is None:
        return _refused("not archived")
    values = {"POOL": inp["poolId"], "VERSION": str(row["version"]), "UPDATED": row["updated_at"]}
    return _answer(request, "archive", values)


app = Starlette(
    routes=[
        Route("/book", book, methods=["POST"]),
        Route("/book-graphql", book_graphql, methods=["POST"]),
        Route("/release", release, methods=["POST"]),
        Route("/pools/create", create_pool, methods=["POST"]),
        Route("/pools/offer", offer, methods=["POST"]),
        Route("/pools/unoffer", unoffer, methods=["POST"]),
        Route("/pools/update", update_pool, methods=["POST"]),
        Route("/pools/archive", archive_pool, methods=["POST"]),
    ],
    lifespan=lifespan,
)
