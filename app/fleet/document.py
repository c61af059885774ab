"""Decoding a fleet file within bounds: its size, its nesting and what its aliases expand to.

A fleet file is written by people, but it is still input: a deep nesting overflowed the
composer's recursion (INTERNAL), and YAML aliases let a few kilobytes stand for millions of
nodes, which validation then walked one by one. So the bytes are counted before anything
is parsed, and the YAML composer counts as it builds the node graph: collections nested
deeper than `max_depth`, or aliases that together repeat more than `max_alias_nodes`
nodes, stop it at that event, with INVALID_INPUT naming its line and column. Each check is
constant work per event and the composer stops at the first bound passed, so refusing a
file costs time linear in the part of it read. The bounds are settings
(`BETTERCOMPUTE_FLEET_FILE_MAX_*`, app/config.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
import yaml.cyaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from app.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class FileBounds:
    max_bytes: int = 1_048_576
    max_depth: int = 32  # collections (mappings, sequences) inside one another
    max_alias_nodes: int = 10_000  # nodes the file's aliases repeat, all together


def refused(source: str, line: int, column: int, message: str) -> InvalidInput:
    """INVALID_INPUT at a place in the file (1-based line and column)."""
    return InvalidInput(
        f"{source}: line {line}, column {column}: {message}", field="file", line=line, column=column
    )


def _place(data: bytes | str, offset: int) -> tuple[int, int]:
    """1-based line and column of an offset (bytes or characters, as `data` counts)."""
    newline: Any = b"\n" if isinstance(data, bytes) else "\n"
    line = data.count(newline, 0, offset) + 1
    return line, offset - (data.rfind(newline, 0, offset) + 1) + 1


def decode_text(data: bytes | str, source: str, bounds: FileBounds) -> str:
    """The file's text: at most `max_bytes` bytes of UTF-8."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > bounds.max_bytes:
        line, column = _place(raw, bounds.max_bytes)
        raise refused(
            source,
            line,
            column,
            f"the file is larger than {bounds.max_bytes} bytes "
            "(BETTERCOMPUTE_FLEET_FILE_MAX_BYTES)",
        )
    if isinstance(data, str):
        return data
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _place(raw, exc.start)
        raise refused(source, line, column, "not UTF-8 text") from None


# JSON strings (whose brackets are text) and brackets; possessive, so never backtracking.
_JSON_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')


def check_json_depth(text: str, source: str, bounds: FileBounds) -> None:
    """JSON has no aliases; its nesting is checked by one pass before it is parsed."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > bounds.max_depth:
                line, column = _place(text, token.start())
                raise refused(source, line, column, _too_deep(bounds))
        elif bracket in "]}":
            depth -= 1


def _too_deep(bounds: FileBounds) -> str:
    return f"nested deeper than {bounds.max_depth} levels (BETTERCOMPUTE_FLEET_FILE_MAX_DEPTH)"


class PythonEvents(Reader, Scanner, Parser):
    """PyYAML's own scanner and parser: the events when PyYAML was built without libyaml."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)


# The events come from libyaml when PyYAML has it (its wheels do): several times faster
# than PyYAML's own scanner, and just as lazy. The composer above them is PyYAML's, so its
# node graph (and what is constructed from it) is safe_load's.
EVENT_SOURCES: tuple[type, ...] = (
    (yaml.cyaml.CParser, PythonEvents) if yaml.__with_libyaml__ else (PythonEvents,)  # type: ignore[attr-defined]
)


class _BoundedComposer(Composer):
    """safe_load's composer, counting depth and alias expansion as it goes."""

    def __init__(self, source: str, bounds: FileBounds) -> None:
        Composer.__init__(self)
        self.source = source
        self.bounds = bounds
        self.depth = 0
        self.alias_nodes = 0
        # Per composed node (by id; the graph keeps them alive): (nodes, height), what an
        # alias to it repeats. A node still being composed has none yet.
        self.shapes: dict[int, tuple[int, int]] = {}

    def _refused(self, mark: Any, message: str) -> InvalidInput:
        return refused(self.source, mark.line + 1, mark.column + 1, message)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[attr-defined]
        mark = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is the composer's own error
                shape = self.shapes.get(id(target))
                if shape is None:
                    raise self._refused(mark, "an alias inside the node it names")
                nodes, height = shape
                self.alias_nodes += nodes
                if self.alias_nodes > self.bounds.max_alias_nodes:
                    raise self._refused(
                        mark,
                        f"aliases repeat more than {self.bounds.max_alias_nodes} nodes "
                        "(BETTERCOMPUTE_FLEET_FILE_MAX_ALIAS_NODES)",
                    )
                if self.depth + height > self.bounds.max_depth:
                    raise self._refused(mark, _too_deep(self.bounds))
            return super().compose_node(parent, index)
        collection = isinstance(event, yaml.CollectionStartEvent)
        if collection:
            self.depth += 1
            if self.depth > self.bounds.max_depth:
                raise self._refused(mark, _too_deep(self.bounds))
        try:
            node = super().compose_node(parent, index)
        finally:
            if collection:
                self.depth -= 1
        if node is not None:
            self.shapes[id(node)] = self._shape(node)
        return node

    def _shape(self, node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, 0
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = node.value
        shapes = [self.shapes[id(child)] for child in children]
        return 1 + sum(s[0] for s in shapes), 1 + max((s[1] for s in shapes), default=0)


def _loader(events: Any) -> type:
    class BoundedLoader(_BoundedComposer, events, SafeConstructor, Resolver):  # type: ignore[misc]
        def __init__(self, text: str, source: str, bounds: FileBounds) -> None:
            events.__init__(self, text)
            _BoundedComposer.__init__(self, source, bounds)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    return BoundedLoader


_LOADERS = {events: _loader(events) for events in EVENT_SOURCES}


def load_yaml(
    text: str, source: str, bounds: FileBounds, events: type = EVENT_SOURCES[0]
) -> object:
    """`yaml.safe_load` with the composer bounded (see the module's docstring)."""
    loader = _LOADERS[events](text, source, bounds)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
