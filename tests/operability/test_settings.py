"""Settings: one pydantic-settings class; every environment name that worked before still
does; docs/operations.md's table is the one generated from the class."""

from __future__ import annotations

import os

import pytest

from app import config_env
from app.config import Settings
from app.settings_table import OPERATIONS, with_table

# Every variable as it was named before the class, with a value other than the default.
ENVIRONMENT = {
    "BETTERCOMPUTE_DATABASE_URL": ("database_url", "postgresql+asyncpg://u@h/d"),
    "BETTERCOMPUTE_BROADCAST_URL": ("broadcast_url", "redis://h:6379/0"),
    "BETTERCOMPUTE_GRAPHIQL": ("graphiql", False),
    "BETTERCOMPUTE_INTROSPECTION": ("introspection", False),
    "BETTERCOMPUTE_MAX_QUERY_DEPTH": ("max_query_depth", 7),
    "BETTERCOMPUTE_MAX_ALIASES": ("max_aliases", 8),
    "BETTERCOMPUTE_MAX_TOKENS": ("max_tokens", 9),
    "BETTERCOMPUTE_MAX_QUERY_COST": ("max_query_cost", 10),
    "BETTERCOMPUTE_MAX_BODY_BYTES": ("max_body_bytes", 11),
    "BETTERCOMPUTE_MAX_SUBSCRIPTIONS": ("max_subscriptions_per_connection", 12),
    "BETTERCOMPUTE_CONNECTION_INIT_TIMEOUT_SECONDS": ("connection_init_timeout_s", 1.5),
    "BETTERCOMPUTE_KEEPALIVE_SECONDS": ("keepalive_interval_s", 2.5),
    "BETTERCOMPUTE_SUBSCRIBER_QUEUE_SIZE": ("subscriber_queue_size", 13),
    "BETTERCOMPUTE_SUBSCRIBER_STALL_SECONDS": ("subscriber_stall_timeout_s", 3.5),
    "BETTERCOMPUTE_EVENT_POLL_SECONDS": ("event_poll_interval_s", 4.5),
    "BETTERCOMPUTE_BROKER_PROBE_SECONDS": ("broker_probe_interval_s", 5.5),
    "BETTERCOMPUTE_EVENT_RETENTION_SECONDS": ("event_retention_s", 14),
    "BETTERCOMPUTE_DB_POOL_SIZE": ("db_pool_size", 15),
    "BETTERCOMPUTE_DB_MAX_OVERFLOW": ("db_max_overflow", 16),
    "BETTERCOMPUTE_DB_CONNECT_TIMEOUT_SECONDS": ("db_connect_timeout_s", 6.5),
    "BETTERCOMPUTE_DB_ACQUIRE_TIMEOUT_SECONDS": ("db_acquire_timeout_s", 7.5),
    "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": ("db_statement_timeout_s", 8.5),
    "BETTERCOMPUTE_READINESS_TIMEOUT_SECONDS": ("readiness_timeout_s", 9.5),
}


def test_every_variable_keeps_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (_, value) in ENVIRONMENT.items():
        monkeypatch.setenv(name, str(value).lower() if isinstance(value, bool) else str(value))
    monkeypatch.setenv("BETTERCOMPUTE_ALLOWED_ORIGINS", "https://a.example, https://b.example")
    settings = Settings.from_env()
    for name, (field, value) in ENVIRONMENT.items():
        assert getattr(settings, field) == value, name
        assert Settings.env_name(field) == name
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    # Settings(...) is the defaults and what it is given: tests build it so.
    assert Settings(max_tokens=3) == Settings().model_copy(update={"max_tokens": 3})
    assert Settings().max_query_depth == 12


def test_empty_and_switch_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BETTERCOMPUTE_MAX_TOKENS", "")  # empty: the default, as before
    monkeypatch.setenv("BETTERCOMPUTE_GRAPHIQL", "off")
    monkeypatch.setenv("BETTERCOMPUTE_INTROSPECTION", "1")
    settings = Settings.from_env()
    assert (settings.max_tokens, settings.graphiql, settings.introspection) == (2000, False, True)
    monkeypatch.setenv("BETTERCOMPUTE_MAX_TOKENS", "many")
    with pytest.raises(ValueError, match=r"max_tokens|MAX_TOKENS"):
        Settings.from_env()


def test_settings_are_frozen_and_hashable() -> None:
    settings = Settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.max_tokens = 1  # type: ignore[misc]
    assert hash(settings) == hash(Settings())


def test_every_setting_is_described_and_readme_has_the_generated_table() -> None:
    assert all(field.description for field in Settings.model_fields.values())
    text = OPERATIONS.read_text()
    assert with_table(text) == text, "run scripts/settings-table --write"
    for field in Settings.model_fields:
        assert f"`{Settings.env_name(field)}`" in text


@pytest.mark.parametrize(
    "environment",
    [
        {},
        {
            "BETTERCOMPUTE_DATABASE_URL": "postgresql+asyncpg://u@h/d",
            "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": "2.5",
        },
        {"BETTERCOMPUTE_DATABASE_URL": "", "BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS": ""},
        {
            "bettercompute_database_url": "sqlite:///x.db",
            "BetterCompute_DB_Statement_Timeout_Seconds": "3",
        },
        {"BETTERCOMPUTE_DATABASE_URL": "sqlite:///a.db", "bettercompute_database_url": ""},
    ],
    ids=["unset", "set", "empty", "any-case", "empty-spelling"],
)
def test_admin_commands_read_the_database_as_settings_does(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]
) -> None:
    """app/config_env.py reads two settings without pydantic-settings, the same way."""
    read = {Settings.env_name("database_url"), Settings.env_name("db_statement_timeout_s")}
    for name in list(os.environ):
        if name.upper() in read:
            monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    assert config_env.database_url() == settings.database_url
    assert config_env.db_statement_timeout_s() == settings.db_statement_timeout_s


def test_a_statement_timeout_that_is_no_number_is_left_to_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BETTERCOMPUTE_DB_STATEMENT_TIMEOUT_SECONDS", "soon")
    assert config_env.db_statement_timeout_s() is None  # the CLI then builds Settings
    with pytest.raises(ValueError, match=r"db_statement_timeout_s|DB_STATEMENT_TIMEOUT"):
        Settings.from_env()
