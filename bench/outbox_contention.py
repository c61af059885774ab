"""Event-writing transactions without the fleet-wide lock (issue 20, ADR 0012). A bench: it
prints, asserts nothing.

1. The statements one pool `update` issues (an event-writing transaction of the service,
   run through the real domain on a throwaway database) are captured in order as the
   driver sent them, and each is checked against `pg_stat_statements` (it must have been
   counted once per captured update).
2. They are replayed as a `pgbench` script, 32 clients, each on its own pool (the pool id
   becomes `(ARRAY[...])[:client_id + 1]`; the audience row's seq becomes the events
   sequence's `currval`), in three variants: `new` (as the service issues them), `bare`
   (the ordering step taken out: tx = 0 in the INSERT, no probe), `old` (bare plus 0002's
   `pg_advisory_xact_lock` before the INSERT). Printed: tps of each, new/bare (target
   >= 0.7), old/bare, and the fraction of active backends of the bench database waiting on
   a lock, sampled from pg_stat_activity every 20 ms (target <= 10% for new).
3. Commit-to-delivery of events under 32 writers through the real relay (in process):
   each writer updates its own pool through the domain; one subscription of the owner
   tenant records when each version arrives; p50/p99 (target p99 < 50 ms). Before it, the
   pgbench writers through the same relay: as fast as they go, the relay reading read
   after read (nothing wakes it for pgbench's commits; in the service every commit
   elsewhere wakes it through the broker, so at this rate a wake-up is pending at every
   read's end), then polling every `--poll-ms` (the wake-ups left out), then at half the
   rate, polling (pgbench -R; asked and achieved printed). Saturated, the relay and its
   backend wait their turn among 32 busy backends for this machine's cores: each such
   round prints, from the kernel's schedstat, how long this process's loop thread (the
   relay's, the subscriber's) and the relay's backends ran and how long they were ready
   to run but waited for a core. pgbench runs
   in a session of its own, as writers in other processes do: a child in this one shared
   the relay's CPU share where the kernel groups tasks by session (autogroup, printed).

    .venv/bin/python -m bench.outbox_contention [--seconds 8] [--clients 32] [--poll-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url

import app.events.relay as relay_module
from app.capacity.inputs import CreatePoolInput, UpdatePoolInput, parse_input
from app.capacity.inventory import create_site, create_tenant
from app.capacity.service import Capacity
from app.config import Settings
from app.db.engine import RELAY_APPLICATION_NAME, Database, create_database
from app.events.cursor import Position
from app.events.reader import OutboxEvent, Uncovered
from app.events.relay import Relay
from app.iam.callers import authenticate, create_caller
from app.iam.principal import Principal
from bench.database import bench_database
from bench.proc import run_queue_s

OLD_LOCK_KEY = 0x62635F6F7574  # 0002's OUTBOX_LOCK_KEY ("bc_out"), retired from app/


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


async def _seed(db: Database, pools: int) -> tuple[Principal, list[str]]:
    await create_tenant(db, "acme")
    site = await create_site(db, "acme", "custom", "eu-west")
    _, token = await create_caller(db, "acme", "admin")
    principal = await authenticate(db, f"Bearer {token}")
    capacity = Capacity(db)
    ids = []
    for _ in range(pools):
        body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
        created = await capacity.create_pool(principal, parse_input(CreatePoolInput, body))
        ids.append(created.pool.id)
    return principal, ids


def _update(pool_id: str, n: int) -> UpdatePoolInput:
    model = "H100" if n % 2 else "A100"
    return parse_input(UpdatePoolInput, {"tenantId": "acme", "poolId": pool_id, "gpuModel": model})


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, datetime):
        return "'" + value.isoformat() + "'"
    if isinstance(value, list) and all(isinstance(v, int | str) for v in value):
        # An array parameter (unnest): PostgreSQL's array literal; a JSON list would not parse.
        return "'{" + ",".join(json.dumps(v) for v in value) + "}'"
    if isinstance(value, dict | list):
        value = json.dumps(value)
    return "'" + str(value).replace("'", "''") + "'"


async def _capture(db: Database, principal: Principal, pool_id: str, times: int) -> list[str]:
    """The statements of one update, literal, in order; checked against pg_stat_statements.

    Taken through SQLAlchemy's cursor events, so on a copy of `db` without the unit of
    work's driver statements (app/db/session_statements.py sends them past those events):
    the same statement objects, compiled by the same dialect, on the plain path."""
    db = dataclasses.replace(db, driver=None)
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    capacity = Capacity(db)
    await capacity.update_pool(principal, _update(pool_id, 0))  # warm: caches, prepared
    async with db.writer.connect() as conn:
        await conn.execute(text("SELECT pg_stat_statements_reset()"))
        await conn.commit()
    event.listen(db.writer.sync_engine, "before_cursor_execute", record)
    try:
        for n in range(times):
            mark = len(seen)
            await capacity.update_pool(principal, _update(pool_id, n + 1))
            if n == 0:
                first = seen[mark:]
    finally:
        event.remove(db.writer.sync_engine, "before_cursor_execute", record)
    async with db.writer.connect() as conn:
        counted = {
            _normal(q): c
            for q, c in (
                await conn.execute(
                    text(
                        "SELECT query, calls FROM pg_stat_statements"
                        " WHERE dbid = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database())"
                    )
                )
            ).all()
        }
    missing = [s for s, _ in first if counted.get(_normal(s), 0) < times]
    if missing:
        print(f"  not counted {times} times by pg_stat_statements: {missing}")
    statements = []
    for statement, parameters in first:
        rendered = statement
        values = list(parameters or ())
        for i in range(len(values), 0, -1):  # $10 before $1
            rendered = rendered.replace(f"${i}", _literal(values[i - 1]))
        statements.append(" ".join(rendered.split()))
    return statements


def _normal(query: str) -> str:
    return re.sub(r"\$\d+", "$", " ".join(query.split()))


def _script(
    statements: Sequence[str], pools: Sequence[str], variant: str, stamp: bool = False
) -> str:
    choose = "(ARRAY[" + ", ".join(f"'{p}'" for p in pools) + "]::text[])[:client_id + 1]"
    lines = ["BEGIN;"]
    for statement in statements:
        s = statement.replace(f"'{pools[0]}'", choose)
        if s.startswith("INSERT INTO event_audience"):
            # The event's seq, as one row's VALUES or an unnest of an array of them.
            current = "currval(pg_get_serial_sequence('events', 'seq'))"
            s = re.sub(r"VALUES \((\d+)", f"VALUES ({current}", s)
            s = re.sub(r"unnest\('\{\d+\}'::BIGINT\[\]\)", current, s)
        # The event's INSERT, alone or (since event and audience are one statement) in a CTE.
        writes_event = "INSERT INTO events " in s
        if writes_event and stamp:  # occurred_at: when it was written
            s = re.sub(r"'[^']*'::TIMESTAMP WITH TIME ZONE", "clock_timestamp()", s, count=1)
        if writes_event and variant != "new":
            s = re.sub(r"greatest\(pg_current_xact_id\(\)::text::bigint, \(SELECT .*?\)\)", "0", s)
            if variant == "old":
                lines.append(f"SELECT pg_advisory_xact_lock({OLD_LOCK_KEY});")
        lines.append(s + ";")
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


async def _pgbench(
    url: str,
    script: str,
    clients: int,
    seconds: float,
    rate: float | None = None,
    log_prefix: str | None = None,
    *,
    sample_locks: bool = True,
) -> tuple[float, float]:
    """(tps, fraction of active backends waiting on a lock); at most `rate` transactions a
    second in all when given (pgbench -R), else as fast as they go; each transaction's end
    logged under `log_prefix` when given (pgbench -l). Without `sample_locks` the fraction
    is 0 and nothing is sampled: a delivery round measures the relay in this process, and
    a sampler querying pg_stat_activity every 20 ms beside it would take its turns."""
    parsed = make_url(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    command = [
        "pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-f", f.name,
        "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432),
        "-U", parsed.username or "postgres", parsed.database or "",
    ] + ([] if rate is None else ["-R", f"{rate:.0f}"]) + (
        [] if log_prefix is None else ["-l", "--log-prefix", log_prefix]
    )  # fmt: skip
    # pgbench stands in for writers elsewhere (other services, other hosts): in a session
    # of its own, so on a kernel that groups tasks by session for CPU (autogroup) it is
    # not scheduled inside this process's group, taking turns with the relay it loads.
    process = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    waiting = await _lock_waits(url, process) if sample_locks else 0.0
    out, err = await process.communicate()
    os.unlink(f.name)
    found = re.search(r"tps = ([\d.]+)", out.decode())
    if found is None:
        raise RuntimeError(f"pgbench failed: {err.decode()[-2000:]}")
    return float(found.group(1)), waiting


async def _lock_waits(url: str, process: asyncio.subprocess.Process) -> float:
    """Until `process` ends, the fraction of the bench database's active backends waiting
    on a lock, sampled from pg_stat_activity every 20 ms."""
    waiting = active = 0
    sampler = create_database(url, Settings(db_pool_size=1, db_max_overflow=0))
    try:
        async with sampler.reader.connect() as conn:
            while process.returncode is None:
                row = (
                    await conn.execute(
                        text(
                            "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*)"
                            " FROM pg_stat_activity WHERE datname = current_database()"
                            " AND state = 'active' AND pid <> pg_backend_pid()"
                        )
                    )
                ).one()
                await conn.rollback()
                waiting, active = waiting + row[0], active + row[1]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 0.02)
    finally:
        await sampler.dispose()
    return waiting / active if active else 0.0


class _AllOfThem:
    async def load(self, executor: Any, events: Sequence[OutboxEvent]) -> _AllOfThem:
        return self

    def readable(self, event: OutboxEvent, subscription: Any) -> OutboxEvent:
        return event


class _Owner:
    tenants = ("acme",)
    pool_id = None
    types = None


async def _delivery(
    db: Database, principal: Principal, pools: Sequence[str], seconds: float
) -> tuple[list[float], int]:
    relay: Relay[Any] = Relay(db, _AllOfThem(), poll_interval_s=2.0)  # type: ignore[arg-type]
    committed: dict[Position, float] = {}

    async def notify(position: Position) -> None:
        committed[position] = time.time()
        relay.wake(position)

    capacity = Capacity(db, notify)
    await relay.start()
    received: dict[Position, float] = {}
    subscription = await relay.open(_Owner(), None)

    async def read() -> None:
        async for item in subscription.stream():
            received[item.position] = time.time()

    reader = asyncio.create_task(read())
    stop = time.monotonic() + seconds

    async def writer(pool_id: str) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            await capacity.update_pool(principal, _update(pool_id, n))

    await asyncio.gather(*(writer(p) for p in pools))
    print(f"  (relay reads stopped by D's bound: {relay.blocked_reads})")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not set(committed) <= set(received):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await relay.stop()
    latencies = [(received[p] - at) * 1000 for p, at in committed.items() if p in received]
    return latencies, len(committed) - len(latencies)


@contextlib.contextmanager
def _timed_relay_reads(round_trips: list[float]) -> Iterator[None]:
    """Each relay read's wall time in ms as the relay awaits it (its round trip: its
    process's and its backend's waits for a core included), appended to `round_trips`.
    A bench instrument: the relay module's name for the read, wrapped for the run."""
    original = relay_module.read_uncovered  # type: ignore[attr-defined]

    async def timed(*args: Any, **kwargs: Any) -> Uncovered:
        began = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            round_trips.append((time.perf_counter() - began) * 1000)

    relay_module.read_uncovered = timed  # type: ignore[attr-defined]
    try:
        yield
    finally:
        relay_module.read_uncovered = original  # type: ignore[attr-defined]


