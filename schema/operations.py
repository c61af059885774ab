"""Which operation of a document runs, checked before the limits and validation:

- a document with several operations needs `operationName` (GraphQL spec, "GetOperation");
  strawberry otherwise runs the first one;
- a subscription is served over websockets only; over HTTP its resolver ran as a plain
  field and failed as INTERNAL.

Both are INVALID_INPUT.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextvars import ContextVar

from graphql import GraphQLError, OperationDefinitionNode
from starlette.websockets import WebSocket
from strawberry.extensions import SchemaExtension
from strawberry.types.graphql import OperationType

from schema.errors import INVALID_INPUT

# `operationName` as the request sent it, set where each transport reads the request
# (schema/view.py, schema/websockets.py): strawberry's `operation_name` falls back to the
# first operation's name, so it cannot tell a name that was sent from none.
sent_operation_name: ContextVar[str | None] = ContextVar("sent_operation_name", default=None)


class OperationChecks(SchemaExtension):
    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document = context.graphql_document
        assert document is not None
        operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        message = None
        if len(operations) > 1 and sent_operation_name.get() is None:
            message = "Must provide operation name if query contains multiple operations."
        elif context.operation_type is OperationType.SUBSCRIPTION and not isinstance(
            getattr(context.context, "request", None), WebSocket
        ):
            message = (
                "subscriptions are served over websockets on /graphql "
                "(graphql-transport-ws or graphql-ws), not over HTTP"
            )
        if message is not None:
            context.pre_execution_errors = [
                GraphQLError(message, extensions={"code": INVALID_INPUT})
            ]
        yield
