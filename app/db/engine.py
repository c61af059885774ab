"""Engines for both dialects, with SQLite configured for a server.

SQLite allows one writer at a time. A deferred transaction that reads and then
writes can fail with SQLITE_BUSY instead of waiting, so writes start with
BEGIN IMMEDIATE on their own engine; reads stay deferred and run beside them (WAL).
On PostgreSQL both roles share one engine.

Everything that waits on the database is bounded (app/config.py, README "Connection
budget"): opening a connection, taking one from the pool, and each statement, so a
database that refuses, drops or stops answering turns into UNAVAILABLE in bounded time
instead of requests that hang for as long as the outage lasts.

A pooled connection that died while idle (a server restart, a terminated backend) is
handled without a round trip per checkout, directly on PostgreSQL (behind PgBouncer the
pool still pings, see `create_database`; SQLAlchemy's `pool_pre_ping` costs three round
trips on asyncpg: BEGIN, a ping, ROLLBACK). Pessimistically where
it costs nothing: the server closes the socket, asyncpg's connection sees it
(`is_closed()`), and the pool's `checkout` event raises DisconnectionError, so the pool
connects afresh. Optimistically for the rest (a connection that dies between checkout and
its first statement): SQLAlchemy invalidates the connection and the pool's older ones
(`DBAPIError.connection_invalidated`), the caller answers UNAVAILABLE, and a unit of work
that met it before sending its COMMIT (the server keeps nothing of a transaction whose
connection is gone) runs once more on a new connection (Capacity._write); one that met
it during COMMIT is not run again (the server may have committed it). A connection that
stops answering without closing is bounded by the statement timeout, as a ping would
have been.

Behind PgBouncer in transaction mode (a PostgreSQL URL with `?pgbouncer=true`, README
"Connection budget") a server connection serves one transaction and then another client:
nothing may outlive a transaction. So statements are not cached per connection and each
prepared statement gets a unique name (SQLAlchemy's asyncpg "Prepared Statement Name with
PGBouncer"), and statement_timeout and jit (app/db/direct.py NO_JIT), startup parameters
PgBouncer refuses, are set for the transaction at its start instead, in one statement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from app.config import Settings
from app.db import direct_sqlite
from app.db.direct import NO_JIT, DirectReads
from app.db.direct_sqlite import DirectSQLiteReads
from app.db.embedded import SQL_FUNCTIONS, busy_timeout_ms, connection_pragmas, sqlite_file
from app.db.session_statements import (
    AutocommitStatements,
    DriverStatements,
    SessionStatements,
    driver_statements,
)

log = logging.getLogger(__name__)

# The engine's reader keeps this many SQLite connections; the direct reads at most as many.
SQLITE_READERS = 4
# The relay's own connections (PostgreSQL): its drain, one wake-up at a time, and its
# usage rounds; taken out of DB_POOL_SIZE, so a process's budget is unchanged (none when
# the pool is no larger: the relay then reads on the pool).
RELAY_CONNECTIONS = 2
# What they plan: each read for its own position. A prepared statement's generic plan,
# made while the outbox was small (a scan and a sort of the whole table), was kept on its
# connection as the outbox grew (docs/performance.md "Figures").
RELAY_SETTINGS = {"plan_cache_mode": "force_custom_plan"}
_PLAN_EACH_READ = select(*(func.set_config(k, v, True) for k, v in RELAY_SETTINGS.items()))
# An execution option of the engine behind PgBouncer: there every statement is the
# unnamed one (`pgbouncer_connect_args`), parsed and planned for its values each time.
_PLANNED_EACH_TIME = "bettercompute_planned_each_time"


async def plan_each_read(conn: AsyncConnection) -> None:
    """RELAY_SETTINGS for the rest of `conn`'s transaction, on PostgreSQL: the relay's
    plans for position reads on a shared connection (one round trip; none behind
    PgBouncer, where each statement is planned for its values anyway)."""
    if conn.dialect.name == "postgresql" and not conn.sync_engine.get_execution_options().get(
        _PLANNED_EACH_TIME
    ):
        await conn.execute(_PLAN_EACH_READ)


# How the service's connections name themselves in pg_stat_activity (PostgreSQL directly;
# behind PgBouncer, PgBouncer's own).
APPLICATION_NAME = "bettercompute"
RELAY_APPLICATION_NAME = "bettercompute relay"

# What a read runs on: a connection, a unit of work's session, or its statements.
Executor = AsyncConnection | AsyncSession | SessionStatements | AutocommitStatements

# asyncpg's own statement bound sits above the server's statement_timeout, so a slow
# statement is cancelled by the server (the connection stays usable) and the client's
# bound only fires when the server does not answer at all.
_CLIENT_STATEMENT_MARGIN_S = 1.0
# The URL query flag that says a PostgreSQL URL points at PgBouncer in transaction mode
# (the name other clients, Prisma among them, use for the same thing).
PGBOUNCER_FLAG = "pgbouncer"


def behind_pgbouncer(url: str | URL) -> tuple[URL, bool]:
    """`url` without the pgbouncer flag, and whether the flag was set."""
    parsed = make_url(url)
    value = parsed.query.get(PGBOUNCER_FLAG)
    if value is None:
        return parsed, False
    flag = value[-1] if isinstance(value, tuple) else value
    return parsed.difference_update_query([PGBOUNCER_FLAG]), flag.strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
    }


def _unnamed_statement() -> str:
    # The unnamed statement: PgBouncer hands it only to this transaction, and nothing is
    # left to close. A named one (SQLAlchemy's recipe, unique names) is closed by asyncpg
    # before the connection's next statement with no timeout at all, so a database that
    # stops answering held that request until it came back.
    return ""


def pgbouncer_connect_args() -> dict[str, Any]:
    """asyncpg connect arguments safe under transaction pooling: no statement cache, and
    every statement the unnamed one (parsed again with its execution)."""
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _unnamed_statement,
    }


@dataclass(frozen=True)
class Database:
    url: str
    writer: AsyncEngine
    reader: AsyncEngine
    # PostgreSQL (not behind PgBouncer): single statements outside a transaction.
    direct: DirectReads | None = None
    # PostgreSQL on asyncpg (not behind PgBouncer): a unit of work's built-once Core
    # statements on its own driver connection (app/db/session_statements.py).
    driver: DriverStatements | None = None
    # The embedded SQLite file: the compiled reads' statements, one hand-off each.
    sqlite_reads: DirectSQLiteReads | None = None
    # PostgreSQL (not behind PgBouncer): the event relay's reads (RELAY_SETTINGS).
    relay: AsyncEngine | None = None

    @cached_property  # asked on every compiled read; an engine's dialect never changes
    def dialect(self) -> str:
        return self.writer.dialect.name

    @property
    def pooled_by_transaction(self) -> bool:
        """Behind PgBouncer in transaction mode: a statement outside a transaction may run
        on another server connection than the one that prepared it."""
        return behind_pgbouncer(self.url)[1]

    async def dispose(self) -> None:
        if self.direct is not None:
            await self.direct.close()
        if self.sqlite_reads is not None:
            await self.sqlite_reads.close()
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()
        if self.relay is not None:
            await self.relay.dispose()


def configure_sqlite(
    engine: AsyncEngine, begin: str, busy_timeout: int, *, server: bool = True
) -> None:
    """Every connection gets a server's pragmas (app/db/embedded.py, the same the stdlib
    writer uses) or, for migrations, only the busy timeout; every transaction starts with
    `begin` (BEGIN IMMEDIATE takes the write lock up front, waiting for it if busy)."""
    pragmas = (
        connection_pragmas(busy_timeout) if server else (f"PRAGMA busy_timeout={busy_timeout}",)
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN below, not the driver, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in pragmas:
            cursor.execute(pragma)
        cursor.close()
        if server:
            for name, (arguments, function) in SQL_FUNCTIONS.items():
                dbapi_connection.create_function(name, arguments, function, deterministic=True)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin)


def _sqlite_reads(url: str, s: Settings, busy_timeout: int) -> DirectSQLiteReads | None:
    """The compiled reads' own connections to an SQLite file (app/db/direct_sqlite.py),
    when aiosqlite offers what they use; else (and for memory or a URL with options)
    they run on the reader's pool."""
    path = sqlite_file(url)
    size = min(s.db_direct_pool_size, SQLITE_READERS)
    if path is None or size <= 0:
        return None
    try:
        found = direct_sqlite.problem()
    except Exception as exc:  # the check itself broke: aiosqlite moved under it
        found = f"{type(exc).__name__}: {exc}"
    if found is not None:
        log.warning("direct SQLite reads cannot run (%s); the read pool serves instead", found)
        return None
    return DirectSQLiteReads(
        path, max_size=size, busy_timeout_ms=busy_timeout, acquire_timeout_s=s.db_acquire_timeout_s
    )


