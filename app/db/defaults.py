"""Column defaults, each defined once: the models declare them (app/db/models.py) and the
embedded store, which writes without SQLAlchemy (app/db/embedded_rows.py), applies them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

# A new site's agents start at this desired-state revision (bumped by pool changes).
FIRST_AGENT_REVISION: Final = 1


def utcnow() -> datetime:
    return datetime.now(UTC)
