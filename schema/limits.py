"""Query limits, checked before anything runs (CONTRACT section 9): depth, aliases and
tokens (strawberry's own checks, fragment spreads followed) and a static cost estimate.
Every refusal is RESOURCE_EXHAUSTED.

Cost: each selected field costs 1, times the size of the lists above it. A field with a
`first` argument multiplies what is below it by `first` (its default when not given);
any other list multiplies by LIST_ESTIMATE, except a connection's own `edges` and `nodes`,
already counted by its `first`. Introspection fields are free. The estimate is computed
with the request's variables, so `first: $n` counts as sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_list_type,
    validate,
)
from graphql.pyutils import Undefined
from strawberry.extensions import SchemaExtension
from strawberry.extensions.max_aliases import create_validator as alias_validator
from strawberry.extensions.query_depth_limiter import create_validator as depth_validator
from strawberry.schema.schema import validate_document

from schema.errors import RESOURCE_EXHAUSTED

LIST_ESTIMATE = 10
# Fragments nested deeper than this are cut off (a cycle is invalid anyway).
_MAX_FRAGMENT_NESTING = 32


def coded_rule(rule: type[ValidationRule], limit: str) -> type[ValidationRule]:
    """A rule whose errors say RESOURCE_EXHAUSTED (strawberry's limiters report plain
    errors, and report them while the rule is constructed)."""

    class Coded(rule):  # type: ignore[misc, valid-type]
        def __init__(self, context: ValidationContext) -> None:
            report = context.report_error

            def report_coded(error: GraphQLError) -> None:
                error.extensions = {
                    **(error.extensions or {}),
                    "code": RESOURCE_EXHAUSTED,
                    "limit": limit,
                }
                report(error)

            context.report_error = report_coded  # type: ignore[method-assign]
            try:
                super().__init__(context)
            finally:
                del context.report_error  # back to the class's method

    Coded.__name__ = f"Coded{rule.__name__}"
    return Coded


class _Estimator:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: Mapping[str, Any],
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables

    def _fields(
        self, selection_set: SelectionSetNode | None, parent: Any, depth: int = 0
    ) -> Iterator[tuple[FieldNode, Any]]:
        if selection_set is None or depth > _MAX_FRAGMENT_NESTING:
            return
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                yield selection, parent
            elif isinstance(selection, InlineFragmentNode):
                inner = parent
                if selection.type_condition is not None:
                    inner = self.schema.get_type(selection.type_condition.name.value) or parent
                yield from self._fields(selection.selection_set, inner, depth + 1)
            elif isinstance(selection, FragmentSpreadNode):
                fragment = self.fragments.get(selection.name.value)
                if fragment is not None:
                    inner = self.schema.get_type(fragment.type_condition.name.value) or parent
                    yield from self._fields(fragment.selection_set, inner, depth + 1)

    def _first(self, node: FieldNode, default: Any) -> int:
        for argument in node.arguments or ():
            if argument.name.value != "first":
                continue
            value = argument.value
            if isinstance(value, IntValueNode):
                return max(0, int(value.value))
            if isinstance(value, VariableNode):
                sent = self.variables.get(value.name.value)
                if isinstance(sent, int) and not isinstance(sent, bool):
                    return max(0, sent)
        return default if isinstance(default, int) and default is not Undefined else 100

    def cost(self, selection_set: SelectionSetNode | None, parent: Any) -> int:
        total = 0
        for node, owner in self._fields(selection_set, parent):
            name = node.name.value
            if name.startswith("__"):
                continue
            fields = (
                owner.fields if isinstance(owner, GraphQLObjectType | GraphQLInterfaceType) else {}
            )
            field = fields.get(name)
            if field is None:
                total += 1
                continue
            below = self.cost(node.selection_set, get_named_type(field.type))
            if "first" in field.args:
                total += 1 + self._first(node, field.args["first"].default_value) * below
            elif is_list_type(get_nullable_type(field.type)) and not owner.name.endswith(
                "Connection"
            ):
                total += 1 + LIST_ESTIMATE * below
            else:
                total += 1 + below
        return total


def cost_rule(budget: int, variables: Mapping[str, Any]) -> type[ValidationRule]:
    class QueryCost(ValidationRule):
        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
            context = self.context
            fragments = {
                d.name.value: d
                for d in context.document.definitions
                if isinstance(d, FragmentDefinitionNode)
            }
            root = context.schema.get_root_type(node.operation)
            cost = _Estimator(context.schema, fragments, variables).cost(node.selection_set, root)
            if cost > budget:
                self.report_error(
                    GraphQLError(
                        f"query cost {cost} is over the budget of {budget}; ask for fewer "
                        "items (`first`) or fewer nested lists",
                        node,
                        extensions={
                            "code": RESOURCE_EXHAUSTED,
                            "limit": "cost",
                            "cost": cost,
                            "budget": budget,
                        },
                    )
                )

    return QueryCost


@lru_cache(maxsize=512)
def _validate(
    schema: GraphQLSchema, document: DocumentNode, rules: tuple[type[ASTValidationRule], ...]
) -> list[GraphQLError]:
    """Validation depends on the document only (the parser cache hands back the same
    document for the same text), so a dashboard's repeated query is validated once."""
    return validate_document(schema, document, rules)


def query_limits(
    *, max_depth: int, max_aliases: int, max_tokens: int, max_cost: int
) -> type[SchemaExtension]:
    """An extension class (constructed per request) that adds every limit and runs the
    validation itself: the document's rules from a cache, the cost with this request's
    variables (the only part that depends on them)."""
    depth = coded_rule(depth_validator(max_depth, None), "depth")
    aliases = coded_rule(alias_validator(max_aliases), "aliases")

    class QueryLimits(SchemaExtension):
        # Set up in on_parse (listed before ParserCache), not on_operation: a hook of the
        # whole operation stays suspended as long as a subscription lives.
        def on_parse(self) -> Iterator[None]:
            context = self.execution_context
            context.parse_options["max_tokens"] = max_tokens
            context.validation_rules = (*context.validation_rules, depth, aliases)
            yield

        def on_validate(self) -> Iterator[None]:
            context = self.execution_context
            assert context.graphql_document is not None
            schema = context.schema._schema
            errors = list(_validate(schema, context.graphql_document, context.validation_rules))
            if not errors:
                cost = cost_rule(max_cost, context.variables or {})
                errors = validate(schema, context.graphql_document, [cost])
            # Set (even when empty): strawberry then skips its own, uncached validation.
            context.pre_execution_errors = errors
            yield

    return QueryLimits
