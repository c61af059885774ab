"""A compiled read that meets a connection-class fault answers 503 at once: its one
statement gives up and the request is answered UNAVAILABLE, with no second wait on the
plain path (issue 21; app/capacity/service.py `Capacity.read_json`).

The fault is a real one, made from outside the service: on SQLite another process holds
the WAL index's read locks (tests/db/faults.py `StallingSQLite`: no transaction begins;
SQLite retries for about 10 s and gives up), on PostgreSQL a session of the test's own
holds an ACCESS EXCLUSIVE lock on `pools` (the statement_timeout cancels the wait, 57014).
The app runs behind a real uvicorn server, with the compiled reads on their own
connections (app/db/direct.py, app/db/direct_sqlite.py) and, fenced off, on the engine's
read pool (`BETTERCOMPUTE_DB_DIRECT_POOL_SIZE=0`). Each faulted request sends at most
the one statement an answered one does (the plain path would send more: the caller's
token, then its read, waiting again), and the compiled reads count it neither answered
nor declined."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from prometheus_client import REGISTRY
from sqlalchemy.engine import make_url

from app.config import Settings
from tests.db.faults import StallingSQLite, hold_lock
from tests.events.conftest import served
from tests.support import Fleet

BOUND_S = 1.0  # the statement bound, lock waits included (PostgreSQL)
SQLITE_RETRIES_S = 10.0  # SQLite's own retries for a WAL read lock, whatever the bound
MARGIN_S = 6.0  # a busy 2-core machine
LIST_POOLS = 'query { pools(tenantId: "acme", first: 10) { nodes { id } } }'


def _statements(transport: str) -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": transport})
    return found or 0.0


def _compiled(outcome: str) -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": outcome})
    return found or 0.0


async def _hold_read_lock(database_url: str, dialect: str) -> Callable[[], Awaitable[None]]:
    """Take a lock every compiled read waits on, from outside the service; returns its
    release."""
    if dialect == "sqlite":
        stalling = StallingSQLite(make_url(database_url).database or "")
        await stalling.start()
        await stalling.stall()

        async def release_sqlite() -> None:
            await stalling.resume()
            await stalling.close()

        return release_sqlite
    return await hold_lock(database_url, "LOCK TABLE pools IN ACCESS EXCLUSIVE MODE")


@pytest.mark.parametrize("direct_pool", [4, 0], ids=["own-connections", "engine-pool"])
async def test_a_compiled_read_meeting_a_held_lock_is_503_at_once(
    database_url: str, dialect: str, direct_pool: int, fleet: Fleet
) -> None:
    settings = Settings(
        database_url=database_url,
        db_statement_timeout_s=BOUND_S,
        db_direct_pool_size=direct_pool,
        compiled_reads=True,
        event_poll_interval_s=3600,
        revocation_poll_interval_s=3600,
    )
    async with served(settings) as (_, address):
        await fleet.tenant("acme")
        site = await fleet.site("acme")
        headers = {"authorization": f"Bearer {await fleet.caller('acme', 'admin')}"}
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=60) as client:
            body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
            created = await client.post("/api/compute/pools/create", json=body, headers=headers)
            assert created.status_code == 200, created.text
            get = {"tenantId": "acme", "poolId": created.json()["pool"]["id"]}
            calls: dict[str, tuple[str, Callable[[], Awaitable[httpx.Response]]]] = {
                "rest pools/get": (
                    "rest",
                    lambda: client.post("/api/compute/pools/get", json=get, headers=headers),
                ),
                "graphql pools": (
                    "graphql",
                    lambda: client.post("/graphql", json={"query": LIST_POOLS}, headers=headers),
                ),
            }
            # Each is answered by its compiled statement once the caller is remembered and
            # the query text planned (after one clean plain run): one statement.
            answered_statements = {}
            for name, (transport, call) in calls.items():
                for _ in range(2):
                    assert (await call()).status_code == 200
                answered, before = _compiled("answered"), _statements(transport)
                assert (await call()).status_code == 200
                assert _compiled("answered") == answered + 1, name
                answered_statements[name] = _statements(transport) - before

            release = await _hold_read_lock(database_url, dialect)
            try:
                counted = _compiled("answered"), _compiled("declined")
                sent = {name: _statements(transport) for name, (transport, _) in calls.items()}

                async def timed(
                    call: Callable[[], Awaitable[httpx.Response]],
                ) -> tuple[httpx.Response, float]:
                    began = time.monotonic()
                    return await call(), time.monotonic() - began

                # Both at once: one wait for the fault between them.
                answers = await asyncio.gather(*(timed(call) for _, call in calls.values()))
            finally:
                await release()
            bound = SQLITE_RETRIES_S if dialect == "sqlite" else BOUND_S
            for (name, (transport, _)), (faulted, took) in zip(calls.items(), answers, strict=True):
                print(f"{dialect} {name}: {faulted.status_code} in {took:.2f} s")
                assert faulted.status_code == 503, (name, faulted.text)
                assert int(faulted.headers["retry-after"]) > 0
                if transport == "rest":
                    assert faulted.json()["error"]["code"] == "UNAVAILABLE"
                else:
                    (error,) = faulted.json()["errors"]
                    assert error["extensions"]["code"] == "UNAVAILABLE"
                # No second wait: at most the compiled statement was sent (none when the
                # fault met the opening of a connection for it), and no request went on to
                # the plain path (it would count as declined, below).
                assert _statements(transport) - sent[name] <= answered_statements[name], name
                assert took < bound + MARGIN_S, name
            assert (_compiled("answered"), _compiled("declined")) == counted
            for name, (_, call) in calls.items():
                assert (await call()).status_code == 200, name
