"""TRACE turn credit from a frozen reference (spec section 2, steps 2-5).

The reference scores the gold answer ``y*`` after every prefix ``S_0..S_T``; the per-token
mean log-probability ``l_k`` is the prefix's *readiness*. Two pure functions turn these
scores into one credit per transition:

* :func:`prefix_values`: the state value ``V_k`` in one of three forms (the credit paper's
  value-form ablation), each with ``V_0 = 0`` so the TD rewards telescope to ``V_T``:

  - ``log_ratio`` (default, the paper's method): ``V_k = log(d_0 / d_k)`` with the remaining
    gap ``d_k = -l_k + eps``;
  - ``raw_diff`` ("raw log-prob difference"): ``V_k = l_k - l_0``;
  - ``remaining_gap``: the share of the initial gap closed, ``V_k = (d_0 - d_k) / d_0``, the
    linear (first-order) form of the log-ratio. The unnormalised ``d_0 - d_k`` equals
    ``l_k - l_0`` exactly (``eps`` cancels), i.e. ``raw_diff``, so the named form must be the
    normalised one to be a distinct ablation arm.

  :func:`log_ratio_values` is the default form by name.
* :func:`td_turn_credit`: one-step TD rewards ``delta_k = V_{k+1} - V_k``, a normalised
  discounted K-step window truncated at the end of the trajectory, plus a terminal fill of
  ``kappa * g^(T-k) * A_out`` on the transitions whose window reaches the last transition.

Options beside the paper's form (docs/TRACE.md section 2, departures): :func:`centre_turn_terms`
(gated centring within mixed groups, optionally per turn index) and :func:`clip_turn_terms`.

Bad scores are errors, never clamps: a positive log-probability or a NaN means the scorer is
broken, and clamping would hide that inside a plausible-looking credit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

# Readiness scores are mean log-probabilities, so they are <= 0 up to float rounding.
POSITIVE_SCORE_TOLERANCE = 1e-6


def _check_vector(name: str, x: Tensor) -> Tensor:
    """Validate a non-empty, finite, 1-D tensor and return it as float64 for exact-ish math."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty: at least the prompt prefix S_0 is needed")
    x64 = x.detach().to(torch.float64)
    if not bool(torch.isfinite(x64).all()):
        bad = torch.nonzero(~torch.isfinite(x64)).flatten().tolist()
        raise ValueError(f"{name} holds non-finite entries at positions {bad}")
    return x64


def _out_dtype(x: Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


VALUE_FORMS = ("log_ratio", "raw_diff", "remaining_gap")
"""State-value forms of :func:`prefix_values` (``algo.advantage.credit_value``)."""


def _checked_scores(prefix_logprobs: Tensor, eps: float) -> tuple[Tensor, float]:
    """Validated float64 readiness scores (finite, <= tolerance) and ``eps`` as a float."""
    if not math.isfinite(_as_float("eps", eps)) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    scores = _check_vector("prefix_logprobs", prefix_logprobs)
    positive = scores > POSITIVE_SCORE_TOLERANCE
    if bool(positive.any()):
        where = torch.nonzero(positive).flatten().tolist()
        raise ValueError(
            f"prefix_logprobs must be <= {POSITIVE_SCORE_TOLERANCE} (log-probabilities); "
            f"positions {where} hold {scores[positive].tolist()}"
        )
    return scores, float(eps)


def _gaps(scores: Tensor, eps: float) -> Tensor:
    """Remaining gaps ``d_k = -l_k + eps``; a non-positive gap is an error (a log or a ratio of it)."""
    gaps = -scores + eps
    if bool((gaps <= 0).any()):
        where = torch.nonzero(gaps <= 0).flatten().tolist()
        raise ValueError(f"remaining gap d_k = -l_k + eps is <= 0 at positions {where} (eps={eps})")
    return gaps


def prefix_values(prefix_logprobs: Tensor, form: str = "log_ratio", eps: float = 0.1) -> Tensor:
    """State values ``V_0..V_T`` of one trajectory in the value form ``form`` (module docstring).

    Args:
        prefix_logprobs: ``[T+1]`` readiness scores ``l_0..l_T`` (mean log-prob of ``y*``).
        form: ``log_ratio`` (``log(d_0/d_k)``), ``raw_diff`` (``l_k - l_0``) or
            ``remaining_gap`` (``(d_0 - d_k)/d_0``), with ``d_k = -l_k + eps``.
        eps: part of the remaining-gap definition (default 0.1), not a stabiliser; validated
            for every form, unused by ``raw_diff``.

    Returns:
        ``[T+1]`` values with ``V_0 = 0`` exactly, in the input's floating dtype.

    Raises:
        ValueError: an unknown form, empty or non-1-D input, non-finite scores, a score above
            ``1e-6``, ``eps <= 0`` or (gap forms) a non-positive gap ``d_k``.
    """
    if form not in VALUE_FORMS:
        raise ValueError(f"credit value form must be one of {', '.join(VALUE_FORMS)}; got {form!r}")
    scores, eps = _checked_scores(prefix_logprobs, eps)
    if form == "raw_diff":
        values = scores - scores[0]
    else:
        gaps = _gaps(scores, eps)
        if form == "log_ratio":
            values = torch.log(gaps[0]) - torch.log(gaps)
        else:
            values = (gaps[0] - gaps) / gaps[0]
    return values.to(_out_dtype(prefix_logprobs))


def log_ratio_values(prefix_logprobs: Tensor, eps: float = 0.1) -> Tensor:
    """State values ``V_k = log(d_0 / d_k)`` with ``d_k = -l_k + eps`` (spec section 2 step 2).

    The default value form: ``prefix_values(prefix_logprobs, "log_ratio", eps)``.

    Args:
        prefix_logprobs: ``[T+1]`` readiness scores ``l_0..l_T`` (mean log-prob of ``y*``).
        eps: part of the remaining-gap definition (default 0.1), not a stabiliser.

    Returns:
        ``[T+1]`` values with ``V_0 = 0``, in the input's floating dtype.

    Raises:
        ValueError: empty or non-1-D input, non-finite scores, a score above ``1e-6``,
            ``eps <= 0`` or a non-positive gap ``d_k``.
    """
    return prefix_values(prefix_logprobs, "log_ratio", eps)


def _as_float(name: str, x: object) -> float:
    """Accept Python/numpy numbers and one-element tensors; reject everything else."""
    if isinstance(x, Tensor) and x.numel() == 1:
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(x).__name__}")
    return float(x)


