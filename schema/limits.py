"""Query limits, checked before anything else looks at a parsed document (CONTRACT
section 9): depth, aliases, the size of the selection once fragments are expanded, and a
static cost. Every refusal is RESOURCE_EXHAUSTED. graphql-core's own validation runs only
on a document that passed them.

Every check does work linear in the document: a fragment is measured once, however
often it is spread (a chain of fragments that each spread the next twice expands to
2^n fields from a few hundred bytes), and the sizes are summed as numbers.

Cost: each selected field costs 1, times the size of the lists above it. A field with a
`first` argument multiplies what is below it by `first` (its default when not given);
any other list multiplies by its bound from app/capacity/bounds.py (LIST_BOUNDS), except
a connection's own `edges` and `nodes`, already counted by its `first`. Root `quotas`
without `poolId` has no bound (every visible pool): it counts as a full page of pools,
UNPAGED_QUOTAS rows, and may be asked once per operation (docs/graphql.md).
Introspection fields are free. The estimate is computed with the request's variables,
so `first: $n` counts as sent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_list_type,
    validate,
)
from graphql.pyutils import Undefined
from strawberry.extensions import SchemaExtension
from strawberry.schema.validation_rules.maybe_null import MaybeNullValidationRule
from strawberry.schema.validation_rules.one_of import OneOfInputValidationRule

from app.capacity.bounds import (
    MAX_CAPACITY_ROWS,
    MAX_IMPACT_ITEMS,
    MAX_OFFERS_PER_POOL,
    MAX_RESOURCES,
)
from app.capacity.paging import MAX_PAGE_SIZE
from app.catalog import POOL_METHODS
from app.compat import graphql_core_schema
from app.observe import request_info
from schema.errors import RESOURCE_EXHAUSTED

# Lists without `first`, by (type, field): their most items, as the domain bounds them.
LIST_BOUNDS: Mapping[tuple[str, str], int] = {
    ("Query", "capacity"): MAX_CAPACITY_ROWS,
    ("Query", "catalog"): len(POOL_METHODS),
    ("Query", "quotas"): MAX_RESOURCES,  # with poolId; see UNPAGED_QUOTAS
    ("Pool", "quotas"): MAX_RESOURCES,
    ("Pool", "capacity"): MAX_CAPACITY_ROWS,
    ("Pool", "offers"): MAX_OFFERS_PER_POOL,
    ("OfferedPool", "quotas"): MAX_RESOURCES,  # offerPool's answer: a Pool's fields
    ("OfferedPool", "capacity"): MAX_CAPACITY_ROWS,
    ("OfferedPool", "offers"): MAX_OFFERS_PER_POOL,
    ("OfferedPool", "lending"): MAX_OFFERS_PER_POOL,
    ("Offer", "quotas"): MAX_RESOURCES,
    ("Reservation", "resources"): MAX_RESOURCES,
    ("Pool", "lending"): MAX_OFFERS_PER_POOL,
    ("GuestLending", "quotas"): MAX_RESOURCES,
    ("Impact", "tenantsLosingAccess"): MAX_IMPACT_ITEMS,
    ("Impact", "reservations"): MAX_IMPACT_ITEMS,
    ("Impact", "offersEnded"): MAX_OFFERS_PER_POOL,
}
# Root `quotas` without `poolId`: the tenant's rows in every pool it sees, which nothing
# bounds; counted as the rows of one full page of pools. Its items are flat (no list
# below), so an alias of it costs at most this many rows times its scalar fields.
UNPAGED_QUOTAS = MAX_PAGE_SIZE * MAX_RESOURCES
# A list field this table does not know (a test keeps the schema's lists in it).
UNKNOWN_LIST = MAX_PAGE_SIZE
# Fields in an operation once every fragment spread is expanded: what validation and
# execution walk. A document within the token limit and no fragments stays far below.
MAX_EXPANDED_FIELDS = 10_000
# orjson encodes 64-bit integers only; the message carries the exact figure.
MAX_REPORTED_COST = 2**63 - 1
# Parsed documents are kept per query text (schema/app.py's parser cache) and so is what
# is derived from them (shape_errors, _validate: keyed by the document, so they keep it
# alive): each is bounded by max_tokens (2,000 tokens: under 1 MB), so this many bound
# them all. 512 let distinct texts from one caller hold hundreds of MB (issue 19).
DOCUMENT_CACHE_SIZE = 128


def _refusal(message: str, node: Any, limit: str, **details: Any) -> GraphQLError:
    return GraphQLError(
        message, node, extensions={"code": RESOURCE_EXHAUSTED, "limit": limit, **details}
    )


def _fragments_in_order(document: DocumentNode) -> list[FragmentDefinitionNode]:
    """The document's fragments, each after every fragment it spreads (a cycle, refused
    by validation later, is cut where it closes). Iterative: a chain of fragments may be
    longer than Python's recursion limit allows."""
    fragments = {
        d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
    }
    spreads = {name: _spread_names(f.selection_set) for name, f in fragments.items()}
    order: list[FragmentDefinitionNode] = []
    state: dict[str, bool] = {}  # False while being visited, True once placed
    for root in fragments:
        if root in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(spreads[root]))]
        state[root] = False
        while stack:
            name, pending = stack[-1]
            for child in pending:
                if child in fragments and child not in state:
                    state[child] = False
                    stack.append((child, iter(spreads[child])))
                    break
            else:
                stack.pop()
                state[name] = True
                order.append(fragments[name])
    return order


