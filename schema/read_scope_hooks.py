"""Per-operation upkeep of the request's reads: the read connection is returned when the
last operation on a context ends (a websocket runs several on one context)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from strawberry.extensions import SchemaExtension

from schema.context import Context


class ReadScopeHooks(SchemaExtension):
    async def on_operation(self) -> AsyncIterator[None]:
        context = self.execution_context.context
        if not isinstance(context, Context):
            yield
            return
        if context.active_operations == 0:
            await context.refresh_reads()  # nothing cached from an earlier operation
        context.active_operations += 1
        try:
            yield
        finally:
            context.active_operations -= 1
            if context.active_operations == 0:
                await context.reads.close()