async def _timer_lateness(late: list[float], period: float) -> None:
    """How late a `period` sleep wakes in this process, in ms, appended to `late` until
    cancelled: what the relay's poll of the same length waits beyond it."""
    while True:
        began = time.perf_counter()
        await asyncio.sleep(period)
        late.append(max(0.0, (time.perf_counter() - began - period) * 1000))


async def _rows(db: Database, sql: str, **params: Any) -> list[Any]:
    """The rows of one statement, on a connection of the service's pool, nothing kept."""
    async with db.writer.connect() as conn:
        rows = list(await conn.execute(text(sql), params))
        await conn.rollback()
    return rows


async def _relay_backends(db: Database) -> list[int]:
    """The PostgreSQL backends of the relay's own connections (its application_name)."""
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = :name"
        " AND datname = current_database()"
    )
    return [pid for (pid,) in await _rows(db, sql, name=RELAY_APPLICATION_NAME)]


class _Waits:
    """CPU and run-queue wait (the scheduler's schedstat) over a round, of this process's
    main thread (the relay's event loop, the subscriber's too) and of the relay's
    backends: the time each ran, and the time it was ready to run but waited for a core."""

    def __init__(self, backends: list[int]) -> None:
        self._began = time.perf_counter()
        self._loop = run_queue_s(os.getpid())
        self._backends = {pid: run_queue_s(pid) for pid in backends}

    def report(self, backends: list[int]) -> str:
        wall = time.perf_counter() - self._began
        loop = [now - then for now, then in zip(run_queue_s(os.getpid()), self._loop, strict=True)]
        spent = [0.0, 0.0]
        for pid in backends:  # one that appeared during the round counts from its start
            before = self._backends.get(pid, (0.0, 0.0))
            for i, (now, then) in enumerate(zip(run_queue_s(pid), before, strict=True)):
                spent[i] += now - then
        return (
            f"of the round's {wall:.1f} s, the relay's {len(backends)} backends ran"
            f" {spent[0]:.2f} s and waited for a core {spent[1]:.2f} s, this process's loop"
            f" ran {loop[0]:.2f} s and waited {loop[1]:.2f} s (schedstat)"
        )


