"""The relay-read benchmark's machinery: `bench.relay_reads` runs every read strategy of
the relay on the same events and prints a row for each. Figures are not checked (this
machine is shared); what is printed is, and the bench itself refuses a run in which a
read did not deliver every event."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import pytest

from bench.relay_reads import STRATEGIES
from tests.databases import POSTGRES_URL
from tests.support import bench_output


@pytest.mark.soak
async def test_a_short_run_prints_every_strategy(
    database_url_for: Callable[[str], Awaitable[str]],
) -> None:
    await database_url_for("postgresql")  # PostgreSQL is there (or the test is skipped)
    printed = await bench_output(
        *("bench.relay_reads", "--events", "4", "--reads", "5", "--rounds", "1"),
        within_s=300,
        BENCH_POSTGRES_URL=POSTGRES_URL,
    )
    for name in STRATEGIES:
        (row,) = (line for line in printed.splitlines() if line.strip().startswith(name))
        assert re.search(r"lowest +[0-9]+ µs, median +[0-9]+ µs a read", row), row
