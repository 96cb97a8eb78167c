"""Clock and ETA text for progress lines (training steps, tiny-model pretraining).

Pure and dependency-free, at the package's bottom like :mod:`tracerl.errors`, so every layer
that reports progress formats time the same way.
"""

from __future__ import annotations


def clock(seconds: float | None) -> str:
    """``75`` -> ``1:15``, ``3725`` -> ``1:02:05``; ``None`` (unknown) -> ``?``."""
    if seconds is None or seconds != seconds or seconds < 0:  # NaN or negative: unknown
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def eta_seconds(elapsed: float, done: int, remaining: int) -> float | None:
    """Seconds left at the mean pace so far: ``elapsed / done * remaining`` (None before the first)."""
    if done <= 0:
        return None
    return elapsed / done * max(remaining, 0)