def refuse_closed_on_checkout(engine: AsyncEngine) -> None:
    """A pooled connection the server closed while it was idle is replaced at checkout,
    with no round trip (module docstring): the pool retries the checkout on a
    DisconnectionError."""

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and driver.is_closed():
            raise DisconnectionError("the pooled connection was closed while idle")


def _engine(
    url: str | URL,
    s: Settings,
    *,
    pool_size: int,
    max_overflow: int,
    connect_args: dict[str, Any] | None = None,
    ping: bool = False,
    execution_options: dict[str, Any] | None = None,
) -> AsyncEngine:
    """A pool of connections to `url` whose wait for a connection is bounded, and whose
    bound values (a pool policy's join token among them) never reach a log line or an
    exception's message, even with SQL logging on: every engine of the service. A
    PostgreSQL connection is checked at checkout: by a ping, or else, with no round trip,
    by whether the server closed it while idle."""
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=s.db_acquire_timeout_s,
        pool_pre_ping=ping,
        hide_parameters=True,
        connect_args=connect_args or {},
        execution_options=execution_options or {},
    )
    if not ping and engine.dialect.name == "postgresql":
        refuse_closed_on_checkout(engine)
    return engine


def create_database(url: str, settings: Settings | None = None) -> Database:
    """The engines for `url`, sized and bounded by `settings` (its db_* fields)."""
    s = settings or Settings()
    if make_url(url).get_backend_name() == "sqlite":
        # aiosqlite logs every statement with its bound values at DEBUG; keep that off.
        logging.getLogger("aiosqlite").setLevel(logging.INFO)
        # One writer at a time: writes queue for the writer's one connection.
        writer = _engine(url, s, pool_size=1, max_overflow=0)
        reader = _engine(url, s, pool_size=SQLITE_READERS, max_overflow=SQLITE_READERS)
        busy_timeout = busy_timeout_ms(s.db_statement_timeout_s)
        configure_sqlite(writer, "BEGIN IMMEDIATE", busy_timeout)
        configure_sqlite(reader, "BEGIN", busy_timeout)
        return Database(url, writer, reader, sqlite_reads=_sqlite_reads(url, s, busy_timeout))
    target, pgbouncer = behind_pgbouncer(url)
    statement_timeout = str(max(1, round(s.db_statement_timeout_s * 1000)))
    connect_args: dict[str, Any] = {
        "timeout": s.db_connect_timeout_s,
        "command_timeout": s.db_statement_timeout_s + _CLIENT_STATEMENT_MARGIN_S,
    }
    if pgbouncer:
        connect_args |= pgbouncer_connect_args()
    else:
        connect_args["server_settings"] = {
            "statement_timeout": statement_timeout,
            **NO_JIT,
            "application_name": APPLICATION_NAME,
        }
        # asyncpg's own cache holds what runs through it alone: the compiled reads when
        # they use this pool (SQLAlchemy prepares its statements in its own cache).
        connect_args["statement_cache_size"] = s.db_prepared_statements_per_connection
    # The relay's own connections only where as many are left for requests.
    relay_apart = not pgbouncer and s.db_pool_size >= 2 * RELAY_CONNECTIONS
    engine = _engine(
        target,
        s,
        pool_size=s.db_pool_size - (RELAY_CONNECTIONS if relay_apart else 0),
        max_overflow=s.db_max_overflow,
        connect_args=connect_args,
        # Behind PgBouncer the pool still pings: without it the PgBouncer suite met an
        # asyncpg connection garbage-collected unclosed, now and then (not yet understood).
        ping=pgbouncer,
        execution_options={_PLANNED_EACH_TIME: True} if pgbouncer else None,
    )
    if pgbouncer:

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(connection: Any) -> None:
            # SET LOCAL ends with the transaction, as the server connection's loan does;
            # both settings in one statement (one round trip per transaction).
            connection.exec_driver_sql(
                f"SELECT set_config('statement_timeout', '{statement_timeout}', true),"
                " set_config('jit', 'off', true)"
            )

    direct = None
    if not pgbouncer and s.db_direct_pool_size > 0:
        direct = DirectReads(
            target.set(drivername="postgresql").render_as_string(hide_password=False),
            max_size=s.db_direct_pool_size,
            statements_per_connection=s.db_prepared_statements_per_connection,
            connect_timeout_s=s.db_connect_timeout_s,
            acquire_timeout_s=s.db_acquire_timeout_s,
            statement_timeout_ms=int(statement_timeout),
            command_timeout_s=s.db_statement_timeout_s + _CLIENT_STATEMENT_MARGIN_S,
        )
    driver = None if pgbouncer else driver_statements(engine.dialect, enabled=s.compiled_reads)
    relay = None
    if relay_apart:
        server_settings = {
            **connect_args["server_settings"],
            **RELAY_SETTINGS,
            "application_name": RELAY_APPLICATION_NAME,
        }
        relay = _engine(
            target,
            s,
            pool_size=RELAY_CONNECTIONS,
            max_overflow=0,
            connect_args={**connect_args, "server_settings": server_settings},
        )
    return Database(url, engine, engine, direct, driver, relay=relay)
