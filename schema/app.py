"""The schema. `schema` (default settings) is what `scripts/export-schema` prints to
schema/schema.graphql; the server builds its own from its settings (limits, introspection)
and with the fast executor when app/compat.py finds it can run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import DisableIntrospection, ParserCache, SchemaExtension
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.types import ExecutionContext

from app.compat import graphql_core_schema
from app.config import Settings
from schema.cost_budget import CostBudget
from schema.errors import ErrorCodes
from schema.limits import DOCUMENT_CACHE_SIZE, query_limits
from schema.mutations import Mutation
from schema.operations import OperationChecks
from schema.queries import Query
from schema.read_scope_hooks import ReadScopeHooks
from schema.scalars import SCALAR_MAP
from schema.subscriptions import Subscription


class Schema(strawberry.Schema):
    def process_errors(
        self, errors: list[GraphQLError], execution_context: ExecutionContext | None = None
    ) -> None:
        """Errors are logged where they are classified (schema/errors.py): expected domain
        errors (NOT_FOUND, PERMISSION_DENIED...) are answers, not incidents."""


def without_suggestions(
    base: type[StrawberryGraphQLCoreExecutionContext],
) -> type[StrawberryGraphQLCoreExecutionContext]:
    """`base` coercing variables without "Did you mean ...?" (an unknown input field, a
    misspelt enum value): graphql-core's executor classes take `hide_suggestions` in
    `build`, which execute and subscribe call, but strawberry passes none."""

    class WithoutSuggestions(base):  # type: ignore[valid-type,misc]
        @classmethod
        def build(cls, *args: Any, **kwargs: Any) -> Any:
            kwargs["hide_suggestions"] = True
            return super().build(*args, **kwargs)

    return WithoutSuggestions


@lru_cache(maxsize=8)
def _build(
    introspection: bool,
    max_depth: int,
    max_aliases: int,
    max_tokens: int,
    max_cost: int,
    tracing: bool = False,
    fast_executor: bool = False,
) -> Schema:
    extensions: list[type[SchemaExtension] | Callable[[], SchemaExtension]] = [
        ReadScopeHooks,
        OperationChecks,  # before the limits: which operation runs, and over what
        # Before ParserCache: its on_parse sets the parse options (max_tokens) the cache uses.
        query_limits(
            max_depth=max_depth,
            max_aliases=max_aliases,
            max_tokens=max_tokens,
            max_cost=max_cost,
            hide_suggestions=not introspection,
        ),
        # The same query text is parsed once (limits apply: max_tokens is in the key).
        lambda: ReportingParserCache(maxsize=DOCUMENT_CACHE_SIZE),
        CostBudget,  # after the limits: charges the cost they computed, before execution
        ErrorCodes,
    ]
    if not introspection:
        extensions.append(DisableIntrospection)
    if tracing:  # OTEL_TRACES_EXPORTER (app/tracing.py); imported only then
        from app.tracing import graphql_extension

        traced = graphql_extension()  # None when it could record a secret
        if traced is not None:
            extensions.insert(0, traced)
    executor: type[StrawberryGraphQLCoreExecutionContext] = (
        StrawberryGraphQLCoreExecutionContext  # strawberry's own
    )
    if fast_executor:  # imported only then: it subclasses what app/compat.py checked
        from schema.executor import FastFieldsExecutor

        executor = FastFieldsExecutor
    if not introspection:
        # Validation suggests nothing (query_limits); nor does variable coercion.
        executor = without_suggestions(executor)
    built = Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=extensions,
        execution_context_class=executor,
        config=StrawberryConfig(scalar_map=SCALAR_MAP),
    )
    graphql_core_schema(built)  # the limits need it: refuse to start without it
    return built


class ReportingParserCache(ParserCache):
    """strawberry's ParserCache, but a text that does not parse (a syntax error, the token
    limit) is left to strawberry's own parse, inside its error handling, which reports
    it as the operation's error on every transport: raised from this hook, it escaped
    the websocket stream (a bare `complete` and a traceback). The second parse stops
    where the first did, at the token limit at the latest."""

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        try:
            context.graphql_document = self.cached_parse_document(
                context.query, **context.parse_options
            )
        except GraphQLError:
            context.graphql_document = None
        yield


def build_schema(
    settings: Settings, *, tracing: bool = False, fast_executor: bool = False
) -> Schema:
    """One schema per distinct set of limits (building one takes tens of milliseconds).
    `fast_executor`: schema/executor.py, when app/compat.py says it can run."""
    return _build(
        settings.introspection,
        settings.max_query_depth,
        settings.max_aliases,
        settings.max_tokens,
        settings.max_query_cost,
        tracing,
        fast_executor,
    )


schema = build_schema(Settings())

__all__: list[Any] = ["build_schema", "schema"]
