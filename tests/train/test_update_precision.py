"""Device, precision and memory of the policy update: fp32 master weights under bf16 autocast,
chunked log-probs equal to the full computation, gradient checkpointing, the finite check."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.models.memory import enable_gradient_checkpointing
from tracerl.models.heads import logit_transform
from tracerl.train.update import (
    UpdateSettings,
    _full_logprobs,
    _micro_batch_loss,
    pad_trajectories,
    policy_update,
    token_logprobs,
)

VOCAB = 40


def _model(seed: int = 0) -> torch.nn.Module:
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def _trajectory(seed: int, turns: int) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    made = [Turn(ids(3 + i), ids(4), "x", Action(kind="tool", name="search")) for i in range(turns)]
    return Trajectory(task_id=str(seed), group_id="g", prompt_ids=ids(5), turns=made)


def _settings(**changes) -> UpdateSettings:
    base = UpdateSettings(micro_batch_size=4, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                          loss_agg="token-mean", grad_clip=1e9)
    return UpdateSettings(**{**base.__dict__, **changes})


def _batch(model: torch.nn.Module, n: int = 4) -> tuple[list[Trajectory], list[torch.Tensor]]:
    """Trajectories with on-policy old log-probs and alternating +-1 advantages on sampled tokens."""
    trajs = [_trajectory(seed, turns=1 + seed % 2) for seed in range(n)]
    for traj in trajs:
        ids = torch.tensor([traj.token_ids], device=next(model.parameters()).device)
        with torch.no_grad():
            logprobs = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0].tolist()
        for turn, (start, end) in zip(traj.turns, traj.turn_spans, strict=True):
            turn.logprobs = logprobs[start:end]
    advs = [torch.tensor(t.sampled, dtype=torch.float32) * (1.0 if i % 2 else -1.0) for i, t in enumerate(trajs)]
    return trajs, advs


def test_padded_batch_lives_on_the_model_device_and_the_update_runs() -> None:
    model = _model()
    trajs, advs = _batch(model)
    device = next(model.parameters()).device
    batch = pad_trajectories(trajs, advs, pad_id=0, device=device)
    for tensor in (batch.input_ids, batch.attention_mask, batch.loss_mask, batch.old_logprobs, batch.advantages):
        assert tensor.device == device
    assert batch.input_ids.shape == (4, max(len(t.token_ids) for t in trajs))
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.1), trajs, advs, _settings(), pad_id=0)
    assert metrics["nonfinite_skipped"] == 0.0
    assert metrics["trained_tokens"] == sum(sum(t.sampled) for t in trajs)
    assert all(isinstance(v, float) for v in metrics.values())


def test_bf16_compute_with_fp32_master_weights_applies_a_1e_6_step() -> None:
    """lr = 1e-6: with float32 master weights the step lands; the old scheme (bf16 weights updated in
    place) rounds ``w + delta`` back to ``w`` for nearly every weight, so nothing would train."""
    model = _model()
    trajs, advs = _batch(model)
    master = copy.deepcopy(model)
    before = {k: v.detach().clone() for k, v in master.named_parameters()}
    optimizer = torch.optim.AdamW(master.parameters(), lr=1e-6, weight_decay=0.0)
    policy_update(master, optimizer, trajs, advs, _settings(dtype="bfloat16"), pad_id=0)
    changed = sum(int((p != before[k]).sum()) for k, p in master.named_parameters())
    total = sum(p.numel() for p in master.parameters())
    assert all(p.dtype == torch.float32 for p in master.parameters())
    assert changed > 0.9 * total
    # The update is below bf16 resolution for most weights: rounding the new weight to bf16 gives the old one.
    lost = sum(int((p.bfloat16() == before[k].bfloat16()).sum()) for k, p in master.named_parameters())
    assert lost > 0.95 * total

    naive = copy.deepcopy(model).to(torch.bfloat16)  # the old behaviour: the weights themselves are bf16
    naive_before = [p.detach().clone() for p in naive.parameters()]
    naive_opt = torch.optim.AdamW(naive.parameters(), lr=1e-6, weight_decay=0.0)
    policy_update(naive, naive_opt, trajs, advs, _settings(), pad_id=0)
    naive_changed = sum(int((p != q).sum()) for p, q in zip(naive.parameters(), naive_before, strict=True))
    assert naive_changed < 0.05 * total


def test_bf16_autocast_logprobs_are_close_to_fp32_and_the_loss_is_fp32() -> None:
    model = _model()
    trajs, advs = _batch(model)
    batch = pad_trajectories(trajs, advs, pad_id=0)
    with torch.no_grad():
        exact = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0)
    assert low.dtype == torch.float32
    assert not torch.equal(low, exact)  # autocast really ran in bf16
    assert torch.allclose(low, exact, atol=0.05)
    loss, stats = _micro_batch_loss(model, batch, _settings(dtype="bfloat16"), 10.0, None)
    assert loss.dtype == torch.float32 and stats.dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_full_vocabulary_computation(temperature: float) -> None:
    model = _model()
    model.train()
    trajs, advs = _batch(model)
    batch = pad_trajectories(trajs, advs, pad_id=0)
    weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(1))

    def value_and_grads(fn) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        out = fn()
        (out * weights).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    full_value, full_grads = value_and_grads(lambda: torch.cat(
        [torch.zeros(4, 1), _full_logprobs(model, batch.input_ids, batch.attention_mask, temperature)], dim=1))
    # chunk 7 does not divide the 4 x (L-1) positions: the last chunk is partial.
    chunk_value, chunk_grads = value_and_grads(
        lambda: token_logprobs(model, batch.input_ids, batch.attention_mask, temperature, chunk=7))
    assert torch.allclose(chunk_value, full_value, atol=1e-5)
    for a, b in zip(chunk_grads, full_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients() -> None:
    plain = _model()
    trajs, advs = _batch(plain)
    ckpt = copy.deepcopy(plain)
    enable_gradient_checkpointing(ckpt)
    results = []
    for model in (plain, ckpt):
        metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), trajs, advs, _settings(), 0)
        results.append((metrics["loss"], [p.grad.clone() for p in model.parameters()]))
    assert any(getattr(m, "gradient_checkpointing", False) for m in ckpt.modules())
    assert not any(getattr(m, "gradient_checkpointing", False) for m in plain.modules())
    assert math.isclose(results[0][0], results[1][0], rel_tol=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_nonfinite_step_is_skipped_and_reported() -> None:
    model = _model()
    trajs, advs = _batch(model)
    # An overflowing advantage on row 1's sampled tokens makes the loss and the gradients non-finite.
    advs[1] = torch.where(advs[1] != 0, torch.tensor(float("inf")), torch.tensor(0.0))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = policy_update(model, optimizer, trajs, advs, _settings(), pad_id=0)
    assert metrics["nonfinite_skipped"] == 1.0
    assert not math.isfinite(metrics["loss"]) or not math.isfinite(metrics["grad_norm"])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert not optimizer.state  # AdamW never stepped, so its moments were not polluted


def test_token_logprobs_rejects_a_non_positive_temperature() -> None:
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(_model(), ids, torch.ones_like(ids), 0.0)


def test_logit_transforms_of_families_that_rescale_logits() -> None:
    x = torch.tensor([1.0, -4.0])
    softcap = logit_transform(type("C", (), {"final_logit_softcapping": 2.0})())
    assert torch.allclose(softcap(x), torch.tensor([2 * math.tanh(0.5), 2 * math.tanh(-2.0)]))
    cohere = logit_transform(type("C", (), {"logit_scale": 0.5})())
    assert torch.equal(cohere(x), torch.tensor([0.5, -2.0]))
    granite = logit_transform(type("C", (), {"logits_scaling": 4.0})())
    assert torch.equal(granite(x), torch.tensor([0.25, -1.0]))
    assert torch.equal(logit_transform(object())(x), x)


def test_trainer_with_bf16_compute_keeps_fp32_master_state(tmp_path) -> None:
    """Two smoke steps of ``trace`` with bf16 autocast, a KL term and gradient checkpointing."""
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer

    config = resolve_config("trace", smoke="random", overrides=[
        "model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
        "eval.size=4", "steps=2", "model.dtype=bfloat16", "optim.kl_coef=0.01", "optim.gradient_checkpointing=true"])
    trainer = Trainer(config, tmp_path)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    records = trainer.run()
    assert [r["nonfinite_skipped"] for r in records] == [0.0, 0.0]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in records)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert {p.dtype for p in trainer.reference.model.parameters()} == {torch.bfloat16}
    assert any(not torch.equal(before[k], p) for k, p in trainer.model.named_parameters())


def test_a_step_where_no_row_carries_signal_runs_nothing() -> None:
    model = _model()
    trajs, advs = _batch(model)
    before = [p.detach().clone() for p in model.parameters()]
    zero = [torch.zeros_like(a) for a in advs]
    metrics = policy_update(model, torch.optim.AdamW(model.parameters(), lr=1.0), trajs, zero, _settings(), 0)
    assert metrics == {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0, "trained_tokens": 0.0,
                       "update_forward_tokens": 0.0, "unique_trained_tokens": 0.0, "nonfinite_skipped": 0.0}
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_update_on_cuda_with_low_precision_compute_and_a_kl_reference(dtype: str) -> None:
    from tracerl.models.precision import grad_scaler
    from tracerl.models.scoring import ReferenceScorer

    model = _model().to("cuda")
    trajs, advs = _batch(model)
    scorer = ReferenceScorer(model, None, None, dtype=getattr(torch, dtype))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    scaler = grad_scaler("cuda", dtype)
    for _ in range(8):  # fp16: the scaler may skip its first steps while it finds a scale without overflow
        metrics = policy_update(model, optimizer, trajs, advs, _settings(dtype=dtype, kl_coef=0.1), 0, scorer, scaler)
        if not metrics["nonfinite_skipped"]:
            break
    assert metrics["nonfinite_skipped"] == 0.0 and math.isfinite(metrics["kl"])
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert sum(int((p != q).sum()) for p, q in zip(model.parameters(), before, strict=True)) > 0


def test_a_loss_scale_overflow_is_the_scalers_skip_not_a_nonfinite_step() -> None:
    """fp16 scaling: a finite loss whose scaled gradients overflow is skipped by the scaler (which
    lowers its scale) and must not count towards optim.max_nonfinite_steps."""
    model = _model()
    trajs, advs = _batch(model)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # scaled float32 gradients overflow to inf
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = policy_update(model, optimizer, trajs, advs, _settings(), pad_id=0, scaler=scaler)
    assert math.isfinite(metrics["loss"]) and not math.isfinite(metrics["grad_norm"])
    assert metrics["scaler_skipped"] == 1.0 and metrics["nonfinite_skipped"] == 0.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert scaler.get_scale() < 2.0**127  # the scaler backed off
