"""Run-time warnings as one console line each, once per run.

Python prints a warning as ``path:line: UserWarning: text`` plus the source line: in the demo a
268-column line about a starving stratum, three times in 40 steps, between the step lines.
Inside :func:`warnings_to_console` each warning becomes ``warning: text``, cut to the console's
width, and a warning that repeats with only its numbers changed is shown once; the full texts
are kept in the returned list (the demo writes them into its summary).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?")
"""A number standing alone (``0.0%``, ``49%``, ``10``), not one inside a name (``hops2``)."""


def warning_key(category: type[Warning], text: str) -> tuple[str, str]:
    """What makes two warnings the same: the category and the text with its numbers masked."""
    return category.__name__, _NUMBER.sub("#", " ".join(text.split()))


def one_line(text: str, width: int) -> str:
    """``warning: text`` on one line of at most ``width`` characters (cut with ``...``)."""
    line = "warning: " + " ".join(text.split())
    return line if len(line) <= width else line[: max(width - 3, 0)].rstrip() + "..."


@contextmanager
def warnings_to_console(echo: Callable[[str], None], width: int) -> Iterator[list[str]]:
    """Within the block, show each distinct warning as one ``echo`` line (see module docstring);
    yields the list the full texts of the shown warnings are appended to. The warning filters
    and ``warnings.showwarning`` are restored on exit."""
    shown: list[str] = []
    seen: set[tuple[str, str]] = set()

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        text = str(message)
        key = warning_key(category, text)
        if key in seen:
            return
        seen.add(key)
        shown.append(" ".join(text.split()))
        echo(one_line(text, width))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield shown
