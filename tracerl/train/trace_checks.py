"""Cross-field checks of the TRACE options beside the papers' forms (docs/TRACE.md sections 2-3).

Each option is validated in its own dataclass; what needs two sections (the agent format and the
scoring prefix, the scheme and its allocation mode) is checked here, once, from
``TrainConfig.__post_init__``, and raises :class:`ConfigError` naming the fields.
"""

from __future__ import annotations

from typing import Any

from tracerl.train.config_io import ConfigError

THINK_FORMATS = ("chat", "search_r1")
"""Formats whose answer turns may open with a think block (``algo.score_after_empty_think``)."""


def check_trace_options(cfg: Any) -> None:
    """Raise :class:`ConfigError` when TRACE options contradict the rest of ``cfg`` (a TrainConfig)."""
    if cfg.algo.score_after_empty_think and cfg.model.format not in THINK_FORMATS:
        raise ConfigError(f"algo.score_after_empty_think needs model.format in {', '.join(THINK_FORMATS)} "
                          f"(a format with think blocks), got {cfg.model.format!r}")
