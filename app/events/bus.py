"""Wake-ups between processes. The outbox is the source of truth; the broker only says
"there is something newer than you have", carrying the newest position (`<tx>.<seq>`).

Each process holds one broker subscription. broadcaster 0.3.1 does not notice a dropped
connection (the Redis listener task dies quietly; a terminated LISTEN connection just
stops delivering), and its Redis backend can miss its own subscription (see
redis_wakeups.py, which replaces it), so a supervisor owns the connection: it probes it with its own
messages, and when the broker stops answering it tears the connection down and makes
a new one. Every (re)connect tells the listeners to catch up from the outbox, which
covers whatever was published while nobody listened.

Publishing is coalesced in one task: a wake-up only needs the newest position, so a burst of
commits becomes a few messages, and backends whose connection allows one operation at
a time (asyncpg) never see two at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, Final
from urllib.parse import urlparse

from broadcaster import Broadcast

from app import metrics
from app.events.cursor import Position
from app.events.redis_wakeups import RedisWakeups
from app.events.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CHANNEL: Final = "bettercompute.pool-events"
# On the same channel: "a token was revoked, look now" (app/iam/revocations.py).
TOKEN_REVOKED: Final = "token-revoked"

# Called with the newest position a wake-up carries, or None for "catch up, you may have
# missed some". Must not block: listeners only set a flag.
WakeListener = Callable[[Position | None], None]
# Called when a token was revoked somewhere, or on a (re)connect. Must not block.
RevocationListener = Callable[[], None]


class EventBus:
    def __init__(
        self,
        url: str,
        *,
        probe_interval_s: float = 2.0,
        probe_timeout_s: float | None = None,
        publish_timeout_s: float = 2.0,
        max_reconnect_delay_s: float = 5.0,
    ) -> None:
        self.url = url
        self._probe_interval_s = probe_interval_s
        # A busy process may take a moment to answer; a dead connection never does.
        self._probe_timeout_s = probe_timeout_s or max(2.0, 2 * probe_interval_s)
        self._publish_timeout_s = publish_timeout_s
        self._max_delay_s = max_reconnect_delay_s
        self._listeners: list[WakeListener] = []
        self._revocation_listeners: list[RevocationListener] = []
        self._broadcast: Broadcast | None = None  # the live connection, None while down
        self._connected = asyncio.Event()
        self._broken = asyncio.Event()
        self._pending: Position | None = None  # newest position not yet published
        self._publish_wanted = asyncio.Event()
        self._publishing = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._probe_token = f"probe:{secrets.token_hex(8)}"
        self.connections = 0  # how many times a broker connection was made (for tests)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def add_listener(self, listener: WakeListener) -> None:
        self._listeners.append(listener)

    def add_revocation_listener(self, listener: RevocationListener) -> None:
        self._revocation_listeners.append(listener)

    async def connect(self, *, wait_s: float = 5.0) -> None:
        """Start the supervisor and wait (a while) for the first connection. A broker that
        is down does not stop the service: the relay's poll delivers meanwhile."""
        self._tasks = [
            asyncio.create_task(self._supervise(), name="event-bus-supervisor"),
            asyncio.create_task(self._publish_loop(), name="event-bus-publisher"),
        ]
        try:
            async with asyncio.timeout(wait_s):
                await self._connected.wait()
        except TimeoutError:
            log.warning("event broker %s unreachable; retrying in the background", self._where)

    async def disconnect(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def notify(self, position: Position) -> None:
        """After a commit: wake this process at once, and other processes via the broker."""
        self._wake(position)
        if self._pending is None or position > self._pending:
            self._pending = position
        self._publish_wanted.set()

    # -- internals ------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        parsed = urlparse(self.url)  # no credentials in logs
        return f"{parsed.scheme}://{parsed.hostname or ''}:{parsed.port or ''}"

    @property
    def _probing(self) -> bool:
        return urlparse(self.url).scheme != "memory"  # in-process: nothing can drop

    def _wake(self, position: Position | None) -> None:
        for listener in self._listeners:
            listener(position)

    def _revoked(self) -> None:
        for listener in self._revocation_listeners:
            listener()

    async def _publish_loop(self) -> None:
        """Publish the newest pending wake-up. While the broker is down it is held, and
        published once a connection is back: other processes may have reconnected
        before us and would otherwise wait for their poll."""
        while True:
            await self._publish_wanted.wait()
            await self._connected.wait()
            self._publish_wanted.clear()
            position, self._pending = self._pending, None
            broadcast = self._broadcast
            if position is None or broadcast is None:
                continue
            try:
                async with asyncio.timeout(self._publish_timeout_s):
                    await self._publish(broadcast, wake_message(position))
            except Exception as exc:  # any broker failure: keep it for the next connection
                log.warning("event wake-up not published: %s: %s", type(exc).__name__, exc)
                self._broken.set()
                if self._pending is None or position > self._pending:
                    self._pending = position
                self._publish_wanted.set()
                await asyncio.sleep(0.1)  # the supervisor is tearing the connection down

    async def _supervise(self) -> None:
        delay = 0.0
        while True:
            made = self.connections
            try:
                await self._session()
            except Exception as exc:  # any broker failure: reconnect
                log.warning(
                    "event broker %s: %s: %s; reconnecting", self._where, type(exc).__name__, exc
                )
            # Back off while the broker stays down; retry at once after a working session.
            delay = 0.1 if self.connections > made else min(2 * delay or 0.1, self._max_delay_s)
            await asyncio.sleep(delay)

    def _new_broadcast(self) -> Broadcast:
        return _broadcast_for(self.url)

    async def _publish(self, broadcast: Broadcast, message: str) -> None:
        # One at a time: the postgres backend publishes on its one LISTEN connection.
        async with self._publishing:
            await broadcast.publish(CHANNEL, message)

    async def _session(self) -> None:
        """One broker connection: connect, subscribe, listen until it proves dead."""
        broadcast = self._new_broadcast()
        async with AsyncExitStack() as stack:
            stack.push_async_callback(self._close, broadcast, stack)
            async with asyncio.timeout(self._probe_timeout_s):
                await broadcast.connect()
                # Entered on its own stack so that tearing it down can be bounded in time.
                inner = AsyncExitStack()
                stack.push_async_callback(self._bounded_close, inner)
                subscriber = await inner.enter_async_context(broadcast.subscribe(CHANNEL))
            self._broadcast = broadcast
            self._broken.clear()
            self._connected.set()
            metrics.BROKER_CONNECTED.set(1)
            self.connections += 1
            log.info("event broker %s connected", self._where)
            self._wake(None)  # catch up on what was published while we were not listening
            self._revoked()
            await self._listen(broadcast, subscriber)

    async def _close(self, broadcast: Broadcast, _: AsyncExitStack) -> None:
        self._broadcast = None
        self._connected.clear()
        metrics.BROKER_CONNECTED.set(0)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await broadcast.disconnect()

    @staticmethod
    async def _bounded_close(stack: AsyncExitStack) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await stack.aclose()

    async def _listen(self, broadcast: Broadcast, subscriber: Any) -> None:
        probe_seen = asyncio.Event()
        probe_round = 0

        async def receive() -> None:
            while True:
                message = (await subscriber.get()).message
                position = wake_position(message)
                if position is not None:
                    self._wake(position)
                elif message == TOKEN_REVOKED:
                    self._revoked()
                elif message == f"{self._probe_token}:{probe_round}":
                    probe_seen.set()

        async def probe() -> None:
            nonlocal probe_round
            while True:
                await asyncio.sleep(self._probe_interval_s)
                probe_round += 1
                probe_seen.clear()
                async with asyncio.timeout(self._probe_timeout_s):
                    await self._publish(broadcast, f"{self._probe_token}:{probe_round}")
                    await probe_seen.wait()

        async def broken() -> None:
            await self._broken.wait()
            raise ConnectionError("publishing failed")

        tasks = [asyncio.create_task(receive()), asyncio.create_task(broken())]
        if self._probing:
            tasks.append(asyncio.create_task(probe()))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            task.result()  # raises what ended the session
        raise ConnectionError("broker subscription ended")


def wake_message(position: Position) -> str:
    return f"{position.tx}.{position.seq}"


def wake_position(message: str) -> Position | None:
    """The position a wake-up carries, or None if `message` is not one."""
    tx, dot, seq = message.partition(".")
    if dot and tx.isascii() and tx.isdecimal() and seq.isascii() and seq.isdecimal():
        return Position(int(tx), int(seq))
    return None


def _broadcast_for(url: str) -> Broadcast:
    if urlparse(url).scheme in ("redis", "rediss"):
        return Broadcast(backend=RedisWakeups(url))
    return Broadcast(url)


async def announce_revocation(url: str, *, timeout_s: float = 2.0) -> bool:
    """From a process that serves nothing (the CLI): tell every serve process on the
    broker to look for revoked tokens now. Best effort: each also looks every few
    seconds, and `memory://` reaches no other process. True when published."""
    if urlparse(url).scheme == "memory":
        return False
    broadcast = _broadcast_for(url)
    try:
        async with asyncio.timeout(timeout_s):
            await broadcast.connect()
            try:
                await broadcast.publish(CHANNEL, TOKEN_REVOKED)
            finally:
                await broadcast.disconnect()
    except Exception as exc:  # any broker failure: the pollers find it anyway
        where = urlparse(url).hostname  # no credentials in logs
        log.warning("revocation not announced on %s: %s: %s", where, type(exc).__name__, exc)
        return False
    return True
