"""A YAML loader with bounds: safe tags only, at most ``MAX_NODES`` nodes once aliases are expanded.

``yaml.safe_load`` refuses ``!!python/object`` tags but not alias bombs: 400 bytes of nested
``&a [*b, *b, ...]`` anchors stand for billions of nodes, and every walk over the loaded data
(merging, number parsing, dataclass building) visits each of them. Here each node's expanded
size is counted as it is composed (an alias adds the size of the node it names), so a bomb is
refused after reading its text once, and a config of ordinary size (a few hundred nodes, anchors
and ``<<`` merges included) loads as before. Nesting deeper than ``MAX_DEPTH`` is refused too
(PyYAML would otherwise end in a ``RecursionError``).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_NODES = 100_000
"""Nodes of one document, aliases expanded (a full tracerl config has about 200)."""
MAX_DEPTH = 64
"""Nesting of one document (a tracerl config nests 4 levels)."""


class YamlBombError(ValueError):
    """A YAML document that expands past :data:`MAX_NODES` nodes or nests past :data:`MAX_DEPTH`."""


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts every node's expanded size while composing (see module doc)."""

    max_nodes = MAX_NODES
    max_depth = MAX_DEPTH

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}
        self._depth = 0
        self._open: set[str] = set()
        """Anchors of the nodes being composed now (an alias to one of them is a cycle)."""

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        if self._depth > self.max_depth:
            raise YamlBombError(f"nested deeper than {self.max_depth} levels")
        event = self.peek_event()
        anchor: str | None = getattr(event, "anchor", None)
        if isinstance(event, AliasEvent) and anchor in self._open:
            # ``a: &o {self: *o}``: the node would contain itself, and every walk over it would recurse
            # forever (a RecursionError hundreds of lines long).
            raise YamlBombError(f"uses the anchor &{anchor} inside itself at line {event.start_mark.line + 1} "
                                "(a recursive alias)")
        opened = anchor if anchor is not None and not isinstance(event, AliasEvent) else None
        if opened is not None:
            self._open.add(opened)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if opened is not None:
                self._open.discard(opened)
        if self._size(node) > self.max_nodes:
            raise YamlBombError(f"expands to more than {self.max_nodes} nodes (an alias bomb?)")
        return node

    def _size(self, node: Node) -> int:
        """Expanded node count of ``node``; children were composed (and sized) before it."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._sizes.get(id(child), 1) for child in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
        else:
            size = 1
        self._sizes[id(node)] = size
        return size


def load_bounded(text: str) -> Any:
    """Parse one YAML document with :class:`BoundedSafeLoader`.

    Raises :class:`YamlBombError` for a document past the bounds and ``yaml.YAMLError`` for
    invalid YAML; the caller names the file.
    """
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise YamlBombError(f"nested too deeply (past {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()