def _check_credit_args(
    horizon: int, gamma: float, terminal_scale: float, outcome: float
) -> tuple[float, float, float]:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"horizon must be an integer >= 0, got {horizon!r}")
    g = _as_float("gamma", gamma)
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma!r}")
    kappa = _as_float("terminal_scale", terminal_scale)
    if not math.isfinite(kappa):
        raise ValueError(f"terminal_scale must be finite, got {terminal_scale!r}")
    a_out = _as_float("outcome_advantage", outcome)
    if not math.isfinite(a_out):
        raise ValueError(f"outcome_advantage must be finite, got {outcome!r}")
    return g, kappa, a_out


def window_lengths(num_transitions: int, horizon: int) -> Tensor:
    """``h_k = min(K-1, T-1-k)`` for k = 0..T-1; ``K = 0`` gives ``h_k = 0`` (spec step 4)."""
    k = torch.arange(num_transitions)
    if horizon == 0:
        return torch.zeros(num_transitions, dtype=torch.long)
    return torch.clamp(num_transitions - 1 - k, max=horizon - 1)


def td_turn_credit(
    values: Tensor,
    outcome_advantage: float,
    *,
    horizon: int = 3,
    gamma: float = 0.8,
    terminal_scale: float = 2.0,
) -> Tensor:
    """Per-transition credit ``c_k`` (spec section 2 steps 3-5).

    ``c_k = sum_{j<=h} g^j delta_{k+j} / sum_{j<=h} g^j`` with ``h = min(K-1, T-1-k)`` and
    ``delta_k = V_{k+1} - V_k``; where the window reaches the last transition
    (``k + h == T-1``) the terminal fill ``kappa * g^(T-k) * A_out`` is added.

    ``K = horizon = 0`` disables the dense part (``c_k = 0``) and, read literally, sets
    ``h = 0``, so the terminal fill then lands on the last transition ``k = T-1`` only.

    Args:
        values: ``[T+1]`` state values ``V_0..V_T`` (see :func:`prefix_values`).
        outcome_advantage: the leaf's GRPO outcome advantage ``A_out``.
        horizon: window length ``K`` (default 3).
        gamma: window discount ``g`` in [0, 1] (default 0.8); ``0^0 = 1``.
        terminal_scale: ``kappa`` (default 2.0).

    Returns:
        ``[T]`` credits in the input's floating dtype (empty when ``T = 0``).
    """
    gamma, terminal_scale, outcome_advantage = _check_credit_args(
        horizon, gamma, terminal_scale, outcome_advantage
    )
    v = _check_vector("values", values)
    num = v.numel() - 1
    if num == 0:
        return torch.zeros(0, dtype=_out_dtype(values))
    deltas = v[1:] - v[:-1]
    h = window_lengths(num, horizon)
    if horizon == 0:
        credit = torch.zeros(num, dtype=torch.float64)
    else:
        # Window j of transition k reads delta_{k+j}; pad so every window has K slots.
        padded = torch.cat([deltas, deltas.new_zeros(horizon - 1)])
        windows = padded.unfold(0, horizon, 1)  # [T, K]
        j = torch.arange(horizon)
        weights = torch.tensor(gamma, dtype=torch.float64) ** j  # g^0 = 1 even for g = 0
        used = j.unsqueeze(0) <= h.unsqueeze(1)  # [T, K]
        w = torch.where(used, weights.unsqueeze(0), torch.zeros((), dtype=torch.float64))
        credit = (w * windows).sum(dim=1) / w.sum(dim=1)
    credit = credit + fill_coefficients(num, horizon, gamma, terminal_scale) * outcome_advantage
    return credit.to(_out_dtype(values))


