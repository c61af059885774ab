"""The compiled booking path: `createReservation` / `releaseReservation` answered by the
domain's one statement (app/capacity/booking.py, booking_release.py) without running
GraphQL, as schema/compiled_reads.py answers reads.

A mutation text is planned as a read is, once it has run cleanly through the plain path
(so it parsed, validated and passed the limits): the plan is CompiledReads' (the same
cache and byte bound), its operation a mutation. Per request: the variables coerced by
graphql-core, the selection collected (fragments, aliases, @skip/@include, __typename),
the `input` argument converted by strawberry's own argument conversion and the input's
`to_seed`, then parsed by the domain (parse_input), all before anything is written. The
root must be one booking field (and __typename); its payload's fields must be plain
fields of strawberry objects (default resolvers, no arguments), rendered as
schema/executor.py's fast fields render them: `coerce_output_value` of the attribute.

Only a success is answered here. Anything else (a variable that does not coerce, an
input the domain refuses, a refusal of the statement, a caller it cannot vouch for) is
answered by the plain path after the token is looked up, so every error keeps the plain
path's exact shape and a bad token is told first. A refusal writes nothing (booking.py),
so the plain path's booking is the request's only effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphql import (
    FieldNode,
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    OperationType,
    get_named_type,
)
from graphql.execution.values import VariableValues, get_argument_values, get_variable_values
from strawberry.resolvers import is_default_resolver
from strawberry.schema import BaseSchema
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.arguments import convert_arguments
from strawberry.types.field import StrawberryField

from app.capacity.inputs import CreateReservationInput, ReleaseReservationInput, parse_input
from app.capacity.service import Capacity
from app.capacity.views import ReservationView
from app.compat import graphql_core_schema
from app.iam.principal import Principal
from schema.compiled_reads import CompiledReads, Plan, Unplanned, hashable
from schema.executor import plan_for
from schema.types.payloads import ReservationPayload
from schema.types.reservation import Reservation

# The booking fields and the domain input each one's `input` parses to.
_WRITES: dict[str, type[CreateReservationInput] | type[ReleaseReservationInput]] = {
    "createReservation": CreateReservationInput,
    "releaseReservation": ReleaseReservationInput,
}

# How a selected field renders: ("typename", key, name) | ("leaf", key, attribute,
# serialise, nullable) | ("object", key, attribute, fields, nullable, is_list).
_Render = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class WriteShape:
    """One selection of a planned mutation, for one value of its directive variables."""

    key: str  # the booking field's response key
    name: str  # createReservation or releaseReservation
    field: GraphQLField
    node: FieldNode
    strawberry_field: StrawberryField
    # The root's response keys in order: "Mutation" for a __typename, None for the booking.
    root: tuple[tuple[str, str | None], ...]
    payload: tuple[_Render, ...]


@dataclass(frozen=True, slots=True)
class Written:
    """The booking's answer: the response's `data`, and the operation's cost."""

    data: dict[str, Any]
    cost: int


