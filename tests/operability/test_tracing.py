"""Traces: off by default; with OTEL_TRACES_EXPORTER set, every request is one trace: the
HTTP server span, below it the GraphQL operation's (a GraphQL request) and the SQL
statements, on every path (REST and GraphQL, compiled reads and plain, reads and writes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from app.config import Settings
from tests.events.conftest import running, served
from tests.events.support import settle
from tests.support import Fleet

QUERY = 'query Pools { pools(tenantId: "acme", first: 5) { nodes { id } } }'

_exporter = InMemorySpanExporter()


class _Tasks(SpanProcessor):
    """Which asyncio task began each span: the event relay's own reads are told apart
    from a request's by it (they are traces of their own, begun by its task)."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop (the redaction probe's thread)
            task = None
        self.names[span.context.span_id] = task.get_name() if task is not None else ""


_tasks = _Tasks()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once per process) exporting to memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_tasks)
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # what an operator sets
    _exporter.clear()
    _tasks.names.clear()
    yield _exporter
    _exporter.clear()


async def _graphql(database_url: str, fleet: Fleet) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    async with running(Settings(database_url=database_url)) as (_, api):
        answer = await api.client.post(
            "/graphql", json={"query": QUERY}, headers={"authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200 and "errors" not in answer.json(), answer.text


async def test_one_trace_spans_http_graphql_and_sql(
    database_url: str, fleet: Fleet, spans: InMemorySpanExporter
) -> None:
    await _graphql(database_url, fleet)
    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if (s.attributes or {}).get("http.route") == "/graphql"]
    assert server.kind == trace.SpanKind.SERVER
    trace_id = server.context.trace_id
    in_trace = [s for s in finished if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in in_trace}

    def ancestors(span: object) -> list[str]:
        names = []
        parent = getattr(span, "parent", None)
        while parent is not None and parent.span_id in by_id:
            names.append(by_id[parent.span_id].name)
            parent = by_id[parent.span_id].parent
        return names

    graphql = [s for s in in_trace if s.name.startswith("GraphQL")]
    assert graphql, [s.name for s in in_trace]
    sql = [s for s in in_trace if (s.attributes or {}).get("db.system")]
    assert sql, [s.name for s in in_trace]
    # A SQL statement of the resolvers sits below the GraphQL operation, below HTTP.
    below_graphql = [s for s in sql if any(n.startswith("GraphQL") for n in ancestors(s))]
    assert below_graphql and server.name in ancestors(below_graphql[0])


async def test_no_spans_by_default(
    database_url: str, fleet: Fleet, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    await _graphql(database_url, fleet)
    assert spans.get_finished_spans() == ()


CREATE = "mutation($i: CreatePoolInput!) { createPool(input: $i) { pool { id } } }"
UPDATE = "mutation($i: UpdatePoolInput!) { updatePool(input: $i) { pool { id } } }"
READ = (
    'query Read { pools(tenantId: "acme", first: 5) { nodes { id policy } } }',
    'query One($p: ID!) { pool(tenantId: "acme", poolId: $p) { id policy } }',
)
CA_HASH = "sha256:" + "ab" * 32


def _join(token: str) -> dict[str, object]:
    return {
        "kubernetes": {
            "apiServer": "https://k8s.example:6443",
            "token": token,
            "caCertHash": CA_HASH,
        }
    }


def _join_literal(token: str) -> str:
    return (
        '{kubernetes: {apiServer: "https://k8s.example:6443", token: "' + token + '",'
        ' caCertHash: "' + CA_HASH + '"}}'
    )


def _recorded(span: object) -> list[str]:
    """Every value a finished span holds: its name, attributes and its events'."""
    values = [str(getattr(span, "name", ""))]
    values += [str(v) for v in (getattr(span, "attributes", None) or {}).values()]
    for event in getattr(span, "events", ()):
        values.append(str(event.name))
        values += [str(v) for v in (event.attributes or {}).values()]
    return values


@pytest.mark.parametrize("fast_path", [True, False], ids=["compiled", "plain"])
async def test_no_span_holds_a_join_token(
    database_url: str,
    fleet: Fleet,
    spans: InMemorySpanExporter,
    fast_path: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Several requests, so the compiled path answers the reads after the first; creates
    and updates by variables and by literals, refused ones, a GET carrying one."""
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    auth = {"authorization": f"Bearer {token}"}
    secrets = [f"join-{n}-{'x' * 8}-SECRET-{fast_path}" for n in range(8)]
    pool = {"tenantId": "acme", "siteId": site, "class": "METAL_HOST", "gpuModel": "H100"}
    async with running(Settings(database_url=database_url, fast_path=fast_path)) as (_, api):
        c = api.client

        async def ok(body: dict[str, object]) -> dict[str, object]:
            answer = await c.post("/graphql", json=body, headers=auth)
            assert answer.status_code == 200 and "errors" not in answer.json(), answer.text
            return dict(answer.json()["data"])

        created = await ok(
            {"query": CREATE, "variables": {"i": {**pool, "policy": _join(secrets[0])}}}
        )
        pool_id = created["createPool"]["pool"]["id"]
        literal = (
            'mutation { createPool(input: {tenantId: "acme", siteId: "' + site + '",'
            f" class: METAL_HOST, policy: {_join_literal(secrets[1])}}}) {{ pool {{ id }} }} }}"
        )
        await ok({"query": literal})
        update = {"tenantId": "acme", "poolId": pool_id, "policy": _join(secrets[2])}
        await ok({"query": UPDATE, "variables": {"i": update}})
        literal = (
            'mutation { updatePool(input: {tenantId: "acme", poolId: "' + pool_id + '",'
            f" policy: {_join_literal(secrets[3])}}}) {{ pool {{ id }} }} }}"
        )
        await ok({"query": literal})
        # Refused: an unknown field beside a literal token; a token as a gpuModel.
        refused = literal.replace("policy:", "colour: 1, policy:").replace(secrets[3], secrets[4])
        answer = await c.post("/graphql", json={"query": refused}, headers=auth)
        assert answer.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
        bad = {**update, "gpuModel": _join(secrets[5])}
        answer = await c.post(
            "/graphql", json={"query": UPDATE, "variables": {"i": bad}}, headers=auth
        )
        assert answer.json()["errors"], answer.text
        by_get = await c.get(
            "/graphql", params={"query": literal.replace(secrets[3], secrets[6])}, headers=auth
        )
        assert by_get.status_code == 405
        for _ in range(4):  # compiled after the first, when the fast path is on
            await ok({"query": READ[0]})
            await ok({"query": READ[1], "variables": {"p": pool_id}})
        rest = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
        await api.ok(token, "pools/create", {**rest, "policy": _join(secrets[7])})
        metrics = (await c.get("/metrics")).text

    finished = spans.get_finished_spans()
    servers = [s for s in finished if (s.attributes or {}).get("http.route") == "/graphql"]
    assert len(servers) == 15, [s.name for s in servers]  # one per request, all traced
    assert [s for s in finished if "/api/compute/" in str((s.attributes or {}).get("http.route"))]
    operations = [s for s in finished if (s.attributes or {}).get("component") == "graphql"]
    assert any("query" in (s.attributes or {}) for s in operations)
    params = [
        v for s in operations for k, v in (s.attributes or {}).items() if k == "graphql.param.input"
    ]
    assert params and any("[redacted]" in str(v) for v in params), params
    for span in finished:
        for value in _recorded(span):
            for secret in secrets:
                assert secret not in value, (span.name, value)
    for record in caplog.records:
        assert not any(secret in record.getMessage() for secret in secrets), record
    assert not any(secret in metrics for secret in secrets)


@pytest.fixture
def unredacted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """strawberry's extension as if it had changed under our subclass: the stock one."""
    from strawberry.extensions.tracing import OpenTelemetryExtension

    from app import tracing
    from schema import app as schema_app

    monkeypatch.setattr(tracing, "_redacting_extension", lambda: OpenTelemetryExtension)
    tracing.graphql_extension.cache_clear()
    schema_app._build.cache_clear()
    yield
    monkeypatch.undo()
    tracing.graphql_extension.cache_clear()
    schema_app._build.cache_clear()


async def test_without_redaction_no_graphql_span_is_recorded(
    database_url: str,
    fleet: Fleet,
    spans: InMemorySpanExporter,
    unredacted: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    secret = "join-unredacted-SECRET"
    pool = {"tenantId": "acme", "siteId": site, "class": "METAL_HOST", "policy": _join(secret)}
    async with running(Settings(database_url=database_url)) as (_, api):
        answer = await api.client.post(
            "/graphql",
            json={"query": CREATE, "variables": {"i": pool}},
            headers={"authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 200 and "errors" not in answer.json(), answer.text
    assert "GraphQL spans are left out" in caplog.text
    finished = spans.get_finished_spans()
    assert not [s for s in finished if s.name.startswith("GraphQL")]
    assert [s for s in finished if (s.attributes or {}).get("db.system")]  # SQL still traced
    assert not any(secret in value for span in finished for value in _recorded(span))


async def test_no_span_of_a_websocket_operation_holds_a_join_token(
    database_url: str, fleet: Fleet, spans: InMemorySpanExporter
) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    secrets = ["join-ws-variable-SECRET", "join-ws-literal-SECRET"]
    pool = {"tenantId": "acme", "siteId": site, "class": "METAL_HOST"}
    literal = (
        'mutation { createPool(input: {tenantId: "acme", siteId: "' + site + '",'
        f" class: METAL_HOST, policy: {_join_literal(secrets[1])}}}) {{ pool {{ id }} }} }}"
    )
    operations = [
        {"query": CREATE, "variables": {"i": {**pool, "policy": _join(secrets[0])}}},
        {"query": literal},
    ]
    async with (
        served(Settings(database_url=database_url)) as (_, address),
        websockets.connect(
            f"ws://{address}/graphql",
            subprotocols=["graphql-transport-ws"],  # type: ignore[list-item]
        ) as ws,
    ):
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(json.dumps(init))
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        for n, payload in enumerate(operations):
            await ws.send(json.dumps({"id": str(n), "type": "subscribe", "payload": payload}))
            answer = json.loads(await ws.recv())
            assert answer["type"] == "next" and "errors" not in answer["payload"], answer
            assert json.loads(await ws.recv())["type"] == "complete"
    finished = spans.get_finished_spans()
    traced = [s for s in finished if (s.attributes or {}).get("component") == "graphql"]
    assert len([s for s in traced if "query" in (s.attributes or {})]) == 2
    for span in finished:
        for value in _recorded(span):
            assert not any(secret in value for secret in secrets), (span.name, value)


# --- one trace per request, on every path ------------------------------------------

POOLS = 'query Pools { pools(tenantId: "acme", first: 5) { nodes { id quotas { resource } } } }'
TIMES = 3  # the compiled path answers a query text and a caller after their first
MISSING = "pool_01j0000000000000000000000z"  # no such pool


def _one_trace(finished: tuple[Any, ...], graphql: bool, what: str) -> None:
    """The spans of one request: one trace, the HTTP server span its root, the GraphQL
    operation's span below it (a GraphQL request), and a SQL statement below that (or
    below HTTP, for REST)."""
    servers = [s for s in finished if (s.attributes or {}).get("http.route")]
    assert len(servers) == 1, (what, [s.name for s in finished])
    (server,) = servers
    assert server.kind == trace.SpanKind.SERVER and server.parent is None, what
    trace_id = server.context.trace_id
    # Outside it only the event relay's reads of the outbox (woken by a write, or
    # reading on after one), traces of their own begun by the relay's task.
    relay = [s for s in finished if _tasks.names.get(s.context.span_id) == "event-relay"]
    assert all(s.context.trace_id != trace_id for s in relay), what
    finished = tuple(s for s in finished if s not in relay)
    outside = [
        (s.name, str((s.attributes or {}).get("db.statement"))[:60])
        for s in finished
        if s.context.trace_id != trace_id
    ]
    assert not outside, (what, outside)
    by_id = {s.context.span_id: s for s in finished}

    def ancestors(span: Any) -> list[Any]:
        found, parent = [], span.parent
        while parent is not None:
            assert parent.span_id in by_id, (what, span.name, "a parent not exported")
            found.append(by_id[parent.span_id])
            parent = by_id[parent.span_id].parent
        return found

    for span in finished:  # a tree under the server span
        assert span is server or server in ancestors(span), (what, span.name)
    operations = [
        s
        for s in finished
        if s.name.startswith("GraphQL Query") and (s.attributes or {}).get("component") == "graphql"
    ]
    sql = [s for s in finished if (s.attributes or {}).get("db.system")]
    assert sql, (what, [s.name for s in finished])
    if graphql:
        assert len(operations) == 1, (what, [s.name for s in finished])
        assert [s for s in sql if operations[0] in ancestors(s)], (what, [s.name for s in finished])
    else:
        assert not operations, (what, [s.name for s in finished])


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "plain"])
async def test_every_request_is_one_trace_http_graphql_sql(
    database_url: str,
    dialect: str,
    fleet: Fleet,
    spans: InMemorySpanExporter,
    compiled: bool,
) -> None:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    auth = {"authorization": f"Bearer {token}"}
    settings = Settings(
        database_url=database_url,
        compiled_reads=compiled,
        # Quiet pollers: their statements are traces of their own, not the request's.
        event_poll_interval_s=3600,
        revocation_poll_interval_s=3600,
    )
    async with running(settings) as (app, api):
        made = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
        pool = await api.ok(token, "pools/create", made)
        get = {"tenantId": "acme", "poolId": pool["pool"]["id"]}
        create = {"tenantId": "acme", "siteId": site, "class": "METAL_HOST"}
        requests: list[tuple[str, str, dict[str, Any]]] = [
            ("rest pools/list", "/api/compute/pools/list", {"tenantId": "acme"}),
            ("rest pools/get", "/api/compute/pools/get", get),
            ("graphql pools", "/graphql", {"query": POOLS}),
            ("graphql pool", "/graphql", {"query": READ[1], "variables": {"p": get["poolId"]}}),
            # Its plan declines (no such pool): the plain path answers NOT_FOUND.
            ("graphql pool, none", "/graphql", {"query": READ[1], "variables": {"p": MISSING}}),
            ("graphql createPool", "/graphql", {"query": CREATE, "variables": {"i": create}}),
            ("rest pools/create", "/api/compute/pools/create", made),
        ]
        before = _compiled_answered()
        for what, path, body in requests:
            for n in range(TIMES):
                await settle(app)  # the relay has read earlier writes' events
                spans.clear()
                answer = await api.client.post(path, json=body, headers=auth)
                assert answer.status_code == 200, answer.text
                assert ("errors" in answer.json()) is ("none" in what), answer.text
                _one_trace(spans.get_finished_spans(), path == "/graphql", f"{what} #{n + 1}")
        answered = _compiled_answered() - before
    # The compiled path answered each read after its first at least (on both dialects):
    # the traces above are its own too.
    if compiled:
        assert answered >= 2 * (TIMES - 1), (dialect, answered)
    else:
        assert answered == 0, (dialect, answered)


def _compiled_answered() -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": "answered"})
    return found or 0.0
