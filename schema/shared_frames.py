"""Sending a subscriber the frame of an event that an identical request already rendered.

The fast executor renders a subscription event once per distinct request and shown
event (schema/executor.py); every other subscriber with that request gets the same data.
Yet each of them still went through strawberry's whole per-result pipeline to send it: a
graphql-core per-event step, the schema extensions' per-result hooks (seven extension
objects entered and asked for results, about 11 us), the protocol message built and
encoded. With 1,000 subscribers of one view that was most of the cost of an event.

Here the subscription resolver (schema/subscriptions.py) hands such an event straight to
the subscriber's socket: the payload `{"data": ...}` encoded once per request and shown
event, written inside the protocol's own frame with the operation's id. Only for a
result that strawberry would send as exactly that: no errors (a shared rendering never
has any) and no extension results (none of the schema's extensions adds any unless
tracing is on, and then this path is off). The first subscriber of each request, and any
event not rendered yet (one whose `pool` read is still under way), take strawberry's
pipeline as before; so does everything when the fast executor or our websocket handlers
are not in use. Order is kept: the resolver is the stream's one producer, and it sends
before it takes the next event, as strawberry would have.

At start-up the server checks (strawberry_frame_problem) that strawberry's two protocols
still send a plain result as the frames built here; if not, nothing goes this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, Final, Protocol

import orjson
from graphql import ExecutionResult
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import Operation
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types import ExecutionResult as StrawberryResult

from app import metrics


class TextSocket(Protocol):
    """What the writer needs of the connection (schema/websockets.py's TextFrames)."""

    async def send_text_frame(self, text: str) -> None: ...

    def encode_payload(self, payload: Mapping[str, object]) -> str: ...


# The frame of each protocol around an operation's result payload (graphql-transport-ws
# `next`; legacy graphql-ws `data`), in strawberry's key order.
HEADS: Final[Mapping[str, Callable[[str], str]]] = {
    GRAPHQL_TRANSPORT_WS_PROTOCOL: lambda id_: f'{{"id":{id_},"type":"next","payload":',
    GRAPHQL_WS_PROTOCOL: lambda id_: f'{{"type":"data","id":{id_},"payload":',
}

_FRAMED = metrics.EVENT_RENDERINGS.labels("frame")


class FrameWriter:
    """One subscription operation's socket and frame head."""

    __slots__ = ("_head", "_socket")

    def __init__(self, socket: TextSocket, protocol: str, operation_id: str) -> None:
        self._socket = socket
        self._head = HEADS[protocol](orjson.dumps(operation_id).decode())

    def frame(self, payload: str) -> str:
        return f"{self._head}{payload}}}"

    async def payload(
        self,
        renderings: dict[Any, Any],
        key: Any,
        operation: object,
        preparing: Callable[[], AbstractContextManager[object]],
    ) -> str | None:
        """The encoded payload of the data rendered for `key` (the request) in
        `renderings` (the shown event's), awaiting a rendering under way (its `pool`
        read) within `preparing` (the server's own time, not the client's); None when
        there is none to share. Encoded once for every subscriber of the request."""
        rendered = renderings.get(key)
        if rendered is None or rendered[0] is not operation:
            return None
        data = rendered[1]
        if isinstance(data, asyncio.Future):
            try:
                with preparing():
                    result = await asyncio.shield(data)  # not cancelled for the others
            except asyncio.CancelledError:
                raise
            except Exception:
                return None  # strawberry's path executes its own and reports it
            if not shareable(result):
                return None
            data = result.data
        encoded = renderings.get((ENCODED, key))
        if encoded is None or encoded[0] is not operation:
            encoded = renderings[(ENCODED, key)] = (
                operation,
                self._socket.encode_payload({"data": data}),
            )
        payload: str = encoded[1]
        return payload

    async def send(self, payload: str) -> None:
        await self._socket.send_text_frame(self.frame(payload))
        _FRAMED.inc()


NO_KEY: Final[Any] = object()


def shareable(result: object) -> bool:
    """A rendering other subscribers may be given: an execution that reported no error."""
    return isinstance(result, ExecutionResult) and not result.errors


def request_key(operation: object, variable_values: Any) -> Any:
    """A subscription request's key in an event's renderings (the fast executor's and
    ours): (the operation node's id, its variables as canonical JSON), or NO_KEY. The
    node itself is kept beside what is stored under it, so no other can reuse the id."""
    coerced = getattr(variable_values, "coerced", variable_values)
    try:
        # As str: orjson's bytes keep their whole output buffer (about 1.4 KB), and
        # every idle subscription holds its key.
        return (id(operation), orjson.dumps(coerced, option=orjson.OPT_SORT_KEYS).decode())
    except TypeError:
        return NO_KEY


ENCODED: Final = "encoded"  # the renderings key's tag for an encoded payload

# Set by our websocket handlers for the task each subscription operation runs in (an
# asyncio task starts with a copy of the context it was made in); None elsewhere.
current_writer: ContextVar[FrameWriter | None] = ContextVar("frame_writer", default=None)


def strawberry_frame_problem() -> str | None:
    """Strawberry's two protocols send a result without errors or extensions as the frames
    written here (same keys, same order); None when they do, else what differs. Run
    once by the server (app/server.py, through app.compat.usable)."""

    class Recorder:
        """A handler, as far as strawberry's send paths use it."""

        def __init__(self) -> None:
            self.sent: list[str] = []

        async def send_message(self, message: object) -> None:
            self.sent.append(orjson.dumps(message).decode())

        def forget_id(self, _id: str) -> None: ...

    class Socket:
        """A socket, as far as the writer uses it to build a frame."""

        def encode_payload(self, payload: object) -> str:
            return orjson.dumps(payload).decode()

    result = StrawberryResult(data={"poolEvents": {"cursor": "c", "n": [1, None]}}, errors=None)
    recorder = Recorder()
    operation = Operation(recorder, "op-1", "", None, None)  # type: ignore[arg-type]
    sends: list[tuple[str, Callable[[], Any]]] = [
        (GRAPHQL_TRANSPORT_WS_PROTOCOL, lambda: operation.send_next(result)),
        (
            GRAPHQL_WS_PROTOCOL,
            lambda: BaseGraphQLWSHandler.send_data_message(recorder, result, "op-1"),  # type: ignore[arg-type]
        ),
    ]
    for protocol, send in sends:
        _run_at_once(send())
        writer = FrameWriter(Socket(), protocol, "op-1")  # type: ignore[arg-type]
        ours = writer.frame(Socket().encode_payload({"data": result.data}))
        if recorder.sent[-1] != ours:
            return f"{protocol} sends {recorder.sent[-1]}, not {ours}"
    return None


def _run_at_once(coroutine: Any) -> None:
    """Runs a coroutine that awaits nothing that suspends (no event loop needed)."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise RuntimeError("the send path suspended")
