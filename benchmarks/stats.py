"""The tests of the comparison protocol, as small pure functions over per-seed paired differences.

``deltas[i]`` is an arm minus its baseline on seed i (same seed, same initial model, same
questions). :func:`paired_t` gives the mean, the 95% t-interval and the two-sided t-test p-value;
:func:`sign_flip` the exact two-sided sign-flip (permutation) p-value of the mean; :func:`holm`
adjusts a family of p-values; :func:`wilson` is the 95% interval of a proportion;
:func:`paired_bootstrap` the percentile bootstrap interval (reported from :data:`BOOTSTRAP_MIN_N`
seeds on). The t distribution is computed here (regularised incomplete beta by Lentz's continued
fraction, Numerical Recipes section 6.4) because scipy is no dependency of the benchmarks.
"""

from __future__ import annotations

import math
from typing import Any

BOOTSTRAP_MIN_N = 10
"""Fewest seeds a percentile bootstrap interval is reported for: below that it is narrower than
the t-interval (it ignores that the spread itself is estimated) and degenerate at n = 2."""
EXACT_SIGN_FLIP_MAX_N = 16
"""Up to this many differences every one of the 2^n sign assignments is enumerated."""
Z_975 = 1.959963984540054
"""The standard normal's 97.5% quantile (the Wilson interval's z)."""


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), x < (a+1)/(a+b+2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                    -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side; else use the symmetry
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (0 < q < 1), by bisection on :func:`t_sf` (to 1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_quantile: q must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - q:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_sf(mid, df) > 1.0 - q else (lo, mid)
    return 0.5 * (lo + hi)


def paired_t(deltas: list[float]) -> dict[str, Any]:
    """Mean, sample sd, 95% t-interval and two-sided one-sample t-test p-value of ``deltas`` (shape (n,)).

    Returns ``{"mean", "sd", "lo", "hi", "p_t", "n"}``; with n < 2 every field but ``mean`` and
    ``n`` is None (one difference has no spread). Zero spread (equal differences, e.g. two seeds
    both one question better): the interval is the mean itself and ``p_t`` is None, since the t
    statistic is 0/0 or infinite; the sign-flip p-value still applies.
    """
    import numpy as np

    n = len(deltas)
    mean = float(np.asarray(deltas, dtype=float).mean()) if n else None  # numpy's sum, as the bootstrap's
    if n < 2 or mean is None:
        return {"mean": mean, "sd": None, "lo": None, "hi": None, "p_t": None, "n": n}
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in deltas) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0.0:
        return {"mean": mean, "sd": 0.0, "lo": mean, "hi": mean, "p_t": None, "n": n}
    half = t_quantile(0.975, n - 1) * se
    p = min(1.0, 2.0 * t_sf(abs(mean) / se, n - 1))
    return {"mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half, "p_t": p, "n": n}


def sign_flip(deltas: list[float], resamples: int = 100000, seed: int = 0) -> float | None:
    """Two-sided sign-flip p-value of the mean of ``deltas`` (shape (n,)): the share of sign
    assignments whose |mean| is at least the observed |mean|.

    Under "no effect" each paired difference is as likely positive as negative. Exact over all 2^n
    assignments (the observed one included, so p >= 2 / 2^n) for n <= :data:`EXACT_SIGN_FLIP_MAX_N`;
    above, ``resamples`` seeded random assignments with p = (1 + hits) / (1 + resamples).
    None for no differences.
    """
    import numpy as np

    n = len(deltas)
    if n == 0:
        return None
    x = np.asarray(deltas, dtype=float)
    observed = abs(x.sum()) * (1 - 1e-12)  # the observed assignment counts despite rounding
    if n <= EXACT_SIGN_FLIP_MAX_N:
        codes = np.arange(2 ** n)[:, None] >> np.arange(n)[None, :] & 1  # (2^n, n): bit i of each code
        sums = np.abs(((1 - 2 * codes) * x).sum(axis=1))
        return float((sums >= observed).mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(resamples, n))
    return float((1 + (np.abs((signs * x).sum(axis=1)) >= observed).sum()) / (1 + resamples))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (None entries stay None, not counted).

    With m p-values sorted ascending, the i-th (from 0) becomes max over j <= i of
    min(1, (m - j) p_(j)): monotone in the sorted order, and rejecting where it is <= alpha
    controls the family-wise error at alpha.
    """
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        out[i] = running
    return out


def holm_thresholds(pvalues: list[float | None], alpha: float = 0.05) -> list[float | None]:
    """Each p-value's step of Holm's procedure, in the order given (None stays None): with m
    p-values sorted ascending, the i-th (from 0) is compared with alpha / (m - i)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    for rank, (_, i) in enumerate(order):
        out[i] = alpha / (len(order) - rank)
    return out

def wilson(successes: int, n: int) -> tuple[float, float] | None:
    """The Wilson score 95% interval of a proportion ``successes / n``; None for n = 0."""
    if n == 0:
        return None
    p, z2 = successes / n, Z_975 * Z_975
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_975 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_bootstrap(deltas: list[float], resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Mean of ``deltas`` (shape (n,)) with a percentile bootstrap 95% interval over seeds.

    Returns ``{"mean", "lo", "hi", "n"}``; ``lo``/``hi`` are None for fewer than 2 differences.
    Seeded, so a merge reproduces the committed numbers. Callers report it only from
    :data:`BOOTSTRAP_MIN_N` seeds on.
    """
    import numpy as np

    n = len(deltas)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    x = np.asarray(deltas, dtype=float)
    if n < 2:
        return {"mean": float(x.mean()), "lo": None, "hi": None, "n": n}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": n}


def paired_t_power(diff: float, sd: float, n: int, alpha: float, sims: int = 100_000, seed: int = 0) -> float:
    """Power of the two-sided paired t-test at level ``alpha``: the share of ``sims`` simulated sets of
    ``n`` normal differences (mean ``diff``, sd ``sd``) whose p-value is below ``alpha``.

    Monte Carlo (seeded, so a registration's numbers are reproducible) instead of the noncentral t,
    which this module does not have; its error is about ``sqrt(p (1 - p) / sims)``.
    """
    import numpy as np

    if n < 2 or sd <= 0 or not 0.0 < alpha < 1.0:
        raise ValueError(f"paired_t_power: need n >= 2, sd > 0 and 0 < alpha < 1; got n={n}, sd={sd}, alpha={alpha}")
    draws = np.random.default_rng(seed).normal(diff, sd, size=(sims, n))
    t = np.abs(draws.mean(axis=1)) / (draws.std(axis=1, ddof=1) / math.sqrt(n))
    return float((t > t_quantile(1.0 - alpha / 2.0, n - 1)).mean())


def detectable_difference(sd: float, n: int, alpha: float, power: float = 0.8, sims: int = 100_000) -> float:
    """The smallest true mean difference (in the units of ``sd``'s) that :func:`paired_t_power` finds with
    at least ``power``: bisection on the difference, to 1% of ``sd``."""
    lo, hi = 0.0, sd
    while paired_t_power(hi, sd, n, alpha, sims) < power:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 0.01 * sd:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if paired_t_power(mid, sd, n, alpha, sims) < power else (lo, mid)
    return hi
