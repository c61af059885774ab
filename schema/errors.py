"""Every GraphQL error carries `extensions.code` from CONTRACT section 3.

- A domain error raised by a resolver keeps its code and details (`field` among them).
- Unexpected exceptions are masked: INTERNAL with a message that reveals nothing, or
  UNAVAILABLE when the database is down (app/db/errors.py decides and logs).
- graphql-core's own errors (syntax, validation, variable coercion) are INVALID_INPUT;
  a limit refusal carries RESOURCE_EXHAUSTED, set where the limit is checked.
- graphql-core's messages end with the value they refused (`found: {...}`), printed in
  full for a literal: where it holds a secret field (a policy key's, e.g.
  `kubernetes.token`, CONTRACT section 6), the value is cut from the message, which still
  names the type and the field (`extensions.field`). A secret is never read back, not
  even to the caller who sent it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension
from strawberry.types.execution import StreamExecutionResult

from app.capacity.policy import secret_field_names
from app.compat import input_field, token_limit
from app.db.errors import to_domain_error
from app.errors import DomainError

INVALID_INPUT = "INVALID_INPUT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
# Where graphql-core's messages start echoing a value: `, found: V.` / `. Found: V.`
# (input values), `, but encountered error 'E'; found: V.` (a scalar's own error), and
# `String cannot represent a non string value: V` (scalars). The earliest one is taken:
# the echo is always at the end, so cutting earlier only ever removes more.
_ECHO = re.compile(
    r"(?P<before>[,.;]?\s*[Ff]ound:|,?\s*but encountered error)|cannot represent[^:]*(?P<after>):"
)
NOT_SHOWN = "The value sent is not shown: it holds a secret field."


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
    tokens = token_limit(error.message)
    if tokens is not None:  # graphql-core words it as a syntax error; it is a limit
        message = f"the document has more than {tokens} tokens, the most a document may have"
        return with_code(error, RESOURCE_EXHAUSTED, message, limit="tokens", max=tokens)
    field = input_field(error.message)
    details = {"field": field} if field else {}
    return with_code(error, INVALID_INPUT, without_secrets(error.message), **details)


@lru_cache(maxsize=1)
def _secret_key() -> re.Pattern[str]:
    """A secret field's name used as a key, as graphql-core prints values: `token: "x"`
    (a literal) or `'token': 'x'` (a variable)."""
    names = "|".join(sorted(re.escape(name) for name in secret_field_names()))
    if not names:
        return re.compile(r"(?!)")  # no secret fields: nothing ever matches
    return re.compile(rf"""(?<![\w$])["']?(?:{names})["']?\s*:""")


def without_secrets(message: str) -> str:
    """`message` with the value it echoes cut when that value holds a secret field."""
    if not _secret_key().search(message):
        return message
    echo = _ECHO.search(message)
    if echo is None:  # a message this module does not know: show none of it
        return f"Invalid value. {NOT_SHOWN}"
    cut = echo.start("after") if echo.group("after") is not None else echo.start()
    head = message[:cut].rstrip(" ,.;:")
    return f"{head} {NOT_SHOWN}" if head.endswith("?") else f"{head}. {NOT_SHOWN}"


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
