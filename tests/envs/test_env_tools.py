"""Typed tools: schema from the signature, argument checks, failures attributed correctly."""

from __future__ import annotations

import pytest

from tracerl.envs.tools import Tool, ToolCallError, ToolFailure, ToolSet


def lookup(key: str, limit: int = 3, scale: float = 1.0) -> str:
    """Look a key up.

    Longer explanation that is not part of the description.
    """
    return f"{key}:{limit}:{scale}"


def broken(query: str) -> str:
    """Always fails."""
    raise KeyError(query)


def test_schema_from_signature() -> None:
    tool = Tool.from_function(lookup)
    assert tool.schema() == {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}, "limit": {"type": "integer"}, "scale": {"type": "number"}},
            "required": ["key"],
        },
    }


def test_call_and_argument_errors() -> None:
    tools = ToolSet([lookup, broken])
    assert tools.names == ("lookup", "broken")
    assert tools.call("lookup", {"key": "k", "scale": 2}) == "k:3:2.0"
    for args, needle in [({}, "missing argument key"), ({"key": "k", "x": 1}, "unexpected argument x"),
                         ({"key": 5}, "key must be of type string"), ({"key": "k", "limit": True}, "limit must be of type integer"),
                         ({"key": "  "}, "key is empty")]:
        with pytest.raises(ToolCallError, match=needle):
            tools.call("lookup", args)
    with pytest.raises(ToolCallError, match="unknown tool nope"):
        tools.call("nope", {})
    with pytest.raises(ToolFailure, match="KeyError"):
        tools.call("broken", {"query": "q"})


def test_bad_tool_definitions() -> None:
    def answer(text: str) -> str:
        """Reserved."""
        return text

    def nodoc(x: str) -> str:
        return x

    def untyped(x) -> str:  # noqa: ANN001
        """No hint."""
        return x

    for fn, needle in [(answer, "reserved"), (nodoc, "docstring"), (untyped, "hint")]:
        with pytest.raises(ValueError, match=needle):
            Tool.from_function(fn)
    with pytest.raises(ValueError, match="duplicate"):
        ToolSet([lookup, lookup])
