"""Direct reads on PostgreSQL: one asyncpg pool for statements that run alone, outside a
transaction, in one round trip (the compiled reads, app/capacity/json_reads.py).

SQLAlchemy's pool pings each connection it lends (on asyncpg: BEGIN, a statement,
ROLLBACK), which costs more than a compiled read itself. These statements need no ping: a
connection that has died fails the statement and the pool drops it (asyncpg reopens a
connection it saw closed when it is next lent); the caller answers UNAVAILABLE at once
when the failure is the database being out of reach (app/db/errors.connection_fault:
a wait that ran out, a connection refused or reset), since the plain path would wait for
it again, and on the plain path for any other failure. Bounded like the engines: connect,
acquire and statement timeouts from the db_* settings; opened on first use, at most `max_size`
connections (README: the connection budget), each keeping at most
`statements_per_connection` statements prepared (asyncpg's statement cache, least
recently used deallocated): PostgreSQL keeps each prepared statement's plan in the
backend's memory, about a megabyte for a large dashboard's, so distinct query texts must
not accumulate there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from app.metrics import statement_sent

if TYPE_CHECKING:
    import asyncpg

# A span per statement sent to asyncpg itself, outside SQLAlchemy (whose statements
# app/tracing.py traces by its engine events): app/tracing.py sets it when tracing is on.
StatementSpan = Callable[[str], AbstractContextManager[object]]
_statement_span: StatementSpan | None = None


def trace_statements(span: StatementSpan | None) -> None:
    global _statement_span
    _statement_span = span


def traced(sql: str) -> AbstractContextManager[object]:
    """Around a statement sent to asyncpg directly: its span, when tracing is on."""
    return nullcontext() if _statement_span is None else _statement_span(sql)


# No JIT compilation for any statement of the service's (these connections and the
# engines'). PostgreSQL compiles a statement whose estimated cost passes jit_above_cost
# (100,000 by default) on every execution, prepared or not: 40-70 ms of compiling for a
# relay read that runs in 0.2 ms, once a generic plan's estimate (500 events, a
# subquery each) passed the bound (seen with auto_explain under bench.writes). Every
# statement here is short; none gains from it.
NO_JIT = {"jit": "off"}
# How these connections name themselves in pg_stat_activity (engine.APPLICATION_NAME).
DIRECT_APPLICATION_NAME = "bettercompute direct"


async def _nothing_to_reset(_connection: asyncpg.Connection) -> None:
    return None


class DirectReads:
    def __init__(
        self,
        dsn: str,
        *,
        max_size: int,
        statements_per_connection: int,
        connect_timeout_s: float,
        acquire_timeout_s: float,
        statement_timeout_ms: int,
        command_timeout_s: float,
    ) -> None:
        self._dsn = dsn
        self._max_size = max_size
        self._statements = statements_per_connection
        self._connect_timeout_s = connect_timeout_s
        self._acquire_timeout_s = acquire_timeout_s
        self._statement_timeout_ms = statement_timeout_ms
        self._command_timeout_s = command_timeout_s
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    async def _opened(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    import asyncpg

                    self._pool = await asyncpg.create_pool(
                        self._dsn,
                        min_size=0,
                        max_size=self._max_size,
                        timeout=self._connect_timeout_s,
                        command_timeout=self._command_timeout_s,
                        # The hot set stays prepared; beyond it, the least recently used
                        # statement is deallocated (on the server too).
                        statement_cache_size=self._statements,
                        server_settings={
                            "statement_timeout": str(self._statement_timeout_ms),
                            # One plan per statement, made once per connection: these
                            # statements are planned alike for any parameters, and
                            # planning one (about a millisecond) costs more than running it.
                            "plan_cache_mode": "force_generic_plan",
                            **NO_JIT,
                            "application_name": DIRECT_APPLICATION_NAME,
                        },
                        # Nothing here changes session state (one read statement, no
                        # transaction), so a returned connection needs no RESET ALL.
                        reset=_nothing_to_reset,
                    )
        return self._pool

    async def fetchval(self, sql: str, params: tuple[Any, ...]) -> Any:
        pool = await self._opened()
        # The acquire bounded by asyncio.timeout rather than asyncpg's `timeout=`, which
        # runs every acquire in a task of its own (wait_for): a measurable share of a
        # one-pool read's CPU. The same bound, and the lending back keeps it too.
        async with asyncio.timeout(self._acquire_timeout_s):
            conn = await pool.acquire()
        try:
            statement_sent()
            with traced(sql):
                return await conn.fetchval(sql, *params)
        except TimeoutError:
            # The server did not answer within the statement bound + 1 s (its own
            # statement_timeout would have): asyncpg sends a cancel request on a new
            # connection, and lending the connection back waits for it, up to the
            # command and the acquire timeouts more. The connection is not to be
            # trusted anyway: dropped, it is not waited for.
            conn.terminate()
            raise
        finally:
            await pool.release(conn, timeout=self._acquire_timeout_s)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
