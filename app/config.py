"""Settings from the environment (CONTRACT section 8)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./bettercompute.db"


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def _float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value is None or value == "" else float(value)


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    broadcast_url: str = "memory://"
    graphiql: bool = True
    introspection: bool = True
    # GraphQL query limits: refused before execution.
    max_query_depth: int = 12
    max_aliases: int = 30
    max_tokens: int = 2000
    # One page of 100 pools with every field, offers and quota rows at their bounds
    # (docs/graphql.md).
    max_query_cost: int = 600_000
    # Request bodies (REST and GraphQL): 413 past this many bytes.
    max_body_bytes: int = 1_048_576
    # Subscriptions (docs/events.md).
    max_subscriptions_per_connection: int = 20
    connection_init_timeout_s: float = 10.0
    keepalive_interval_s: float = 15.0
    subscriber_queue_size: int = 1000
    subscriber_stall_timeout_s: float = 8.0  # a client not reading this long is closed
    event_poll_interval_s: float = 2.0
    broker_probe_interval_s: float = 2.0
    event_retention_s: int = 0  # 0 keeps every event
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)
    # The database connection budget per process and how long anything may wait on the
    # database (README "Connection budget"); past a bound a request answers UNAVAILABLE.
    db_pool_size: int = 10
    db_max_overflow: int = 10
    db_connect_timeout_s: float = 5.0
    db_acquire_timeout_s: float = 10.0
    db_statement_timeout_s: float = 10.0  # PostgreSQL statement_timeout; SQLite busy_timeout
    readiness_timeout_s: float = 2.0  # /readyz: how long the database may take to answer
    # Websockets: every process looks for revoked tokens this often and closes their
    # sockets (4403); the largest message a client may send (larger closes with 1009).
    revocation_poll_interval_s: float = 2.0
    websocket_max_message_bytes: int = 1_048_576
    # Persisted queries on /graphql (docs/graphql.md): automatic, allowlist or off; the
    # allowlist mode runs only the operations of an Apollo persisted query manifest.
    persisted_queries: str = "automatic"
    persisted_queries_manifest: str = ""
    # Where `npm ci` in web/ put GraphiQL's assets (served under /assets/, no CDN).
    web_assets_dir: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        origins = os.environ.get("BETTERCOMPUTE_ALLOWED_ORIGINS", "")
        return cls(
            database_url=os.environ.get("BETTERCOMPUTE_DATABASE_URL", DEFAULT_DATABASE_URL),
            broadcast_url=os.environ.get("BETTERCOMPUTE_BROADCAST_URL", "memory://"),
            graphiql=_flag("BETTERCOMPUTE_GRAPHIQL", True),
            introspection=_flag("BETTERCOMPUTE_INTROSPECTION", True),
            max_query_depth=_int("BETTERCOMPUTE_MAX_QUERY_DEPTH", 12),
            max_aliases=_int("BETTERCOMPUTE_MAX_ALIASES", 30),
            max_tokens=_int("BETTERCOMPUTE_MAX_TOKENS", 2000),
            max_query_cost=_int("BETTERCOMPUTE_MAX_QUERY_COST", 600_000),
            max_body_bytes=_int("BETTERCOMPUTE_MAX_BODY_BYTES", 1_048_576),
            max_subscriptions_per_connection=_int("BETTERCOMPUTE_MAX_SUBSCRIPTIONS", 20),
            connection_init_timeout_s=_float("BETTERCOMPUTE_CONNECTION_INIT_TIMEOUT_SECONDS", 10.0),
            keepalive_interval_s=_float("BETTERCOMPUTE_KEEPALIVE_SECONDS", 15.0),
            subscriber_queue_size=_int("BETTERCOMPUTE_SUBSCRIBER_QUEUE_SIZE", 1000),
            subscriber_stall_timeout_s=_float("BETTERCOMPUTE_SUBSCRIBER_STALL_SECONDS", 8.0),
            event_poll_interval_s=_float("BETTERCOMPUTE_EVENT_POLL_SECONDS", 2.0),
            broker_probe_interval_s=_float("BETTERCOMPUTE_BROKER_PROBE_SECONDS", 2.0),
            event_retention_s=_int("BETTERCOMPUTE_EVENT_RETENTION_SECONDS", 0),
            allowed_origins=tuple(o.strip() for o in origins.split(",") if o.strip()),
            db_pool_size=_int("BETTERCOMPUTE_DB_POOL_SIZE", 10),
            db_max_overflow=_int("BETTERCOMPUTE_DB_MAX_OVERFLOW", 10),
            db_connect_timeout_s=_float("BETTERCOMPUTE_DB_CONNECT_TIMEOUT_SECONDS", 5.0),
            db_acquire_timeout_s=_float("BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT_SECONDS", 10.0),
            db_statement_timeout_s=_float("BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS", 10.0),
            readiness_timeout_s=_float("BETTERCOMPUTE_READINESS_TIMEOUT_SECONDS", 2.0),
            revocation_poll_interval_s=_float("BETTERCOMPUTE_REVOCATION_POLL_SECONDS", 2.0),
            websocket_max_message_bytes=_int("BETTERCOMPUTE_WS_MAX_MESSAGE_BYTES", 1_048_576),
            persisted_queries=os.environ.get("BETTERCOMPUTE_PERSISTED_QUERIES", "automatic"),
            persisted_queries_manifest=os.environ.get(
                "BETTERCOMPUTE_PERSISTED_QUERIES_MANIFEST", ""
            ),
            web_assets_dir=os.environ.get("BETTERCOMPUTE_WEB_ASSETS_DIR", ""),
        )
