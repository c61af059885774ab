"""app/compat.py: with the pinned libraries every fast piece runs; when an internal it
relies on changes, the app says so once and answers the same through the plain path.

A changed internal is simulated as a library upgrade would bring it: the method kept,
its parameters renamed (so it still works for the stock code that calls it). Each test
asks for the fast path itself, whatever BETTERCOMPUTE_FAST_PATH says for the run."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import graphql.execution.values
import httpx
import pytest
from graphql.execution.executor import Executor
from starlette.applications import Starlette
from starlette.routing import Route
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types.info import Info
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from app import compat
from app.config import Settings
from app.server import create_app
from app.websocket_protocol import LeanWebSocketProtocol
from schema import shared_frames
from schema.executor import FastFieldsExecutor
from schema.view import GraphQLView
from schema.websockets import LegacyWSHandler
from tests.events.conftest import served
from tests.events.test_websocket import a_created_event_streams
from tests.rest.scene import Scene
from tests.support import Api, Fleet

PAGE = """{ pools(tenantId: "acme", first: 10) {
  pageInfo { hasNextPage }
  nodes { id class region owned archived version quotas { resource max used } } } }"""
BOOK = """mutation($input: CreateReservationInput!) { createReservation(input: $input) {
  reservation { id } } }"""


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "app.compat"]


def _renamed(method: Callable[..., Any]) -> Callable[..., Any]:
    """The method with its parameters under other names, as an upgrade might rename them."""

    def renamed(self: Any, *arguments: Any) -> Any:
        return method(self, *arguments)

    return renamed


def _view(app: Starlette) -> GraphQLView:
    route = next(r for r in app.routes if isinstance(r, Route) and r.path == "/graphql")
    view = route.endpoint
    assert isinstance(view, GraphQLView)
    return view


@asynccontextmanager
async def _running(settings: Settings) -> AsyncIterator[tuple[Starlette, Api]]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield app, Api(client)


def test_with_the_pinned_libraries_every_piece_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        fast = compat.check(Settings(fast_path=True))
        protocol = compat.websocket_protocol(Settings(fast_path=True))
    assert fast == compat.Compatibility(executor=True, websocket_handlers=True)
    assert protocol is LeanWebSocketProtocol
    assert _warnings(caplog) == []


def test_fast_path_off_leaves_every_fast_piece_out() -> None:
    plain = Settings(fast_path=False)
    assert compat.check(plain) == compat.Compatibility(executor=False, websocket_handlers=True)
    assert compat.websocket_protocol(plain) == "websockets-sansio"
    schema = _view(create_app(plain)).schema
    assert schema.execution_context_class is StrawberryGraphQLCoreExecutionContext  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", ["graphql-transport-ws", "graphql-ws"])
def test_a_changed_result_frame_turns_the_shared_frames_off(
    protocol: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """schema/shared_frames.py writes the frame strawberry sends for a plain result: if
    strawberry's frame changes (here, a key it adds), the check leaves them out."""
    from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import Operation
    from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler

    if protocol == "graphql-transport-ws":

        async def changed(self: Any, result: Any) -> None:
            await self.send_operation_message(
                {"id": self.id, "type": "next", "payload": {"data": result.data, "hasNext": False}}
            )

        monkeypatch.setattr(Operation, "send_next", changed)
    else:

        async def changed_legacy(self: Any, result: Any, operation_id: str) -> None:
            await self.send_message(
                {"id": operation_id, "type": "data", "payload": {"data": result.data}}
            )

        monkeypatch.setattr(BaseGraphQLWSHandler, "send_data_message", changed_legacy)
    assert shared_frames.strawberry_frame_problem() is not None
    with caplog.at_level(logging.WARNING):
        view = _view(create_app(Settings(fast_path=True)))
    assert view.shared_frames is False
    assert [w for w in _warnings(caplog) if "shared event frames cannot run" in w]


def test_with_the_pinned_libraries_event_frames_are_shared() -> None:
    assert shared_frames.strawberry_frame_problem() is None
    assert _view(create_app(Settings(fast_path=True))).shared_frames is True
    assert _view(create_app(Settings(fast_path=False))).shared_frames is False


def test_the_graphql_core_schema_is_required() -> None:
    with pytest.raises(RuntimeError, match="_schema"):
        compat.graphql_core_schema(object())


