"""Alembic environment for both dialects.

Called two ways:
- from the service (app.db.migrate), which hands over an open connection in
  `config.attributes["connection"]`, already inside a transaction that it commits;
- from the `alembic` command line, which opens its own connection to `-x url=...`
  or BETTERCOMPUTE_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import JSON
from sqlalchemy.engine import Connection

from app.config import Settings
from app.db.migrate import lock_schema, migration_engine
from app.db.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    return url or config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url


def _render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Autogenerate spells our column types without importing app code."""
    if type_ != "type":
        return False
    if isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if isinstance(obj, JSON) and "postgresql" in getattr(obj, "_variant_mapping", {}):
        autogen_context.imports.add("from sqlalchemy.dialects import postgresql")
        return 'sa.JSON().with_variant(postgresql.JSONB(), "postgresql")'
    return False


def _configure(**options: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite alters tables by recreating them
        compare_type=True,
        render_item=_render_item,
        **options,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    """Emit the SQL script instead of running it (`alembic upgrade head --sql`)."""
    _configure(url=_database_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    lock_schema(connection)
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = migration_engine(_database_url())
    try:
        async with engine.begin() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        asyncio.run(run_async_migrations())
    else:
        do_run_migrations(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
