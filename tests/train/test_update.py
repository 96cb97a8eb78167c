"""The policy update: micro-batching and skipping zero-advantage rows leave the step unchanged."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.train.update import UpdateSettings, policy_update, token_logprobs


def _model() -> torch.nn.Module:
    config = Qwen3Config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _trajectory(seed: int, turns: int) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, 40, (n,), generator=g).tolist()  # noqa: E731
    made = [Turn(ids(3 + i), ids(4), "x", Action(kind="tool", name="search")) for i in range(turns)]
    return Trajectory(task_id=str(seed), group_id="g", prompt_ids=ids(5), turns=made)


def _settings(micro: int) -> UpdateSettings:
    return UpdateSettings(micro_batch_size=micro, temperature=1.0, clip_low=0.2, clip_high=0.28,
                          kl_coef=0.0, loss_agg="token-mean", grad_clip=1e9)


def _stepped(model: torch.nn.Module, trajs: list[Trajectory], advs: list[torch.Tensor], micro: int) -> torch.nn.Module:
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy_update(model, optimizer, trajs, advs, _settings(micro), pad_id=0)
    return model


def _with_old_logprobs(model: torch.nn.Module, traj: Trajectory) -> None:
    ids = torch.tensor([traj.token_ids])
    logprobs = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0].tolist()
    for turn, (start, end) in zip(traj.turns, traj.turn_spans, strict=True):
        turn.logprobs = logprobs[start:end]


def test_micro_batches_and_skipped_zero_rows_give_the_same_step() -> None:
    model = _model()
    trajs = [_trajectory(seed, turns=1 + seed % 3) for seed in range(6)]
    for traj in trajs:
        _with_old_logprobs(model, traj)
    advs = []
    for i, traj in enumerate(trajs):
        mask = torch.tensor(traj.sampled, dtype=torch.float32)
        advs.append(mask * (0.0 if i in (1, 4) else (i - 2.5)))  # two rows carry no signal
    whole = _stepped(model, trajs, advs, micro=6)
    split = _stepped(model, trajs, advs, micro=1)
    for (name, a), (_, b) in zip(whole.named_parameters(), split.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), whole.parameters(), strict=True))


def test_observation_tokens_get_no_gradient_signal() -> None:
    """Changing the advantage on forced (observation) tokens changes nothing."""
    model = _model()
    traj = _trajectory(7, turns=2)
    _with_old_logprobs(model, traj)
    sampled = torch.tensor(traj.sampled, dtype=torch.float32)
    base = sampled * 1.5
    noisy = base + (1 - sampled) * 100.0
    a = _stepped(model, [traj], [base], micro=1)
    b = _stepped(model, [traj], [noisy], micro=1)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