def _spread_names(selection_set: SelectionSetNode | None) -> list[str]:
    names: list[str] = []
    pending = [selection_set]
    while pending:
        current = pending.pop()
        if current is None:
            continue
        for selection in current.selections:
            if isinstance(selection, FragmentSpreadNode):
                names.append(selection.name.value)
            else:
                pending.append(selection.selection_set)  # type: ignore[attr-defined]
    return names


def _operations(document: DocumentNode) -> list[OperationDefinitionNode]:
    return [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]


@dataclass(frozen=True)
class Shape:
    """A selection set with its fragments expanded. `depth` and `aliases` count as
    strawberry's QueryDepthLimiter and MaxAliasesLimiter did: depth is the nesting of
    fields that have a selection set (introspection fields not counted)."""

    depth: int = 0
    aliases: int = 0
    fields: int = 0


_NOTHING = Shape()


def _shape(selection_set: SelectionSetNode, known: Mapping[str, Shape]) -> Shape:
    depth = aliases = fields = 0
    for selection in selection_set.selections:
        if isinstance(selection, FragmentSpreadNode):
            inner = known.get(selection.name.value, _NOTHING)  # unknown or cyclic: none
        elif isinstance(selection, InlineFragmentNode):
            inner = _shape(selection.selection_set, known)
        else:
            assert isinstance(selection, FieldNode)
            below = _shape(selection.selection_set, known) if selection.selection_set else None
            counted = below is not None and not selection.name.value.startswith("__")
            inner = Shape(
                depth=1 + below.depth if counted and below else 0,
                aliases=(selection.alias is not None) + (below.aliases if below else 0),
                fields=1 + (below.fields if below else 0),
            )
        depth = max(depth, inner.depth)
        aliases += inner.aliases
        fields += inner.fields
    return Shape(depth, aliases, fields)