async def _relay_read_times(db: Database) -> None:
    """What the relay's read statement took in PostgreSQL (pg_stat_statements, since the
    run's reset): its execution, waits for a core included, not its round trip."""
    ((calls, mean, most),) = await _rows(
        db,
        "SELECT sum(calls), sum(total_exec_time) / nullif(sum(calls), 0), max(max_exec_time)"
        " FROM pg_stat_statements WHERE query LIKE '%read_horizon%'"
        " AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    print(
        f"  (the relay's read in PostgreSQL: {calls or 0} calls, mean {mean or 0:.2f} ms,"
        f" max {most or 0:.1f} ms)"
    )


def _commits(log_prefix: str) -> dict[int, list[float]]:
    """Per pgbench client, when each of its transactions ended as it saw it (its COMMIT
    answered), in order: `client_id transaction_no time script_no epoch us [lag]`."""
    ended: dict[int, list[tuple[int, float]]] = {}
    directory, prefix = os.path.split(log_prefix)
    for name in os.listdir(directory):
        if name.startswith(prefix):
            with open(os.path.join(directory, name)) as log:
                for line in log:
                    client, number, _, _, epoch, us = line.split()[:6]
                    ended.setdefault(int(client), []).append(
                        (int(number), int(epoch) + int(us) / 1e6)
                    )
    return {client: [at for _, at in sorted(rows)] for client, rows in ended.items()}


