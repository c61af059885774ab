"""One read connection per request, opened on first use and shared by all its reads.

A GraphQL request resolves fields (and DataLoader batches) as concurrent tasks; a lock
makes them take turns on the one connection (an AsyncConnection must never run two
statements at once), so a query holds one pooled connection however wide it fans out.
`Capacity` runs a read on the scope it is given (`reads=`), else on a connection of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.engine import Database

T = TypeVar("T")


class ReadScope:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn: AsyncConnection | None = None
        self._lock = asyncio.Lock()

    async def run(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self._lock:
            if self._conn is None:
                self._conn = await self._db.reader.connect()
            return await work(self._conn)

    async def close(self) -> None:
        """End the read transaction and return the connection; the next run opens anew."""
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()
