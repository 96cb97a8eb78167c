"""What one ``generate`` call takes and returns: :class:`SamplingParams`, :class:`Generation`, and the
per-row stop-string check (:class:`StopChecker`) every decode loop shares.

Kept apart from :mod:`~tracerl.models.backend` so the decode engines
(:mod:`~tracerl.models.decode_async`, :mod:`~tracerl.models.static_decode`) use them without importing
the backend that drives them; :mod:`~tracerl.models.backend` re-exports all four.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How one ``generate`` call samples."""

    max_new_tokens: int
    """Hard cap on generated tokens per row (ends the row with finish_reason "length")."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    stop_strings: tuple[str, ...] = ()
    """A row stops once its decoded generated text contains any of these (tokens kept)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must not contain empty strings")


@dataclass
class Generation:
    """One sampled continuation of one prefix."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    state: list[float] | None = None
    """The policy's last-layer hidden state [H] at the prefix's last token (the state the turn was
    sampled from), when the backend records states (:attr:`HFPolicy.record_states`); else None."""


class StopChecker:
    """Per-row stop-string detection on a short decoded tail (avoids O(n^2) decoding)."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        # A stop string can span at most len(s) tokens when each token decodes to >= 1 char;
        # a few extra tokens cover byte-level pieces that decode to partial characters.
        self.window = max((len(s) for s in stop_strings), default=0) + 4

    def hit(self, generated: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(generated[-self.window :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)
