"""The relay-read benchmark's machinery: `bench.relay_reads` runs every read strategy of
the relay on the same events and prints a row for each. Figures are not checked (this
machine is shared); what is printed is, and the bench itself refuses a run in which a
read did not deliver every event."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bench.relay_reads import STRATEGIES
from tests.databases import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.soak
async def test_a_short_run_prints_every_strategy(
    database_url_for: Callable[[str], Awaitable[str]],
) -> None:
    await database_url_for("postgresql")  # PostgreSQL is there (or the test is skipped)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "bench.relay_reads", "--events", "4", "--reads", "5", "--rounds", "1"),
        cwd=ROOT,
        env={**os.environ, "BENCH_POSTGRES_URL": POSTGRES_URL},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 300)
    printed = output.decode()
    assert process.returncode == 0, printed
    for name in STRATEGIES:
        (row,) = (line for line in printed.splitlines() if line.strip().startswith(name))
        assert re.search(r"lowest +[0-9]+ µs, median +[0-9]+ µs a read", row), row
