"""TRACE turn credit (spec section 2 steps 2-5): hand-computed cases, properties, errors."""

from __future__ import annotations

import math

import pytest
import torch
from core_reference import slow_credit
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.credit import log_ratio_values, prefix_values, td_turn_credit


def t64(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


# Readiness chosen so that with eps = 0.1 the gaps are d = [2, 1, 0.5, 0.2]:
# V = [0, log 2, log 4, log 10], deltas = [log 2, log 2, log 2.5].
READINESS = [-1.9, -0.9, -0.4, -0.1]


def test_log_ratio_values_hand_computed() -> None:
    values = log_ratio_values(t64(READINESS), eps=0.1)
    expected = [0.0, math.log(2), math.log(4), math.log(10)]
    assert torch.allclose(values, t64(expected), atol=1e-12)
    assert values[0].item() == 0.0


def test_log_ratio_values_keeps_float_dtype() -> None:
    assert log_ratio_values(torch.tensor(READINESS)).dtype == torch.float32
    assert log_ratio_values(t64(READINESS)).dtype == torch.float64


def test_td_turn_credit_hand_computed() -> None:
    values = log_ratio_values(t64(READINESS), eps=0.1)
    credit = td_turn_credit(values, 1.0, horizon=2, gamma=0.5, terminal_scale=2.0)
    ln2, ln25 = math.log(2), math.log(2.5)
    expected = [
        (ln2 + 0.5 * ln2) / 1.5,  # k=0: window {0,1}, does not reach k=2
        (ln2 + 0.5 * ln25) / 1.5 + 2.0 * 0.5**2 * 1.0,  # k=1: window {1,2} reaches the end
        ln25 + 2.0 * 0.5**1 * 1.0,  # k=2: truncated window {2}
    ]
    assert torch.allclose(credit, t64(expected), atol=1e-12)


def test_td_turn_credit_default_window_covers_short_trajectory() -> None:
    # T = 2 <= K = 3: every window reaches the end, so both transitions get the fill.
    values = t64([0.0, 1.0, 3.0])
    credit = td_turn_credit(values, -1.0)
    g = 0.8
    expected = [(1.0 + g * 2.0) / (1 + g) - 2.0 * g**2, 2.0 - 2.0 * g]
    assert torch.allclose(credit, t64(expected), atol=1e-12)


def test_horizon_zero_only_terminal_fill_on_last_transition() -> None:
    values = t64([0.0, 1.0, 3.0, 2.0])
    credit = td_turn_credit(values, 1.0, horizon=0, gamma=0.5, terminal_scale=2.0)
    assert credit.tolist() == [0.0, 0.0, 2.0 * 0.5 * 1.0]


def test_no_transitions_gives_empty() -> None:
    credit = td_turn_credit(t64([0.0]), 1.0)
    assert credit.shape == (0,)


def test_gamma_zero_is_one_step_delta() -> None:
    values = t64([0.0, 1.0, 3.0, 2.0])
    credit = td_turn_credit(values, 5.0, horizon=3, gamma=0.0)
    assert credit.tolist() == [1.0, 2.0, -1.0]  # g^0 = 1; the fill g^(T-k) vanishes


scores = st.lists(st.floats(min_value=-20.0, max_value=0.0), min_size=1, max_size=9)


@settings(deadline=None, max_examples=150)
@given(
    readiness=scores,
    eps=st.floats(min_value=1e-3, max_value=2.0),
    horizon=st.integers(min_value=0, max_value=6),
    gamma=st.floats(min_value=0.0, max_value=1.0),
    kappa=st.floats(min_value=-3.0, max_value=3.0),
    a_out=st.floats(min_value=-3.0, max_value=3.0),
)
def test_vectorised_equals_loop(
    readiness: list[float], eps: float, horizon: int, gamma: float, kappa: float, a_out: float
) -> None:
    values = log_ratio_values(t64(readiness), eps)
    fast = td_turn_credit(values, a_out, horizon=horizon, gamma=gamma, terminal_scale=kappa)
    slow = slow_credit(values.tolist(), a_out, horizon, gamma, kappa)
    assert fast.shape == (len(readiness) - 1,)
    assert torch.allclose(fast, t64(slow), atol=1e-9, rtol=1e-9)


@settings(deadline=None)
@given(readiness=scores, eps=st.floats(min_value=1e-3, max_value=2.0))
def test_values_start_at_zero_and_deltas_telescope(readiness: list[float], eps: float) -> None:
    values = log_ratio_values(t64(readiness), eps)
    assert values[0].item() == 0.0
    one_step = td_turn_credit(values, 0.0, horizon=1, terminal_scale=0.0)
    assert torch.allclose(one_step, values[1:] - values[:-1], atol=1e-12)
    assert math.isclose(one_step.sum().item(), values[-1].item(), abs_tol=1e-9)


@settings(deadline=None)
@given(
    readiness=scores,
    horizon=st.integers(min_value=0, max_value=5),
    gamma=st.floats(min_value=0.05, max_value=1.0),
)
def test_terminal_fill_only_where_window_reaches_end(
    readiness: list[float], horizon: int, gamma: float
) -> None:
    values = log_ratio_values(t64(readiness))
    t_count = len(readiness) - 1
    with_fill = td_turn_credit(values, 1.0, horizon=horizon, gamma=gamma, terminal_scale=1.0)
    without = td_turn_credit(values, 1.0, horizon=horizon, gamma=gamma, terminal_scale=0.0)
    fill = (with_fill - without).tolist()
    first = t_count - max(horizon, 1)  # windows of k >= T-K reach the last transition
    for k in range(t_count):
        expected = gamma ** (t_count - k) if k >= first else 0.0
        assert math.isclose(fill[k], expected, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("scores_in", "eps", "match"),
    [
        ([], 0.1, "empty"),
        ([[-1.0, -2.0]], 0.1, "1-D"),
        ([-1.0, float("nan")], 0.1, "non-finite"),
        ([-1.0, float("-inf")], 0.1, "non-finite"),
        ([-1.0, 0.5], 0.1, "<= 1e-06"),
        ([-1.0], 0.0, "eps"),
        ([-1.0], -0.1, "eps"),
        ([-1.0], float("nan"), "eps"),
        ([-1.0, 5e-7], 1e-7, "remaining gap"),
    ],
)
def test_log_ratio_values_errors(scores_in: list, eps: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        log_ratio_values(t64(scores_in), eps)


def test_log_ratio_values_accepts_rounding_above_zero() -> None:
    values = log_ratio_values(t64([-1.0, 5e-7]), 0.1)
    assert torch.isfinite(values).all()


def test_log_ratio_values_rejects_non_tensor() -> None:
    with pytest.raises(ValueError, match="torch.Tensor"):
        log_ratio_values([-1.0, -0.5])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"horizon": -1}, "horizon"),
        ({"horizon": 1.5}, "horizon"),
        ({"gamma": -0.1}, "gamma"),
        ({"gamma": 1.1}, "gamma"),
        ({"gamma": float("nan")}, "gamma"),
        ({"terminal_scale": float("inf")}, "terminal_scale"),
        ({"outcome_advantage": float("nan")}, "outcome_advantage"),
        ({"values": t64([])}, "empty"),
        ({"values": t64([0.0, float("inf")])}, "non-finite"),
        ({"values": torch.zeros(2, 2)}, "1-D"),
    ],
)
def test_td_turn_credit_errors(kwargs: dict, match: str) -> None:
    args = {"values": t64([0.0, 1.0]), "outcome_advantage": 1.0}
    args.update(kwargs)
    values, a_out = args.pop("values"), args.pop("outcome_advantage")
    with pytest.raises(ValueError, match=match):
        td_turn_credit(values, a_out, **args)


