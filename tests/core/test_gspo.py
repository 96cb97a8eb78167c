"""GSPO's sequence-level surrogate (arXiv 2507.18071): hand-computed values, the gradient of the
paper's formula, masking and micro-batching, the policy-loss registry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.losses import (
    POLICY_LOSSES,
    aggregate_loss,
    clipped_surrogate_loss,
    gspo_surrogate_loss,
    loss_normaliser,
    sequence_log_ratio,
)

LN = math.log
SEQ = "seq-mean-token-mean"


def test_sequence_log_ratio_hand_computed() -> None:
    old = torch.zeros(3, 4)
    lp = torch.tensor([[0.2, 0.4, 9.0, 0.0], [-0.3, float("nan"), 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    got = sequence_log_ratio(lp, old, mask)
    # Row 0: mean of 0.2, 0.4, 0.0; row 1: -0.3 alone (the NaN is masked); row 2: no token -> 0.
    assert torch.allclose(got, torch.tensor([0.2, -0.3, 0.0]), atol=1e-7)
    assert sequence_log_ratio(lp[0], old[0], mask[0]).shape == (1,)


def test_gspo_surrogate_hand_computed() -> None:
    # Sequence ratios 1.5, 0.5, 0.5, sqrt(2) (geometric means) with advantages +1, +1, -1, -1,
    # clipped to [1 - 3e-4, 1 + 4e-4]: the pessimistic min picks, per sequence,
    # 1.0004 (clipped), 0.5, -0.9997 (clipped) and -sqrt(2).
    log_ratios = torch.tensor([[LN(1.5), LN(1.5)], [LN(0.5), LN(0.5)], [LN(0.5), LN(0.5)], [LN(2.0), 0.0]])
    old = torch.full((4, 2), -2.0)
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    loss = gspo_surrogate_loss(old + log_ratios, old, adv, mask)
    expected = torch.tensor([-(1 + 4e-4), -0.5, 1 - 3e-4, math.sqrt(2)]).unsqueeze(1).expand(4, 2)
    assert torch.allclose(loss, expected, atol=1e-6)
    # Per sequence, every token holds the sequence's value, so seq-mean-token-mean is GSPO's mean.
    total = aggregate_loss(loss, mask, SEQ, loss_normaliser([mask], SEQ))
    assert total.item() == pytest.approx(float(expected[:, 0].mean()), abs=1e-6)


def _paper_objective(lp: torch.Tensor, old: torch.Tensor, adv_rows: torch.Tensor, mask: torch.Tensor,
                     low: float, high: float) -> torch.Tensor:
    """GSPO as the paper writes it: -(1/G) sum_i min(s_i A_i, clip(s_i) A_i), with
    s_i = (pi(y_i)/pi_old(y_i))^(1/|y_i|) over the trained tokens; rows without tokens are left out."""
    terms = []
    for i in range(lp.shape[0]):
        m = mask[i]
        if not m.any():
            continue
        s = torch.exp((lp[i][m] - old[i][m]).sum() / m.sum())
        a = adv_rows[i]
        terms.append(-torch.minimum(s * a, torch.clamp(s, 1 - low, 1 + high) * a))
    return torch.stack(terms).mean()


@settings(deadline=None, max_examples=40)
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 6),
    cols=st.integers(1, 7),
    clip=st.sampled_from([(3e-4, 4e-4), (0.2, 0.28), (0.05, 0.05)]),
    spread=st.sampled_from([0.0, 0.01, 0.3]),
)
def test_gspo_value_and_gradient_equal_the_paper_formula(
    seed: int, rows: int, cols: int, clip: tuple[float, float], spread: float
) -> None:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 3
    start = old + spread * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    mask = torch.rand(rows, cols, generator=gen) < 0.7
    mask[0, 0] = True  # at least one trained token
    adv_rows = torch.randn(rows, generator=gen, dtype=torch.float64)
    adv = torch.where(mask, adv_rows.unsqueeze(1), torch.zeros((), dtype=torch.float64))
    lp = start.clone().requires_grad_()
    ours = aggregate_loss(gspo_surrogate_loss(lp, old, adv, mask, clip_low=clip[0], clip_high=clip[1]),
                          mask, SEQ, loss_normaliser([mask], SEQ))
    (grad,) = torch.autograd.grad(ours, lp)
    lp2 = start.clone().requires_grad_()
    paper = _paper_objective(lp2, old, adv_rows, mask, *clip)
    (grad2,) = torch.autograd.grad(paper, lp2)
    assert ours.item() == pytest.approx(paper.item(), abs=1e-10)
    assert torch.allclose(grad, grad2, atol=1e-10)
    assert not grad[~mask].any()


def test_on_policy_gradient_is_the_length_normalised_policy_gradient() -> None:
    # At lp == old (s = 1, nothing clipped) d loss / d lp_it = -A_i / (G * |y_i|) on trained tokens.
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]])
    loss = aggregate_loss(gspo_surrogate_loss(lp, lp.detach(), adv, mask), mask, SEQ, 2.0)
    loss.backward()
    assert lp.grad is not None
    expected = torch.tensor([[-2 / (2 * 2), -2 / (2 * 2), 0.0], [1 / (2 * 3)] * 3])
    assert torch.allclose(lp.grad, expected, atol=1e-7)


def test_token_varying_advantages_use_the_sequence_ratio() -> None:
    # GSPO-token: one ratio per sequence, one advantage per token.
    old = torch.zeros(1, 2)
    lp = torch.tensor([[LN(1.5), LN(1.5)]])
    adv = torch.tensor([[1.0, -1.0]])
    loss = gspo_surrogate_loss(lp, old, adv, torch.ones(1, 2, dtype=torch.bool))
    assert torch.allclose(loss, torch.tensor([[-(1 + 4e-4), 1.5]]), atol=1e-6)


def test_masked_tokens_change_nothing() -> None:
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 5, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.where(mask, torch.tensor([[1.0], [-0.5], [2.0]]), torch.zeros(()))
    base = old + 0.1 * torch.randn(3, 5, generator=gen)
    garbage = torch.where(mask, base, torch.full_like(base, float("nan")))
    grads, losses = [], []
    for values in (base, garbage):
        lp = values.clone().requires_grad_()
        loss = aggregate_loss(gspo_surrogate_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.2),
                              mask, SEQ, loss_normaliser([mask], SEQ))
        loss.backward()
        assert lp.grad is not None
        grads.append(torch.where(mask, lp.grad, torch.zeros(())))
        losses.append(loss.item())
    assert losses[0] == losses[1] and torch.equal(grads[0], grads[1])


def test_micro_batches_sum_to_the_whole_batch() -> None:
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(5, 4, generator=gen, dtype=torch.float64)
    lp = old + 0.2 * torch.randn(5, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 4, generator=gen) < 0.8
    adv = torch.where(mask, torch.randn(5, 1, generator=gen, dtype=torch.float64), torch.zeros((), dtype=torch.float64))
    norm = loss_normaliser([mask], SEQ)
    whole = aggregate_loss(gspo_surrogate_loss(lp, old, adv, mask, clip_low=0.1, clip_high=0.1), mask, SEQ, norm)
    split = sum(
        aggregate_loss(gspo_surrogate_loss(lp[a:b], old[a:b], adv[a:b], mask[a:b], clip_low=0.1, clip_high=0.1),
                       mask[a:b], SEQ, norm)
        for a, b in ((0, 2), (2, 3), (3, 5))
    )
    assert float(split) == pytest.approx(float(whole), abs=1e-12)


def test_policy_loss_registry() -> None:
    assert POLICY_LOSSES.names() == ["gspo", "ppo"]
    with pytest.raises(ValueError, match="gspo, ppo"):
        POLICY_LOSSES.get("grpo")
    old = torch.zeros(2, 2)
    lp = torch.log(torch.tensor([[1.5, 0.5], [1.0, 2.0]]))
    adv = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, ratio = POLICY_LOSSES.get("ppo")(lp, old, adv, mask, 0.2, 0.28)
    assert torch.equal(loss, clipped_surrogate_loss(lp, old, adv)) and torch.allclose(ratio, lp.exp())
    loss, ratio = POLICY_LOSSES.get("gspo")(lp, old, adv, mask, 3e-4, 4e-4)
    assert torch.equal(loss, gspo_surrogate_loss(lp, old, adv, mask))
    # The ratio the clip acts on: sqrt(1.5 * 0.5) for row 0, 1.0 for row 1 (its 2.0 is masked).
    assert torch.allclose(ratio, torch.tensor([[math.sqrt(0.75)] * 2, [1.0, 1.0]]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": float("inf")}, "clip_high"),
        ({"mask": torch.ones(2, 3, dtype=torch.bool)}, "shape mismatch"),
        ({"logprobs": torch.zeros(1, 2, 2), "old_logprobs": torch.zeros(1, 2, 2),
          "advantages": torch.zeros(1, 2, 2), "mask": torch.ones(1, 2, 2, dtype=torch.bool)}, r"\[B, L\]"),
    ],
)
def test_gspo_errors(kwargs: dict, match: str) -> None:
    args = {"logprobs": torch.zeros(2, 2), "old_logprobs": torch.zeros(2, 2), "advantages": torch.ones(2, 2),
            "mask": torch.ones(2, 2, dtype=torch.bool), **kwargs}
    with pytest.raises(ValueError, match=match):
        gspo_surrogate_loss(args.pop("logprobs"), args.pop("old_logprobs"), args.pop("advantages"),
                            args.pop("mask"), **args)
