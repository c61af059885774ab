"""Websockets of a revoked token are closed, in every process.

A websocket authenticates at `connection_init` and may stay open for hours. Every
operation sent over it checks its token again (schema/websockets.py); for the sockets
that only stream, each serve process keeps a registry of its open sockets by token hash
and one watcher task that reads the tokens revoked lately (an indexed read of
`api_tokens.revoked_at`) every `revocation_poll_interval_s`, and at once when the broker
says a token was revoked (`bettercompute token revoke` publishes that on a shared
broker, app/events/bus.py). Each open socket of a revoked token is closed with 4403.
The database is the only source of truth: a wake-up carries nothing, and a lost one
delays a close by at most one interval.

`revoked_at` is written with the revoking process's clock, and the watcher compares it
only with other `revoked_at` values: it reads every revocation newer than the newest it
has seen, less a window. The window covers a revocation that commits after a later one,
a socket that registers just after its token's revocation was read, and revokers whose
clocks differ by less than the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from typing import Final, Protocol

from sqlalchemy import func, select

from app.db.engine import Database
from app.db.models import ApiToken

log = logging.getLogger(__name__)

WINDOW: Final = timedelta(seconds=60)
FORBIDDEN: Final = 4403  # the close code of a socket whose token is not (or no longer) valid


class RevocableSocket(Protocol):
    async def close_revoked(self) -> None:
        """Close the socket with 4403 (its token was revoked)."""


class RevocationWatcher:
    def __init__(self, db: Database, interval_s: float) -> None:
        self._db = db
        self._interval_s = interval_s
        # Per process, not per socket: a token's open sockets, by token hash.
        self._sockets: dict[str, set[RevocableSocket]] = {}
        self._newest: datetime | None = None  # the newest revoked_at read so far
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def register(self, token_hash: str, socket: RevocableSocket) -> None:
        self._sockets.setdefault(token_hash, set()).add(socket)

    def unregister(self, token_hash: str, socket: RevocableSocket) -> None:
        sockets = self._sockets.get(token_hash)
        if sockets is not None:
            sockets.discard(socket)
            if not sockets:
                del self._sockets[token_hash]

    def wake(self) -> None:
        """Look now (a bus listener: must not block)."""
        self._wanted.set()

    async def start(self) -> None:
        try:
            async with self._db.reader.connect() as conn:
                self._newest = await conn.scalar(select(func.max(ApiToken.revoked_at)))
        except Exception as exc:  # the database may be down at start; the loop retries
            log.warning("token revocations not read: %s: %s", type(exc).__name__, exc)
        self._task = asyncio.create_task(self._run(), name="token-revocation-watcher")

    async def stop(self) -> None:
        tasks = [*self._closing, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    async def check(self) -> int:
        """Close the open sockets of tokens revoked lately; returns how many."""
        if not self._sockets:
            return 0  # nothing to close; the next read starts from the same point
        query = select(ApiToken.token_hash, ApiToken.revoked_at)
        if self._newest is None:
            query = query.where(ApiToken.revoked_at.is_not(None))
        else:
            query = query.where(ApiToken.revoked_at > self._newest - WINDOW)
        async with self._db.reader.connect() as conn:
            rows = (await conn.execute(query)).all()
        closed = 0
        for token_hash, revoked_at in rows:
            if revoked_at is not None and (self._newest is None or revoked_at > self._newest):
                self._newest = revoked_at
            for socket in self._sockets.pop(token_hash, ()):
                self._close(socket)
                closed += 1
        return closed

    def _close(self, socket: RevocableSocket) -> None:
        task = asyncio.create_task(socket.close_revoked())
        self._closing.add(task)
        task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("closing a revoked token's websocket failed: %r", task.exception())

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.check()
            except Exception as exc:  # the database is down: try again next time
                log.warning("token revocations not read: %s: %s", type(exc).__name__, exc)