def test_td_turn_credit_accepts_tensor_outcome() -> None:
    credit = td_turn_credit(
        t64([0.0, 1.0]), torch.tensor(1.0), horizon=1, gamma=0.5, terminal_scale=2.0
    )
    assert credit.tolist() == [1.0 + 2.0 * 0.5]


# ----------------------------------------------------------------------------- value forms


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        # l = [-1.9, -0.9, -0.4, -0.1], eps = 0.1, d = [2, 1, 0.5, 0.2].
        ("log_ratio", [0.0, math.log(2), math.log(4), math.log(10)]),
        ("raw_diff", [0.0, 1.0, 1.5, 1.8]),  # l_k - l_0
        ("remaining_gap", [0.0, 0.5, 0.75, 0.9]),  # (d_0 - d_k) / d_0
    ],
)
def test_prefix_values_hand_computed(form: str, expected: list[float]) -> None:
    values = prefix_values(t64(READINESS), form, eps=0.1)
    assert torch.allclose(values, t64(expected), atol=1e-12)
    assert values[0].item() == 0.0
    assert prefix_values(torch.tensor(READINESS), form).dtype == torch.float32


# Quarter steps: distinct scores stay distinct after the gap arithmetic (the order check).
coarse = st.lists(st.integers(-80, 0).map(lambda q: q / 4), min_size=1, max_size=9)


@settings(deadline=None, max_examples=80)
@given(readiness=coarse, eps=st.floats(min_value=1e-3, max_value=2.0))
def test_value_forms_start_at_zero_telescope_and_agree_on_order(readiness: list[float], eps: float) -> None:
    scores_in = t64(readiness)
    log_ratio = prefix_values(scores_in, "log_ratio", eps)
    gap = prefix_values(scores_in, "remaining_gap", eps)
    raw = prefix_values(scores_in, "raw_diff", eps)
    for values in (log_ratio, gap, raw):
        assert values[0].item() == 0.0
        one_step = td_turn_credit(values, 0.0, horizon=1, terminal_scale=0.0)
        assert math.isclose(one_step.sum().item(), values[-1].item(), abs_tol=1e-9)
        # Every form is increasing in l_k: more readiness, more value.
        order = torch.sign(values.unsqueeze(0) - values.unsqueeze(1))
        assert torch.equal(order, torch.sign(scores_in.unsqueeze(0) - scores_in.unsqueeze(1)))
    # remaining_gap is 1 - d_k/d_0 = 1 - exp(-log_ratio); raw_diff is d_0 - d_k.
    assert torch.allclose(gap, 1.0 - torch.exp(-log_ratio), atol=1e-12)
    gaps = -scores_in + eps
    assert torch.allclose(raw, gaps[0] - gaps, atol=1e-12)


def test_prefix_values_errors() -> None:
    with pytest.raises(ValueError, match="log_ratio, raw_diff, remaining_gap"):
        prefix_values(t64(READINESS), "ratio")
    for form in ("log_ratio", "raw_diff", "remaining_gap"):
        with pytest.raises(ValueError, match="<= 1e-06"):
            prefix_values(t64([-1.0, 0.5]), form)
    # A non-positive gap is an error only where the form divides by it or takes its log.
    assert prefix_values(t64([-1.0, 5e-7]), "raw_diff", 1e-7).tolist() == pytest.approx([0.0, 1.0])
    with pytest.raises(ValueError, match="remaining gap"):
        prefix_values(t64([-1.0, 5e-7]), "remaining_gap", 1e-7)
