"""Shared fixtures. Every database test runs on SQLite and on PostgreSQL.

Databases (see tests/databases.py):
- `dialect`: "sqlite" or "postgresql"; a test asking for a database runs once per
  dialect (marks `sqlite`/`postgresql`, so `-m "not postgresql"` works).
- `database_url_for` (session): `await database_url_for(dialect)` gives the URL of the
  run's database for that dialect, created and migrated to head on first use and
  dropped when the run ends. Its rows are not cleaned: use `database_url` in tests.
- `database_url`: that database for `dialect`, every table emptied before the test.
- `db`: an `app.db.engine.Database` on `database_url`, disposed after the test.
- `fresh_database_url`: a brand-new database with no tables (not migrated) for this
  test only, dropped after it; for migration and `db upgrade` tests.

Services: PostgreSQL (BETTERCOMPUTE_TEST_POSTGRES_URL) and Redis
(`redis_url`, BETTERCOMPUTE_TEST_REDIS_URL). When one is unreachable its tests are
skipped, or fail when BETTERCOMPUTE_TEST_REQUIRE_SERVICES=1 (as in CI).

Isolation: a test that leaves asyncio tasks running fails at its teardown, and those tasks
are cancelled there (`leaked_tasks_fail`), so a failing test cannot poison the next one with
its writers or their connections; `empty_tables` ends any PostgreSQL backend still busy on
the run's database before the next test starts.

The fast path: on, unless BETTERCOMPUTE_FAST_PATH=false (CI runs the GraphQL and
websocket suites both ways, .ci/run), or one of its mechanisms is switched off alone.
The variable reaches every `Settings(...)` a test builds and every `bettercompute serve`
it starts (they inherit the environment).
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
import pytest_asyncio
from redis.asyncio import Redis
from starlette.applications import Starlette

from app.config import FAST_PATH_PIECES, Settings
from app.db.engine import Database, create_database
from app.server import create_app
from tests.databases import (
    CONNECT_TIMEOUT_S,
    DIALECTS,
    REDIS_URL,
    TestDatabases,
    empty_tables,
    service_unavailable,
)
from tests.support import Api, Fleet


def pytest_configure(config: pytest.Config) -> None:
    for name in DIALECTS:
        config.addinivalue_line("markers", f"{name}: runs against the {name} database")
    config.addinivalue_line(
        "markers", "fast_path: asserts work only the fast path saves; skipped on the plain path"
    )
    plain_path_if_asked()


def plain_path_if_asked() -> None:
    """`Settings(...)` reads no environment (tests build it so): with
    BETTERCOMPUTE_FAST_PATH=false in the environment (or one of the mechanisms it sets,
    BETTERCOMPUTE_COMPILED_READS, _FAST_EXECUTOR, _LEAN_WEBSOCKET), their defaults become
    false for this run, so every app a test assembles takes the plain path there."""
    from_env = Settings.from_env()
    changed = False
    for name in ("fast_path", *FAST_PATH_PIECES):
        if getattr(from_env, name) is False:
            Settings.model_fields[name].default = False
            changed = True
    # BETTERCOMPUTE_DB_DIRECT_POOL_SIZE=0: the compiled reads on the engines' pools (on
    # SQLite, the reader's instead of app/db/direct_sqlite.py's connections).
    if "BETTERCOMPUTE_DB_DIRECT_POOL_SIZE" in os.environ:
        Settings.model_fields["db_direct_pool_size"].default = from_env.db_direct_pool_size
        changed = True
    if changed:
        Settings.model_rebuild(force=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that narrows `dialect` with its own parametrize loses the fixture's marks:
    mark it by the dialect it runs on, so `-m postgresql` selects it too. On the plain
    path, the fast path's own tests are skipped. The `soak` scenarios (minutes each), then
    the `slow` tests, go first: a run then ends on short tests, not on one worker still
    minutes into a long one while the others are done."""
    defaults = Settings()
    plain = not all(getattr(defaults, name) for name in FAST_PATH_PIECES)
    for item in items:
        if plain and item.get_closest_marker("fast_path"):
            item.add_marker(pytest.mark.skip(reason="the fast path's own work (plain path run)"))
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("dialect") if callspec is not None else None
        if name in DIALECTS and not item.get_closest_marker(name):
            item.add_marker(getattr(pytest.mark, name))
    items.sort(key=_scheduled)  # stable: collection order within each group


