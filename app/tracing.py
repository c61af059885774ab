"""OpenTelemetry traces: off by default, switched on by the standard settings.

`OTEL_TRACES_EXPORTER` names the exporter (`console`, or `otlp` once an OTLP exporter
package is installed; any exporter registered under the SDK's entry points), and the
rest of `OTEL_*` (service name, resource attributes, sampler, the exporter's endpoint)
is read by the SDK itself. When the process already has an SDK tracer provider (run
under `opentelemetry-instrument`, or a test's), spans go to it. `OTEL_SDK_DISABLED=true`
keeps them off.

One trace per request: the HTTP server span (Starlette), the GraphQL operation's spans
(strawberry's OpenTelemetryExtension), and a span per SQL statement (SQLAlchemy) and per
Redis command below it. Nothing here is imported unless tracing is on: the modules are
heavy and every request would pay for the spans.

A span never holds a secret (CONTRACT section 6: a join token is never read back, traces
included):

- the operation's `query` attribute is the document with every literal value replaced
  (strings by "", numbers by 0), printed from graphql-core's AST; a document that does
  not parse is recorded as "";
- a resolver's `graphql.param.*` attributes show its arguments with every secret field
  (a policy key's, e.g. `kubernetes.token`) replaced by "[redacted]", wherever it sits;
- the HTTP span's URL and target leave out the query string (a GET carries the query
  and its variables there).

The first two rely on strawberry's extension keeping its operation span in
`_span_holder`; `graphql_extension` proves the redaction on a probe schema first, and
without it leaves the GraphQL spans out (with a warning) rather than record a secret.

Every path gives the same trace. A compiled read (docs/decisions/0008) runs no GraphQL
execution, so the view opens its operation's span itself (`compiled_operation`: named,
with `component` and a literal-free `query`, as strawberry's extension does, and only
when that extension runs), and its one statement, sent to asyncpg past SQLAlchemy, gets
a SQL span of its own (`instrument_clients` sets app/db/direct.py's hook): HTTP, then
GraphQL, then SQL, as on the plain path; one that declines (the plain path answers)
leaves its span renamed, so a request holds one GraphQL operation span.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy.engine import make_url
from starlette.applications import Starlette

from app.capacity.policy import secret_field_names
from app.db import direct
from app.db.engine import Database
from app.errors import DomainError

log = logging.getLogger(__name__)
REDACTED = "[redacted]"
T = TypeVar("T")


def enabled() -> bool:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    return exporter not in ("", "none") and not disabled


def _ensure_provider() -> None:
    from importlib.metadata import entry_points

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return  # configured already (opentelemetry-instrument, or a test)
    provider = TracerProvider(
        resource=Resource.create({"service.name": "bettercompute"})  # OTEL_SERVICE_NAME wins
    )
    names = os.environ["OTEL_TRACES_EXPORTER"].lower().split(",")
    for name in (n.strip() for n in names if n.strip()):
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            raise RuntimeError(
                f"OTEL_TRACES_EXPORTER={name}: no such exporter installed "
                "(`otlp` needs opentelemetry-exporter-otlp)"
            )
        exporter = next(iter(found)).load()()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def instrument_app(app: Starlette) -> None:
    """HTTP server spans; call before the app serves its first request."""
    from opentelemetry.instrumentation.starlette import StarletteInstrumentor

    _ensure_provider()
    StarletteInstrumentor.instrument_app(app, server_request_hook=_without_query_string)


# The attributes of an HTTP server span that hold the URL's query string.
_URL_ATTRIBUTES = ("http.url", "url.full", "http.target")


def _without_query_string(span: Any, scope: Mapping[str, Any]) -> None:
    """The server span's URL without its query string: a GET to /graphql carries the
    document and its variables there (a literal join token included)."""
    if not scope.get("query_string"):
        return
    attributes = getattr(span, "attributes", None) or {}
    for name in _URL_ATTRIBUTES:
        value = attributes.get(name)
        if isinstance(value, str):
            span.set_attribute(name, value.split("?", 1)[0])
    if "url.query" in attributes:
        span.set_attribute("url.query", "")


def without_secrets(value: Any, secrets: frozenset[str] | None = None) -> Any:
    """`value` (resolver arguments: dicts, lists, strawberry inputs) as plain data with
    every secret field replaced, at any depth; linear in its size."""
    names = secret_field_names() if secrets is None else secrets
    if isinstance(value, Mapping):
        return {
            key: REDACTED if key in names else without_secrets(item, names)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [without_secrets(item, names) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return without_secrets(fields, names)
    return value


def literal_free(document: Any) -> str:
    """The document with every string literal "" and every number 0 (graphql-core's AST,
    one visit): what was asked, without what was sent."""
    from graphql import (
        FloatValueNode,
        IntValueNode,
        StringValueNode,
        Visitor,
        print_ast,
        visit,
    )

    class Literals(Visitor):
        def enter_string_value(self, node: StringValueNode, *_: Any) -> StringValueNode:
            return StringValueNode(value="", block=False)

        def enter_int_value(self, node: IntValueNode, *_: Any) -> IntValueNode:
            return IntValueNode(value="0")

        def enter_float_value(self, node: FloatValueNode, *_: Any) -> IntValueNode:
            return IntValueNode(value="0")

    if document is None:
        return ""
    return print_ast(visit(document, Literals()))


def _redacting_extension() -> type[Any]:
    from strawberry.extensions import LifecycleStep
    from strawberry.extensions.tracing import OpenTelemetryExtension

    def args_without_secrets(args: dict[str, Any], info: Any) -> dict[str, Any]:
        shown: dict[str, Any] = without_secrets(args)
        return shown

    class RedactingOpenTelemetryExtension(OpenTelemetryExtension):
        """strawberry's extension recording no literal and no secret (module docstring)."""

        def __init__(self, *, execution_context: Any = None, tracer_provider: Any = None) -> None:
            super().__init__(
                execution_context=execution_context,
                arg_filter=args_without_secrets,
                tracer_provider=tracer_provider,
            )

        def on_operation(self) -> Generator[None, None, None]:
            steps = super().on_operation()
            next(steps)  # the operation's span, started with `query` as sent
            span = self._span_holder[LifecycleStep.OPERATION]
            span.set_attribute("query", "")  # replaced once parsed, before the span ends
            try:
                yield
            finally:
                document = self.execution_context.graphql_document
                span.set_attribute("query", literal_free(document))
                for _ in steps:  # the rest of strawberry's hook: it ends the span
                    pass

    return RedactingOpenTelemetryExtension


