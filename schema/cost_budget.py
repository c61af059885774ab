"""The caller's GraphQL cost budget (app/rate_limit.py): after the limits have computed
the operation's cost (schema/limits.py) and before it runs, the cost is charged; an
operation that does not fit what is left of the window is refused RESOURCE_EXHAUSTED
(HTTP 429 with Retry-After, schema/view.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from app.observe import request_info
from app.rate_limit import RateLimited, RateLimiter
from schema.context import Context


class CostBudget(SchemaExtension):
    async def on_validate(self) -> AsyncIterator[None]:
        execution = self.execution_context
        context = execution.context
        if not execution.pre_execution_errors and isinstance(context, Context):
            limiter: RateLimiter | None = getattr(context.request.app.state, "rate_limiter", None)
            if limiter is not None and limiter.cost is not None and context.cost is not None:
                try:
                    principal = await context.principal()
                except Exception:  # unauthenticated: the resolvers answer that
                    principal = None
                if principal is not None:
                    try:
                        await limiter.charge_cost(principal.caller_id, context.cost, request_info())
                    except RateLimited as exc:
                        execution.pre_execution_errors = [
                            GraphQLError(exc.message, extensions={"code": exc.code, **exc.details})
                        ]
        yield
