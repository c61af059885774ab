"""A Redis backend for broadcaster, in place of the one it ships.

broadcaster 0.3.1's RedisBackend wakes its reader before SUBSCRIBE has registered the
channel; with redis-py 8 the reader can then find no channel, stop, and wait forever,
so the subscription silently receives nothing. This one subscribes first and starts
reading after. redis-py's own retries are off: a dropped connection ends the reader,
and EventBus's supervisor reconnects and catches up from the outbox, so no reconnect
goes unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from broadcaster import BroadcastBackend, Event
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


class RedisWakeups(BroadcastBackend):
    def __init__(self, url: str) -> None:  # the base class only raises
        self._redis = Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=5)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._received: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        await self._redis.ping()

    async def disconnect(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._redis.aclose()

    async def subscribe(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)
        if self._reader is None:
            self._reader = asyncio.create_task(self._read())

    async def unsubscribe(self, channel: str) -> None:
        await self._pubsub.unsubscribe(channel)

    async def publish(self, channel: str, message: Any) -> None:
        await self._redis.publish(channel, message)

    async def next_published(self) -> Event:
        item = await self._received.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def _read(self) -> None:
        try:
            async for message in self._pubsub.listen():
                if message["type"] == "message":
                    self._received.put_nowait(
                        Event(message["channel"].decode(), message["data"].decode())
                    )
        except Exception as exc:  # the connection dropped: hand it to the listener
            self._received.put_nowait(exc)
