"""The ``optim.divergence`` section: when a run counts as diverged (the monitor that applies it is
:mod:`tracerl.runs.divergence`)."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("stop", "warn", "rollback", "off")


@dataclass
class DivergenceConfig:
    """When a run counts as diverged (``optim.divergence``)."""

    mode: str = "warn"
    """``warn``: one line on stderr per kind of divergence, training goes on; ``stop``: end the run
    with that line (the diverged step is not checkpointed); ``rollback``: end the run on the newest
    checkpoint written before the divergence began (restored in place, ``LATEST`` moved back to
    it; the later checkpoints are renamed ``diverged-ckpt-NNNNNN``); ``off``: no tests."""
    jump_factor: float = 1000.0
    """Loss, gradient norm or KL at this many times its running median is divergence."""
    warmup: int = 3
    """Steps of history before the jump tests start (the running median needs a few values)."""
    window: int = 20
    """Steps the running median looks back over."""
    entropy_share: float = 0.9
    """Sampled-token entropy at this share of ln(vocabulary) (the uniform distribution), from a
    median below half of that, is divergence; 0 switches the test off."""
    collapse_steps: int = 3
    """Steps with a valid-action rate of 0 and no reward, after a rate of at least
    ``collapse_min_rate`` before, that count as a collapse; 0 switches the test off."""
    collapse_min_rate: float = 0.1
    """Mean valid-action rate before the collapse that shows the policy used to act."""
    length_factor: float = 3.0
    """Generated tokens per rollout at this many times their running median for ``length_steps``
    steps in a row is a length blow-up (a policy padding its turns with junk); 0 switches it off.
    Measured on the demo: the collapse ran 3.6x, 4.2x, 4.1x the median from its step
    42 on; a run that recovered had a two-step spike (2.9x, 6.7x)."""
    length_steps: int = 3
    """Steps in a row the generations must stay ``length_factor`` times longer than before (a
    spike of one or two long steps that the next update corrects is not a blow-up)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode = {self.mode!r} is not valid; allowed values: {', '.join(MODES)}")
        if not self.jump_factor > 1:
            raise ValueError(f"jump_factor must be > 1, got {self.jump_factor}")
        if self.warmup < 1 or self.window < self.warmup:
            raise ValueError(f"need 1 <= warmup <= window, got warmup={self.warmup}, window={self.window}")
        if not 0 <= self.entropy_share <= 1:
            raise ValueError(f"entropy_share must lie in [0, 1] (0: off), got {self.entropy_share}")
        if self.collapse_steps < 0 or not 0 <= self.collapse_min_rate <= 1:
            raise ValueError("collapse_steps must be >= 0 (0: off) and collapse_min_rate in [0, 1], got "
                             f"{self.collapse_steps} and {self.collapse_min_rate}")
        if not (self.length_factor == 0 or self.length_factor > 1) or self.length_steps < 1:
            raise ValueError("length_factor must be 0 (off) or > 1 and length_steps >= 1, got "
                             f"{self.length_factor} and {self.length_steps}")