async def test_a_changed_executor_internal_runs_the_stock_executor(
    database_url: str,
    fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _running(Settings(database_url=database_url, fast_path=True)) as (fast_app, fast):
        s = await Scene.start(fast, fleet)
        await s.pool(ownerQuota={"gpu": 4})
        await s.pool(ownerQuota={"gpu": 2, "nvme": 1})
        expected = await fast.graphql(s.token, PAGE)
        assert _view(fast_app).schema.execution_context_class is FastFieldsExecutor  # type: ignore[attr-defined]

    monkeypatch.setattr(Executor, "execute_fields", _renamed(Executor.execute_fields))
    with caplog.at_level(logging.WARNING):
        app = create_app(Settings(database_url=database_url, fast_path=True))
    (warning,) = _warnings(caplog)
    assert warning.startswith("executor cannot run (")
    assert "execute_fields takes (self, arguments)" in warning
    schema = _view(app).schema
    assert schema.execution_context_class is StrawberryGraphQLCoreExecutionContext  # type: ignore[attr-defined]
    async with _running(Settings(database_url=database_url, fast_path=True)) as (_, plain):
        answer = await plain.graphql(s.token, PAGE)
    assert "errors" not in answer and len(answer["data"]["pools"]["nodes"]) == 2
    assert answer == expected


def test_an_info_without_raw_info_reads_event_pools_plainly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PoolEvent.pool's compiled read takes its field nodes from strawberry's
    `Info._raw_info`: without it, the stock executor runs and no event pool compiles."""
    assert _view(create_app(Settings(fast_path=True))).event_compiled is not None
    annotations = {k: v for k, v in Info.__annotations__.items() if k != "_raw_info"}
    monkeypatch.setattr(Info, "__annotations__", annotations)
    with caplog.at_level(logging.WARNING):
        view = _view(create_app(Settings(fast_path=True)))
    assert [w for w in _warnings(caplog) if "Info has no _raw_info" in w]
    assert view.schema.execution_context_class is StrawberryGraphQLCoreExecutionContext  # type: ignore[attr-defined]
    assert view.event_compiled is None


async def test_changed_error_messages_are_reported_and_errors_keep_their_code(
    api: Api, fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool(ownerQuota={"gpu": 4}))["id"]
    resources = [{"resource": "gpu", "amount": "x"}]
    variables = {"input": {"tenantId": "acme", "poolId": pool_id, "resources": resources}}
    before = await api.graphql(s.token, BOOK, variables)
    field = "resources[0].amount"
    assert before["errors"][0]["extensions"] == {"code": "INVALID_INPUT", "field": field}

    # graphql-core prints the path another way: `at ['resources', 0, 'amount']`.
    monkeypatch.setattr(graphql.execution.values, "print_path_list", lambda p: f" at {p!r}")
    with caplog.at_level(logging.WARNING):
        compat.check(Settings(fast_path=True))
    (warning,) = _warnings(caplog)
    assert warning.startswith("graphql-core error messages cannot run (a bad `quota[0].max`")
    after = await api.graphql(s.token, BOOK, variables)
    assert after["errors"][0]["extensions"] == {"code": "INVALID_INPUT"}


async def test_changed_handler_methods_leave_strawberrys_handlers_serving(
    database_url: str,
    fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(
        BaseGraphQLWSHandler, "handle_start", _renamed(BaseGraphQLWSHandler.handle_start)
    )
    with caplog.at_level(logging.WARNING):
        async with served(Settings(database_url=database_url, fast_path=True)) as (app, address):
            (warning,) = _warnings(caplog)
            assert warning.startswith("websocket handlers cannot run (")
            assert warning.endswith("strawberry's own handlers serve")
            view = _view(app)
            assert view.graphql_ws_handler_class is BaseGraphQLWSHandler
            assert GraphQLView.graphql_ws_handler_class is LegacyWSHandler  # the class keeps ours
            await a_created_event_streams(app, address, fleet, "graphql-ws")


async def test_a_changed_uvicorn_protocol_serves_uvicorns_own(
    database_url: str,
    fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(WebSocketsSansIOProtocol, "send", _renamed(WebSocketsSansIOProtocol.send))
    settings = Settings(database_url=database_url, fast_path=True)
    with caplog.at_level(logging.WARNING):
        assert compat.websocket_protocol(settings) == "websockets-sansio"
    (warning,) = _warnings(caplog)
    assert warning.startswith("websocket protocol cannot run (WebSocketsSansIOProtocol.send")
    async with served(settings) as (app, address):  # served() asks compat the same
        await a_created_event_streams(app, address, fleet, "graphql-transport-ws")