def _scheduled(item: pytest.Item) -> int:
    """Longest first (pytest-xdist hands tests out in this order)."""
    if item.get_closest_marker("soak"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


# Pool waits of the `db` fixture's engines (production: BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT).
TEST_ACQUIRE_S = 60.0

# --- isolation ---------------------------------------------------------------------

# A task still running this long after its test's fixtures are torn down is a leak.
LEAK_GRACE_S = 2.0
# How long cancelled leaked tasks get to unwind (close their connections).
LEAK_CANCEL_S = 10.0


def _describe(task: asyncio.Task[object]) -> str:
    coroutine = task.get_coro()
    name = getattr(coroutine, "__qualname__", None) or repr(coroutine)
    return f"{task.get_name()} ({name})"


@pytest.fixture(autouse=True)
def no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """For each asyncio test, `leaked_tasks_fail` (a sync test runs no task on the
    session's loop, and one under Playwright's sync API has a loop of its own running)."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("leaked_tasks_fail")


@pytest_asyncio.fixture(loop_scope="session")
async def leaked_tasks_fail() -> AsyncIterator[None]:
    """Fail the test that leaves tasks running on the session's loop (set up first, so
    this runs after every other fixture of the test is torn down), and cancel them: a
    gather that raised leaves its siblings running, and they would go on writing, holding
    pool connections and locks into the next test."""
    before = asyncio.all_tasks()
    yield
    current = asyncio.current_task()
    leaked = {t for t in asyncio.all_tasks() - before if t is not current}
    if leaked:
        _, leaked = await asyncio.wait(leaked, timeout=LEAK_GRACE_S)
    if not leaked:
        return
    names = sorted(_describe(t) for t in leaked)
    for task in leaked:
        task.cancel()
    _, stuck = await asyncio.wait(leaked, timeout=LEAK_CANCEL_S)
    detail = f"; {len(stuck)} ignored cancellation" if stuck else ""
    pytest.fail(
        f"the test left {len(names)} task(s) running (cancelled now{detail}): " + ", ".join(names),
        pytrace=False,
    )


# --- databases ---------------------------------------------------------------------


@pytest.fixture(
    params=[pytest.param(name, marks=getattr(pytest.mark, name), id=name) for name in DIALECTS]
)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def test_databases(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[TestDatabases]:
    databases = TestDatabases(tmp_path_factory.mktemp("sqlite"))
    try:
        yield databases
    finally:
        await databases.close()


@pytest.fixture(scope="session")
def database_url_for(test_databases: TestDatabases) -> Callable[[str], Awaitable[str]]:
    return test_databases.migrated


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(dialect: str, database_url_for: Callable[[str], Awaitable[str]]) -> str:
    url = await database_url_for(dialect)
    await empty_tables(url)
    return url


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    # A busy machine (load 16 on 2 cores) legitimately keeps a test waiting for a pool
    # connection longer than production's 10 s bound; tests of that bound build their own.
    database = create_database(database_url, Settings(db_acquire_timeout_s=TEST_ACQUIRE_S))
    try:
        yield database
    finally:
        await database.dispose()


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_database_url(dialect: str, test_databases: TestDatabases) -> AsyncIterator[str]:
    url = await test_databases.create_empty(dialect)
    try:
        yield url
    finally:
        await test_databases.drop(url)


# --- services ----------------------------------------------------------------------


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def redis_url() -> str:
    client = Redis.from_url(
        REDIS_URL, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=CONNECT_TIMEOUT_S
    )
    try:
        await client.ping()
    except Exception as exc:  # any failure to reach the server means "unavailable"
        service_unavailable(f"Redis unreachable at {REDIS_URL}: {type(exc).__name__}: {exc}")
    finally:
        await client.aclose()
    return REDIS_URL


# --- HTTP application ----------------------------------------------------------------
# Fixtures for the Starlette app and its clients (REST, GraphQL, websockets) go here,
# built on `db` / `database_url` so they run on both dialects.


@pytest_asyncio.fixture(loop_scope="session")
async def app(database_url: str) -> AsyncIterator[Starlette]:
    """The real Starlette app on this test's database, its lifespan running."""
    application = create_app(Settings(database_url=database_url))
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture(loop_scope="session")
async def api(app: Starlette) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield Api(client)


@pytest.fixture
def fleet(db: Database) -> Fleet:
    return Fleet(db)
