"""The per-request GraphQL context: who is calling, the domain, a read scope, loaders."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from app.capacity.service import Capacity
from app.config import Settings
from app.db.read_scope import ReadScope
from app.iam.callers import authenticate
from app.iam.principal import Principal
from schema.loaders import Loaders, create_loaders

if TYPE_CHECKING:
    from schema.compiled_reads import CompiledReads

T = TypeVar("T")


@dataclass
class Context:
    request: Request | WebSocket
    response: Response | WebSocket | None
    capacity: Capacity
    settings: Settings
    # graphql-transport-ws / graphql-ws: the connection_init payload (strawberry sets it).
    connection_params: dict[str, object] | None = None
    # The plans of compiled reads where a subscription event's `pool` may be answered by
    # one (the executor splices its JSON in: schema/spliced.py); None: the plain read.
    compiled: CompiledReads | None = None
    reads: ReadScope = field(init=False)
    _loaders: Loaders | None = field(default=None, init=False)
    _principal: asyncio.Task[Principal] | None = field(default=None, init=False)
    cost: int | None = field(default=None, init=False)  # the operation's (schema/limits.py)

    def __post_init__(self) -> None:
        self.reads = self.capacity.read_scope()

    @property
    def loaders(self) -> Loaders:
        """Made on first use: a websocket that only streams events never needs them, and a
        server holds thousands of those."""
        if self._loaders is None:
            self._loaders = create_loaders(self.capacity, self.reads, self.principal)
        return self._loaders

    def authorization(self) -> str | None:
        """`Authorization: Bearer ...` from the request, or from a websocket's
        connection_init payload (`{"authorization": "Bearer ..."}`), CONTRACT section 2."""
        header = self.request.headers.get("authorization")
        if header is None and self.connection_params is not None:
            # Any case: GraphiQL sends its headers pane as is ({"Authorization": ...}).
            value = next(
                (v for k, v in self.connection_params.items() if k.lower() == "authorization"),
                None,
            )
            header = value if isinstance(value, str) else None
        return header

    async def principal(self) -> Principal:
        """Authenticate once, on first use; a failure is UNAUTHENTICATED every time."""
        if self._principal is None:
            self._principal = asyncio.ensure_future(
                authenticate(self.capacity.db, self.authorization())
            )
        return await asyncio.shield(self._principal)

    async def reauthenticate(self) -> Principal:
        """Check the token again, now (each operation over a websocket does): a token
        revoked since connection_init is UNAUTHENTICATED from here on."""
        self._principal = None
        return await self.principal()

    def fork(self) -> Context:
        """The same caller with reads of its own: one per subscription event, so each
        event reads fresh data and releases its connection once sent."""
        forked = Context(
            self.request,
            self.response,
            self.capacity,
            self.settings,
            self.connection_params,
            self.compiled,
        )
        forked._principal = self._principal
        return forked

    def forget_principal(self) -> None:
        """Authenticate again on next use (a websocket whose connection_init changed it)."""
        self._principal = None

    async def refresh_reads(self) -> None:
        """Drop what this request has read: a new read transaction and empty loaders."""
        await self.reads.close()
        self._loaders = None

    async def write(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run one domain write (one unit of work, opened by the domain). Reads before it
        are let go so nothing stale is served after it (SQLite keeps a read snapshot)."""
        await self.refresh_reads()
        try:
            return await call()
        finally:
            await self.refresh_reads()
