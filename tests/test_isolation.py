"""A failing test does not poison the next one (tests/conftest.py, "Isolation").

Each case runs a small suite in a pytest of its own, with this suite's fixtures: a first
test leaks (tasks that go on running, a transaction left open on the run's database) and
fails; the second must start clean and pass.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.databases import CONNECT_TIMEOUT_S, POSTGRES_URL, service_unavailable

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]

# The inner run: this suite's fixtures and its asyncio settings (pyproject.toml).
CONFTEST = "from tests.conftest import *  # noqa: F403\n"
OPTIONS = (
    "-p",
    "no:cacheprovider",
    "-o",
    "asyncio_mode=auto",
    "-o",
    "asyncio_default_fixture_loop_scope=session",
    "-o",
    "asyncio_default_test_loop_scope=session",
)

LEAKED_TASKS = """
import asyncio

writes = []

async def test_a_gather_fails_and_leaves_its_siblings_writing():
    async def writer():
        while True:
            writes.append(1)
            await asyncio.sleep(0.01)

    async def failing():
        await asyncio.sleep(0.05)
        raise TimeoutError("QueuePool limit reached")

    await asyncio.gather(writer(), writer(), failing())

async def test_the_next_test_sees_no_writer():
    before = len(writes)
    await asyncio.sleep(0.3)
    assert len(writes) == before, "a writer of the previous test is still running"
"""

OPEN_TRANSACTION = """
import asyncpg
from sqlalchemy.engine import make_url

held = []

import pytest

@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_a_transaction_left_open(database_url):
    url = make_url(database_url)
    connection = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, database=url.database
    )
    held.append(connection)
    await connection.execute("BEGIN")
    await connection.execute("LOCK TABLE pools IN ACCESS EXCLUSIVE MODE")
    raise AssertionError("fails with the lock held")

@pytest.mark.parametrize("dialect", ["postgresql"])
async def test_the_next_test_gets_its_tables(database_url):
    pass
"""


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


@pytest.mark.postgresql
def test_a_failing_test_does_not_poison_the_next_one(pytester: pytest.Pytester) -> None:
    server = make_url(POSTGRES_URL)
    try:
        socket.create_connection((server.host, server.port or 5432), CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        service_unavailable(f"PostgreSQL unreachable: {exc}")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_tasks=LEAKED_TASKS, test_transaction=OPEN_TRANSACTION)
    result = pytester.runpytest_subprocess(*OPTIONS, timeout=300)
    # Each leaking test fails (the tasks' one at its teardown too); each next one passes.
    result.assert_outcomes(passed=2, failed=2, errors=1)
    result.stdout.fnmatch_lines(["*left 2 task(s) running (cancelled now)*writer*"])
