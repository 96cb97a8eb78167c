"""Per-token losses and their aggregation: hand-computed values, masking, micro-batching."""

from __future__ import annotations

import math

import pytest
import torch
from core_factories import make_traj
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator
from tracerl.core.losses import (
    aggregate_loss,
    available_aggregations,
    clipped_surrogate_loss,
    k3_kl,
    loss_normaliser,
    policy_loss_metrics,
)

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_clipped_surrogate_hand_computed() -> None:
    # ratios 1.5 and 0.5 against advantages +1 / -1, clip range [0.8, 1.28].
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])
    old = torch.full((5,), -1.0)
    loss = clipped_surrogate_loss(old + ratio.log(), old, adv, clip_low=0.2, clip_high=0.28)
    expected = torch.tensor([-1.28, 1.5, -0.5, 0.8, -2.0])
    assert torch.allclose(loss, expected, atol=1e-6)


def test_clipped_surrogate_gradient_vanishes_only_where_clipped() -> None:
    old = torch.zeros(4)
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    clipped_surrogate_loss(lp, old, adv).sum().backward()
    assert lp.grad is not None
    assert lp.grad[0] == 0 and lp.grad[3] == 0  # clipped: no push further out of the trust region
    assert lp.grad[1] == pytest.approx(1.5) and lp.grad[2] == pytest.approx(-0.5)


