"""Backend config validation and the importance-sampling guard (recomputed old log-probs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from helpers_tiny import tiny_model

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.config.schema import ConfigError, ModelConfig, resolve_config
from tracerl.train.loop import Trainer
from tracerl.train.update import UpdateSettings, token_logprobs, with_trainer_logprobs

VLLM_HINT = r"model.backend = 'vllm' needs vLLM: pip install -e '\.\[vllm\]' \(or make vllm\)"


def _hide_vllm(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present else None) if name == "vllm" else real(name, *a))


def test_backend_is_validated_at_config_load(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_config("grpo").model.backend == "hf"
    with pytest.raises(ConfigError, match="model.backend = 'sglang' is not valid; allowed values: hf, vllm"):
        resolve_config("grpo", overrides=["model.backend=sglang"])
    _hide_vllm(monkeypatch, present=False)
    with pytest.raises(ConfigError, match=VLLM_HINT):
        resolve_config("grpo", overrides=["model.backend=vllm"])
    _hide_vllm(monkeypatch, present=True)  # found (not imported): the config loads
    assert resolve_config("grpo", overrides=["model.backend=vllm"]).model.backend == "vllm"
    with pytest.raises(ConfigError, match="optim.recompute_old_logprobs = 'sometimes' is not valid"):
        resolve_config("grpo", overrides=["optim.recompute_old_logprobs=sometimes"])
    with pytest.raises(ConfigError, match=r"model.vllm_gpu_memory_utilization must be in \(0, 1\]"):
        resolve_config("grpo", overrides=["model.vllm_gpu_memory_utilization=1.5"])


def test_vllm_sleep_needs_the_vllm_backend_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="model.vllm_sleep needs model.backend = 'vllm' \\(got 'hf'\\)"):
        resolve_config("grpo", overrides=["model.vllm_sleep=true"])
    _hide_vllm(monkeypatch, present=True)
    with pytest.raises(ConfigError, match="model.vllm_sleep needs model.device = 'cuda' \\(got 'cpu'\\)"):
        resolve_config("grpo", overrides=["model.backend=vllm", "model.vllm_sleep=true", "model.device=cpu"])
    assert ModelConfig(backend="vllm", vllm_sleep=True, device="cuda").vllm_sleep  # the section itself is valid


def _trajectory(prompt: list[int], turns: list[tuple[list[int], list[int], list[float]]]) -> Trajectory:
    return Trajectory("t", "g", prompt, [Turn(a, o, "", Action("tool"), logprobs=lp) for a, o, lp in turns])


def test_recomputed_logprobs_and_the_mismatch_are_hand_checkable() -> None:
    model = tiny_model(50, seed=1).eval()
    settings = UpdateSettings(micro_batch_size=1, temperature=0.7, clip_low=0.2, clip_high=0.2, kl_coef=0.0,
                              loss_agg="token-mean", grad_clip=1.0)
    a = _trajectory([3, 4], [([5, 6], [7], [0.0, 0.0]), ([8], [], [0.0])])
    b = _trajectory([9], [([10, 11, 12], [], [0.0, 0.0, 0.0])])
    ids = [torch.tensor([t.token_ids]) for t in (a, b)]
    truth = [token_logprobs(model, i, torch.ones_like(i), 0.7)[0].tolist() for i in ids]
    # Sampler log-probs = trainer log-probs + 0.5 on a's tokens, - 0.25 on b's, + 2.0 on b's last.
    a = _trajectory([3, 4], [([5, 6], [7], [truth[0][2] + 0.5, truth[0][3] + 0.5]), ([8], [], [truth[0][5] + 0.5])])
    b = _trajectory([9], [([10, 11, 12], [], [truth[1][1] - 0.25, truth[1][2] - 0.25, truth[1][3] + 2.0])])
    fixed, metrics = with_trainer_logprobs(model, [a, b], settings, pad_id=0)
    assert metrics["logprob_mismatch_max"] == pytest.approx(2.0, abs=1e-5)
    assert metrics["logprob_mismatch_mean_abs"] == pytest.approx((3 * 0.5 + 2 * 0.25 + 2.0) / 6, abs=1e-5)
    for traj, row in zip(fixed, truth, strict=True):
        sampled = [lp for lp, m in zip(traj.old_logprobs, traj.sampled, strict=True) if m]
        assert sampled == pytest.approx([lp for lp, m in zip(row, traj.sampled, strict=True) if m], abs=1e-6)
    assert a.turns[0].logprobs[0] == pytest.approx(truth[0][2] + 0.5)  # the inputs are not modified


def test_hf_backend_always_recomputes_with_near_zero_mismatch(tmp_path: Path) -> None:
    config = resolve_config("grpo", smoke="random", overrides=["steps=1", "eval.every=0", "eval.size=2",
                                                           "optim.recompute_old_logprobs=always"])
    with Trainer(config, tmp_path / "always") as trainer:
        (record,) = trainer.run()
        assert trainer.executor.backend.version == 1  # the trainer synced the backend after its one update
    assert record["logprob_mismatch_mean_abs"] < 1e-4 and record["logprob_mismatch_max"] < 1e-4
    auto = resolve_config("grpo", smoke="random", overrides=["steps=1", "eval.every=0", "eval.size=2"])
    with Trainer(auto, tmp_path / "auto") as trainer:
        assert trainer.recompute_old_logprobs is False  # auto: only when the sampler is another engine
