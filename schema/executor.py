"""A graphql-core executor with a fast path for plain attribute fields.

graphql-core resolves every field through the same general machinery: a response path,
a resolve-info record (strawberry's has 15 entries), the resolver call and a recursive
value completion, about 10 us a field. A dashboard page of 100 pools has thousands of
fields, nearly all of them plain attributes of read models (`id`, `resource`, `max`...).

For a field that strawberry itself would resolve as a bare `getattr` (no resolver, no
field extension, no arguments) and whose type is a scalar or enum, this executor reads
the attribute and serialises it directly, with the same serialiser graphql-core would
call. Anything unusual (a null in a non-null field, an exception, an awaitable, a
serialisation error) falls back to graphql-core's path, which then reports it exactly as
it always does. Results are identical; only the bookkeeping is skipped. A resolver's
Spliced value (schema/spliced.py: `PoolEvent.pool` as its compiled statement answered it)
is completed as that JSON, which the statement built for the field's selection.

It overrides graphql-core methods outside its public API: app/compat.py checks them when
the app is assembled, and the app runs strawberry's stock executor when they changed or
`BETTERCOMPUTE_FAST_PATH` is false.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, cast

from graphql import (
    ExecutionResult,
    GraphQLField,
    GraphQLNonNull,
    GraphQLObjectType,
    OperationType,
    is_leaf_type,
)
from graphql.pyutils import Path
from strawberry.resolvers import is_default_resolver
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.field import StrawberryField

from app import metrics
from schema.shared_frames import NO_KEY, request_key, shareable
from schema.spliced import SPLICES, Spliced

# (attribute name, serialise, nullable) for a fast field; None for any other field.
_Plan = tuple[str, Callable[[Any], Any], bool] | None
# Keyed by id(): GraphQLField compares by value. The field is kept so its id stays unique.
_plans: dict[int, tuple[GraphQLField, _Plan]] = {}
_PLAIN = (str, int, float, bool)


def plan_for(field_def: GraphQLField) -> _Plan:
    """How the fast executor renders `field_def` (shared with schema/compiled_writes.py,
    whose mutation answers render their leaves alike); None when it resolves as usual."""
    known = _plans.get(id(field_def))
    if known is not None:
        return known[1]
    plan: _Plan = None
    field = (field_def.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    return_type = field_def.type
    nullable = not isinstance(return_type, GraphQLNonNull)
    leaf = return_type.of_type if isinstance(return_type, GraphQLNonNull) else return_type
    if (
        isinstance(field, StrawberryField)
        and field.is_basic_field
        and not field_def.args
        and field_def.resolve is not None
        and is_default_resolver(field_def.resolve)
        and is_leaf_type(leaf)
    ):
        plan = (field.python_name, leaf.coerce_output_value, nullable)
    _plans[id(field_def)] = (field_def, plan)
    return plan


_EXECUTED = metrics.EVENT_RENDERINGS.labels("executed")
_SHARED = metrics.EVENT_RENDERINGS.labels("shared")


class FastFieldsExecutor(StrawberryGraphQLCoreExecutionContext):
    _selection_plans: dict[int, tuple[Any, list[tuple[str, Any, _Plan]]]]
    _rendering_key: Any = None  # per subscription: its operation and variables

    def complete_value(
        self,
        return_type: Any,
        field_details_list: Any,
        info: Any,
        path: Path,
        result: Any,
        position_context: Any,
    ) -> Any:
        """A Spliced value (`PoolEvent.pool` as its compiled statement answered it) is the
        field's completed value as it is: the statement built it for this selection."""
        if type(result) is Spliced:
            return result.value
        return super().complete_value(
            return_type, field_details_list, info, path, result, position_context
        )

    def execute_operation(self, serially: bool | None = None) -> Any:
        """A subscription event whose root value carries `renderings` (a dict shared by
        every subscriber shown the same event object, see PoolEvent) is executed once
        per distinct request: the same operation node (same document, same selection
        set) with the same variables. The root value's `renderings` is shared only by
        subscribers for whom nothing else decides the answer (with `pool` selected, the
        event's dict for one view, whose read they share: schema/subscriptions.py), so
        the same request over the same shown event gives the same data; the other subscribers
        get that data, not a new execution. A result with errors is not shared."""
        renderings = getattr(self.root_value, "renderings", None)
        if renderings is None or self.operation.operation is not OperationType.SUBSCRIPTION:
            return super().execute_operation(serially)
        key = self._rendering_key
        if key is None:
            key = self._rendering_key = request_key(self.operation, self.variable_values)
        if key is NO_KEY:
            _EXECUTED.inc()
            return super().execute_operation(serially)
        known = renderings.get(key)
        # The operation node is kept with its data: no other document can reuse its id.
        if known is not None and known[0] is self.operation:
            shared = known[1]
            if isinstance(shared, asyncio.Future):  # under way (`pool` is read): await it
                return self._await_shared(shared, serially)
            _SHARED.inc()
            return ExecutionResult(data=shared, errors=None)
        _EXECUTED.inc()
        result = super().execute_operation(serially)
        if isinstance(result, ExecutionResult):
            if shareable(result):
                renderings[key] = (self.operation, result.data)
            return result
        if not self.is_awaitable(result):
            return result
        # An execution that awaits (the `pool` read): the subscribers of the same request
        # arriving meanwhile await this one rather than starting their own.
        running = asyncio.ensure_future(result)
        running.add_done_callback(_retrieved)
        renderings[key] = (self.operation, running)
        return self._await_own(running, renderings, key)

    async def _await_own(
        self, running: asyncio.Future[Any], renderings: dict[Any, Any], key: Any
    ) -> Any:
        # Shielded: this subscriber going away does not cancel the others' rendering.
        result = await asyncio.shield(running)
        if shareable(result):
            renderings[key] = (self.operation, result.data)
        elif renderings.get(key, (None, None))[1] is running:
            del renderings[key]  # not shared: the next subscriber executes its own
        return result

    async def _await_shared(self, running: asyncio.Future[Any], serially: bool | None) -> Any:
        # The wait is the server's own preparing of this subscriber's message, as the read
        # would be in its own execution (the relay's stall clock does not run meanwhile).
        subscription = getattr(self.root_value, "subscription", None)
        preparing = getattr(subscription, "preparing", None)
        try:
            with preparing() if preparing is not None else contextlib.nullcontext():
                result = await asyncio.shield(running)
        except asyncio.CancelledError:
            raise
        except Exception:
            result = None
        if shareable(result):
            _SHARED.inc()
            return ExecutionResult(data=result.data, errors=None)
        # The first one failed or has errors: this subscriber's own execution reports its own.
        _EXECUTED.inc()
        own = super().execute_operation(serially)
        return await own if self.is_awaitable(own) else own

    def build_per_event_executor(self, payload: Any) -> FastFieldsExecutor:
        """A subscription runs each event on a shallow copy of one executor, which would
        share the memos (graphql-core's `_relevant_sub_fields`, our `_selection_plans`).
        Both are keyed by objects every event makes anew, so shared they grow by an entry
        per event for as long as the subscription lives; each event gets its own. The
        request key is worked out once per subscription and kept on it (copies get it)."""
        if self._rendering_key is None:
            self._rendering_key = request_key(self.operation, self.variable_values)
        renderings = getattr(payload, "renderings", None)
        if renderings is not None and self._rendering_key is not NO_KEY:
            known = renderings.get(self._rendering_key)
            if (
                known is not None
                and known[0] is self.operation
                and not isinstance(known[1], asyncio.Future)
            ):
                # Already rendered for an earlier subscriber of the same request: no
                # executor to copy, only the data to hand over (execute_subscription_event
                # asks the per-event executor for nothing but execute_operation).
                _SHARED.inc()
                return cast("FastFieldsExecutor", _Rendered(known[1]))
        executor = cast("FastFieldsExecutor", super().build_per_event_executor(payload))
        executor._relevant_sub_fields = {}
        executor._selection_plans = {}
        return executor

    def _selection_plan(
        self, parent_type: GraphQLObjectType, grouped_field_set: Any
    ) -> list[tuple[str, Any, _Plan]]:
        """Per selection (memoised by graphql-core for every item of a list): each field's
        response name, its field nodes and its fast plan, worked out once per request."""
        try:
            plans = self._selection_plans
        except AttributeError:
            plans = self._selection_plans = {}
        known = plans.get(id(grouped_field_set))
        if known is not None:
            return known[1]
        fields = parent_type.fields
        entries = []
        for response_name, field_details_list in grouped_field_set.items():
            node = field_details_list[0].node
            field_def = fields.get(node.name.value)
            plan = plan_for(field_def) if field_def is not None and not node.arguments else None
            entries.append((response_name, field_details_list, plan))
        plans[id(grouped_field_set)] = (grouped_field_set, entries)
        return entries

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: Any,
        position_context: Any,
    ) -> Any:
        manager = self.middleware_manager
        if manager is not None and manager.middlewares:  # each field through its middleware
            return super().execute_fields(
                parent_type, source_value, path, grouped_field_set, position_context
            )
        results: dict[str, Any] = {}
        slow: dict[str, Any] = {}
        for response_name, field_details_list, plan in self._selection_plan(
            parent_type, grouped_field_set
        ):
            if plan is not None:
                attribute, serialise, nullable = plan
                try:
                    value = getattr(source_value, attribute)
                    if value is None:
                        if nullable:
                            results[response_name] = None
                            continue
                    elif type(value) in _PLAIN or not (
                        isinstance(value, Exception) or self.is_awaitable(value)
                    ):
                        serialised = serialise(value)
                        if serialised is not None:
                            results[response_name] = serialised
                            continue
                except Exception:
                    pass  # graphql-core's path below reports it
            slow[response_name] = field_details_list
            results[response_name] = None  # keeps the response's field order
        if not slow:
            return results
        # The rest go through graphql-core, in one call so awaitables are gathered as usual.
        done = super().execute_fields(parent_type, source_value, path, slow, position_context)
        if self.is_awaitable(done):
            pending: Awaitable[dict[str, Any]] = done

            async def merged() -> dict[str, Any]:
                return _merge(results, slow, await pending)

            return merged()
        return _merge(results, slow, cast("dict[str, Any]", done))


# A resolver may answer with a value already rendered (schema/spliced.py).
setattr(FastFieldsExecutor, SPLICES, True)


class _Rendered:
    """The per-event executor of a subscriber whose request was rendered already."""

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        self._data = data

    def execute_operation(self, serially: bool | None = None) -> ExecutionResult:
        return ExecutionResult(data=self._data, errors=None)


def _retrieved(done: asyncio.Future[Any]) -> None:
    """Its exception is the awaiting subscribers' to report; never "never retrieved"."""
    if not done.cancelled():
        done.exception()


def _merge(results: dict[str, Any], slow: dict[str, Any], done: dict[str, Any]) -> dict[str, Any]:
    for name in slow:
        if name in done:
            results[name] = done[name]
        else:
            del results[name]  # graphql-core left it out (an unknown field)
    return results
