"""Which fields a query selects below the current one, fragments followed.

Lets a list resolver load a nested list for the whole page at once, before any item is
resolved, so items need no futures or resolvers of their own. Read from strawberry's
`info.selected_fields` (its public view of the selection). Directives are not applied:
a field under `@skip` counts as selected, which at worst loads a list nobody reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from strawberry import Info
from strawberry.types.nodes import FragmentSpread, InlineFragment, SelectedField, Selection


def _fields(selections: Iterable[Selection]) -> Iterable[SelectedField]:
    for selection in selections:
        if isinstance(selection, SelectedField):
            yield selection
        elif isinstance(selection, FragmentSpread | InlineFragment):
            yield from _fields(selection.selections)


def selected_below(info: Info, *paths: tuple[str, ...]) -> set[str]:
    """The field names selected at any of `paths` below the current field, e.g.
    `("nodes",)` and `("edges", "node")` for the items of a connection."""
    current = list(_fields(info.selected_fields))  # this field, once per node selecting it
    names: set[str] = set()
    for path in paths:
        level = current
        for step in path:
            level = [
                child for node in level for child in _fields(node.selections) if child.name == step
            ]
        for node in level:
            names.update(child.name for child in _fields(node.selections))
    return names
