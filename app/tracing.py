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
"""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette

from app.db.engine import Database


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
    StarletteInstrumentor.instrument_app(app)


def graphql_extension() -> Any:
    """strawberry's extension: a span per operation, with parsing, validation, resolvers."""
    from strawberry.extensions.tracing import OpenTelemetryExtension

    return OpenTelemetryExtension


def instrument_clients(db: Database) -> None:
    """SQL statement spans on this process's engines; Redis command spans (redis-py)."""
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    engines = [db.writer.sync_engine]
    if db.reader is not db.writer:
        engines.append(db.reader.sync_engine)
    # The instrumentation declares SQLAlchemy < 2.1 (its range lags releases); it hooks
    # the engine events 2.1 keeps (tests/operability/test_tracing.py sees the spans).
    SQLAlchemyInstrumentor().instrument(engines=engines, skip_dep_check=True)
    RedisInstrumentor().instrument()


def uninstrument_clients() -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().uninstrument()
    RedisInstrumentor().uninstrument()
