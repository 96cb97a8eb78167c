"""Where an assistant turn ends: the pure text rules the agent formats apply.

A backend stops sampling on plain strings (all a vLLM engine can match); these functions decide
whether the text at such a stop completes the turn, and what the engine must force after it.
They never raise and read only the text, so the parser and the stop rule agree by construction
(``ReactFormat.parse`` uses :func:`action_end` too).
"""

from __future__ import annotations

import re

_BRACKETS = re.compile(r"[\[\]\n]")
OBSERVATION_MARK = "\nObservation:"
"""What introduces a react observation; the policy writes it in pretraining texts, the engine forces
what of it the policy did not write (a turn now ends at the action's ``]``)."""


def action_end(text: str, start: int) -> tuple[int, bool] | None:
    """Where a react action whose ``[`` ends at ``start`` ends: ``(index, closed)``, or None while open.

    ``closed``: ``text[index]`` is the ``]`` that balances the ``[`` (nested pairs belong to the
    argument, ``answer[a [b] c]``). Not closed: ``text[index]`` is a newline met first, which makes
    the action malformed (the argument must sit on one line, as the parser always required).
    """
    depth = 1
    for match in _BRACKETS.finditer(text, start):
        char = match.group()
        if char == "\n":
            return match.start(), False
        depth += 1 if char == "[" else -1
        if depth == 0:
            return match.start(), True
    return None


def unwritten_mark(written: str, mark: str) -> str:
    """The part of ``mark`` still to force after ``written``: none when ``written`` holds the mark
    (the turn stopped on it), else what its longest suffix that starts ``mark`` leaves over."""
    if mark.strip() in written:
        return ""
    for k in range(len(mark) - 1, 0, -1):
        if written.endswith(mark[:k]):
            return mark[k:]
    return mark


def strip_think(text: str) -> str | None:
    """The text after the last ``</think>``; None when a think block was opened and never closed."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return None if "<think>" in text else text


def tagged_ends_turn(text: str, end_token: str = "") -> bool:
    """Whether a tagged turn that stopped on a closing tag is complete: yes on the end-of-turn
    token, else only when the stop is not inside a think block left open (the parser would call
    such a turn invalid; the policy was quoting a tag while reasoning, so it samples on)."""
    return bool(end_token and end_token in text) or strip_think(text) is not None