@lru_cache(maxsize=DOCUMENT_CACHE_SIZE)
def shape_errors(
    document: DocumentNode, max_depth: int, max_aliases: int, max_fields: int
) -> list[GraphQLError]:
    """Depth, aliases and expanded size: they depend on the document only."""
    known: dict[str, Shape] = {}
    for fragment in _fragments_in_order(document):
        known[fragment.name.value] = _shape(fragment.selection_set, known)
    errors: list[GraphQLError] = []
    aliases = fields = 0
    for operation in _operations(document):
        shape = _shape(operation.selection_set, known)
        if shape.depth > max_depth:
            name = operation.name.value if operation.name else "anonymous"
            message = f"'{name}' exceeds maximum operation depth of {max_depth}"
            errors.append(_refusal(message, operation, "depth"))
        aliases += shape.aliases
        fields += shape.fields
    if aliases > max_aliases:
        errors.append(_refusal(f"{aliases} aliases found. Allowed: {max_aliases}", None, "aliases"))
    if fields > max_fields:
        message = (
            f"the query selects {fields} fields once its fragments are expanded; "
            f"at most {max_fields} are allowed"
        )
        errors.append(_refusal(message, None, "fields"))
    return errors


@dataclass(frozen=True)
class Cost:
    """A selection's estimated cost, and how many times it reads an unbounded list."""

    total: int = 0
    unbounded: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.total + other.total, self.unbounded + other.unbounded)


_FREE = Cost()


class _Estimator:
    """The cost of each fragment once (in dependency order), then of each operation."""

    def __init__(self, schema: GraphQLSchema, variables: Mapping[str, Any]) -> None:
        self.schema = schema
        self.variables = variables
        self.fragments: dict[str, Cost] = {}

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
        if isinstance(default, int) and default is not Undefined:
            return default
        return MAX_PAGE_SIZE

    def _type(self, name: str) -> GraphQLNamedType | None:
        return self.schema.get_type(name)

    def cost(self, selection_set: SelectionSetNode | None, owner: GraphQLNamedType | None) -> Cost:
        total = _FREE
        for selection in selection_set.selections if selection_set else ():
            if isinstance(selection, FragmentSpreadNode):
                total += self.fragments.get(selection.name.value, _FREE)
            elif isinstance(selection, InlineFragmentNode):
                inner = owner
                if selection.type_condition is not None:
                    inner = self._type(selection.type_condition.name.value)
                total += self.cost(selection.selection_set, inner)
            else:
                assert isinstance(selection, FieldNode)
                total += self._field(selection, owner)
        return total

    def _field(self, node: FieldNode, owner: GraphQLNamedType | None) -> Cost:
        name = node.name.value
        if name.startswith("__"):
            return _FREE
        fields = owner.fields if isinstance(owner, GraphQLObjectType | GraphQLInterfaceType) else {}
        field = fields.get(name)
        if field is None or owner is None:
            return Cost(1)  # validation refuses it later
        below = self.cost(node.selection_set, get_named_type(field.type))
        unbounded = 0
        if "first" in field.args:
            size = self._first(node, field.args["first"].default_value)
        elif is_list_type(get_nullable_type(field.type)) and not owner.name.endswith("Connection"):
            size = LIST_BOUNDS.get((owner.name, name), UNKNOWN_LIST)
            if (owner.name, name) == ("Query", "quotas") and not any(
                a.name.value == "poolId" for a in node.arguments or ()
            ):
                size, unbounded = UNPAGED_QUOTAS, 1
        else:
            size = 1
        return Cost(1 + size * below.total, unbounded + size * below.unbounded)

    def operations(self, document: DocumentNode) -> Iterator[tuple[OperationDefinitionNode, Cost]]:
        for fragment in _fragments_in_order(document):
            owner = self._type(fragment.type_condition.name.value)
            self.fragments[fragment.name.value] = self.cost(fragment.selection_set, owner)
        for operation in _operations(document):
            root = self.schema.get_root_type(operation.operation)
            yield operation, self.cost(operation.selection_set, root)


