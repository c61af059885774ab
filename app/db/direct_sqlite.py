"""Direct reads on the embedded SQLite default: a few aiosqlite connections of their own
for statements that run alone, outside a transaction (the compiled reads,
app/capacity/json_reads.py), each ONE hand-off to its connection's thread
(`execute_fetchall`), as PostgreSQL's run on app/db/direct.py's asyncpg pool.

Through the engine's read pool the same statement costs five or six trips through
aiosqlite's thread (SQLAlchemy's cursor, execute, fetchall, close, the pool's rollback on
return) and the pool's own bookkeeping, more than a one-pool statement itself; under load
the pool's overflow also opens and closes connections (a thread, the pragmas) per request.

Each connection is opened as every other one to the file (app/db/embedded.py's pragmas:
WAL, foreign keys, and as busy timeout the statement timeout, which the engine's
connections wait for a lock too; its SQL_FUNCTIONS, a page's cursor encoder), read-only,
and without automatic indexes (`_READER_PRAGMAS`). Bounded like the engine's reader: at
most `max_size` connections, opened on first use and kept; a statement waits at most
`acquire_timeout_s` for one (TimeoutError: UNAVAILABLE, app/db/errors.py, as the engine's
pool timeout is); a lock held past the busy timeout is "database is locked", UNAVAILABLE
too, and so is a wait for a connection during which another statement met such a lock:
it would wait for the same lock again (under a stalled file, requests queued behind the
lent connections waited twice). A connection whose
statement failed otherwise (or was cancelled) is closed, not lent again. Closed on
shutdown (`Database.dispose`).

Fenced: `problem` checks aiosqlite for the API used here when the engine is made
(app/db/engine.py); when it is not as expected the compiled reads use the engine's read
pool, as before, with one warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sqlite3
from typing import TYPE_CHECKING, Any

from app.db.direct import traced
from app.db.embedded import SQL_FUNCTIONS, connection_pragmas, file_uri
from app.metrics import statement_sent

if TYPE_CHECKING:
    import aiosqlite


# Nothing but the compiled SELECTs runs here. And no automatic indexes: every table these
# statements read is searched by a key, and the only ones without an index are a few
# rows of the tenant's lineage, which SQLite would otherwise index anew per statement
# (half of a one-pool REST read) and take for large enough to scan every authz row by it
# rather than search the lineage's own (a dashboard page).
_READER_PRAGMAS = ("PRAGMA query_only=ON", "PRAGMA automatic_index=OFF")
# A lock waited for past its bound: the busy timeout ("locked", "busy"), or a WAL read lock
# another process held through SQLite's own retries ("locking protocol", about 10 s).
# The connection itself is fine.
_LOCK_WAITS = ("locked", "busy", "locking protocol")


def problem() -> str | None:
    """Why aiosqlite cannot serve these reads (its API is not the one used here), or None."""
    import aiosqlite

    connect = inspect.signature(aiosqlite.connect).parameters
    if "database" not in connect or not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in connect.values()
    ):
        return "aiosqlite.connect takes no (database, **sqlite3_arguments)"
    # Each returns an awaitable (execute_fetchall is wrapped to be a context manager too).
    for name, parameters in (
        ("execute_fetchall", ["self", "sql", "parameters"]),
        ("close", ["self"]),
        ("create_function", ["self", "name", "num_params", "func", "deterministic"]),
    ):
        method = getattr(aiosqlite.Connection, name, None)
        if method is None or not inspect.iscoroutinefunction(inspect.unwrap(method)):
            return f"aiosqlite.Connection.{name} is gone or not a coroutine"
        found = list(inspect.signature(method).parameters)
        if found != parameters:
            return f"aiosqlite.Connection.{name} takes ({', '.join(found)})"
    return None


class DirectSQLiteReads:
    def __init__(
        self, path: str, *, max_size: int, busy_timeout_ms: int, acquire_timeout_s: float
    ) -> None:
        self._path = path
        self._max_size = max_size
        self._busy_timeout_ms = busy_timeout_ms
        self._acquire_timeout_s = acquire_timeout_s
        self._idle: list[aiosqlite.Connection] = []
        self._open: set[aiosqlite.Connection] = set()
        self._slots = asyncio.Semaphore(max_size)
        self._closed = False
        # Statements that met a lock wait so far: one that waited for a connection while
        # another met it gives up at once rather than wait for the same lock again.
        self._lock_waits = 0

    @property
    def connections(self) -> int:
        """Connections open now (idle or lent)."""
        return len(self._open)

    async def _connect(self) -> aiosqlite.Connection:
        import aiosqlite

        # isolation_level=None: the driver opens no transaction; one SELECT, one snapshot.
        # mode=rw: a file that is gone is an error here, never a new empty database.
        conn = await aiosqlite.connect(file_uri(self._path, "rw"), uri=True, isolation_level=None)
        try:
            for pragma in (*connection_pragmas(self._busy_timeout_ms), *_READER_PRAGMAS):
                await conn.execute_fetchall(pragma)
            for name, (arguments, function) in SQL_FUNCTIONS.items():
                await conn.create_function(name, arguments, function, deterministic=True)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _acquire(self) -> aiosqlite.Connection:
        if self._closed:
            raise sqlite3.OperationalError("unable to open: the direct reads are closed")
        if self._slots.locked():  # all lent: wait for one, bounded
            seen = self._lock_waits
            async with asyncio.timeout(self._acquire_timeout_s):
                await self._slots.acquire()
            if self._lock_waits != seen:
                self._slots.release()
                raise sqlite3.OperationalError("database is locked (met while waiting)")
        else:
            await self._slots.acquire()  # free now: no timer to arm
        try:
            if self._idle:
                return self._idle.pop()
            conn = await self._connect()
        except BaseException as exc:
            self._met_lock(exc)
            self._slots.release()
            raise
        self._open.add(conn)
        return conn

    def _met_lock(self, exc: BaseException) -> bool:
        """Whether `exc` is a lock waited for past its bound (counted, for the waiters)."""
        met = isinstance(exc, sqlite3.OperationalError) and any(
            wait in str(exc).lower() for wait in _LOCK_WAITS
        )
        self._lock_waits += met
        return met

    async def _release(self, conn: aiosqlite.Connection) -> None:
        if self._closed:  # lent when the reads were closed: closed now
            await self._discard(conn)
            return
        self._idle.append(conn)  # the most recently used is lent next
        self._slots.release()

    async def _discard(self, conn: aiosqlite.Connection) -> None:
        self._open.discard(conn)
        self._slots.release()
        with contextlib.suppress(Exception):  # already broken: nothing more to release
            await conn.close()

    async def fetchval(self, sql: str, params: tuple[Any, ...]) -> Any:
        """The first column of the first row `sql` returns (None: no row), in one trip."""
        conn = await self._acquire()
        try:
            statement_sent()
            with traced(sql):
                rows = await conn.execute_fetchall(sql, params)
        except sqlite3.OperationalError as exc:
            if self._met_lock(exc):
                await self._release(conn)  # the connection is fine: the lock was held too long
            else:
                await self._discard(conn)
            raise
        except BaseException:
            # Cancelled (its statement may still run on the thread) or failed otherwise:
            # not lent again.
            await asyncio.shield(self._discard(conn))
            raise
        await self._release(conn)
        for row in rows:
            return row[0]
        return None

    async def close(self) -> None:
        """Close every idle connection; lent ones are closed as they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._open.discard(conn)
            with contextlib.suppress(Exception):
                await conn.close()
