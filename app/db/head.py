"""The newest Alembic revision, as a constant the CLI reads without importing Alembic.

`bettercompute` compares it with the embedded SQLite file's `alembic_version` to skip the
migration step on every command (about a second of imports). tests/db/test_migrations.py
keeps it equal to the chain's real head: a new revision must update it.
"""

from __future__ import annotations

from typing import Final

HEAD_REVISION: Final = "0011"
