"""Broker outages: when the wake-up connection drops, the process reconnects and catches
up from the outbox, so subscribers see no gap and no duplicate. The poll is set to a
minute here, so only the reconnect can deliver what was committed during the outage."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.config import Settings
from app.db.engine import Database
from tests.databases import direct_url
from tests.events.brokers import PrivateRedis
from tests.events.conftest import running
from tests.events.support import emit_updates, settle, subscribe, wait_until
from tests.rest.scene import Scene
from tests.support import Fleet


def _settings(database_url: str, broadcast_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        broadcast_url=broadcast_url,
        event_poll_interval_s=60,
        broker_probe_interval_s=0.3,
    )


@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
async def test_a_redis_restart_mid_stream_loses_and_repeats_nothing(
    database_url: str, db: Database
) -> None:
    redis = PrivateRedis()
    await redis.start()
    try:
        settings = _settings(database_url, redis.url)
        async with running(settings) as (writer, api), running(settings) as (reader, _):
            s = await Scene.start(api, Fleet(db))
            pool_id = (await s.pool())["id"]
            watching = await subscribe(reader, s.token, "acme")
            capacity = writer.state.capacity
            await emit_updates(capacity, pool_id, "acme", 10)
            await wait_until(lambda: len(watching.events) == 10)

            await redis.stop()
            await emit_updates(capacity, pool_id, "acme", 10, start=10)  # wake-up lost
            await asyncio.sleep(0.5)
            assert len(watching.events) == 10
            await redis.start()
            await wait_until(lambda: len(watching.events) >= 20)  # caught up on reconnect
            await emit_updates(capacity, pool_id, "acme", 10, start=20)
            await wait_until(lambda: len(watching.events) >= 30)
            await settle(reader, watching)

            assert [e.data["n"] for e in watching.events] == list(range(30))
            assert reader.state.bus.connections >= 2
            await watching.close()
    finally:
        await redis.stop()


@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
async def test_a_killed_listen_connection_is_replaced_and_caught_up(
    database_url: str, db: Database
) -> None:
    # LISTEN needs a session of its own: always a direct URL, never through PgBouncer.
    broadcast = make_url(direct_url(database_url)).set(drivername="postgresql")
    settings = _settings(database_url, broadcast.render_as_string(hide_password=False))
    async with running(settings) as (writer, api), running(settings) as (reader, _):
        s = await Scene.start(api, Fleet(db))
        pool_id = (await s.pool())["id"]
        watching = await subscribe(reader, s.token, "acme")
        capacity = writer.state.capacity
        await emit_updates(capacity, pool_id, "acme", 10)
        await wait_until(lambda: len(watching.events) == 10)

        async with db.writer.connect() as conn:
            killed = (
                await conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND (query ILIKE 'LISTEN%' OR query ILIKE '%pg_notify%')"
                    )
                )
            ).all()
        assert len(killed) == 2  # each process's one broker connection
        await emit_updates(capacity, pool_id, "acme", 10, start=10)
        await wait_until(lambda: len(watching.events) >= 20)  # caught up on reconnect
        await emit_updates(capacity, pool_id, "acme", 10, start=20)
        await wait_until(lambda: len(watching.events) >= 30)
        await settle(reader, watching)

        assert [e.data["n"] for e in watching.events] == list(range(30))
        assert reader.state.bus.connections >= 2
        await watching.close()


@pytest.mark.parametrize("dialect", ["postgresql"])  # what only PostgreSQL has
async def test_redis_wake_ups_reach_the_other_process_without_a_reconnect(
    database_url: str, db: Database, redis_url: str
) -> None:
    """broadcaster's own Redis backend could subscribe and then receive nothing; with the
    poll at a minute and no reconnect, every event here arrives by its wake-up alone."""
    settings = _settings(database_url, redis_url)
    async with running(settings) as (writer, api), running(settings) as (reader, _):
        s = await Scene.start(api, Fleet(db))
        pool_id = (await s.pool())["id"]
        watching = await subscribe(reader, s.token, "acme")
        for n in range(20):
            await emit_updates(writer.state.capacity, pool_id, "acme", 1, start=n)
            # under the minute-long poll: only the wake-up can deliver in time
            await wait_until(lambda n=n: len(watching.events) == n + 1, within_s=30)
        assert reader.state.bus.connections == 1
        await watching.close()
