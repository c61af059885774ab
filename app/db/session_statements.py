"""A unit of work's statements on its own asyncpg connection (PostgreSQL): the second
execution strategy of `AsyncSession.execute` for Core statements built once.

SQLAlchemy's cost per statement (the session's execution, compile-cache keys, result
set-up) is several times asyncpg's own. A write sends about ten statements, so on
PostgreSQL each Core statement the write sends more than once in the process life is
compiled once by SQLAlchemy, into SQL text and the order of its parameters, and then
sent on the session's own driver connection, in the same transaction, prepared by
asyncpg's statement cache. Nothing is written twice: the text is SQLAlchemy's compile of
the same statement object, its parameters are processed by the same type processors
(`bind_processor`, `result_processor`), and its rows come back as SQLAlchemy rows
(`Result`), so the callers cannot tell the strategies apart.

Fenced (`driver_statements_usable`, checked once per Database): only on PostgreSQL with
asyncpg, not behind PgBouncer in transaction mode, and only while the driver connection
is inside the session's transaction (asyncpg's `is_in_transaction`: SQLAlchemy's adapter
begins lazily, on its first statement); anything else, and a statement seen for the
first time (one built per call never reaches the cache), runs on the plain path
(`AsyncConnection.execute`: Core, without the ORM's per-statement work). Both paths are
tested (tests/db/test_session_statements.py).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVarTuple, overload

from sqlalchemy.engine import Dialect, Result
from sqlalchemy.engine.result import IteratorResult, SimpleResultMetaData
from sqlalchemy.exc import DBAPIError, IntegrityError, InvalidRequestError
from sqlalchemy.exc import InterfaceError as SAInterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import Select
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase, ValuesBase
from sqlalchemy.sql.selectable import TypedReturnsRows
from sqlalchemy.util.typing import TupleAny

from app.db.carried_writes import CarriedWrites, Write
from app.db.direct import traced
from app.db.lease import Lease, lease_problem
from app.metrics import statement_sent

log = logging.getLogger(__name__)

# Compiled statements kept (each holds its statement, so its id stays its own).
MAX_COMPILED: Final = 256
# Statements with blind writes carried (app/db/carried_writes.py), for every unit of work.
_CARRIED: Final = CarriedWrites()
_Processor = Callable[[Any], Any] | None
_Ts = TypeVarTuple("_Ts")


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """One Core statement compiled for the driver: its SQL with positional parameters,
    their names in order, each bind's processor, and its rows' keys and processors."""

    statement: Executable
    compiled: SQLCompiler
    sql: str
    names: tuple[str, ...]
    # Its text is finished per call: an IN list (its length), or a value written into
    # the text at execution (`literal_execute`, as the relay's limit).
    expanding: bool
    binds: Mapping[str, _Processor]
    keys: tuple[str, ...]
    results: tuple[_Processor, ...] | None
    # Its rows' keys as SQLAlchemy's Result takes them, made once (read-only, shared by
    # every result, as SQLAlchemy shares a cursor result's across executions).
    metadata: SimpleResultMetaData
    # Each positional parameter's source, read off the compiled binds once (`_plan`);
    # None: SQLAlchemy's `construct_params` builds them per call.
    plan: tuple[_Argument, ...] | None = None

    def arguments(self, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        if self.expanding:  # the text depends on the values (an IN list's length)
            state = self.compiled.construct_expanded_state(dict(params))
            # The expanded state's processors are those of the IN lists' values only
            # (SQLAlchemy's execution adds the statement's own): a JSONB beside an IN
            # list was sent as a dict.
            processors = {**self.binds, **state.processors}
            values = state.parameters
            return state.statement, tuple(
                p(values[n]) if (p := processors.get(n)) is not None else values[n]
                for n in state.positiontup or ()
            )
        if self.plan is not None:
            return self.sql, tuple(_argument(a, params) for a in self.plan)
        values = self.compiled.construct_params(dict(params))
        binds = self.binds
        return self.sql, tuple(
            binds[n](values[n]) if binds.get(n) is not None else values[n]  # type: ignore[misc]
            for n in self.names
        )

    def rows(self, records: list[Any]) -> list[tuple[Any, ...]]:
        results = self.results
        if results is None:
            return [tuple(r) for r in records]
        return [
            tuple(v if p is None else p(v) for v, p in zip(r, results, strict=True))
            for r in records
        ]


@dataclass(frozen=True, slots=True)
class _Argument:
    """Where one positional parameter comes from: the caller's `key` (or its compiled
    `name`), else the bind's own value; and its type's processor."""

    key: str
    name: str
    required: bool
    value: Any
    processor: _Processor


def _argument(a: _Argument, params: Mapping[str, Any]) -> Any:
    # As construct_params looks a bind up: by its key, then by its compiled name.
    if a.key in params:
        value = params[a.key]
    elif a.name in params:
        value = params[a.name]
    elif a.required:
        raise InvalidRequestError(f"A value is required for bind parameter {a.key!r}", code="cd3x")
    else:
        value = a.value
    return value if a.processor is None else a.processor(value)


def _plan(
    compiled: SQLCompiler, names: tuple[str, ...], binds: Mapping[str, _Processor]
) -> tuple[_Argument, ...] | None:
    """The positional parameters' sources, for a statement whose binds are all plain: a
    bind whose value is computed per call, an escaped name or one rendered into the text
    at execution keeps SQLAlchemy's `construct_params` (tested alike,
    tests/db/test_session_statements.py)."""
    if compiled.escaped_bind_names or compiled.literal_execute_params:
        return None
    if compiled.post_compile_params or getattr(compiled, "_collected_params", None):
        return None  # (the latter: values a statement carries from `.params()`)
    # As construct_params reads them: the last bind of each name gives its value.
    by_name = {name: bind for bind, name in compiled.bind_names.items()}
    plan = []
    for name in names:
        bind = by_name[name]
        if bind.callable is not None or bind.expanding:
            return None
        plan.append(_Argument(bind.key, name, bind.required, bind.value, binds.get(name)))
    return tuple(plan)


def is_orm(statement: Executable) -> bool:
    """A statement only the session runs: a SELECT of entities (its rows are objects of
    the identity map), or an ORM INSERT, UPDATE or DELETE (it keeps the identity map in
    step). A SELECT of columns named by mapped attributes is Core's to run."""
    if statement._propagate_attrs.get("compile_state_plugin") != "orm":
        return False
    if not isinstance(statement, Select):
        return True
    return any(
        d.get("entity") is not None and d.get("expr") is d.get("entity")
        for d in statement.column_descriptions
    )


