"""The compiled read path: a GraphQL read whose answer one statement can build.

A query text is planned once, after it has run cleanly through the plain path (so it
parsed, validated and passed the limits, none of which depends on variables): its
selection (fragments expanded, fields merged by response key, @skip/@include decided,
aliases kept) becomes a shape (app/capacity/shapes.py) the domain compiles into one SQL
statement. Per request only what must be done is: coerce the variables, decide the
directives that depend on them, read the arguments, compute the cost (it depends on
`first`), and ask the domain. Anything the plan does not cover (another root field,
`offers`, `policy`, a quota's `grant`...) is simply not planned, and runs on the plain
path; so is every answer with an error, which the domain declines to give.

Only public graphql-core functions are used: parse, get_operation_ast, type_from_ast,
value_from_ast, get_variable_values, get_argument_values. Variables of plain scalar types
sent with their exact JSON type are taken as they are (graphql-core would coerce them to
themselves); anything else goes through get_variable_values.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLEnumType,
    GraphQLField,
    GraphQLIncludeDirective,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLSchema,
    GraphQLSkipDirective,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    VariableNode,
    get_named_type,
    get_operation_ast,
    parse,
    type_from_ast,
    value_from_ast,
)
from graphql.execution.values import VariableValues, get_argument_values, get_variable_values
from graphql.pyutils import Undefined

from app.capacity.fields import (
    PAGE_INFO,
    ROW_TABLES,
    Relation,
    graphql_relations,
    graphql_values,
)
from app.capacity.json_reads import CompiledRead
from app.capacity.service import PAGED, Capacity
from app.capacity.shapes import (
    AccessShape,
    CapacityShape,
    Constant,
    Field,
    LendingShape,
    Nested,
    Paged,
    PageShape,
    PoolShape,
    QuotasShape,
    Read,
    Rows,
    Shape,
)
from app.metrics import COMPILED_PLAN_BYTES as PLAN_BYTES
from app.metrics import COMPILED_PLANS as PLANS
from schema.limits import cost_errors

# GraphQL field name -> the domain's value, per kind of object the plan covers, and
# GraphQL list (or a quota's grant) -> the kind of its rows: both read from the table of
# fields (app/capacity/fields.py), the one list of what compiles.
_VALUES: dict[str, dict[str, str]] = {kind: graphql_values(kind) for kind in ROW_TABLES}
_RELATIONS: dict[str, dict[str, Relation]] = {kind: graphql_relations(kind) for kind in ROW_TABLES}
_PAGE_INFO = {e.graphql: e.name for e in PAGE_INFO.entries if e.graphql is not None}
# The root fields the plan covers: a page of pools, one pool, lists of rows (the
# tenant's quota rows, a pool's rollup, the owner's ranked capacity rows), and why the
# caller holds a permission on a pool (`access`).
_ROOTS = {
    "pools": PageShape,
    "pool": PoolShape,
    "quotas": QuotasShape,
    "capacity": CapacityShape,
    "lending": LendingShape,
    "access": AccessShape,
}
_PLANNED = (OperationType.QUERY, OperationType.MUTATION)
# A plan keeps a shape per combination of the variables its directives read.
_MAX_SHAPES_PER_PLAN = 16
# The plans are bounded by the bytes they hold (BETTERCOMPUTE_COMPILED_PLAN_CACHE_BYTES):
# a plan of a 3 KB query text holds its document, shapes and statements, some 100 KB,
# so a count alone bounds nothing. A text longer than any dashboard's (a large comment,
# say) is never planned.
DEFAULT_PLAN_CACHE_BYTES = 16 * 1024 * 1024
MAX_PLANNED_QUERY_CHARS = 64 * 1024


# A connection's node planned from its selection (a pool's fields, a reservation's).
_NodePlanner = Callable[
    ["Plan", GraphQLObjectType, dict[str, list[FieldNode]], VariableValues], tuple["Field", ...]
]


class Unplanned(Exception):
    """The selection asks for something the compiled path does not build."""


# How the root field's argument gets its value: a variable (with the argument's default
# when the variable is absent) or a literal, decided once per plan.
_Argument = tuple[str, str | None, Any]  # (name, variable or None, default or literal)


@dataclass(frozen=True, slots=True)
class Built:
    read: CompiledRead  # the domain's statement for the shape
    arguments: tuple[_Argument, ...]

    def args(self, variables: dict[str, Any]) -> dict[str, Any]:
        """graphql-core's get_argument_values over variables that coerced."""
        found: dict[str, Any] = {}
        for name, variable, value in self.arguments:
            if variable is None:
                found[name] = value
            elif variable in variables:
                found[name] = variables[variable]
            elif value is not Undefined:
                found[name] = value
        return found


