"""The fan-out benchmark's own machinery (bench/events_fanout.py): a `--quick` run, tiny
sizes, with the server, the writer and two client processes each in its own process.
Figures are not checked (this machine is busy); what it prints and decides is."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.databases import POSTGRES_URL

ROOT = Path(__file__).resolve().parents[2]


async def test_the_quick_run_reports_rates_cpu_and_exactly_once(
    redis_url: str, database_url_for: Callable[[str], Awaitable[str]]
) -> None:
    await database_url_for("postgresql")  # PostgreSQL is there (or the test is skipped)
    env = {**os.environ, "BENCH_POSTGRES_URL": POSTGRES_URL, "BENCH_REDIS_URL": redis_url}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "bench.events_fanout", "--quick", "--seconds", "1"),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 300)
    printed = output.decode()
    assert process.returncode == 0, printed
    for expected in (
        "1. idle subscriptions, one per websocket: 40",
        "2. steady rate: requested 20 events/s for 1 s; the writer committed 20 in",
        "delivered 200/200, 0 repeated; commit->receipt p50",
        "3. throughput: 20 events x 40 subscribers: 800/800 delivered (0 repeated)",
        "CPU, % of one core over the phase: server",
        "clients",
        "server CPU per delivery",
        "load average",
        "not the full size: targets not checked",
    ):
        assert expected in printed, printed
