"""The relay's CPU per read, in process (PostgreSQL): what one relay read of `--events`
events costs the event loop, delivered to one subscriber, under each of the relay's read
strategies, in alternating rounds of one run. A bench: it prints, asserts nothing.

Strategies (app/events/relay.py, `_drain_reads`; app/db/session_statements.py):
- `plain, per read`: SQLAlchemy executes the read, on a connection checked out per read
  (BETTERCOMPUTE_COMPILED_READS off, a pool too small for the relay's own connections);
- `driver, per read`: the read built once, run on asyncpg (AutocommitStatements);
- `plain, held`: SQLAlchemy on one connection of the relay's own, held from read to read;
- `driver, held`: both, the default.

Each round resets the relay's state to before the events, so every read reads the same
rows; CPU is the process's (time.process_time: the loop, the driver's sockets included),
per read, the lowest and the median of `--rounds` rounds of `--reads` reads each. The
machine's other load moves every figure; compare the strategies within one run.

    .venv/bin/python -m bench.relay_reads [--events 16] [--reads 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import create_database
from app.events.cursor import DeliveryState
from app.events.relay import Relay
from bench.database import bench_database
from bench.outbox_contention import _AllOfThem, _Owner, _seed, _update

STRATEGIES: dict[str, dict[str, Any]] = {
    "plain, per read": {"compiled_reads": False, "db_pool_size": 2},
    "driver, per read": {"db_pool_size": 2},
    "plain, held": {"compiled_reads": False},
    "driver, held": {},
}


async def _cpu_per_read(
    url: str, start: DeliveryState, settings: Settings, events: int, reads: int
) -> float:
    """CPU seconds per relay read of the `events` events after `start`, to one
    subscriber (its loop not started: only these reads run)."""
    db = create_database(url, settings)
    relay: Relay[Any] = Relay(db, _AllOfThem(), poll_interval_s=3600)  # type: ignore[arg-type]
    try:
        subscription = await relay.open(_Owner(), None)
        taken = 0

        read_all = asyncio.Event()  # the subscriber took a whole read's events

        async def read() -> None:
            nonlocal taken
            async for _ in subscription.stream():
                taken += 1
                if taken % events == 0:
                    read_all.set()

        reader = asyncio.create_task(read())
        began = time.process_time()
        for _ in range(reads):
            relay.state = subscription.state = start
            read_all.clear()
            await relay.fresh_drain()
            await read_all.wait()
        spent = time.process_time() - began
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        if taken != reads * events:
            raise RuntimeError(f"{taken} events delivered, {reads * events} expected")
        return spent / reads
    finally:
        await relay.stop()
        await db.dispose()


async def main(events: int, reads: int, rounds: int) -> None:
    print(
        f"relay_reads: one relay read of {events} events to one subscriber, CPU of this"
        f" process per read; {rounds} rounds of {reads} reads a strategy, alternating"
    )
    async with bench_database() as url:
        seeding = create_database(url)
        try:
            principal, pools = await _seed(seeding, events)
            # The events the reads read: one update a pool, after a relay state is taken
            # (the pools' creation events come before it).
            capacity = Capacity(seeding)
            relay: Relay[Any] = Relay(seeding, _AllOfThem())  # type: ignore[arg-type]
            await relay.fresh_drain()
            start = relay.state
            await relay.stop()
            for n, pool_id in enumerate(pools):
                await capacity.update_pool(principal, _update(pool_id, n + 1))
        finally:
            await seeding.dispose()
        figures: dict[str, list[float]] = {name: [] for name in STRATEGIES}
        for _ in range(rounds):
            for name, fields in STRATEGIES.items():
                cpu = await _cpu_per_read(url, start, Settings(**fields), events, reads)
                figures[name].append(cpu)
    base = min(figures["plain, per read"])
    for name, cpus in figures.items():
        print(
            f"  {name:<17} lowest {min(cpus) * 1e6:6.0f} µs, median"
            f" {statistics.median(cpus) * 1e6:6.0f} µs a read"
            f" ({min(cpus) / base:.2f} of plain, per read)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=16)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.events, arguments.reads, arguments.rounds))
