"""Each operation reads through a scope of its own, returned when the operation ends.

Over HTTP the context is the request's. A websocket shares one context between all its
operations, and a subscription's operation lasts as long as the stream; so there every
operation runs on a fork of the connection's context (the same caller, its own reads
and loaders): a query beside a subscription reads fresh data and lets its connection go
when it is answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.websockets import WebSocket
from strawberry.extensions import SchemaExtension

from schema.context import Context


class ReadScopeHooks(SchemaExtension):
    async def on_operation(self) -> AsyncIterator[None]:
        context = self.execution_context.context
        if not isinstance(context, Context):
            yield
            return
        if isinstance(context.request, WebSocket):
            context = context.fork()
            self.execution_context.context = context  # read by execution, after this hook
        try:
            yield
        finally:
            await context.reads.close()
