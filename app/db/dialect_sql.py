"""SQL functions that each dialect writes its own way, declared as templates: a
`FunctionElement` subclass and one text per dialect (`default` for any dialect not
named), where `{0}` stands for its arguments. One mechanism for the outbox's, the usage
relay's, the collation's and the compiled reads' dialect seams."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


def per_dialect(element: type[FunctionElement[Any]], **templates: str) -> None:
    """Compile `element` on each dialect named by `templates` (`default`: any other):
    its one argument (or its arguments, comma separated) where the template says `{0}`."""
    for dialect, template in templates.items():

        def render(
            e: FunctionElement[Any], compiler: SQLCompiler, template: str = template, **kw: Any
        ) -> str:
            return template.format(compiler.process(e.clauses, **kw))

        compiles(element, dialect)(render)