def _arguments(field_def: GraphQLField, node: FieldNode) -> tuple[_Argument, ...]:
    given = {a.name.value: a.value for a in node.arguments or ()}
    found: list[_Argument] = []
    for name, argument in field_def.args.items():
        value = given.get(name)
        if isinstance(value, VariableNode):
            found.append((name, value.name.value, argument.default_value))
        elif value is not None:
            found.append((name, None, value_from_ast(value, argument.type)))
        elif argument.default_value is not Undefined:
            found.append((name, None, argument.default_value))
    return tuple(found)


# A variable the fast coercion handles: (name, scalar, non-null, default or Undefined).
_Variable = tuple[str, str, bool, Any]
_EXACT = {"String": (str,), "ID": (str,), "Int": (int,), "Boolean": (bool,)}
_INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one request asks the domain: the compiled read, its arguments, its cost."""

    read: CompiledRead
    args: dict[str, Any]
    cost: int


class _Recording(dict[str, Any]):
    """Variables that remember which of them were read (by the cost estimate)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.read: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self.read:
            self.read.append(key)
        return super().get(key, default)


@dataclass(eq=False)
class Plan:
    key: tuple[str, str | None]  # (query, operationName): its place in the cache
    document: DocumentNode
    operation: OperationDefinitionNode
    fragments: dict[str, FragmentDefinitionNode]
    directive_variables: tuple[str, ...]
    # Every variable is a plain scalar: values of the exact JSON type coerce to
    # themselves, with no call into graphql-core (None: always call it).
    variables: tuple[_Variable, ...] | None
    shapes: dict[tuple[Any, ...], Built | None] = field(default_factory=dict)
    # The cost depends on the variables it reads (`first`...), found on first estimate.
    cost_variables: tuple[str, ...] | None = None
    costs: dict[tuple[Any, ...], int | None] = field(default_factory=dict)


def _directive_variables(document: DocumentNode) -> tuple[str, ...]:
    """Variables any @skip/@include of the document reads."""
    found: list[str] = []

    def walk(selection_set: SelectionSetNode | None) -> None:
        for node in selection_set.selections if selection_set else ():
            for directive in node.directives or ():
                for argument in directive.arguments or ():
                    if isinstance(argument.value, VariableNode):
                        name = argument.value.name.value
                        if name not in found:
                            found.append(name)
            walk(getattr(node, "selection_set", None))

    for definition in document.definitions:
        walk(getattr(definition, "selection_set", None))
    return tuple(found)