async def _delivery_from_pgbench(
    db: Database,
    url: str,
    script: str,
    pools: Sequence[str],
    seconds: float,
    rate: float | None = None,
    poll_s: float = 0.005,
) -> tuple[list[float], list[float], float]:
    """The service's statements from one pgbench writer per pool; the real relay in this
    process, its poll (5 ms by default) standing in for the wake-up a service commit would
    send (0: a read right after each read, as a wake-up pending at every read's end gives).
    Two latencies per event: receipt - its occurred_at (clock_timestamp() in its INSERT,
    before the COMMIT is sent), and receipt - when its writer saw its COMMIT answered
    (pgbench's log: the k-th event of a pool is its client's k-th transaction, one writer
    per pool, none rolled back), the measure the in-process writers take."""
    relay: Relay[Any] = Relay(db, _AllOfThem(), poll_interval_s=poll_s)  # type: ignore[arg-type]
    round_trips: list[float] = []
    late: list[float] = []
    async with db.writer.connect() as conn:  # the relay reads' own figures, this run only
        await conn.execute(text("SELECT pg_stat_statements_reset()"))
        await conn.commit()
    await relay.start()
    from_insert: list[float] = []
    received: dict[str, list[float]] = {}
    subscription = await relay.open(_Owner(), None)

    async def read() -> None:
        async for item in subscription.stream():
            now = time.time()
            from_insert.append((now - item.occurred_at.timestamp()) * 1000)
            received.setdefault(item.pool_id, []).append(now)

    reader = asyncio.create_task(read())
    with tempfile.TemporaryDirectory() as logs, _timed_relay_reads(round_trips):
        prefix = os.path.join(logs, "tx")
        ticker = asyncio.create_task(_timer_lateness(late, 0.005))
        waits = _Waits(await _relay_backends(db))
        tps, _ = await _pgbench(url, script, len(pools), seconds, rate, prefix, sample_locks=False)
        waited = waits.report(await _relay_backends(db))
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        print(f"  (relay reads stopped by D's bound: {relay.blocked_reads})")
        await _relay_read_times(db)
        print(
            f"  (the same read as the relay saw it, from sent to rows: {len(round_trips)} calls,"
            f" p50 {_pct(round_trips, 0.5):.1f} ms, p90 {_pct(round_trips, 0.9):.1f} ms;"
            f" a 5 ms timer in this process woke late by p50 {_pct(late, 0.5):.1f} ms,"
            f" p90 {_pct(late, 0.9):.1f} ms; {waited})"
        )
        await asyncio.sleep(1.0)  # the last commits' events
        commits = _commits(prefix)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await relay.stop()
    from_commit = [
        (at - ended) * 1000
        for client, pool_id in enumerate(pools)
        for at, ended in zip(received.get(pool_id, []), commits.get(client, []), strict=False)
    ]
    return from_insert, from_commit, tps


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _autogroup() -> str:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as setting:
            return "on" if setting.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


