"""`CodePoint`: a string to order or compare by code point, as Python orders `str`, on
both dialects. PostgreSQL's database collation need not be (`COLLATE "C"`); SQLite's
default (BINARY) is. Wherever Python and SQL must agree on an order (the usage relay's
marks, app/events/usage.py; lending's ties, app/capacity/read_rules.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class CodePoint(FunctionElement[str]):
    """A text value ordered by code point."""

    type = String()
    name = "code_point"
    inherit_cache = True


@compiles(CodePoint)
def _code_point(element: CodePoint, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)  # SQLite's BINARY collation


@compiles(CodePoint, "postgresql")
def _code_point_postgresql(element: CodePoint, compiler: SQLCompiler, **kw: Any) -> str:
    return f'({compiler.process(element.clauses, **kw)} COLLATE "C")'
