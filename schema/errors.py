"""Every GraphQL error carries `extensions.code` from CONTRACT section 3.

- A domain error raised by a resolver keeps its code and details (`field` among them).
- Unexpected exceptions are masked: INTERNAL with a message that reveals nothing, or
  UNAVAILABLE when the database is down (app/db/errors.py decides and logs).
- graphql-core's own errors (syntax, validation, variable coercion) are INVALID_INPUT;
  a limit refusal carries RESOURCE_EXHAUSTED, set where the limit is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.types.execution import StreamExecutionResult

from app.compat import input_field, over_token_limit
from app.db.errors import to_domain_error
from app.errors import DomainError

INVALID_INPUT = "INVALID_INPUT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

def with_code(error: GraphQLError, code: str, message: str, **details: Any) -> GraphQLError:
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        original_error=None,
        extensions={"code": code, **details},
    )


def coded(error: GraphQLError) -> GraphQLError:
    """The error as clients see it: with a code, and masked unless expected."""
    if error.extensions and "code" in error.extensions:
        return error
    original = error.original_error
    if isinstance(original, DomainError) or (
        original is not None and not isinstance(original, GraphQLError) and error.path
    ):
        domain = to_domain_error(original)  # logs what it masks
        return with_code(error, domain.code, domain.message, **domain.details)
    if original is not None and not isinstance(original, (GraphQLError, ValueError, TypeError)):
        domain = to_domain_error(original)  # a failure outside any field, e.g. in a hook
        return with_code(error, domain.code, domain.message, **domain.details)
    # graphql-core says which limit or input field only in its messages (app/compat.py).
    if over_token_limit(error.message):
        return with_code(error, RESOURCE_EXHAUSTED, error.message, limit="tokens")
    field = input_field(error.message)
    details = {"field": field} if field else {}
    return with_code(error, INVALID_INPUT, error.message, **details)


class ErrorCodes(SchemaExtension):
    """Rewrites the operation's errors once it ends (not a per-field hook), and each
    result of a subscription as it is sent."""

    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        errors = getattr(result, "errors", None)
        if result is not None and errors:
            result.errors = [coded(e) for e in errors]

    def on_stream_result(self, result: StreamExecutionResult) -> Iterator[None]:
        errors = getattr(result, "errors", None)
        if errors:
            result.errors = [coded(e) for e in errors]  # type: ignore[union-attr]
        yield