def cost_errors(
    schema: GraphQLSchema,
    document: DocumentNode,
    variables: Mapping[str, Any],
    budget: int,
    costs: dict[str | None, int] | None = None,
) -> list[GraphQLError]:
    """Refusals of operations over the budget; `costs` receives each operation's cost
    by name (the response's `extensions.cost`, the caller's cost budget)."""
    errors = []
    for operation, cost in _Estimator(schema, variables).operations(document):
        if costs is not None:
            costs[operation.name.value if operation.name else None] = cost.total
        if cost.unbounded > 1:
            message = (
                "`quotas` without `poolId` reads every pool the tenant sees; "
                "ask for it once per query"
            )
            errors.append(_refusal(message, operation, "cost", unbounded=cost.unbounded))
        elif cost.total > budget:
            message = (
                f"query cost {cost.total} is over the budget of {budget}; ask for fewer "
                "items (`first`) or fewer nested lists"
            )
            reported = min(cost.total, MAX_REPORTED_COST)
            errors.append(_refusal(message, operation, "cost", cost=reported, budget=budget))
    return errors


# What strawberry's own validation (`validate_document`) adds to the rules it is given.
STRAWBERRY_RULES: tuple[type[ASTValidationRule], ...] = (
    MaybeNullValidationRule,
    OneOfInputValidationRule,
)


@lru_cache(maxsize=DOCUMENT_CACHE_SIZE)
def _validate(
    schema: GraphQLSchema,
    document: DocumentNode,
    rules: tuple[type[ASTValidationRule], ...],
    hide_suggestions: bool,
) -> list[GraphQLError]:
    """Validation depends on the document only (the parser cache hands back the same
    document for the same text), so a dashboard's repeated query is validated once.
    strawberry's ValidationCache caches the same call but runs it in its own hook, always:
    it would validate a document the limits refuse (validation is what they protect).
    `hide_suggestions` (introspection off): no "Did you mean ...?" names the schema's
    fields, arguments, types or enum values to a caller that may not introspect it."""
    return validate(
        schema, document, (*rules, *STRAWBERRY_RULES), hide_suggestions=hide_suggestions
    )


def operation_cost(context: object, cost: int) -> None:
    """Where the cost goes: the GraphQL context (the cost budget) and the request's
    report (`extensions.cost`, the access log)."""
    if hasattr(context, "cost"):
        context.cost = cost
    info = request_info()
    if info is not None:
        info.cost = cost


def query_limits(
    *,
    max_depth: int,
    max_aliases: int,
    max_tokens: int,
    max_cost: int,
    hide_suggestions: bool = False,
) -> type[SchemaExtension]:
    """An extension class (constructed per request) that checks every limit and then
    runs graphql-core's validation itself: the limits of the document and its validation
    from caches, the cost with this request's variables (the only part that depends on
    them). `hide_suggestions`: validation errors suggest no names (introspection off)."""

    class QueryLimits(SchemaExtension):
        # Set up in on_parse (listed before ParserCache), not on_operation: a hook of the
        # whole operation stays suspended as long as a subscription lives.
        def on_parse(self) -> Iterator[None]:
            self.execution_context.parse_options["max_tokens"] = max_tokens
            yield

        def on_validate(self) -> Iterator[None]:
            context = self.execution_context
            info = request_info()
            if info is not None:
                info.graphql_operation(context.operation_name)
            if context.pre_execution_errors:  # refused already (schema/operations.py)
                yield
                return
            document = context.graphql_document
            assert document is not None
            schema = graphql_core_schema(context.schema)
            variables = context.variables if isinstance(context.variables, Mapping) else {}
            costs: dict[str | None, int] = {}
            errors: Sequence[GraphQLError] = shape_errors(
                document, max_depth, max_aliases, MAX_EXPANDED_FIELDS
            ) or cost_errors(schema, document, variables, max_cost, costs)
            if costs:
                # The operation that runs (OperationChecks made sure it is named when
                # there are several).
                cost = costs.get(context.operation_name, next(iter(costs.values())))
                operation_cost(context.context, min(cost, MAX_REPORTED_COST))
            if not errors:
                rules = tuple(context.validation_rules)
                errors = _validate(schema, document, rules, hide_suggestions)
            # Set (even when empty): strawberry then skips its own, uncached validation.
            context.pre_execution_errors = list(errors)
            yield

    return QueryLimits
