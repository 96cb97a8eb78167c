"""tracerl.train: the training loop, its update, starting and resuming runs, and the public Python API.

``trainer(preset, out, overrides=..., reward=fn, tools=[fn])`` builds a checked run,
``.run()`` trains it, ``read_metrics(out)`` reads ``metrics.jsonl`` back. The config
(:mod:`tracerl.config`) and the run folder (:mod:`tracerl.runs`) have rooms of their own; their
main names are re-exported here. Names are imported on first use, so ``import tracerl.train``
loads no model code.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "trainer": "tracerl.train.api",
    "Trainer": "tracerl.train.loop",
    "TrainConfig": "tracerl.config.schema",
    "resolve_config": "tracerl.config.schema",
    "PRESETS": "tracerl.config.presets",
    "read_metrics": "tracerl.runs.metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tracerl.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