def compile_for_driver(
    statement: Executable,
    dialect: Dialect,
    column_keys: tuple[str, ...] | None = None,
) -> DriverStatement | None:
    """`statement` as the driver runs it, or None when this path cannot (an ORM statement:
    its rows are entities, built by the session). An INSERT or UPDATE writes the columns
    its `values()` and its parameters name (`column_keys`), as SQLAlchemy compiles it."""
    if is_orm(statement):
        return None
    compiled = statement.compile(  # type: ignore[attr-defined]
        dialect=dialect, column_keys=list(column_keys or ())
    )
    assert isinstance(compiled, SQLCompiler)
    if compiled.insert_prefetch or compiled.update_prefetch:
        return None  # a column default computed in Python at execution: SQLAlchemy's to run
    binds = {
        name: bind.type.dialect_impl(dialect).bind_processor(dialect)
        for name, bind in compiled.binds.items()
    }
    columns = list(getattr(statement, "exported_columns", ()))
    try:
        results = tuple(
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns
        )
    except Exception:
        # A type whose processing needs the driver's type code of the column, which only
        # a cursor gives (a NUMERIC sum on asyncpg): SQLAlchemy's to run.
        return None
    keys = tuple(getattr(statement, "exported_columns", {}).keys())
    names = tuple(compiled.positiontup or ())
    expanding = bool(compiled.literal_execute_params) or any(
        b.expanding for b in compiled.binds.values()
    )
    return DriverStatement(
        statement=statement,
        compiled=compiled,
        sql=str(compiled),
        names=names,
        expanding=expanding,
        binds=binds,
        keys=keys,
        results=results if any(p is not None for p in results) else None,
        plan=None if expanding else _plan(compiled, names, binds),
        metadata=SimpleResultMetaData(keys),
    )