def fill_coefficients(num_transitions: int, horizon: int, gamma: float, terminal_scale: float) -> Tensor:
    """``[T]`` float64 coefficient of ``A_out`` in ``c_k``: ``kappa * g^(T-k)`` where the window reaches
    the last transition (``k + h_k == T-1``), else 0 (spec section 2 step 5)."""
    k = torch.arange(num_transitions)
    reaches_end = (k + window_lengths(num_transitions, horizon)) == num_transitions - 1
    g = torch.tensor(float(gamma), dtype=torch.float64)
    fill = float(terminal_scale) * g ** (num_transitions - k)
    return torch.where(reaches_end, fill, torch.zeros((), dtype=torch.float64))


CENTRE_MODES = ("none", "gated", "gated_turn")
"""Forms of the turn term across a group (``algo.advantage.credit_centre``): ``none`` is the paper's
(uncentred, present in every group); ``gated`` centres it over the transitions of each mixed group
and drops it in all-same groups; ``gated_turn`` centres per (group, turn index) instead."""

FILL_FORMS = ("add", "once")
"""How the terminal fill meets the outcome term (``algo.advantage.credit_fill``): ``add`` (the
paper's: the fill adds ``kappa g^(T-k) A_out`` on top of ``w_out A_out``) or ``once`` (the fill's
``A_out`` is taken out of the outcome term, so every token's total ``A_out`` weight is ``w_out``)."""


def centre_turn_terms(
    terms: Sequence[Tensor], groups: Sequence[object], mixed: Sequence[bool], mode: str = "gated"
) -> list[Tensor]:
    """Turn terms (one ``[T_i]`` tensor per trajectory) centred within their group.

    ``mode`` (:data:`CENTRE_MODES`): ``none`` returns them unchanged; ``gated`` subtracts the mean
    over every transition of the trajectories of the same group (``groups[i]``) when
    ``mixed[i]`` (the group holds a success and a failure), and zeroes them otherwise, so an
    all-same group, where the outcome advantage is 0, gets no gradient at all; ``gated_turn``
    subtracts the mean over the transitions with the same turn index k in the group (A^2TGPO's
    per-turn normalisation, mean only). Centred terms sum to 0 per group (per group and k).
    Why gated: centring every group also centres all-fail groups, whose contrast is between
    searches of equally failed episodes; ungated it collapsed one of two 100-step runs.

    Returns float64 tensors of the same shapes.
    """
    if mode not in CENTRE_MODES:
        raise ValueError(f"credit centre mode must be one of {', '.join(CENTRE_MODES)}; got {mode!r}")
    if not len(terms) == len(groups) == len(mixed):
        raise ValueError(f"terms ({len(terms)}), groups ({len(groups)}) and mixed ({len(mixed)}) must match")
    out = [t.detach().to(torch.float64).clone() for t in terms]
    if mode == "none":
        return out
    sums: dict[object, list[float]] = {}
    for t, g, m in zip(out, groups, mixed, strict=True):
        if m:
            for k, value in enumerate(t.tolist()):
                acc = sums.setdefault((g, k) if mode == "gated_turn" else g, [0.0, 0.0])
                acc[0] += value
                acc[1] += 1.0
    for t, g, m in zip(out, groups, mixed, strict=True):
        if not m:
            t.zero_()
            continue
        for k in range(t.numel()):
            total, count = sums[(g, k) if mode == "gated_turn" else g]
            t[k] -= total / count
    return out


def clip_turn_terms(terms: list[Tensor], c_max: float) -> list[Tensor]:
    """``clamp(w_turn c_k, -c_max, c_max)`` per entry; ``c_max = 0`` means no clip (the paper's)."""
    c = _as_float("c_max", c_max)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"c_max must be a finite number >= 0, got {c_max!r}")
    return [t.clamp(-c, c) if c > 0 else t for t in terms]
