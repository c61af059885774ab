"""`CodePoint`: a string to order or compare by code point, as Python orders `str`, on
both dialects. PostgreSQL's database collation need not be (`COLLATE "C"`); SQLite's
default (BINARY) is. Wherever Python and SQL must agree on an order (the usage relay's
marks, app/events/usage.py; lending's ties, app/capacity/read_rules.py)."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.sql.functions import FunctionElement

from app.db.dialect_sql import per_dialect


class CodePoint(FunctionElement[str]):
    """A text value ordered by code point."""

    type = String()
    name = "code_point"
    inherit_cache = True


# SQLite's default collation (BINARY) orders by code point already.
per_dialect(CodePoint, default="{0}", postgresql='({0} COLLATE "C")')
