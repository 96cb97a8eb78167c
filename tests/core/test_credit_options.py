"""TRACE credit options beside the paper's form: gated centring, per-turn centring, clip, the
fill counted once, and the per-step diagnostics. Hand-computed with readable numbers: raw_diff
values, K = 1 and kappa = 0 make every turn term ``c_k = l_{k+1} - l_k``."""

from __future__ import annotations

import math

import pytest
import torch
from core_factories import make_traj

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator
from tracerl.core.credit import centre_turn_terms, clip_turn_terms, fill_coefficients
from tracerl.core.tree_advantages import credit_diagnostics

PLAIN = {"credit_value": "raw_diff", "horizon": 1, "terminal_scale": 0.0, "w_turn": 1.0}


def batch() -> AdvantageBatch:
    # group g is mixed: A succeeds (A_out = +1), B fails (-1); group h (C alone, failed) is all-same.
    a = make_traj(["s1", "s2", "ansA"], 1.0, readiness=[-2.0, -1.0, -0.5])  # c = [1, 0.5]
    b = make_traj(["s1", "ansB"], 0.0, readiness=[-1.0, -1.5])  # c = [-0.5]
    c = make_traj(["s1", "ansC"], 0.0, group="h", readiness=[-1.0, -0.5])  # c = [0.5]
    return AdvantageBatch([a, b, c])


def turn_values(b: AdvantageBatch, **options: object) -> list[list[float]]:
    out = get_estimator("trace_credit")(b, AdvantageOptions(**{**PLAIN, **options}))  # type: ignore[arg-type]
    return [[adv[s].item() for s, _ in t.turn_spans] for t, adv in zip(b.trajectories, out, strict=True)]


def test_paper_form_is_unchanged() -> None:
    assert turn_values(batch()) == [pytest.approx([2.0, 1.5, 1.0]), pytest.approx([-1.5, -1.0]),
                                    pytest.approx([0.5, 0.0])]


def test_gated_centres_mixed_groups_and_drops_all_same_ones() -> None:
    # group g's transitions: 1, 0.5, -0.5 -> mean 1/3; group h is all-same -> no turn term
    got = turn_values(batch(), credit_centre="gated")
    assert got == [pytest.approx([1 + 2 / 3, 1 + 1 / 6, 1.0]), pytest.approx([-1 - 5 / 6, -1.0]),
                   pytest.approx([0.0, 0.0])]


def test_gated_turn_centres_per_turn_index() -> None:
    # turn 0 of group g: A 1, B -0.5 -> mean 0.25; turn 1: A's 0.5 alone -> centred to 0
    got = turn_values(batch(), credit_centre="gated_turn")
    assert got == [pytest.approx([1.75, 1.0, 1.0]), pytest.approx([-1.75, -1.0]), pytest.approx([0.0, 0.0])]


def test_clip_bounds_the_weighted_turn_term() -> None:
    got = turn_values(batch(), credit_clip=0.6)  # A's 1 -> 0.6; the rest already within 0.6
    assert got == [pytest.approx([1.6, 1.5, 1.0]), pytest.approx([-1.5, -1.0]), pytest.approx([0.5, 0.0])]
    got = turn_values(batch(), credit_clip=0.6, w_turn=2.0)  # w_turn c: A [2, 1], B [-1], C [1]
    assert got == [pytest.approx([1.6, 1.6, 1.0]), pytest.approx([-1.6, -1.0]), pytest.approx([0.6, 0.0])]


def test_fill_once_counts_the_outcome_once() -> None:
    # K = 1, kappa = 2, g = 0.5, w_turn = 0.5: the fill kappa g^(T-k) = 1 lands where k = T-1.
    opts = {"terminal_scale": 2.0, "gamma_td": 0.5, "w_turn": 0.5}
    added = turn_values(batch(), **opts)
    assert added[0] == pytest.approx([1 + 0.5 * 1.0, 1 + 0.5 * (0.5 + 1.0), 1.0])  # A_out x1.5 on turn 1
    assert added[1] == pytest.approx([-1 + 0.5 * (-0.5 - 1.0), -1.0])
    once = turn_values(batch(), credit_fill="once", **opts)
    assert once[0] == pytest.approx([1.5, 1 + 0.5 * 0.5, 1.0])  # outcome weight 1 on every turn
    assert once[1] == pytest.approx([-1 + 0.5 * -0.5, -1.0])
    assert once[2] == added[2] == pytest.approx([0.25, 0.0])  # A_out = 0: nothing to count twice


