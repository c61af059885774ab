"""Benchmark: what a unit of work costs the service's own process, in CPU (printed
figures, docs/performance.md "Since 2990510").

    .venv/bin/python -m bench.unit_of_work      # about 30 seconds

Needs PostgreSQL at 127.0.0.1:5432 (BENCH_POSTGRES_URL); a fresh database, dropped at the
end. One task, no HTTP: `UnitOfWork` around k prepared `SELECT`s (k = 1 and 5) on the
driver path, then asyncpg's own transaction around the same fetch and the bare fetch,
then the phases of a unit of work that holds a session (SQLite's, PgBouncer's; on
PostgreSQL a unit of work leases its connection instead, app/db/lease.py: session,
connection checkout, BEGIN + statement, commit, close), and the same unit of work
made to hold its session. Only this process's CPU is counted (time.process_time):
PostgreSQL's is not.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import asyncpg
from sqlalchemy import bindparam, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.engine import create_database
from app.db.models import Pool
from app.db.session_statements import SessionStatements
from app.db.uow import UnitOfWork
from bench.database import bench_database

_POOLS = Pool.__table__
_READ = select(_POOLS.c.id, _POOLS.c.version).where(_POOLS.c.id == bindparam("pool_key"))
_SQL = "SELECT pools.id, pools.version FROM pools WHERE pools.id = $1::VARCHAR"


def _us(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:7.0f} µs"


async def run(n: int) -> None:
    async with bench_database() as url:
        db = create_database(url)
        try:
            for _ in range(100):  # warm: the statement compiled and prepared
                async with UnitOfWork(db) as uow:
                    await uow.statements.execute(_READ, {"pool_key": "x"})
            for k in (1, 5):
                started = time.process_time()
                for _ in range(n):
                    async with UnitOfWork(db) as uow:
                        for _ in range(k):
                            await uow.statements.execute(_READ, {"pool_key": "x"})
                print(
                    f"UnitOfWork, {k} statement(s):         {_us(time.process_time() - started, n)}"
                )
            assert db.driver is not None and db.driver.leases, "a leased unit of work"
            db.driver.leases = False  # the strategy of SQLite and PgBouncer, on the same pool
            started = time.process_time()
            for _ in range(n):
                async with UnitOfWork(db) as uow:
                    await uow.statements.execute(_READ, {"pool_key": "x"})
            db.driver.leases = True
            print(f"UnitOfWork holding a session, 1:     {_us(time.process_time() - started, n)}")
            raw = await asyncpg.connect(
                make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
            )
            try:
                started = time.process_time()
                for _ in range(n):
                    async with raw.transaction():
                        await raw.fetch(_SQL, "x")
                print(
                    f"asyncpg transaction, 1 fetch:        {_us(time.process_time() - started, n)}"
                )
                started = time.process_time()
                for _ in range(n):
                    await raw.fetch(_SQL, "x")
                print(
                    f"asyncpg fetch alone:                 {_us(time.process_time() - started, n)}"
                )
            finally:
                await raw.close()
            phases: defaultdict[str, float] = defaultdict(float)
            for _ in range(n):
                t0 = time.process_time()
                session = AsyncSession(db.writer, expire_on_commit=False)
                statements = SessionStatements(session, db.driver)
                t1 = time.process_time()
                await statements.connection()
                t2 = time.process_time()
                await statements.execute(_READ, {"pool_key": "x"})
                t3 = time.process_time()
                await session.commit()
                t4 = time.process_time()
                await session.close()
                t5 = time.process_time()
                for name, spent in (
                    ("session", t1 - t0),
                    ("connection checkout", t2 - t1),
                    ("BEGIN + statement", t3 - t2),
                    ("commit", t4 - t3),
                    ("close", t5 - t4),
                ):
                    phases[name] += spent
            print("a session's phases (1 statement; a leased unit of work has none of them):")
            for name, spent in phases.items():
                print(f"  {name:34s}{_us(spent, n)}")
            print(f"CPU of this process only; {n} repetitions each")
        finally:
            await db.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000, help="repetitions of each (3000)")
    args = parser.parse_args(argv)
    asyncio.run(run(args.n))


if __name__ == "__main__":
    main()
