"""The embedded SQLite default migrates itself, and costs nothing when it is current.

Running Alembic imports about a second of code, so `bettercompute` first reads the file's
`alembic_version` with the stdlib and migrates only when it is behind (or missing).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

from app.db.head import HEAD_REVISION


def is_embedded(url: str) -> bool:
    """An SQLite URL (`sqlite://…`, `sqlite+aiosqlite://…`), told without SQLAlchemy."""
    return url.partition(":")[0].partition("+")[0] == "sqlite"


def _sqlite_path(url: str) -> str | None:
    """The file of `sqlite[+driver]:///path`, or None for memory and URLs with options."""
    _, sep, rest = url.partition(":///")
    if not sep or "?" in rest or rest in ("", ":memory:"):
        return None
    return rest


def at_head(url: str) -> bool:
    """Whether the embedded database at `url` is already at HEAD_REVISION."""
    path = _sqlite_path(url)
    if path is None or not Path(path).is_file():
        return False
    try:
        with closing(sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=30)) as conn:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return False  # not migrated yet, or unreadable: let Alembic say what is wrong
    return rows == [(HEAD_REVISION,)]


async def ensure_migrated(url: str) -> None:
    """Migrate the embedded default when it is behind; other databases are left alone."""
    if is_embedded(url) and not at_head(url):
        from app.db.migrate import upgrade

        await upgrade(url)
