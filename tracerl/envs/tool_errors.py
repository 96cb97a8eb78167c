"""How a tool call fails, and the bound on what a failure may say.

A wrong call is the policy's fault (:class:`ToolCallError`); an exception inside the tool, a
timeout or a dead worker process is the environment's (:class:`ToolFailure`). A failure's message
is cut to :data:`MAX_FAILURE_CHARS` (:func:`bounded_message`), so a tool raising 10 MB costs nothing
downstream.

A module of its own because both places a tool runs raise these: in-process
(:mod:`tracerl.envs.tools`) and in the killable worker process (:mod:`tracerl.envs.isolation`),
and the first hands isolated calls to the second.
"""

from __future__ import annotations

MAX_FAILURE_CHARS = 1000
"""Characters kept of a tool failure's message (the observation and the tool-health report)."""


class ToolCallError(ValueError):
    """The policy called a tool wrongly (unknown name, missing/extra/mistyped argument)."""


class ToolFailure(RuntimeError):
    """The tool itself raised: an infrastructure failure, not the policy's fault."""


def bounded_message(text: str, max_chars: int = MAX_FAILURE_CHARS) -> str:
    """``text`` cut to ``max_chars`` characters, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [{len(text) - max_chars} more characters cut]"
