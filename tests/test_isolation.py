"""A failing test does not poison the next one (tests/conftest.py, "Isolation").

Each case runs a small suite in a pytest of its own, with this suite's fixtures: a first
test leaks (tasks that go on running, a transaction left open on the run's database) and
fails; the second must start clean and pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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

async def test_a_transaction_left_open(database_url):
    url = make_url(database_url)
    connection = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, database=url.database
    )
    held.append(connection)
    await connection.execute("BEGIN")
    await connection.execute("LOCK TABLE pools IN ACCESS EXCLUSIVE MODE")
    raise AssertionError("fails with the lock held")

async def test_the_next_test_gets_its_tables(database_url):
    pass
"""


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def test_leaked_tasks_fail_their_test_and_are_cancelled(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(LEAKED_TASKS)
    result = pytester.runpytest_subprocess(*OPTIONS, timeout=300)
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*left 2 task(s) running (cancelled now)*writer*"])


@pytest.mark.postgresql
def test_a_transaction_left_open_does_not_block_the_next_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(OPEN_TRANSACTION)
    result = pytester.runpytest_subprocess(*OPTIONS, "-m", "postgresql", timeout=300)
    result.assert_outcomes(passed=1, failed=1)
