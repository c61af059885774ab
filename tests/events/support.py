"""Helpers for the event tests: collect a subscription's stream, wait for the relay."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import AsyncConnection
from starlette.applications import Starlette

from app.capacity.inputs import PoolEventsInput, parse_input
from app.capacity.service import Capacity
from app.db.engine import Database
from app.db.models import Pool
from app.events.cursor import Position
from app.events.outbox import PendingEvent
from app.events.reader import OutboxEvent, committed_above_horizon, outbox_bounds
from app.events.relay import Relay, Subscription
from app.iam.callers import authenticate
from tests.support import Fleet


async def bare_pools(fleet: Fleet, db: Database, count: int, owner: str = "acme") -> list[str]:
    """`count` pools of `owner` as bare rows (no offers, no authz rows): enough for the
    outbox, whose writers lock the pool's row."""
    await fleet.tenant(owner)
    site = await fleet.site(owner)
    ids = [f"pool_bare{secrets.token_hex(6)}" for _ in range(count)]
    async with db.writer.begin() as conn:
        await conn.execute(
            insert(Pool),
            [
                {
                    "id": pool_id,
                    "tenant_id": owner,
                    "site_id": site,
                    "pool_class": "metal-host",
                    "sharing": "exclusive",
                    "agent": "none",
                    "region": "eu-west",
                }
                for pool_id in ids
            ],
        )
    return ids


async def until_lock_waits(db: Database, count: int, *tasks: asyncio.Task[Any]) -> None:
    """Until `count` PostgreSQL sessions wait on a lock; none of `tasks` may end first."""
    deadline = time.monotonic() + 30
    query = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    async with db.reader.connect() as conn:
        while (await conn.execute(query)).scalar_one() < count:
            for task in tasks:
                assert not task.done(), task.result()
            assert time.monotonic() < deadline, "no session waits on a lock"
            await asyncio.sleep(0.01)
            await conn.rollback()  # a fresh snapshot of pg_stat_activity


@contextlib.asynccontextmanager
async def visible_outbox(db: Database, within_s: float = 30.0) -> AsyncIterator[AsyncConnection]:
    """A connection whose reads see every committed event below the horizon. `all_visible`
    alone does not promise that to a later statement: each statement takes its own
    snapshot and its own look at the server's running transactions, and the horizon errs
    low when another database's transaction ends between the two (app/events/reader.py).
    Here every statement shares one snapshot and one look (REPEATABLE READ), so once the
    check passes, the reads see what it saw."""
    if db.dialect != "postgresql":
        async with db.reader.connect() as conn:
            yield conn
        return
    deadline = time.monotonic() + within_s
    async with db.reader.execution_options(isolation_level="REPEATABLE READ").connect() as conn:
        while await committed_above_horizon(conn):
            assert time.monotonic() < deadline, "the horizon did not pass the newest event"
            await conn.rollback()
            await asyncio.sleep(0.005)
        yield conn


async def all_visible(db: Database, within_s: float = 30.0) -> None:
    """Until every committed event is below the transaction-id horizon (at once on SQLite):
    any transaction of this database still running holds it back (app/events/reader.py),
    so a test reading the outbox right after a commit waits. A later statement's horizon
    may still err low: to read them all, read in `visible_outbox`."""
    async with visible_outbox(db, within_s):
        pass


async def wait_until(condition: Callable[[], bool], within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class Collector:
    """Reads one subscription's stream into `events` in the background."""

    def __init__(self, subscription: Subscription, delay_s: float = 0.0) -> None:
        self.subscription = subscription
        self.events: list[OutboxEvent] = []
        self._delay_s = delay_s
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.subscription.stream():
            self.events.append(event)
            if self._delay_s:
                await asyncio.sleep(self._delay_s)

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]

    @property
    def positions(self) -> list[Position]:
        return [e.position for e in self.events]

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    @property
    def idle(self) -> bool:
        """Level with the relay and nothing left in the mailbox."""
        s = self.subscription
        return s.live and len(s.mailbox) == 0

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def subscribe(
    app: Starlette, token: str, tenant_id: str, *, delay_s: float = 0.0, **arguments: Any
) -> Collector:
    """A `poolEvents` subscription opened as the transports open it, being read."""
    capacity: Capacity = app.state.capacity
    if arguments.get("after") is None:
        # "From now": what committed before must be below the horizon, or it is still to
        # come for this subscription too (docs/decisions/0012).
        await all_visible(capacity.db)
    principal = await authenticate(capacity.db, f"Bearer {token}")
    payload = {"tenantId": tenant_id, **{k: v for k, v in arguments.items() if v is not None}}
    subscription = await capacity.open_pool_events(principal, parse_input(PoolEventsInput, payload))
    return Collector(subscription, delay_s=delay_s)


async def settle(app: Starlette, *collectors: Collector) -> None:
    """Wait until the relay has fanned out every committed event and each collector
    has taken everything mailed to it."""
    relay: Relay = app.state.relay
    capacity: Capacity = app.state.capacity
    # Else "newest" may be short of the last commit.
    async with visible_outbox(capacity.db) as conn:
        newest = (await outbox_bounds(conn)).newest
    await wait_until(lambda: relay.cursor >= newest and all(c.idle for c in collectors))


async def emit_updates(
    capacity: Capacity, pool_id: str, tenant_id: str, count: int, start: int = 0
) -> None:
    """`count` pool.updated events for one tenant in one unit of work (the real outbox
    writer and wake-up), numbered in `data.n`."""
    async with capacity.unit_of_work() as uow:
        assert await uow.lock_pool(pool_id)  # as the domain's writes lock it (outbox.py)
        for n in range(start, start + count):
            uow.emit(
                PendingEvent(
                    type="pool.updated",
                    pool_id=pool_id,
                    tenant_id=tenant_id,
                    data={"n": n},
                    audience=frozenset({tenant_id}),
                )
            )