class CompiledWrites:
    def __init__(self, schema: BaseSchema, reads: CompiledReads) -> None:
        self._strawberry = schema
        self._schema: GraphQLSchema = graphql_core_schema(schema)
        self._reads = reads

    @staticmethod
    def covers(plan: Plan) -> bool:
        return plan.operation.operation is OperationType.MUTATION

    async def answer(
        self,
        plan: Plan,
        variables: dict[str, Any] | None,
        capacity: Capacity,
        principal: Principal,
        token_hash: str,
    ) -> Written | None:
        """The booking's answer, or None for the plain path (module docstring)."""
        raw = dict(variables or {})
        coerced = get_variable_values(self._schema, plan.operation.variable_definitions or (), raw)
        if not isinstance(coerced, VariableValues):
            return None
        shape = self._shape(plan, coerced)
        if shape is None:
            return None
        inp = self._input(shape, coerced)
        if inp is None:
            return None
        cost = self._reads.cost(plan, raw)
        if cost is None:
            return None
        try:
            if isinstance(inp, CreateReservationInput):
                view = await capacity.book(principal, inp, token_hash)
            else:
                view = await capacity.release(principal, inp, token_hash)
        except Exception:  # a refusal or a fault: the plain path meets it and reports it
            return None
        if view is None:
            return None
        # Written: from here a failure is the request's (500), never a second booking.
        return Written(_data(shape, view), cost)

    def _input(
        self, shape: WriteShape, variables: VariableValues
    ) -> CreateReservationInput | ReleaseReservationInput | None:
        """The domain's input, as the plain path's resolver builds it; None when any step
        refuses it (the plain path then says why)."""
        converter = self._strawberry.schema_converter
        try:
            given = get_argument_values(shape.field, shape.node, variables)
            converted = convert_arguments(
                given,
                shape.strawberry_field.arguments,
                scalar_registry=converter.scalar_registry,
                config=self._strawberry.config,
            )
            seed = converted["input"].to_seed()
            inp = parse_input(_WRITES[shape.name], seed)
        except Exception:  # GraphQLError, InvalidInput...: the plain path reports it
            return None
        assert isinstance(inp, CreateReservationInput | ReleaseReservationInput)
        return inp

    def _shape(self, plan: Plan, variables: VariableValues) -> WriteShape | None:
        key = ("write", *(hashable(variables.coerced.get(n)) for n in plan.directive_variables))
        if key in plan.shapes:
            return plan.shapes[key]  # type: ignore[return-value]
        try:
            shape: WriteShape | None = self._build(plan, variables)
        except Unplanned:
            shape = None
        self._reads.keep(plan, key, shape)
        return shape

    def _build(self, plan: Plan, variables: VariableValues) -> WriteShape:
        mutation = self._schema.mutation_type
        assert mutation is not None
        selected = self._reads.collect(plan, [plan.operation.selection_set], variables)
        root: list[tuple[str, str | None]] = []
        write: tuple[str, list[FieldNode]] | None = None
        for key, nodes in selected.items():
            name = nodes[0].name.value
            if name == "__typename":
                root.append((key, mutation.name))
            elif name in _WRITES and write is None:
                write = (key, nodes)
                root.append((key, None))
            else:
                raise Unplanned(name)
        if write is None:
            raise Unplanned("no booking")
        key, nodes = write
        name = nodes[0].name.value
        if len(nodes) > 1:
            raise Unplanned("the booking field selected twice")  # merged arguments
        field_def = mutation.fields[name]
        strawberry_field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
        if not isinstance(strawberry_field, StrawberryField):
            raise Unplanned(name)
        payload = get_named_type(field_def.type)
        assert isinstance(payload, GraphQLObjectType)
        fields = self._fields(plan, payload, nodes, variables)
        return WriteShape(key, name, field_def, nodes[0], strawberry_field, tuple(root), fields)

    def _fields(
        self,
        plan: Plan,
        parent: GraphQLObjectType,
        nodes: list[FieldNode],
        variables: VariableValues,
    ) -> tuple[_Render, ...]:
        below = [n.selection_set for n in nodes if n.selection_set]
        selected = self._reads.collect(plan, below, variables)
        found: list[_Render] = []
        for key, inner in selected.items():
            name = inner[0].name.value
            if name == "__typename":
                found.append(("typename", key, parent.name))
                continue
            field_def = parent.fields.get(name)
            if field_def is None or any(n.arguments for n in inner):
                raise Unplanned(name)
            leaf = plan_for(field_def)
            if leaf is not None:
                attribute, serialise, nullable = leaf
                found.append(("leaf", key, attribute, serialise, nullable))
                continue
            found.append(self._object(plan, key, field_def, inner, variables))
        return tuple(found)

    def _object(
        self,
        plan: Plan,
        key: str,
        field_def: GraphQLField,
        nodes: list[FieldNode],
        variables: VariableValues,
    ) -> _Render:
        """A plain field holding an object or a list of objects (non-null items)."""
        field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
        if not (
            isinstance(field, StrawberryField)
            and field.is_basic_field
            and field_def.resolve is not None
            and is_default_resolver(field_def.resolve)
        ):
            raise Unplanned(key)
        kind = field_def.type
        nullable = not isinstance(kind, GraphQLNonNull)
        kind = kind.of_type if isinstance(kind, GraphQLNonNull) else kind
        is_list = isinstance(kind, GraphQLList)
        if is_list:
            assert isinstance(kind, GraphQLList)
            item = kind.of_type
            if not isinstance(item, GraphQLNonNull):
                raise Unplanned(key)
            kind = item.of_type
        if not isinstance(kind, GraphQLObjectType):
            raise Unplanned(key)
        fields = self._fields(plan, kind, nodes, variables)
        return ("object", key, field.python_name, fields, nullable, is_list)


def _data(shape: WriteShape, view: ReservationView) -> dict[str, Any]:
    payload = ReservationPayload(reservation=Reservation.from_view(view))
    return {
        key: name if name is not None else _render(payload, shape.payload)
        for key, name in shape.root
    }


def _render(source: Any, fields: tuple[_Render, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in fields:
        kind, key = entry[0], entry[1]
        if kind == "typename":
            out[key] = entry[2]
        elif kind == "leaf":
            _, _, attribute, serialise, nullable = entry
            value = getattr(source, attribute)
            if value is None:
                if not nullable:
                    raise AssertionError(f"{key} is null")
                out[key] = None
            else:
                out[key] = serialise(value)
        else:
            _, _, attribute, inner, nullable, is_list = entry
            value = getattr(source, attribute)
            if value is None:
                if not nullable:
                    raise AssertionError(f"{key} is null")
                out[key] = None
            elif is_list:
                out[key] = [_render(item, inner) for item in value]
            else:
                out[key] = _render(value, inner)
    return out