async def main(seconds: float, clients: int, poll_s: float) -> None:
    print(
        f"outbox_contention: {clients} clients, {seconds:g} s rounds, load {_load()};"
        f" CPU grouped by session (autogroup): {_autogroup()}, pgbench in a session of its own"
    )
    async with bench_database() as url:
        db = create_database(url, Settings(db_pool_size=clients + 4, db_max_overflow=8))
        try:
            async with db.writer.connect() as conn:
                await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                await conn.commit()
            principal, pools = await _seed(db, clients)
            statements = await _capture(db, principal, pools[0], 5)
            print(f"  one update issues {len(statements)} statements (+ BEGIN/COMMIT):")
            for s in statements:
                print(f"    {s[:150]}")
            results: dict[str, list[tuple[float, float]]] = {}
            for variant in ("bare", "new", "old", "new", "bare"):
                tps, waiting = await _pgbench(
                    url, _script(statements, pools, variant), clients, seconds
                )
                results.setdefault(variant, []).append((tps, waiting))
                print(
                    f"  pgbench {variant:>4}: {tps:8.1f} tps, lock waits {waiting:6.1%}"
                    f" of active backends (load {_load()})"
                )
            best = {v: max(t for t, _ in r) for v, r in results.items()}
            print(
                f"  new/bare = {best['new'] / best['bare']:.2f} (target >= 0.7),"
                f" old/bare = {best['old'] / best['bare']:.2f};"
                f" lock waits new {max(w for _, w in results['new']):.1%} (target <= 10%)"
            )
            stamped = _script(statements, pools, "new", stamp=True)
            # As fast as they go, read after read (what the service's relay does under
            # them: every commit elsewhere wakes it through the broker, so a wake-up is
            # pending at every read's end) and polling every `poll_s` (the wake-ups left
            # out); then at half that rate, polling.
            phases: list[tuple[float | None, float]] = [(None, poll_s)]
            if poll_s > 0:
                phases.insert(0, (None, 0.0))
            flat_out = 0.0
            for rate, poll in [*phases, (-1.0, poll_s)]:
                if rate == -1.0:
                    # Half the rate: the writers no longer take every core (above, the
                    # relay and its backend wait their turn among 32 busy backends).
                    rate = flat_out / 2
                piped, acked, tps = await _delivery_from_pgbench(
                    db, url, stamped, pools, seconds, rate, poll
                )
                if rate is None:
                    flat_out = max(flat_out, tps)
                asked = "as fast as they go" if rate is None else f"{rate:.0f} tps asked"
                how = "read after read" if poll == 0 else f"poll {poll * 1000:g} ms"
                print(
                    f"  commit-to-delivery, {clients} pgbench writers ({asked}, {tps:.0f} tps)"
                    f" through the relay ({how}): {len(piped)} events;"
                    f" from the writer's COMMIT answered p50 {_pct(acked, 0.5):.1f} ms,"
                    f" p99 {_pct(acked, 0.99):.1f} ms (target < 50),"
                    f" max {max(acked, default=float('nan')):.1f} ms ({len(acked)} matched);"
                    f" from its INSERT p50 {_pct(piped, 0.5):.1f} ms,"
                    f" p99 {_pct(piped, 0.99):.1f} ms; load {_load()}"
                )
            latencies, lost = await _delivery(db, principal, pools, seconds)
            print(
                f"  commit-to-delivery, {clients} in-process writers (the domain's update,"
                " this process's event loop shared with the relay) through the relay:"
                f" {len(latencies)} events, p50 {_pct(latencies, 0.5):.1f} ms,"
                f" p99 {_pct(latencies, 0.99):.1f} ms (target < 50),"
                f" max {max(latencies, default=float('nan')):.1f} ms,"
                f" mean {statistics.fmean(latencies) if latencies else float('nan'):.1f} ms,"
                f" undelivered {lost}; load {_load()}"
            )
        finally:
            await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--poll-ms",
        type=float,
        default=5.0,
        help="the relay's poll under the pgbench writers, after a flat-out round read after"
        " read (default 5; 0: read after read only)",
    )
    arguments = parser.parse_args()
    asyncio.run(main(arguments.seconds, arguments.clients, arguments.poll_ms / 1000))