# What the probe sends: its secret must be in no span, its literal in no `query`.
_PROBE_SECRET, _PROBE_LITERAL = "probe-secret-value", "probe-literal-value"


def _redaction_problem(extension: type[Any]) -> str | None:
    """Run a probe schema with `extension` into an in-memory exporter: None when no span
    holds the secret it sends (by a variable and by a literal) and its `query` attribute
    holds no literal."""
    import strawberry
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from strawberry.scalars import JSON

    def probe(policy: Any, note: str) -> int:
        return 1

    # Real types, not this module's postponed annotations (strawberry resolves names).
    probe.__annotations__ = {"policy": JSON, "note": str, "return": int}
    query = strawberry.type(type("Query", (), {"probe": strawberry.field(resolver=probe)}))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = [lambda: extension(tracer_provider=provider)]
    schema = strawberry.Schema(query=query, extensions=traced)
    secret = next(iter(sorted(secret_field_names())), "token")
    operation = schema.execute(
        f'query Probe($p: JSON!) {{ a: probe(policy: $p, note: "{_PROBE_LITERAL}")'
        f' b: probe(policy: {{kubernetes: {{{secret}: "{_PROBE_SECRET}"}}}}, note: "n") }}',
        variable_values={"p": {"kubernetes": {secret: _PROBE_SECRET}}},
    )
    # Its own thread and loop: the schema is built inside the server's running loop.
    with ThreadPoolExecutor(max_workers=1) as thread:
        result = thread.submit(asyncio.run, operation).result(timeout=30)
    if result.errors:
        return f"the probe failed: {result.errors[0].message}"
    spans = exporter.get_finished_spans()
    if not any(span.name.startswith("GraphQL") for span in spans):
        return "the probe recorded no GraphQL span"
    for span in spans:
        attributes = span.attributes or {}
        if _PROBE_LITERAL in str(attributes.get("query", "")):
            return f"span {span.name!r} recorded a literal in `query`"
        recorded = [*attributes.values()]
        recorded += [value for event in span.events for value in (event.attributes or {}).values()]
        if any(_PROBE_SECRET in str(value) for value in recorded):
            return f"span {span.name!r} recorded a secret"
    return None


