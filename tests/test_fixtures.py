"""The shared fixtures keep their promises: clean tables, restarting sequences."""

from __future__ import annotations

from sqlalchemy import func, insert, select

from app.config import FAST_PATH_PIECES, Settings
from app.db.engine import Database
from app.db.models import Base, Event, Tenant, utcnow
from app.iam.roles import FLEET_TENANT
from tests.databases import empty_tables


async def _add_tenant_and_event(db: Database) -> int:
    async with db.writer.begin() as connection:
        await connection.execute(insert(Tenant).values(id="t-1", created_at=utcnow()))
        result = await connection.execute(
            insert(Event)
            .values(type="pool.created", pool_id="p-1", tenant_id="t-1", data={})
            .returning(Event.seq)
        )
        return int(result.scalar_one())


async def test_database_url_starts_empty_and_sequences_restart(
    db: Database, database_url: str
) -> None:
    async with db.reader.connect() as connection:
        for table in Base.metadata.sorted_tables:
            count = await connection.scalar(select(func.count()).select_from(table))
            expected = 1 if table is Tenant.__table__ else 0  # the built-in fleet tenant
            assert count == expected, table.name
        assert await connection.scalar(select(Tenant.id)) == FLEET_TENANT

    assert await _add_tenant_and_event(db) == 1
    await empty_tables(database_url)
    assert await _add_tenant_and_event(db) == 1


async def test_database_url_for_gives_the_same_database(
    dialect: str, database_url: str, database_url_for: object
) -> None:
    assert callable(database_url_for)
    assert await database_url_for(dialect) == database_url


def test_settings_take_the_path_the_environment_asks_for() -> None:
    """BETTERCOMPUTE_FAST_PATH=false (CI's plain-path run) reaches `Settings(...)`."""
    assert Settings().fast_path is Settings.from_env().fast_path
    for name in FAST_PATH_PIECES:  # and the mechanisms it sets, each also asked alone
        assert getattr(Settings(), name) is getattr(Settings.from_env(), name)
    assert Settings(fast_path=True).fast_path is True
