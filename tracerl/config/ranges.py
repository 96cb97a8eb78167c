"""Number checks of a whole config: no boolean where a number belongs, every number in a range
the code can compute with.

YAML reads ``true`` as a boolean and Python's ``bool`` is an ``int``, so ``steps=true`` would
train one step and ``optim.lr=true`` at a learning rate of 1. A float past ~3.4e38 overflows
float32 (``optim.lr=3e38`` passed validation and crashed AdamW's step 200 lines deep) and an
integer past int64 overflows torch (a huge ``seed`` failed in ``torch.manual_seed`` naming no
field). Ranges here are about what can be computed, not about good hyperparameters: a learning
rate of 1e30 is accepted (and destroys the model, which the divergence check catches).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from tracerl.config.loading import ConfigError

FLOAT_LIMIT = 1e30
"""Largest magnitude of any float field: ~1e8 below float32's maximum, so products such as
AdamW's ``lr / (1 - beta1)`` or a loss times ``kl_coef`` stay representable."""
INT_LIMIT = 2**63 - 1
"""Largest magnitude of any integer field (torch's int64: seeds, counts, sizes)."""
WORLD_ENTITIES = 100_000
"""Most entities of one kind in a SynthWiki world (``data.world.num_people`` and the like)."""
WORLD_QUESTIONS = 1_000_000
"""Most questions of one split of a SynthWiki world (``data.world.num_train``, ``num_test``)."""
FIELD_RANGES: dict[str, tuple[float, float]] = {
    "optim.lr": (0.0, FLOAT_LIMIT),
    "data.tool_timeout_s": (0.0, 1e6),  # ~11 days; threading and poll timeouts overflow near 1e10 s
    # SynthWiki is built in memory at start: ~0.7 ms and ~3 KB per entity, so 100k of a kind is about a
    # minute and a few hundred MB; a billion people was a 3.5 GB MemoryError after three minutes.
    **{f"data.world.num_{kind}": (0, WORLD_ENTITIES) for kind in ("people", "cities", "countries", "books", "bands",
                                                                  "companies")},
    "data.world.num_train": (0, WORLD_QUESTIONS),
    "data.world.num_test": (0, WORLD_QUESTIONS),
    "data.train_worlds": (0, 1000),
}
"""Closed ranges of the fields whose computable range is narrower than the generic one."""


def check_numbers(config: Any, section: str = "") -> None:
    """Raise :class:`ConfigError` naming the first field of ``config`` (recursively) holding a
    boolean in place of a number or a number out of range."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value, where = getattr(config, f.name), f"{section}.{f.name}" if section else f.name
        if dataclasses.is_dataclass(value):
            check_numbers(value, where)
            continue
        kinds = _number_kinds(hints[f.name])
        if not kinds:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            _check_number(where, item, kinds)


def _number_kinds(hint: Any) -> set[type]:
    """``int``/``float`` named by a field's type (``int``, ``float | None``, ``tuple[float, float]``)."""
    if hint in (int, float):
        return {hint}
    return {arg for arg in typing.get_args(hint) if arg in (int, float)}


def _check_number(where: str, value: Any, kinds: set[type]) -> None:
    if isinstance(value, bool):
        expected = " or ".join(sorted("an integer" if k is int else "a number" for k in kinds))
        raise ConfigError(f"{where} = {value}: expected {expected}, not a boolean")
    if not isinstance(value, (int, float)):
        return
    low, high = FIELD_RANGES.get(where, (-FLOAT_LIMIT, FLOAT_LIMIT) if isinstance(value, float)
                                 else (-INT_LIMIT, INT_LIMIT))
    if not low <= value <= high:  # (range starts at 0 where the field's own check needs > 0)
        raise ConfigError(f"{where} = {_short(value)} is out of range: it must lie in [{_bound(low)}, {_bound(high)}]")


def _short(value: int | float) -> str:
    """A number as the message shows it (a 4,000-digit integer is not printed whole)."""
    if isinstance(value, int) and abs(value) >= 10**20:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # past Python's 4300-digit conversion limit
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bound(limit: float) -> str:
    if abs(limit) == INT_LIMIT:
        return "2**63-1" if limit > 0 else "-(2**63-1)"
    return f"{limit:g}"
