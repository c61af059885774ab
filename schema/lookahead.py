"""Which fields a query selects below the current one, fragments followed.

Lets a list resolver load a nested list for the whole page at once, before any item is
resolved, so items need no futures or resolvers of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    SelectionSetNode,
)
from strawberry import Info


def _fields(
    selection_set: SelectionSetNode | None, fragments: dict[str, FragmentDefinitionNode]
) -> Iterable[FieldNode]:
    if selection_set is None:
        return
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            yield selection
        elif isinstance(selection, InlineFragmentNode):
            yield from _fields(selection.selection_set, fragments)
        elif isinstance(selection, FragmentSpreadNode):
            fragment = fragments.get(selection.name.value)
            if fragment is not None:
                yield from _fields(fragment.selection_set, fragments)


def selected_below(info: Info, *paths: tuple[str, ...]) -> set[str]:
    """The field names selected at any of `paths` below the current field, e.g.
    `("nodes",)` and `("edges", "node")` for the items of a connection."""
    fragments = info._raw_info.fragments
    names: set[str] = set()
    for path in paths:
        level: list[FieldNode] = list(info._raw_info.field_nodes)
        for step in path:
            level = [
                child
                for node in level
                for child in _fields(node.selection_set, fragments)
                if child.name.value == step
            ]
        for node in level:
            names.update(child.name.value for child in _fields(node.selection_set, fragments))
    return names
