"""Readiness: can this process serve requests now? `/readyz` checks what a request needs
(the database answers a trivial query within a short bound, the event broker is
connected, the event relay has caught up with the newest committed event within
`readiness_relay_lag_s`) and says which check failed, nothing more; and whether the rate
limits are enforced (`rateLimits`: "off" while their store is silent, which does not make
the process unready). Liveness is `/livez`
(`/healthz` is its older name), which checks nothing outside the process, so an
orchestrator restarts a process only when it is itself stuck, and only routes traffic
away while a dependency is down."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

from app.db.engine import Database
from app.db.errors import RETRY_AFTER_S
from app.events.bus import EventBus
from app.events.relay import Relay
from app.http.responses import JSONResponse
from app.rate_limit import RateLimiter

log = logging.getLogger(__name__)

Check = Literal["ok", "unavailable"]


async def database_check(db: Database, timeout_s: float) -> Check:
    """The reader answers its probe (`_PROBES`) within `timeout_s` (pool wait included).
    It uses the pool, so readiness costs no connection beyond the process's budget.

    The check runs as its own task and is not waited for past the bound: cancelling it
    would wait for SQLAlchemy to close the connection (up to 2 s against a server that
    does not answer); left alone, it ends within the engine's own bounds. While one is
    still running, later probes wait on it instead of taking another connection."""
    check = _running.get(db)
    if check is None:
        check = _running[db] = asyncio.ensure_future(_select_one(db))
        check.add_done_callback(lambda done: _finished(db, done))
    try:
        await asyncio.wait_for(asyncio.shield(check), timeout_s)
    except Exception as exc:  # any failure means "not ready"; the kind is logged, not shown
        log.warning("readiness: database check failed: %s", type(exc).__name__)
        return "unavailable"
    return "ok"


_running: dict[Database, asyncio.Future[None]] = {}  # the check in flight per database


# What proves the store answers. SQLite's `SELECT 1` never opens the file: under a stalled
# file (another process holding the WAL index's read locks) it answered while every read
# failed. Reading the schema begins a read transaction on the file, as every read does.
_PROBES = {"sqlite": "SELECT count(*) FROM sqlite_master"}


async def _select_one(db: Database) -> None:
    async with db.reader.connect() as connection:
        await connection.exec_driver_sql(_PROBES.get(db.dialect, "SELECT 1"))


def _finished(db: Database, check: asyncio.Future[None]) -> None:
    if _running.get(db) is check:
        del _running[db]
    if not check.cancelled():
        check.exception()  # retrieved: a late failure is already reported as "unavailable"


def broker_check(bus: EventBus) -> Check:
    return "ok" if bus.connected else "unavailable"


def relay_check(relay: Relay[Any], max_lag_s: float) -> Check:
    """Caught up: nothing committed (that this process heard of) is left to relay, or the
    relay read to the end of the outbox within the bound. A relay that never read its
    cursor (the database was away at start) is not ready."""
    if relay.caught_up_at is None and not relay.cursor_ready:
        return "unavailable"
    if relay.lag == 0:
        return "ok"
    since = relay.caught_up_at
    now = asyncio.get_running_loop().time()
    return "ok" if since is not None and now - since <= max_lag_s else "unavailable"


async def livez(_: Request) -> Response:
    """The process answers: nothing outside it is checked."""
    return JSONResponse({"ok": True})


async def readyz(request: Request) -> Response:
    state = request.app.state
    checks: dict[str, Check] = {
        "database": await database_check(state.db, state.settings.readiness_timeout_s),
        "broker": broker_check(state.bus),
        "relay": relay_check(state.relay, state.settings.readiness_relay_lag_s),
    }
    ready = all(check == "ok" for check in checks.values())
    # Not a check: a silent rate-limit store lets requests through (app/rate_limit.py).
    limiter: RateLimiter = state.rate_limiter
    return JSONResponse(
        {"ready": ready, "checks": checks, "rateLimits": "on" if limiter.enforced else "off"},
        status_code=200 if ready else 503,
        headers=None if ready else {"retry-after": str(RETRY_AFTER_S)},
    )
