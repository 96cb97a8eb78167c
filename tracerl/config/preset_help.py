"""One line per training preset, for ``tracerl train --help``, and the refusal of an unknown preset name.

The presets themselves are in :mod:`tracerl.config.presets` (which imports torch: too slow for the
help of a command line); ``tests/test_cli_ux_round3.py`` checks that :data:`PRESET_HELP` names every
preset, in order, once, so a new preset cannot reach the help or the refusal without its line.
"""

from __future__ import annotations

import difflib

PRESET_HELP: dict[str, str] = {
    "grpo": "GRPO: groups of chains, group-normalised reward",
    "dapo": "DAPO: all-same groups dropped and refilled",
    "gigpo": "GiGPO: GRPO plus step-level groups of like states",
    "gspo": "GSPO: GRPO rollouts, sequence-level ratio",
    "tree_grpo": "Tree-GRPO: random tree expansion, tree advantage",
    "trace_alloc": "TRACE allocation: learned roots and tree prefixes",
    "trace_credit": "TRACE credit: reference readiness as turn credit",
    "trace": "TRACE: allocation and credit together",
    "trace_alloc_uu": "trace_alloc, uniform roots, uniform prefixes",
    "trace_alloc_ul": "trace_alloc, uniform roots, learned prefixes",
    "trace_alloc_lu": "trace_alloc, learned roots, uniform prefixes",
    "trace_alloc_notree": "trace_alloc, learned roots, no tree",
    "grpo_4x16": "GRPO, 4 prompts x 16 rollouts a step",
    "grpo_twohop": "GRPO trained on two-hop questions only",
    "trace_alloc_floor": "trace_alloc, two rollouts for every pool prompt",
    "trace_alloc_coverage": "trace_alloc, stage-1 roots chosen for coverage",
    "trace_alloc_explore": "trace_alloc, a quarter of stage 1 drawn uniformly",
    "trace_alloc_rootstage1": "trace_alloc, root targets from stage-1 rewards",
    "trace_credit_k1": "trace_credit, credit horizon 1",
    "trace_credit_gated": "trace_credit, turn term centred in mixed groups",
    "trace_credit_gated_k1": "trace_credit_gated with horizon 1",
    "trace_credit_gated_turn": "trace_credit, turn term centred per turn index",
    "trace_credit_clip": "trace_credit, turn credit clipped at 0.2",
    "trace_credit_once": "trace_credit, outcome counted once per token",
}
"""``{preset: one line}``, in the order of :data:`~tracerl.config.presets.PRESETS` (the same names)."""
PRESETS = tuple(PRESET_HELP)


def presets_epilog() -> str:
    """Every preset with its line, one a line, for the end of ``tracerl train --help``."""
    width = max(len(name) for name in PRESETS) + 2
    rows = [f"  {name:<{width}}{PRESET_HELP[name]}" for name in PRESETS]
    return f"Presets ({len(PRESETS)}):\n\n" + "\n".join(rows)


METHODS = ("grpo", "dapo", "gigpo", "gspo", "tree_grpo", "trace_alloc", "trace_credit", "trace")
"""The method presets; the others are variants of one (``trace_alloc_uu``) and are listed under it."""


def _method_of(name: str) -> str | None:
    """The longest method whose name and ``_`` start ``name`` (``trace_alloc`` for ``trace_alloc_uu``)."""
    owners = [m for m in METHODS if name.startswith(f"{m}_") and name not in METHODS]
    return max(owners, key=len) if owners else None


def preset_names() -> str:
    """All preset names, short: the variants of a method as ``method_{a,b}`` (shell brace style)."""
    parts = []
    for name in PRESETS:
        if _method_of(name) is not None:
            continue
        parts.append(name)
        variants = [v[len(name) + 1:] for v in PRESETS if _method_of(v) == name]
        if variants:
            parts.append(f"{name}_{{{','.join(variants)}}}")
    return ", ".join(parts)


def unknown_preset(name: str) -> str:
    """The one-line refusal of an unknown preset: the closest names, then every name."""
    close = difflib.get_close_matches(str(name), list(PRESETS), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown preset {name!r}{hint}; valid presets: {preset_names()} (tracerl train --help: one line each)"