def test_k3_kl_hand_computed() -> None:
    lp = torch.log(torch.tensor([0.5, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.3]))
    kl = k3_kl(lp, ref)
    assert kl[0].item() == pytest.approx(0.5 - math.log(0.5) - 1.0)
    assert kl[1].item() == 0.0


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(-10, 0), st.floats(-10, 0)), min_size=1, max_size=20))
def test_k3_kl_is_non_negative(pairs: list[tuple[float, float]]) -> None:
    lp = torch.tensor([a for a, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([b for _, b in pairs], dtype=torch.float64)
    assert (k3_kl(lp, ref) >= -1e-12).all()


def test_aggregation_hand_computed() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    expected = {
        "token-mean": (1 + 2 + 3 + 4) / 4,
        "seq-mean-token-mean": ((1 + 2 + 3) / 3 + 4 / 1) / 2,
        "seq-mean-token-sum-norm": ((1 + 2 + 3) / 8 + 4 / 8) / 2,
    }
    for mode, value in expected.items():
        norm = loss_normaliser([mask], mode, norm_length=8)
        assert aggregate_loss(per_token, mask, mode, norm).item() == pytest.approx(value)


def test_masked_nan_does_not_leak() -> None:
    per_token = torch.tensor([[1.0, float("nan")]])
    mask = torch.tensor([[True, False]])
    assert aggregate_loss(per_token, mask, "token-mean", 1.0).item() == 1.0


@settings(deadline=None, max_examples=60)
@given(
    data=st.data(),
    rows=st.integers(1, 8),
    cols=st.integers(1, 6),
    mode=st.sampled_from(MODES),
)
def test_micro_batch_split_leaves_loss_unchanged(
    data: st.DataObject, rows: int, cols: int, mode: str
) -> None:
    seed = data.draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    per_token = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    mask = torch.rand(rows, cols, generator=gen) < 0.6
    cuts = (
        sorted(data.draw(st.lists(st.integers(1, rows - 1), max_size=3, unique=True)))
        if rows > 1
        else []
    )
    bounds = [0, *cuts, rows]
    chunks = [(per_token[a:b], mask[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    # Micro-batches are padded to their own lengths: add extra padding columns to one.
    pad = data.draw(st.integers(0, 3))
    chunks[0] = (
        torch.cat(
            [chunks[0][0], torch.full((chunks[0][0].shape[0], pad), 7.0, dtype=torch.float64)], 1
        ),
        torch.cat([chunks[0][1], torch.zeros(chunks[0][1].shape[0], pad, dtype=torch.bool)], 1),
    )
    whole_norm = loss_normaliser([mask], mode, norm_length=10)
    whole = aggregate_loss(per_token, mask, mode, whole_norm)
    norm = loss_normaliser([m for _, m in chunks], mode, norm_length=10)
    assert norm == whole_norm
    split = sum(aggregate_loss(p, m, mode, norm) for p, m in chunks)
    assert float(split) == pytest.approx(float(whole), abs=1e-12)


def _padded(
    batch: AdvantageBatch, advantages: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(t.token_ids) for t in batch.trajectories)
    adv = torch.zeros(len(advantages), length)
    mask = torch.zeros(len(advantages), length, dtype=torch.bool)
    old = torch.zeros(len(advantages), length)
    for i, (traj, a) in enumerate(zip(batch.trajectories, advantages, strict=True)):
        adv[i, : len(a)] = a
        mask[i, : len(a)] = torch.tensor(traj.sampled)
        old[i, : len(a)] = torch.tensor(traj.old_logprobs)
    return adv, mask, old


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "trace_credit"])
def test_masked_observation_tokens_get_zero_advantage_and_zero_loss(estimator: str) -> None:
    trajs = [
        make_traj(["s1", "s2", "ans"], 1.0, readiness=[-2.0, -1.0, -0.5]),
        make_traj(["s1", "ans"], 0.0, readiness=[-2.0, -3.0]),
        make_traj(["s2", "ans"], 0.5, readiness=[-1.0, -1.0]),
    ]
    batch = AdvantageBatch(trajs)
    adv, mask, old = _padded(batch, get_estimator(estimator)(batch, AdvantageOptions()))
    assert not adv[~mask].any()
    gen = torch.Generator().manual_seed(0)
    lp = old + 0.3 * torch.randn(old.shape, generator=gen)
    loss = clipped_surrogate_loss(lp, old, adv)
    assert not loss[~mask].any()
    # Changing the log-probs of forced tokens changes nothing after aggregation.
    garbage = torch.where(mask, lp, torch.full_like(lp, 50.0))
    for mode in MODES:
        norm = loss_normaliser([mask], mode, norm_length=32)
        a = aggregate_loss(loss + 0.1 * k3_kl(lp, old), mask, mode, norm)
        b = aggregate_loss(
            clipped_surrogate_loss(garbage, old, adv) + 0.1 * k3_kl(garbage, old), mask, mode, norm
        )
        assert torch.equal(a, b)


def test_zero_normaliser_only_for_empty_masks() -> None:
    mask = torch.zeros(2, 3, dtype=torch.bool)
    per_token = torch.ones(2, 3, requires_grad=True)
    for mode in MODES:
        norm = loss_normaliser([mask], mode, norm_length=4)
        assert norm == 0.0
        loss = aggregate_loss(per_token, mask, mode, norm)
        loss.backward()
        assert loss.item() == 0.0
    with pytest.raises(ValueError, match="normaliser is 0"):
        aggregate_loss(per_token, torch.ones(2, 3, dtype=torch.bool), "token-mean", 0.0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: loss_normaliser([torch.ones(2, 2)], "sum"), "token-mean"),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 2), "mean", 1.0),
            "seq-mean-token-mean",
        ),
        (lambda: loss_normaliser([torch.ones(2, 2)], "seq-mean-token-sum-norm"), "norm_length"),
        (lambda: loss_normaliser([torch.ones(2, 2)], "token-mean", norm_length=0), "norm_length"),
        (lambda: loss_normaliser([torch.ones(2, 2, 2)], "token-mean"), "shape"),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 3), "token-mean", 1.0),
            "shape mismatch",
        ),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 2), "token-mean", -1.0),
            "normaliser",
        ),
        (
            lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 2), "token-mean", float("nan")),
            "normaliser",
        ),
        (
            lambda: clipped_surrogate_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2)),
            "shape mismatch",
        ),
        (
            lambda: clipped_surrogate_loss(
                torch.zeros(2), torch.zeros(2), torch.zeros(2), clip_low=1.0
            ),
            "clip_low",
        ),
        (
            lambda: clipped_surrogate_loss(
                torch.zeros(2), torch.zeros(2), torch.zeros(2), clip_high=-0.1
            ),
            "clip_high",
        ),
        (lambda: k3_kl(torch.zeros(2), torch.zeros(1)), "shape mismatch"),
    ],
)
def test_loss_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


def test_available_aggregations() -> None:
    assert available_aggregations() == sorted(MODES)


def test_policy_loss_metrics() -> None:
    old = torch.zeros(4)
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.0]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    mask = torch.tensor([True, True, True, False])
    metrics = policy_loss_metrics(lp, old, adv, mask)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)  # tokens 0 (high) and 2 (low)
    r = torch.tensor([1.5, 1.5, 0.5], dtype=torch.float64)
    assert metrics["approx_kl"] == pytest.approx(float((r - 1 - r.log()).mean()))
    assert metrics["ratio_mean"] == pytest.approx(3.5 / 3)
    empty = policy_loss_metrics(lp, old, adv, torch.zeros(4, dtype=torch.bool))
    assert empty == {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0}
