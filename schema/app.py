"""The schema. `schema` (default settings) is what `scripts/export-schema` prints to
schema/schema.graphql; the server builds its own from its settings (limits, introspection).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import strawberry
from graphql import GraphQLError
from strawberry.extensions import DisableIntrospection, ParserCache, SchemaExtension
from strawberry.schema.config import StrawberryConfig
from strawberry.types import ExecutionContext

from app.config import Settings
from schema.cost_budget import CostBudget
from schema.errors import ErrorCodes
from schema.executor import FastFieldsExecutor
from schema.limits import query_limits
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


@lru_cache(maxsize=8)
def _build(
    introspection: bool,
    max_depth: int,
    max_aliases: int,
    max_tokens: int,
    max_cost: int,
    tracing: bool = False,
) -> Schema:
    extensions: list[type[SchemaExtension] | Callable[[], SchemaExtension]] = [
        ReadScopeHooks,
        OperationChecks,  # before the limits: which operation runs, and over what
        # Before ParserCache: its on_parse sets the parse options (max_tokens) the cache uses.
        query_limits(
            max_depth=max_depth, max_aliases=max_aliases, max_tokens=max_tokens, max_cost=max_cost
        ),
        # The same query text is parsed once (limits apply: max_tokens is in the key).
        lambda: ParserCache(maxsize=512),
        CostBudget,  # after the limits: charges the cost they computed, before execution
        ErrorCodes,
    ]
    if not introspection:
        extensions.append(DisableIntrospection)
    if tracing:  # OTEL_TRACES_EXPORTER (app/tracing.py); imported only then
        from app.tracing import graphql_extension

        extensions.insert(0, graphql_extension())
    return Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        extensions=extensions,
        execution_context_class=FastFieldsExecutor,
        config=StrawberryConfig(scalar_map=SCALAR_MAP),
    )


def build_schema(settings: Settings, *, tracing: bool = False) -> Schema:
    """One schema per distinct set of limits (building one takes tens of milliseconds)."""
    return _build(
        settings.introspection,
        settings.max_query_depth,
        settings.max_aliases,
        settings.max_tokens,
        settings.max_query_cost,
        tracing,
    )


schema = build_schema(Settings())

__all__: list[Any] = ["build_schema", "schema"]
