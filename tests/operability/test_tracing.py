"""Traces: off by default; with OTEL_TRACES_EXPORTER set, one GraphQL request is one
trace spanning the HTTP server span, the GraphQL operation and its SQL statements."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import Settings
from tests.events.conftest import running
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