class CompiledReads:
    def __init__(
        self, schema: GraphQLSchema, max_cost: int, max_bytes: int = DEFAULT_PLAN_CACHE_BYTES
    ) -> None:
        self._schema = schema
        self._max_cost = max_cost
        self.max_bytes = max_bytes
        self._plans: OrderedDict[tuple[str, str | None], Plan | None] = OrderedDict()
        self._sizes: dict[tuple[str, str | None], int] = {}
        # The nested pages' arguments found while a shape is built (`_reservations`):
        # planning is synchronous, one shape at a time.
        self._paged: list[_Argument] = []
        self.bytes = 0  # what the plans hold, as `held` measures it: never over max_bytes

    def __len__(self) -> int:
        return len(self._plans)

    def plan(self, query: str, operation_name: str | None) -> Plan | None:
        key = (query, operation_name)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def known(self, query: str, operation_name: str | None) -> bool:
        return (query, operation_name) in self._plans

    def learn(
        self,
        query: str,
        operation_name: str | None,
        kinds: tuple[OperationType, ...] = _PLANNED,
    ) -> None:
        """Plan a query text that has just run cleanly on the plain path (so it parses,
        validates and passes the limits); a query that is no read of the plan's kind is
        remembered as such, so it is not parsed again. `kinds`: the operations planned
        (a subscription's, for its events' `pool`: `event_pool`)."""
        key = (query, operation_name)
        if key in self._plans or len(query) > MAX_PLANNED_QUERY_CHARS:
            return
        plan = self._make_plan(query, operation_name, kinds)
        self._plans[key] = plan
        self._sizes[key] = 0
        PLANS.inc()
        self._grew(key, held((key, plan)))  # the text once: the plan keeps its key

    def _grew(self, key: tuple[str, str | None], size: int) -> None:
        """Count `size` more bytes for the plan under `key`, then drop the least recently
        used plans until the plans fit (this one too, when it alone does not)."""
        self._sizes[key] += size
        self.bytes += size
        PLAN_BYTES.inc(size)
        while self.bytes > self.max_bytes and self._plans:
            oldest, _ = self._plans.popitem(last=False)
            freed = self._sizes.pop(oldest)
            self.bytes -= freed
            PLAN_BYTES.dec(freed)
            PLANS.dec()

    def _kept(self, plan: Plan, size: int) -> None:
        """A plan kept a shape or a cost: count it, if the plan is still cached."""
        if self._plans.get(plan.key) is plan:
            self._grew(plan.key, size)

    def _make_plan(
        self, query: str, operation_name: str | None, kinds: tuple[OperationType, ...]
    ) -> Plan | None:
        document = parse(query, no_location=True)
        operation = get_operation_ast(document, operation_name)
        if operation is None or operation.operation not in kinds:
            return None  # a mutation's plan serves bookings (schema/compiled_writes.py)
        if any(
            getattr(d, "variable_definitions", None)
            for d in document.definitions
            if isinstance(d, FragmentDefinitionNode)
        ):
            return None  # fragment variables (experimental syntax)
        fragments = {
            d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)
        }
        return Plan(
            (query, operation_name),
            document,
            operation,
            fragments,
            _directive_variables(document),
            self._plain_variables(operation),
        )

    def _plain_variables(self, operation: OperationDefinitionNode) -> tuple[_Variable, ...] | None:
        found: list[_Variable] = []
        for definition in operation.variable_definitions or ():
            kind = type_from_ast(self._schema, definition.type)
            non_null = isinstance(kind, GraphQLNonNull)
            named = kind.of_type if isinstance(kind, GraphQLNonNull) else kind
            if not isinstance(named, GraphQLScalarType) or named.name not in _EXACT:
                return None
            default = (
                Undefined
                if definition.default_value is None
                else value_from_ast(definition.default_value, named)
            )
            found.append((definition.variable.name.value, named.name, non_null, default))
        return tuple(found)

    @staticmethod
    def _coerced(plan: Plan, raw: dict[str, Any]) -> dict[str, Any] | None:
        """The variables as graphql-core coerces them, when each is of its exact type,
        null where it may be, or absent; None when graphql-core must decide."""
        if plan.variables is None:
            return None
        found: dict[str, Any] = {}
        for name, scalar, non_null, default in plan.variables:
            if name in raw:
                value = raw[name]
                if value is None:
                    if non_null:
                        return None
                elif type(value) not in _EXACT[scalar] or (scalar == "Int" and value not in _INT32):
                    return None
                found[name] = value
            elif default is not Undefined:
                found[name] = default
            elif non_null:
                return None
        return found

    def prepare(
        self, plan: Plan, variables: Mapping[str, Any] | None, capacity: Capacity
    ) -> Prepared | None:
        """The request's compiled read, arguments and cost, or None for the plain path
        (variables that do not coerce, a selection the plan does not cover, a cost over
        budget)."""
        if plan.operation.operation is not OperationType.QUERY:
            return None
        raw = dict(variables or {})
        coerced = self._coerced(plan, raw)
        full: VariableValues | None = None
        if coerced is None:
            result = get_variable_values(
                self._schema, plan.operation.variable_definitions or (), raw
            )
            if not isinstance(result, VariableValues):
                return None
            full, coerced = result, result.coerced
        key = tuple(hashable(coerced.get(n)) for n in plan.directive_variables)
        if key in plan.shapes:
            built = plan.shapes[key]
        else:
            if full is None:
                result = get_variable_values(
                    self._schema, plan.operation.variable_definitions or (), raw
                )
                assert isinstance(result, VariableValues)  # as the fast coercion found
                full = result
            built = self._build(plan, full, capacity)
            if len(plan.shapes) < _MAX_SHAPES_PER_PLAN:
                plan.shapes[key] = built
                self._kept(plan, held(key) + held(built))
        if built is None:
            return None
        cost = self._cost(plan, raw)
        if cost is None:
            return None
        return Prepared(built.read, built.args(coerced), cost)

    # --- a subscription event's `pool` (schema/subscriptions.py) ------------------------

    def variables(
        self, operation: OperationDefinitionNode, coerced: Mapping[str, Any] | VariableValues
    ) -> VariableValues | None:
        """graphql-core's variables of a running operation from the coerced values its
        resolvers are given (strawberry gives them as a dict; plain scalars coerce to
        themselves), for `event_pool`; None when they do not coerce again (an enum, say):
        the plain path answers."""
        if isinstance(coerced, VariableValues):
            return coerced
        found = get_variable_values(
            self._schema, operation.variable_definitions or (), dict(coerced)
        )
        if not isinstance(found, VariableValues) or found.coerced != dict(coerced):
            return None
        return found

    def event_pool(
        self,
        query: str,
        operation_name: str | None,
        key: str,
        nodes: list[FieldNode],
        variables: VariableValues,
        capacity: Capacity,
    ) -> tuple[CompiledRead, dict[str, Any]] | None:
        """`PoolEvent.pool` under response `key` (its field `nodes`, in a subscription the
        schema has validated, with its coerced `variables`) as Query.pool's statement for
        the same selection, planned as `pool` is (`_pool`), with the arguments of its
        pages of reservations; None where the plain path answers `Query.pool` too (a
        selection the plan does not cover). Planned once per query text and directive
        variables, on the query plans' cache and bound."""
        plan = self.plan(query, operation_name)
        if plan is None and not self.known(query, operation_name):
            self.learn(query, operation_name, (OperationType.SUBSCRIPTION,))
            plan = self.plan(query, operation_name)
        if plan is None or plan.operation.operation is not OperationType.SUBSCRIPTION:
            return None
        coerced = variables.coerced
        shape_key = (
            "PoolEvent.pool",
            key,
            *(hashable(coerced.get(n)) for n in plan.directive_variables),
        )
        if shape_key in plan.shapes:
            built = plan.shapes[shape_key]
        else:
            built = self._build_event_pool(plan, key, nodes, variables, capacity)
            self.keep(plan, shape_key, built)
        return None if built is None else (built.read, built.args(coerced))

    def _build_event_pool(
        self,
        plan: Plan,
        key: str,
        nodes: list[FieldNode],
        variables: VariableValues,
        capacity: Capacity,
    ) -> Built | None:
        self._paged = []
        parent = get_named_type(self._schema.query_type.fields["pool"].type)  # type: ignore[union-attr]
        assert isinstance(parent, GraphQLObjectType)
        try:
            below = self._collect(
                plan, [n.selection_set for n in nodes if n.selection_set], variables
            )
            shape = PoolShape(key, self._pool(plan, parent, below, variables))
        except Unplanned:
            return None
        read = capacity.compile_read(shape)
        return None if read is None else Built(read, tuple(self._paged))

    # --- for schema/compiled_writes.py, whose plans these are too ----------------------

    def cost(self, plan: Plan, raw: dict[str, Any]) -> int | None:
        return self._cost(plan, raw)

    def collect(
        self, plan: Plan, selection_sets: Sequence[SelectionSetNode], variables: VariableValues
    ) -> dict[str, list[FieldNode]]:
        return self._collect(plan, selection_sets, variables)

    def keep(self, plan: Plan, key: tuple[Any, ...], shape: object) -> None:
        """Keep `shape` on the plan under `key`, counted in the cache's bytes, while the
        plan holds fewer than its most shapes."""
        if len(plan.shapes) < _MAX_SHAPES_PER_PLAN:
            plan.shapes[key] = shape  # type: ignore[assignment]
            self._kept(plan, held(key) + held(shape))

    def _cost(self, plan: Plan, raw: dict[str, Any]) -> int | None:
        """schema/limits.py's estimate (None: over the budget), kept per value of the
        variables it reads."""
        if plan.cost_variables is not None:
            key = tuple(hashable(raw.get(n)) for n in plan.cost_variables)
            if key in plan.costs:
                return plan.costs[key]
        recording = _Recording(raw)
        costs: dict[str | None, int] = {}
        refused = cost_errors(self._schema, plan.document, recording, self._max_cost, costs)
        name = plan.operation.name.value if plan.operation.name else None
        cost = None if refused else costs.get(name, next(iter(costs.values()), 0))
        if plan.cost_variables is None:
            plan.cost_variables = tuple(recording.read)
        if len(plan.costs) < _MAX_SHAPES_PER_PLAN:
            key = tuple(hashable(raw.get(n)) for n in plan.cost_variables)
            plan.costs[key] = cost
            self._kept(plan, held(key) + held(cost))
        return cost

    # --- planning ----------------------------------------------------------------------

    def _build(self, plan: Plan, variables: VariableValues, capacity: Capacity) -> Built | None:
        self._paged = []
        try:
            shape, root, field_def, node = self._shape(plan, variables)
        except Unplanned:
            return None
        read = capacity.compile_read(shape, root)
        arguments = (*_arguments(field_def, node), *self._paged)
        return None if read is None else Built(read, arguments)

    def _shape(
        self, plan: Plan, variables: VariableValues
    ) -> tuple[Shape, tuple[Constant, ...], GraphQLField, FieldNode]:
        query_type = self._schema.query_type
        assert query_type is not None
        selected = self._collect(plan, [plan.operation.selection_set], variables)
        root: list[Constant] = []
        data: tuple[str, str, list[FieldNode]] | None = None
        for key, nodes in selected.items():
            name = nodes[0].name.value
            if name == "__typename":
                root.append(Constant(key, query_type.name))
            elif name in _ROOTS and data is None:
                data = (key, name, nodes)
            else:
                raise Unplanned(name)
        if data is None:
            raise Unplanned("no read")
        key, name, nodes = data
        field_def = query_type.fields[name]
        parent = get_named_type(field_def.type)
        assert isinstance(parent, GraphQLObjectType)
        below = self._collect(plan, [n.selection_set for n in nodes if n.selection_set], variables)
        if name == "pools" and any(
            a.name.value == "labelSelector" for a in nodes[0].arguments or ()
        ):
            # The compiled page does not select by labels yet: the plain path does.
            raise Unplanned("labelSelector")
        if name == "pools":
            shape: Shape = PageShape(key, self._page(plan, parent, below, variables, self._pool))
        elif name == "quotas":
            shape = QuotasShape(key, self._object(plan, "quotas", parent, below, variables))
        elif name == "capacity":
            shape = CapacityShape(key, self._object(plan, "capacity", parent, below, variables))
        elif name == "lending":
            shape = LendingShape(key, self._object(plan, "lending", parent, below, variables))
        elif name == "access":
            shape = AccessShape(key, self._object(plan, "access", parent, below, variables))
        else:
            shape = PoolShape(key, self._pool(plan, parent, below, variables))
        return shape, tuple(root), field_def, nodes[0]

    def _collect(
        self,
        plan: Plan,
        selection_sets: Sequence[SelectionSetNode],
        variables: VariableValues,
    ) -> dict[str, list[FieldNode]]:
        """Fields by response key, in first-seen order (graphql-core's CollectFields)."""
        found: dict[str, list[FieldNode]] = {}
        seen_fragments: set[str] = set()

        def walk(selection_set: SelectionSetNode) -> None:
            for node in selection_set.selections:
                if not _included(node, variables):
                    continue
                if isinstance(node, FieldNode):
                    key = node.alias.value if node.alias else node.name.value
                    found.setdefault(key, []).append(node)
                elif isinstance(node, InlineFragmentNode):
                    walk(node.selection_set)
                elif isinstance(node, FragmentSpreadNode):
                    name = node.name.value
                    if name not in seen_fragments:
                        seen_fragments.add(name)
                        walk(plan.fragments[name].selection_set)

        for selection_set in selection_sets:
            walk(selection_set)
        return found

    def _below(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        nodes: list[FieldNode],
        variables: VariableValues,
    ) -> tuple[GraphQLObjectType, dict[str, list[FieldNode]]]:
        """The object type a field of `parent` returns, and what is selected of it."""
        if any(n.arguments for n in nodes):
            raise Unplanned("arguments below the root")
        inner = get_named_type(parent.fields[nodes[0].name.value].type)
        assert isinstance(inner, GraphQLObjectType)
        below = [n.selection_set for n in nodes if n.selection_set]
        return inner, self._collect(plan, below, variables)

    def _page(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        selected: dict[str, list[FieldNode]],
        variables: VariableValues,
        node: _NodePlanner,
    ) -> tuple[Field, ...]:
        """A connection (a page of pools, a pool's page of reservations): its `nodes` and
        `edges` planned by `node`, its `pageInfo`."""
        fields: list[Field] = []
        for key, nodes in selected.items():
            name = nodes[0].name.value
            if name == "__typename":
                fields.append(Constant(key, parent.name))
                continue
            if name not in ("nodes", "edges", "pageInfo"):
                raise Unplanned(name)
            inner, below = self._below(plan, parent, nodes, variables)
            if name == "nodes":
                fields.append(Nested(key, "nodes", node(plan, inner, below, variables)))
            elif name == "edges":
                fields.append(Nested(key, "edges", self._edge(plan, inner, below, variables, node)))
            else:
                fields.append(Nested(key, "page_info", _values(inner, below, _PAGE_INFO)))
        return tuple(fields)

    def _edge(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        selected: dict[str, list[FieldNode]],
        variables: VariableValues,
        node: _NodePlanner,
    ) -> tuple[Field, ...]:
        fields: list[Field] = []
        for key, nodes in selected.items():
            name = nodes[0].name.value
            if name == "__typename":
                fields.append(Constant(key, parent.name))
            elif name == "cursor":
                fields.append(Read(key, "cursor"))
            elif name == "node":
                inner, below = self._below(plan, parent, nodes, variables)
                fields.append(Nested(key, "node", node(plan, inner, below, variables)))
            else:
                raise Unplanned(name)
        return tuple(fields)

    def _pool(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        selected: dict[str, list[FieldNode]],
        variables: VariableValues,
    ) -> tuple[Field, ...]:
        return self._object(plan, "pool", parent, selected, variables)

    def _object(
        self,
        plan: Plan,
        kind: str,
        parent: GraphQLObjectType,
        selected: dict[str, list[FieldNode]],
        variables: VariableValues,
    ) -> tuple[Field, ...]:
        """The fields of an object of `kind`: values, lists of rows, a quota's grant."""
        fields: list[Field] = []
        for key, nodes in selected.items():
            name = nodes[0].name.value
            relation = _RELATIONS[kind].get(name)
            if relation is None or relation.rows is None:
                fields.extend(_values(parent, {key: nodes}, _VALUES[kind]))
                continue
            if relation.rows == "reservations":
                fields.append(self._reservations(plan, key, parent, nodes, variables))
                continue
            inner, below = self._below(plan, parent, nodes, variables)
            if relation.rows == "grant":
                fields.append(Nested(key, "grant", _values(inner, below, _VALUES["grant"])))
            elif relation.rows == "binding" or relation.rows == "denial":  # access's objects
                inside = self._object(plan, relation.rows, inner, below, variables)
                fields.append(Nested(key, relation.rows, inside))
            else:
                inside = self._object(plan, relation.rows, inner, below, variables)
                fields.append(Rows(key, relation.rows, inside))
        return tuple(fields)

    def _reservations(
        self,
        plan: Plan,
        key: str,
        parent: GraphQLObjectType,
        nodes: list[FieldNode],
        variables: VariableValues,
    ) -> Paged:
        """A pool's `reservations` connection, its `first` and `after` (literals or
        variables, as the root's) bound per request as `#<param>:first`/`:after`."""
        field_def = parent.fields[nodes[0].name.value]
        given = [tuple((a.name.value, a.value) for a in n.arguments or ()) for n in nodes]
        if any(g != given[0] for g in given):
            raise Unplanned("one response key, several arguments")  # validation refuses it
        param = f"rsv{len(self._paged) // 2}"
        found = {
            name: (variable, value) for name, variable, value in _arguments(field_def, nodes[0])
        }
        for name in ("first", "after"):
            variable, value = found.get(name, (None, None))
            self._paged.append((f"{PAGED}{param}:{name}", variable, value))
        inner = get_named_type(field_def.type)
        assert isinstance(inner, GraphQLObjectType)
        below = self._collect(plan, [n.selection_set for n in nodes if n.selection_set], variables)
        fields = self._page(plan, inner, below, variables, self._reservation)
        return Paged(key, "reservations", fields, param)

    def _reservation(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        selected: dict[str, list[FieldNode]],
        variables: VariableValues,
    ) -> tuple[Field, ...]:
        """A reservation's values; its `resources` a list of ResourceAmount."""
        fields: list[Field] = []
        for key, nodes in selected.items():
            if nodes[0].name.value != "resources":
                fields.extend(_values(parent, {key: nodes}, _VALUES["reservations"]))
                continue
            inner, below = self._below(plan, parent, nodes, variables)
            fields.append(Nested(key, "amounts", _values(inner, below, _AMOUNT)))
        return tuple(fields)


