"""Settings from the environment (CONTRACT section 8): one pydantic-settings class.

Every field is one setting with its description; its environment variable is
`BETTERCOMPUTE_<FIELD>` unless `env=` names another (kept as the names were before the
class existed). `Settings(...)` is the defaults plus what is passed, nothing read from
the environment (tests build it so); `Settings.from_env()` reads the environment.
docs/operations.md's settings table is generated from this class (scripts/settings-table).
"""

from __future__ import annotations

import ipaddress
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

# What an admin command reads without this class (app/config_env.py) is defined there.
from app.config_env import (
    DB_STATEMENT_TIMEOUT_ENV,
    DEFAULT_DATABASE_URL,
    DEFAULT_DB_STATEMENT_TIMEOUT_S,
    ENV_PREFIX,
)

_read_env: ContextVar[bool] = ContextVar("read_env", default=False)
# The mechanisms `fast_path` switches together, each also a setting of its own.
FAST_PATH_PIECES: tuple[str, ...] = (
    "compiled_reads",
    "fast_executor",
    "lean_websocket",
    "one_write_responses",
)


def setting(default: Any, description: str, env: str | None = None) -> Any:
    """A field with its description; `env` names its variable when it is not the field's."""
    return Field(
        default,
        description=description,
        validation_alias=None if env is None else ENV_PREFIX + env,
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        populate_by_name=True,  # Settings(field=...) as well as the environment's names
        env_ignore_empty=True,  # VAR= means the default, as before
        extra="ignore",
    )

    database_url: str = setting(
        DEFAULT_DATABASE_URL, "the store; production: `postgresql+asyncpg://user@host/db`"
    )
    broadcast_url: str = setting(
        "memory://",
        "event wake-ups between processes: `redis://host:6379/0` or `postgres://user@host/db`",
    )
    graphiql: bool = setting(True, "serve GraphiQL at `/graphql` (switch off in production)")
    introspection: bool = setting(
        True, 'GraphQL introspection, and errors\' "Did you mean" (switch off in production)'
    )
    fast_path: bool = setting(
        True,
        "the fast paths, all four at once: sets `BETTERCOMPUTE_COMPILED_READS`, "
        "`BETTERCOMPUTE_FAST_EXECUTOR`, `BETTERCOMPUTE_LEAN_WEBSOCKET` and "
        "`BETTERCOMPUTE_ONE_WRITE_RESPONSES` (one of those given beside it wins for its own "
        "mechanism); false serves with stock graphql-core, strawberry and uvicorn over the "
        "domain, which answer the same (app/compat.py)",
    )
    compiled_reads: bool = setting(
        True,
        "reads compiled into one statement (docs/decisions/0008), a subscription event's "
        "`pool` too; false answers every read on the plain path (default: "
        "`BETTERCOMPUTE_FAST_PATH`)",
    )
    fast_executor: bool = setting(
        True,
        "GraphQL: the custom executor (schema/executor.py) when app/compat.py finds it can "
        "run; false: strawberry's own (default: `BETTERCOMPUTE_FAST_PATH`)",
    )
    lean_websocket: bool = setting(
        True,
        "`serve`: the lean websocket protocol (app/websocket_protocol.py) when app/compat.py "
        "finds it can run; false: uvicorn's websockets-sansio (default: "
        "`BETTERCOMPUTE_FAST_PATH`)",
    )
    one_write_responses: bool = setting(
        True,
        "`serve` on PostgreSQL: each HTTP response sent to the socket in one write at the "
        "end of the event loop's turn (app/http_protocol.py), when app/compat.py finds it "
        "can run; false, or on SQLite (no faster there): uvicorn's own protocol (default: "
        "`BETTERCOMPUTE_FAST_PATH`)",
    )
    compiled_plan_cache_bytes: int = setting(
        16 * 1024 * 1024,
        "GraphQL: bytes of compiled-read plans kept per process (query texts, documents, "
        "statements; least recently used dropped; docs/decisions/0008)",
    )
    # GraphQL query limits: refused before execution.
    max_query_depth: int = setting(12, "GraphQL: deepest selection (docs/graphql.md)")
    max_aliases: int = setting(30, "GraphQL: aliases per operation")
    max_tokens: int = setting(2000, "GraphQL: tokens per document")
    max_query_cost: int = setting(
        600_000,
        "GraphQL: static cost of one operation; the default fits one page of 100 pools with "
        "every field, offers and quota rows at their bounds (docs/graphql.md)",
    )
    max_body_bytes: int = setting(
        1_048_576, "request bodies (REST and GraphQL) past this size are refused with 413"
    )
    # Subscriptions (docs/events.md).
    max_subscriptions_per_connection: int = setting(
        20, "subscriptions (operations) per websocket connection", env="MAX_SUBSCRIPTIONS"
    )
    max_subscriptions_per_caller: int = setting(
        100,
        "subscriptions one caller may hold open at once, over all its websockets (per "
        "process: each serve process counts its own); past it RESOURCE_EXHAUSTED",
    )
    max_subscriptions_per_tenant: int = setting(
        1000,
        "subscriptions the callers of one tenant may hold open at once (per process); past "
        "it RESOURCE_EXHAUSTED",
    )
    event_pool_reads: int = setting(
        2,
        "database reads the event fan-out makes at once for `PoolEvent.pool` (each read "
        "once per event and view, on a connection held for that read only)",
    )
    connection_init_timeout_s: float = setting(
        10.0, "time to send `connection_init` (4408)", env="CONNECTION_INIT_TIMEOUT_SECONDS"
    )
    keepalive_interval_s: float = setting(
        15.0,
        "websocket ping interval and pong timeout; legacy `ka` interval",
        env="KEEPALIVE_SECONDS",
    )
    subscriber_queue_size: int = setting(
        1000, "events a subscription may have waiting before it reads the outbox instead"
    )
    subscriber_stall_timeout_s: float = setting(
        8.0,
        "how long a client may leave its socket full before it is closed (4413)",
        env="SUBSCRIBER_STALL_SECONDS",
    )
    event_poll_interval_s: float = setting(
        2.0, "each relay reads the outbox at least this often", env="EVENT_POLL_SECONDS"
    )
    usage_coalesce_ms: int = setting(
        100,
        "`pool.usage`: at most one event per pool per subscriber this often (ms); each "
        "relay reads the pools bookings and releases moved once per window",
    )
    usage_round_rows: int = Field(
        1000,  # app/events/usage.py, USAGE_ROUND_ROWS
        ge=1,
        description="`pool.usage`: quota and capacity rows each relay reads at most per "
        "window, oldest stamp first; the rest waits for the next windows",
    )
    broker_probe_interval_s: float = setting(
        2.0, "how often each process checks its broker subscription", env="BROKER_PROBE_SECONDS"
    )
    event_retention_s: int = setting(
        0,
        "prune events older than this many seconds (0 keeps every event)",
        env="EVENT_RETENTION_SECONDS",
    )
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = setting(
        (),
        "comma-separated browser origins (`https://dash.example`) allowed to open the "
        "websocket and, by CORS (preflight included), to call REST and `/graphql`; no CORS "
        "when empty",
    )
    # The database connection budget per process and how long anything may wait on the
    # database (docs/operations.md "Connection budget"); past a bound a request answers UNAVAILABLE.
    # The whole budget kept open once opened: SQLAlchemy closes an overflow connection as
    # soon as it is returned, so load past the pool opened and closed a backend per request.
    db_pool_size: int = setting(
        20, "PostgreSQL connections per process, opened on demand and kept open"
    )
    db_direct_pool_size: int = setting(
        10,
        "connections per process for compiled reads (one statement each, no transaction, "
        "no ping; docs/decisions/0008): PostgreSQL's, and on SQLite at most 4 of their "
        "own; opened on demand; 0: they use the pool",
    )
    db_prepared_statements_per_connection: int = setting(
        16,
        "compiled read statements each PostgreSQL connection keeps prepared (asyncpg's "
        "statement cache: the least recently used is deallocated; statements over 15 KiB "
        "are planned per request); each holds its plan in the server backend",
    )
    db_max_overflow: int = setting(
        0,
        "PostgreSQL connections per process opened beyond the pool under load, each closed "
        "when its request ends",
    )
    db_connect_timeout_s: float = setting(
        5.0, "opening a database connection", env="DB_CONNECT_TIMEOUT_SECONDS"
    )
    db_acquire_timeout_s: float = setting(
        10.0, "waiting for a connection from the pool", env="DB_ACQUIRE_TIMEOUT_SECONDS"
    )
    db_statement_timeout_s: float = setting(
        DEFAULT_DB_STATEMENT_TIMEOUT_S,
        "one statement, lock waits included (PostgreSQL `statement_timeout`; asyncpg gives up "
        "1 s later if the server does not answer); on SQLite the `busy_timeout` for the write "
        "lock",
        env=DB_STATEMENT_TIMEOUT_ENV,
    )
    readiness_timeout_s: float = setting(
        2.0, "how long `/readyz` waits for the database", env="READINESS_TIMEOUT_SECONDS"
    )
    http_keepalive_s: int = setting(
        75,
        "seconds `serve` keeps an idle HTTP/1.1 connection open; longer than clients' and "
        "proxies' own idle timeouts (httpx 5 s, load balancers 60 s), so a request a client "
        "sends on an idle connection never meets the server closing it (it got no answer)",
        env="HTTP_KEEPALIVE_SECONDS",
    )

    # Websockets (docs/events.md).
    revocation_poll_interval_s: float = setting(
        2.0,
        "every process looks for revoked tokens this often and closes their websockets "
        "(4403); at once on a broker wake-up",
        env="REVOCATION_POLL_SECONDS",
    )
    websocket_max_message_bytes: int = setting(
        1_048_576,
        "the largest websocket message a client may send (larger closes with 1009)",
        env="WS_MAX_MESSAGE_BYTES",
    )
    # Persisted queries on /graphql (docs/graphql.md).
    persisted_queries: str = setting(
        "automatic",
        "`automatic` (Apollo's automatic persisted queries), `allowlist` (only the "
        "operations of the manifest run) or `off`",
    )
    persisted_queries_manifest: str = setting(
        "", "the Apollo persisted query manifest (JSON) of the allowlist mode"
    )
    web_assets_dir: str = setting(
        "", "a node_modules holding GraphiQL's assets (empty: the copies the package ships)"
    )

    # Fleet files (`bettercompute apply -f`, app/fleet/document.py): refused past these
    # with INVALID_INPUT naming the line and column, before or while they are parsed.
    fleet_file_max_bytes: int = setting(1_048_576, "fleet files: the largest, in bytes")
    fleet_file_max_depth: int = setting(
        32, "fleet files: mappings and lists nested inside one another, at most"
    )
    fleet_file_max_alias_nodes: int = setting(
        10_000,
        "fleet files: YAML nodes the aliases may repeat, all together (an alias counts "
        "every node of what it names)",
    )

    readiness_relay_lag_s: float = setting(
        10.0,
        "/readyz: how long the event relay may stay behind the newest committed event",
        env="READINESS_RELAY_LAG_SECONDS",
    )
    # Logs (app/logs.py).
    log_format: Literal["auto", "json", "text"] = setting(
        "auto", "`json` lines, `text`, or `auto`: JSON unless stderr is a terminal"
    )
    log_level: str = setting(
        "INFO", "the root log level; `DEBUG` adds SQL statements (never their bound values)"
    )
    # Metrics (app/metrics.py).
    metrics_max_operations: int = setting(
        200,
        "distinct GraphQL operation names `/metrics` labels, per process; later ones are "
        "counted as `other`",
    )
    # The per-caller budget (app/rate_limit.py), per window; 0 switches a budget off.
    rate_limit_requests: int = setting(0, "requests per caller per window (0: no limit)")
    rate_limit_cost: int = setting(
        0, "GraphQL query cost (docs/graphql.md) per caller per window (0: no limit)"
    )
    rate_limit_window_s: int = setting(60, "the rate-limit window", env="RATE_LIMIT_WINDOW_SECONDS")
    rate_limit_storage_url: str = setting(
        "",
        "where budgets are counted: `memory://` (per process) or `redis://host:6379/0` "
        "(shared); empty: the broadcast URL when it is Redis, otherwise memory",
    )
    rate_limit_store_timeout_s: float = setting(
        0.05,
        "how long a request waits for the rate-limit store (Redis); past it the limits are off "
        '(requests pass; `/readyz` says `rateLimits: "off"`) until the store answers again',
        env="RATE_LIMIT_STORE_TIMEOUT_SECONDS",
    )
    # Requests without a valid token, per client address (app/http/address_budget.py).
    unauthenticated_burst: int = setting(
        50,
        "requests with no, a malformed or an unknown token each client address (IPv6: its "
        "/64) may make at once before 429, per process; 0: no limit",
    )
    unauthenticated_per_s: float = setting(
        0.5,
        "how many of those each address is allowed again per second",
        env="UNAUTHENTICATED_PER_SECOND",
    )
    unauthenticated_max_addresses: int = setting(
        10_000, "client addresses remembered for that allowance (least recently seen dropped)"
    )
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = setting(
        (),
        "comma-separated addresses or networks (`10.0.0.0/8`) of proxies whose "
        "`X-Forwarded-For` names the client; empty: the peer address is the client",
    )

    @model_validator(mode="before")
    @classmethod
    def _fast_path_sets_its_pieces(cls, data: Any) -> Any:
        """`fast_path`, when given, sets each mechanism it names that is not given."""
        if not isinstance(data, dict) or "fast_path" not in data:
            return data
        return {**dict.fromkeys(FAST_PATH_PIECES, data["fast_path"]), **data}

    @field_validator("allowed_origins", "trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(o.strip() for o in value.split(",") if o.strip())
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            ipaddress.ip_network(entry, strict=False)  # ValueError names a bad one
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings) if _read_env.get() else (init_settings,)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """The environment's settings (`overrides` win over it)."""
        reset = _read_env.set(True)
        try:
            return cls(**overrides)
        finally:
            _read_env.reset(reset)

    @classmethod
    def env_name(cls, field: str) -> str:
        alias = cls.model_fields[field].validation_alias
        return alias if isinstance(alias, str) else ENV_PREFIX + field.upper()