@lru_cache(maxsize=1)
def graphql_extension() -> Any:
    """strawberry's extension, redacting (module docstring): a span per operation, with
    parsing, validation, resolvers. None when the redaction cannot be shown to hold."""
    try:
        extension = _redacting_extension()
        problem = _redaction_problem(extension)
    except Exception as exc:  # strawberry moved under the subclass
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        log.warning("GraphQL spans are left out: their redaction does not hold (%s)", problem)
        return None
    return extension


# A compiled read that declined (the plain path answers, with its own operation span).
DECLINED_SPAN = "GraphQL compiled read (declined)"


async def compiled_operation(
    operation_name: str | None, document: Any, read: Callable[[], Awaitable[T]]
) -> T:
    """`read()` (a compiled read's answer) in the span of the GraphQL operation it answers,
    current while it runs (its statement's span goes below it): named as strawberry's
    extension names an operation's, with the same `component` and literal-free `query`.
    Declined (None, or a failure other than a domain error: the plain path answers and
    records the operation), the span is renamed DECLINED_SPAN, so a request holds one
    operation span."""
    from opentelemetry import trace

    name = f"GraphQL Query: {operation_name}" if operation_name else "GraphQL Query"
    with trace.get_tracer("strawberry").start_as_current_span(
        name,
        kind=trace.SpanKind.SERVER,
        attributes={"component": "graphql", "query": literal_free(document)},
    ) as span:
        try:
            answer = await read()
        except DomainError:  # the request's answer (UNAVAILABLE)
            raise
        except Exception:
            span.update_name(DECLINED_SPAN)
            span.set_attribute("component", "compiled-read")
            raise
        if answer is None:
            span.update_name(DECLINED_SPAN)
            span.set_attribute("component", "compiled-read")
        return answer


def _statement_spans(db: Database) -> direct.StatementSpan:
    """A SQL span per statement sent to the driver directly (app/db/direct.py, and the
    compiled reads on SQLite: app/capacity/json_reads.py), with the
    attributes SQLAlchemy's instrumentation gives its own: the statement's text (its
    parameters are bound apart and never recorded), the system and the database."""
    from opentelemetry import trace

    tracer = trace.get_tracer("bettercompute.db")
    url = make_url(db.url)
    database, system = url.database or "", url.get_backend_name()

    def span(sql: str) -> AbstractContextManager[Any]:
        verb = sql.split(None, 1)[:1]  # named as SQLAlchemy's are: `SELECT`
        return tracer.start_as_current_span(
            verb[0] if verb else system,
            kind=trace.SpanKind.CLIENT,
            attributes={"db.system": system, "db.name": database, "db.statement": sql},
        )

    return span


def instrument_clients(db: Database) -> None:
    """SQL statement spans on this process's engines and the statements sent to asyncpg
    directly (the compiled reads'); Redis command spans (redis-py)."""
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    engines = [db.writer.sync_engine]
    if db.reader is not db.writer:
        engines.append(db.reader.sync_engine)
    # The instrumentation declares SQLAlchemy < 2.1 (its range lags releases); it hooks
    # the engine events 2.1 keeps (tests/operability/test_tracing.py sees the spans).
    SQLAlchemyInstrumentor().instrument(engines=engines, skip_dep_check=True)
    direct.trace_statements(_statement_spans(db))
    RedisInstrumentor().instrument()


def uninstrument_clients() -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().uninstrument()
    direct.trace_statements(None)
    RedisInstrumentor().uninstrument()
