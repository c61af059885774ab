"""The write benchmark's machinery: `bench.writes --quick` seeds, takes the service's
answers as the floor's templates, runs every write against both and prints every row.
Figures are not checked (this machine is shared); what is printed is."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import pytest

from bench.native_load import ensure_wrk
from bench.writes import ROW_NAMES
from tests.databases import POSTGRES_URL, REDIS_URL, service_unavailable
from tests.support import bench_output

NUMBER = r"[0-9]+(?:\.[0-9]+)?"


@pytest.mark.soak
async def test_the_quick_run_prints_every_row(
    database_url_for: Callable[[str], Awaitable[str]],
) -> None:
    await database_url_for("postgresql")  # PostgreSQL is there (or the test is skipped)
    if ensure_wrk() is None:
        service_unavailable("wrk could not be installed")
    printed = await bench_output(
        "bench.writes", "--quick", BENCH_POSTGRES_URL=POSTGRES_URL, BENCH_REDIS_URL=REDIS_URL
    )
    assert printed.count("uptime at") == 2
    # The floor answers what the service answers, byte for byte in size.
    (sizes,) = (line for line in printed.splitlines() if line.startswith("floor answers have"))
    pairs = re.findall(r"([a-z-]+) ([0-9]+)/([0-9]+)", sizes)
    assert {name for name, _, _ in pairs} == {
        "book", "book-graphql", "release", "create", "offer", "update", "unoffer", "archive"
    }  # fmt: skip
    assert all(ours == theirs for _, ours, theirs in pairs), sizes
    lines = printed.splitlines()
    for name in ROW_NAMES:
        # write, floor/s, service/s, ratio, p50/p99 of each, stmts/req, cpu ms/req, non-2xx
        (row,) = (line for line in lines if line.startswith(name) and "/" in line[len(name) :])
        fields = row[len(name) :].split()
        floor, service, ratio = (float(v) for v in fields[:3])
        assert floor > 0, row  # the floor answered
        if floor and service:
            assert ratio == pytest.approx(service / floor, abs=0.002), row
        for pair in fields[3:6]:
            assert re.fullmatch(rf"{NUMBER}/{NUMBER}", pair), row
        assert re.fullmatch(rf"{NUMBER}/{NUMBER}/{NUMBER}/{NUMBER}", fields[6]), row
        assert re.fullmatch(r"[0-9]+/[0-9]+", fields[7]), row
        assert fields[8] in ("ok", "INVALID:"), row
        # A line per round of each target, with its CPU.
        for target in ("floor", "service"):
            assert any(re.match(rf"{re.escape(name)} +{target} +{NUMBER}", li) for li in lines), (
                name,
                target,
            )
    for workers in ("1 process:", "2 processes:"):
        (line,) = (li for li in lines if li.strip().startswith(workers))
        assert "updates/s" in line and "postgres" in line, line
