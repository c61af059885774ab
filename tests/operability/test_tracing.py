"""Traces: off by default; with OTEL_TRACES_EXPORTER set, one GraphQL request is one
trace spanning the HTTP server span, the GraphQL operation and its SQL statements."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import websockets
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import Settings
from tests.events.conftest import running, served
from tests.support import Fleet

QUERY = 'query Pools { pools(tenantId: "acme", first: 5) { nodes { id } } }'

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once per process) exporting to memory."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # what an operator sets
    _exporter.clear()
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