def test_fill_coefficients_hand_computed() -> None:
    # T = 3, K = 2: h = [1, 1, 0]; windows of k = 1, 2 reach the end; kappa g^(T-k) = 2 * 0.5^[2, 1]
    assert fill_coefficients(3, 2, 0.5, 2.0).tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_centre_and_clip_functions() -> None:
    terms = [torch.tensor([3.0, 1.0]), torch.tensor([-1.0]), torch.tensor([5.0])]
    got = centre_turn_terms(terms, ["g", "g", "h"], [True, True, False], "gated")
    assert [t.tolist() for t in got] == [[2.0, 0.0], [-2.0], [0.0]]
    assert sum(float(t.sum()) for t in got[:2]) == 0.0
    got = centre_turn_terms(terms, ["g", "g", "h"], [True, True, True], "gated_turn")
    assert [t.tolist() for t in got] == [[2.0, 0.0], [-2.0], [0.0]]
    assert [t.tolist() for t in centre_turn_terms(terms, ["g", "g", "h"], [True] * 3, "none")] == [
        [3.0, 1.0], [-1.0], [5.0]]
    assert [t.tolist() for t in clip_turn_terms(terms, 2.0)] == [[2.0, 1.0], [-1.0], [2.0]]
    with pytest.raises(ValueError, match="centre mode"):
        centre_turn_terms(terms, ["g"] * 3, [True] * 3, "always")
    with pytest.raises(ValueError, match="c_max"):
        clip_turn_terms(terms, -1.0)


@pytest.mark.parametrize(("field", "value"), [("credit_centre", "always"), ("credit_fill", "twice"),
                                              ("credit_clip", -0.5), ("credit_clip", math.inf)])
def test_options_are_validated(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AdvantageOptions(**{field: value})  # type: ignore[arg-type]


def test_diagnostics_hand_computed() -> None:
    got = credit_diagnostics(batch(), AdvantageOptions(**PLAIN))  # type: ignore[arg-type]
    assert got["credit_allsame_turn_mean"] == pytest.approx(0.5)  # C's one transition
    assert got["credit_allsame_turn_pos"] == 1.0
    # per sampled token (2 per turn): turn A [1,1,.5,.5,0,0] B [-.5,-.5,0,0] C [.5,.5,0,0];
    # outcome A [1]*6, B [-1]*4, C [0]*4 -> dot 4, |turn|^2 3.5, |outcome|^2 10
    assert got["credit_turn_outcome_cos"] == pytest.approx(4 / math.sqrt(35))
    gated = credit_diagnostics(batch(), AdvantageOptions(**PLAIN, credit_centre="gated"))  # type: ignore[arg-type]
    assert gated["credit_allsame_turn_mean"] == pytest.approx(0.5)  # the paper's term, what gating removes
    # gated turn A [2/3,2/3,1/6,1/6,0,0] B [-5/6,-5/6,0,0]: dot 2(2/3+1/6+5/6) = 10/3
    norm = math.sqrt(2 * (4 / 9 + 1 / 36 + 25 / 36) * 10)
    assert gated["credit_turn_outcome_cos"] == pytest.approx((10 / 3) / norm)


def test_diagnostics_without_all_same_groups_are_nan() -> None:
    b = batch()
    got = credit_diagnostics(AdvantageBatch(b.trajectories[:2]), AdvantageOptions(**PLAIN))  # type: ignore[arg-type]
    assert math.isnan(got["credit_allsame_turn_mean"]) and math.isnan(got["credit_allsame_turn_pos"])


def test_flip_share_counts_turn_terms_that_override_the_outcome() -> None:
    # as batch(), but B's one search raises readiness by 2: its turn term +2 outweighs its outcome -1
    a = make_traj(["s1", "s2", "ansA"], 1.0, readiness=[-2.0, -1.0, -0.5])  # o +1, t [1, 0.5]: same sign
    b = make_traj(["s1", "ansB"], 0.0, readiness=[-2.0, 0.0])  # o -1, t +2: flipped
    c = make_traj(["s1", "ansC"], 0.0, group="h", readiness=[-2.0, 0.0])  # all-same group: not counted
    got = credit_diagnostics(AdvantageBatch([a, b, c]), AdvantageOptions(**PLAIN))  # type: ignore[arg-type]
    assert got["credit_mixed_flip_share"] == pytest.approx(1 / 3)
    assert credit_diagnostics(batch(), AdvantageOptions(**PLAIN))["credit_mixed_flip_share"] == 0.0  # type: ignore[arg-type]
    only_c = credit_diagnostics(AdvantageBatch([c]), AdvantageOptions(**PLAIN))  # type: ignore[arg-type]
    assert math.isnan(only_c["credit_mixed_flip_share"])
