"""``tracerl world build --size``: which SynthWiki world sizes a built world takes.

The embedded tiny model's word-level vocabulary holds the names of the worlds it was pretrained on
(:data:`~tracerl.testbed.tiny_config.DEFAULT_WORLD`: ~700 entities, name seed 0). A world of those
sizes and that name seed, under any new fact seed, uses only names it knows; SynthWiki's own default
(2,800 entities) has names it cannot encode: 75 of 100 sampled gold answers of fact seed 7, which
``tracerl eval`` and ``tracerl train`` refuse. So ``tiny`` is the default size.
"""

from __future__ import annotations

from dataclasses import replace

from tracerl.envs.synthwiki import WorldConfig
from tracerl.errors import UsageError

WORLD_SIZES = ("tiny", "full")


def world_config(size: str, **fields: int) -> WorldConfig:
    """The :class:`WorldConfig` of ``size`` (``tiny``: the embedded model's sizes; ``full``: SynthWiki's
    defaults) with ``fields`` (seeds, question counts, hops, distractors) set."""
    if size == "full":
        return WorldConfig(**fields)
    if size == "tiny":
        from tracerl.testbed.tiny_config import DEFAULT_WORLD

        return replace(DEFAULT_WORLD, **fields)
    raise UsageError(f"--size must be one of {', '.join(WORLD_SIZES)}, got {size!r}")