class DriverStatements:
    """The compiled statements of one dialect, for every unit of work of a Database."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self.begins = _begin_problem() is None
        # Units of work lease their connection (app/db/lease.py): BEGIN is sent as above.
        self.leases = self.begins and lease_problem() is None
        self._compiled: OrderedDict[tuple[int, tuple[str, ...] | None], DriverStatement | None]
        self._compiled = OrderedDict()
        # Statements seen once (held weakly: one built per call is gone by the next call).
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()

    def get(self, statement: Executable, params: Mapping[str, Any]) -> DriverStatement | None:
        # An INSERT or UPDATE compiles to the columns its parameters name.
        columns = tuple(sorted(params)) if isinstance(statement, ValuesBase) else None
        key = (id(statement), columns)
        if key in self._compiled:
            found = self._compiled[key]
            assert found is None or found.statement is statement
            self._compiled.move_to_end(key)
            return found
        try:
            seen = statement in self._seen
        except TypeError:  # not weakly referable: plain path
            return None
        if not seen:
            self._seen.add(statement)
            return None
        # None (an ORM statement) is kept too: should its id come again with another
        # statement, that one runs on the plain path, which is always right.
        made = compile_for_driver(statement, self._dialect, columns)
        self._compiled[key] = made
        while len(self._compiled) > MAX_COMPILED:
            self._compiled.popitem(last=False)
        return made


class SessionStatements:
    """The statements of one unit of work: Core statements on the session's connection,
    each a built-once statement on the driver when the fence allows (module docstring).
    An Executor (app/db/engine.py): the reads take it as they take a connection."""

    def __init__(self, session: AsyncSession | Lease, driver: DriverStatements | None) -> None:
        # A session's connection, or a leased one whose session is made on first need
        # (app/db/lease.py).
        self._lease = session if isinstance(session, Lease) else None
        self._session = None if isinstance(session, Lease) else session
        self._driver = driver
        self._connection: AsyncConnection | None = None
        self._raw: Any = None
        self._begin: Callable[[], Awaitable[None]] | None = None
        if self._lease is not None:
            self._raw = self._lease.driver
            if driver is not None and driver.begins:
                self._begin = self._lease.adapter._start_transaction
        self._later: list[Write] = []  # blind writes not sent yet (write_later)
        # Whether write_later may hold a write: not in a unit of work that also reads
        # through the ORM session (a fleet apply), whose statements do not come here.
        self.holding = True
        self._dialect: str | None = None

    @property
    def session(self) -> AsyncSession:
        """The ORM session of this unit of work (on a lease: made now, if not yet)."""
        if self._lease is not None:
            return self._lease.session_for()
        assert self._session is not None
        return self._session

    def _made_session(self) -> AsyncSession | None:
        return self._lease.session if self._lease is not None else self._session

    @property
    def info(self) -> dict[Any, Any]:
        """What this transaction notes about itself: its session's `info` (on a lease,
        the lease's, which its session takes over once one is made)."""
        if self._lease is not None:
            return self._lease.info
        assert self._session is not None
        return self._session.info

    def loaded(self) -> list[Any]:
        """The ORM objects the session holds (none where no session was made)."""
        session = self._made_session()
        return [] if session is None else list(session.identity_map.values())

    @property
    def dialect(self) -> str:
        """The session's dialect name ("postgresql", "sqlite"), asked once."""
        if self._dialect is None:
            if self._lease is not None:
                self._dialect = self._lease.engine.dialect.name
            else:
                self._dialect = self.session.get_bind().dialect.name
        return self._dialect

    async def write_later(self, statement: UpdateBase, params: Mapping[str, Any]) -> None:
        """A write whose result nobody reads. On PostgreSQL it is sent with the statement
        that next carries writes (a unit of work's event INSERT: `carrying`), or right
        before any other statement, so every statement still sees it; elsewhere now (and
        where `holding` is off)."""
        if not self.holding or self.dialect != "postgresql":
            await self.execute(statement, params)
            return
        self._later.append((statement, dict(params)))

    async def send_later(self) -> None:
        """Send the writes still held, in their order, each as its own statement."""
        later, self._later = self._later, []
        for statement, params in later:
            await self.execute(statement, params)

    def carrying(
        self, statement: Select[Any], params: Mapping[str, Any]
    ) -> tuple[Select[Any], dict[str, Any]]:
        """`statement` with the writes still held as its CTEs, and its parameters with
        theirs: to be executed next. Without any held, `statement` itself."""
        if not self._later:
            return statement, dict(params)
        later, self._later = self._later, []
        return _CARRIED.combine(statement, params, later)

    async def connection(self) -> AsyncConnection:
        """The connection the plain path runs on: the session's, or the lease's."""
        if self._connection is None:
            if self._lease is not None:
                self._connection = self._lease.connection()
                return self._connection
            self._connection = await self.session.connection()
            if self._driver is not None:
                raw = await self._connection.get_raw_connection()
                self._raw = raw.driver_connection
                adapter: Any = raw.dbapi_connection  # SQLAlchemy's asyncpg adapter
                if self._driver.begins:
                    self._begin = adapter._start_transaction
        return self._connection

    async def _in_transaction(self) -> Any:
        """The driver connection when the driver path may run on it (open, and inside
        this unit of work's transaction: BEGIN is sent here first if need be), or None."""
        if self._lease is None and self._connection is None:
            await self.connection()
        raw = self._raw
        # A closed connection (asyncpg's is_in_transaction fails on one) takes the plain
        # path, where SQLAlchemy sees the disconnect and invalidates it.
        if raw is None or raw.is_closed():
            return None
        if self._begin is not None and not raw.is_in_transaction():
            await self._began()
        return raw if raw.is_in_transaction() else None

    async def _began(self) -> None:
        """BEGIN as SQLAlchemy's asyncpg adapter sends it before its first statement (its
        own `_start_transaction`, so it commits and rolls back as ever), without a
        statement of the plain path around it: the write's first statement then takes the
        driver path too. If BEGIN fails (a connection found dead), the plain path runs
        the statement and meets the fault as SQLAlchemy reports it (invalidation, retry)."""
        assert self._begin is not None
        begin, self._begin = self._begin, None
        try:
            await begin()
        except Exception:
            log.debug("BEGIN on the driver failed; the plain path runs the statement")

    @overload
    async def execute(
        self, statement: TypedReturnsRows[*_Ts], params: Mapping[str, Any] | None = None
    ) -> Result[*_Ts]: ...

    @overload
    async def execute(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> Result[*TupleAny]: ...

    async def execute(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> Result[*TupleAny]:
        if self._later:
            await self.send_later()
        raw = await self._in_transaction()
        compiled = None
        if raw is not None:
            assert self._driver is not None
            compiled = self._driver.get(statement, params or {})  # never an ORM one
        if compiled is None and is_orm(statement):
            return await self.session.execute(statement, params)
        session = self._made_session()
        if session is not None and (session.new or session.dirty or session.deleted):
            await session.flush()  # as the session's autoflush before it runs a statement
        if compiled is None:
            conn = await self.connection()
            return await conn.execute(statement, dict(params) if params else None)
        return await _fetch(raw, compiled, params)

    async def execute_many(self, statement: Executable, rows: list[dict[str, Any]]) -> None:
        """`statement` once per row, as one executemany on the plain path; a single row
        as `execute` runs it (the driver path, where the fence allows); no rows, nothing
        (an executemany of none would run the statement once, with no values)."""
        if not rows:
            return
        if len(rows) == 1:
            await self.execute(statement, rows[0])
            return
        if self._later:
            await self.send_later()
        session = self._made_session()
        if session is not None and (session.new or session.dirty or session.deleted):
            await session.flush()
        await (await self.connection()).execute(statement, rows)

    async def scalar(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Any:
        return (await self.execute(statement, params)).scalar()


class AutocommitStatements:
    """Core statements on a connection outside any transaction (AUTOCOMMIT: the relay's
    reads, each a snapshot of its own), each a built-once statement on its driver
    connection when `driver` compiles it, else on the connection itself: no transaction
    to stay inside, so no fence beyond the compile's. Without a driver (SQLite, behind
    PgBouncer, compiled reads off) every statement is the connection's own, in whatever
    transaction it keeps. An Executor (app/db/engine.py)."""

    def __init__(self, connection: AsyncConnection, driver: DriverStatements | None) -> None:
        self.connection = connection
        self._driver = driver
        self._raw: Any = None

    async def execute(
        self, statement: Executable, params: Mapping[str, Any] | None = None
    ) -> Result[*TupleAny]:
        compiled = None
        if self._driver is not None:
            if self._raw is None:
                self._raw = (await self.connection.get_raw_connection()).driver_connection
            # A closed connection takes the plain path, where SQLAlchemy invalidates it.
            if not self._raw.is_closed():
                compiled = self._driver.get(statement, params or {})
        if compiled is None:
            return await self.connection.execute(statement, dict(params) if params else None)
        return await _fetch(self._raw, compiled, params)

    async def scalar(self, statement: Executable, params: Mapping[str, Any] | None = None) -> Any:
        return (await self.execute(statement, params)).scalar()


async def _fetch(
    raw: Any, compiled: DriverStatement, params: Mapping[str, Any] | None
) -> Result[*TupleAny]:
    """`compiled` run on the driver connection `raw`: its rows as SQLAlchemy's, its
    errors as SQLAlchemy raises them."""
    sql, args = compiled.arguments(params or {})
    statement_sent()
    try:
        with traced(sql):
            records = await raw.fetch(sql, *args)
    except Exception as exc:
        raise _adapted(exc, sql) from exc
    return IteratorResult(compiled.metadata, iter(compiled.rows(records)))


def _adapted(exc: Exception, sql: str) -> Exception:
    """asyncpg's error as SQLAlchemy's, as the plain path raises it: an integrity error
    (SQLSTATE class 23) is an IntegrityError (an idempotent create's twin, service._write),
    any other database error a DBAPIError, a closed connection an InterfaceError; the rest
    (a timeout: an OSError) as is."""
    code = getattr(exc, "sqlstate", None)
    if not isinstance(code, str):
        if type(exc).__module__.startswith("asyncpg") and type(exc).__name__ == "InterfaceError":
            # asyncpg's "connection is closed": SQLAlchemy's InterfaceError, UNAVAILABLE.
            return SAInterfaceError(sql, None, exc)
        return exc
    if code.startswith("23"):
        return IntegrityError(sql, None, exc)
    return DBAPIError(sql, None, exc)


def driver_statements(dialect: Dialect, *, enabled: bool) -> DriverStatements | None:
    """The compiled statements for a PostgreSQL engine not behind PgBouncer (the caller
    decides that), or None: the plain path. `enabled` is BETTERCOMPUTE_COMPILED_READS,
    the one-statement family's switch. A library that moved under this path leaves it
    out with one warning, as app/compat.py does for the fast path's pieces."""
    if not enabled:
        return None
    problem = _driver_problem(dialect)
    if problem is not None:
        log.warning("driver statements cannot run (%s); the plain path serves instead", problem)
        return None
    return DriverStatements(dialect)


def _begin_problem() -> str | None:
    """Why BEGIN cannot be sent as SQLAlchemy's asyncpg adapter sends it (a library
    internal: its `_start_transaction` coroutine), or None. With a
    problem, a write's first statement takes the plain path, which begins the
    transaction itself (one warning)."""
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection

    begin = getattr(AsyncAdapt_asyncpg_connection, "_start_transaction", None)
    if not inspect.iscoroutinefunction(begin):
        problem = "SQLAlchemy's asyncpg adapter has no _start_transaction coroutine"
    elif list(inspect.signature(begin).parameters) != ["self"]:
        problem = "SQLAlchemy's asyncpg adapter's _start_transaction takes arguments"
    else:
        return None
    log.warning("a write's first statement takes the plain path (%s)", problem)
    return problem


def _driver_problem(dialect: Dialect) -> str | None:
    from sqlalchemy import JSON, bindparam, column, select
    from sqlalchemy.pool import ManagesConnection

    if dialect.name != "postgresql" or dialect.driver != "asyncpg":
        return f"the driver is {dialect.name}+{dialect.driver}, not postgresql+asyncpg"
    if "driver_connection" not in getattr(ManagesConnection, "__annotations__", {}):
        return "SQLAlchemy's pooled connections have no driver_connection"
    probe: Executable = select(column("a")).where(column("a").in_(bindparam("b", expanding=True)))
    made = compile_for_driver(probe, dialect)
    if made is None or not made.expanding:
        return "a probe statement did not compile"
    sql, args = made.arguments({"b": [1, 2]})
    if args != (1, 2) or "$2" not in sql:
        return f"an IN list compiled as {sql!r} with {args!r}"
    # The argument plan reads SQLAlchemy's compiled binds (`_plan`): it must send what
    # construct_params builds, a default and a type's processor included.
    probe = select(column("a")).where(
        column("a") == bindparam("c"), column("a") != bindparam("d", "x", type_=JSON())
    )
    made = compile_for_driver(probe, dialect)
    if made is None or made.plan is None:
        return "a plain probe statement has no argument plan"
    planned = made.arguments({"c": 3})
    if planned != replace(made, plan=None).arguments({"c": 3}):
        return f"the argument plan sent {planned!r}, not what construct_params builds"
    return None