# A ResourceAmount's fields: an entry of the stored {resource: amount} (json_reads._amounts).
_AMOUNT = {"resource": "resource", "amount": "amount"}


def _values(
    parent: GraphQLObjectType, selected: dict[str, list[FieldNode]], names: dict[str, str]
) -> tuple[Field, ...]:
    """Leaf fields: `__typename`, or a value the domain reads (enums mapped by name)."""
    fields: list[Field] = []
    for key, nodes in selected.items():
        name = nodes[0].name.value
        if name == "__typename":
            fields.append(Constant(key, parent.name))
            continue
        value = names.get(name)
        if value is None or nodes[0].arguments:
            raise Unplanned(name)
        leaf = get_named_type(parent.fields[name].type)
        mapping = None
        if isinstance(leaf, GraphQLEnumType):
            mapping = tuple((str(v.value), n) for n, v in leaf.values.items())
        fields.append(Read(key, value, mapping))
    return tuple(fields)


def _included(
    node: FieldNode | InlineFragmentNode | FragmentSpreadNode | Any, variables: VariableValues
) -> bool:
    """@skip and @include, as graphql-core decides them."""
    for directive in node.directives or ():
        name = directive.name.value
        if name == GraphQLSkipDirective.name:
            decided = get_argument_values(GraphQLSkipDirective, directive, variables)
            if decided.get("if") is True:
                return False
        elif name == GraphQLIncludeDirective.name:
            decided = get_argument_values(GraphQLIncludeDirective, directive, variables)
            if decided.get("if") is False:
                return False
        else:
            raise Unplanned(f"@{name}")
    return True


def held(value: object) -> int:
    """The bytes `value` holds: sys.getsizeof of it and of every object it reaches
    (containers, slots and attributes: a document's nodes, a shape, a statement's
    text), each counted once; classes, functions and shared singletons are not its own."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, bool | type | ModuleType | FunctionType):
            continue
        if id(item) in seen or item is Undefined:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, str | bytes | int | float):
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        else:
            for cls in type(item).__mro__:
                for name in cls.__dict__.get("__slots__", ()):
                    found = getattr(item, name, None)
                    if found is not None:
                        stack.append(found)
            attributes = getattr(item, "__dict__", None)
            if attributes is not None:
                stack.append(attributes)
    return total


def hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | None) else repr(value)
