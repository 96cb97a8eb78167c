"""tracerl.train: configs, presets, the trainer, and the public Python API.

``trainer(preset, out, overrides=..., reward=fn, tools=[fn])`` builds a checked run,
``.run()`` trains it, ``read_metrics(out)`` reads ``metrics.jsonl`` back. Names are imported
on first use, so ``import tracerl.train.config`` stays as light as before.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "trainer": "tracerl.train.api",
    "Trainer": "tracerl.train.loop",
    "TrainConfig": "tracerl.train.config",
    "resolve_config": "tracerl.train.config",
    "PRESETS": "tracerl.train.presets",
    "read_metrics": "tracerl.train.metrics",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tracerl.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
