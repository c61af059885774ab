"""The settings an admin command on the embedded default reads, without pydantic-settings.

Importing pydantic-settings costs about 0.1 s, a third of what `bettercompute tenant
create` may take, and such a command needs two settings only: where the database is and
how long to wait for its write lock. Their names and defaults are defined here once;
app/config.py's `Settings` declares its fields from them, and
tests/operability/test_settings.py checks both read any environment alike.
"""

from __future__ import annotations

import os
from typing import Final

ENV_PREFIX: Final = "BETTERCOMPUTE_"
DEFAULT_DATABASE_URL: Final = "sqlite+aiosqlite:///./bettercompute.db"
DB_STATEMENT_TIMEOUT_ENV: Final = "DB_STATEMENT_TIMEOUT_SECONDS"  # after ENV_PREFIX
DEFAULT_DB_STATEMENT_TIMEOUT_S: Final = 10.0


def _value(name: str) -> str | None:
    """The variable as pydantic-settings reads it: its name in any case, `VAR=` unset, and
    of several non-empty spellings the last one."""
    wanted = (ENV_PREFIX + name).lower()
    found = None
    for key, value in os.environ.items():
        if value and key.lower() == wanted:
            found = value
    return found


def database_url() -> str:
    return _value("DATABASE_URL") or DEFAULT_DATABASE_URL


def db_statement_timeout_s() -> float | None:
    """None when the variable is not a plain number: `Settings` then says what is wrong."""
    value = _value(DB_STATEMENT_TIMEOUT_ENV)
    if value is None:
        return DEFAULT_DB_STATEMENT_TIMEOUT_S
    try:
        return float(value)
    except ValueError:
        return None
