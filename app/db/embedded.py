"""The embedded SQLite default migrates itself, and costs nothing when it is current.

Running Alembic imports about a second of code, so `bettercompute` first reads the file's
`alembic_version` with the stdlib and migrates only when it is behind (or missing). A file
at head is then written with the stdlib too (app/db/embedded_rows.py). Every connection
to the file, whichever driver opens it, starts with `connection_pragmas`.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from app.db.head import HEAD_REVISION


def is_embedded(url: str) -> bool:
    """An SQLite URL (`sqlite://…`, `sqlite+aiosqlite://…`), told without SQLAlchemy."""
    return url.partition(":")[0].partition("+")[0] == "sqlite"


def sqlite_file(url: str) -> str | None:
    """The file of `sqlite[+driver]:///path`, or None for memory and URLs with options.
    Percent-escapes are decoded, as SQLAlchemy decodes them."""
    if not is_embedded(url):
        return None
    _, sep, rest = url.partition(":///")
    if not sep or "?" in rest or rest in ("", ":memory:"):
        return None
    return unquote(rest)


def file_uri(path: str, mode: str) -> str:
    """A URI for `sqlite3.connect(..., uri=True)` that opens `path` and never creates it."""
    return f"file:{quote(path)}?mode={mode}"


def busy_timeout_ms(statement_timeout_s: float) -> int:
    """SQLite's wait for the write lock: the statement timeout (app/config.py)."""
    return max(1, round(statement_timeout_s * 1000))


# Functions the domain's statements call (app/capacity/json_sql.py: a page's cursors), by
# name: (number of arguments, function). Defined, deterministic, on every connection of
# the server's to the file (the engines' and app/db/direct_sqlite.py's) as it opens; the
# domain defines them when its modules load, before any connection opens.
SQL_FUNCTIONS: dict[str, tuple[int, Callable[..., Any]]] = {}


def define_sql_function(name: str, arguments: int, function: Callable[..., Any]) -> None:
    SQL_FUNCTIONS[name] = (arguments, function)


def connection_pragmas(busy_timeout: int) -> tuple[str, ...]:
    """Foreign keys enforced; WAL, so reads run beside the one writer; the write lock
    waited for up to `busy_timeout` milliseconds."""
    return (
        "PRAGMA foreign_keys=ON",
        "PRAGMA journal_mode=WAL",
        "PRAGMA synchronous=NORMAL",
        f"PRAGMA busy_timeout={busy_timeout}",
    )


def at_head(url: str) -> bool:
    """Whether the embedded database at `url` is already at HEAD_REVISION."""
    path = sqlite_file(url)
    if path is None or not Path(path).is_file():
        return False
    try:
        with closing(sqlite3.connect(file_uri(path, "ro"), uri=True, timeout=30)) as conn:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return False  # not migrated yet, or unreadable: let Alembic say what is wrong
    return rows == [(HEAD_REVISION,)]


async def ensure_migrated(url: str) -> None:
    """Migrate the embedded default when it is behind; other databases are left alone."""
    if is_embedded(url) and not at_head(url):
        from app.db.migrate import upgrade

        await upgrade(url)


@contextmanager
def scratch_copy(url: str) -> Iterator[str]:
    """A throwaway copy of the embedded database at `url` (empty when there is no file),
    as a URL, removed afterwards: what a read-only command migrates and reads instead of
    writing the operator's file."""
    path = sqlite_file(url)
    with tempfile.TemporaryDirectory(prefix="bettercompute-") as scratch:
        copy = os.path.join(scratch, "copy.db")
        if path is not None and Path(path).is_file():
            source = sqlite3.connect(file_uri(path, "ro"), uri=True, timeout=30)
            target = sqlite3.connect(copy)
            with closing(source), closing(target):
                source.backup(target)  # consistent under WAL, unlike copying the file
        yield f"{url.partition(':///')[0]}:///{quote(copy)}"
