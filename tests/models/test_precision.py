"""Working precision: the autocast context, float32 loading, the bf16 reference, policy reloading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers_tiny import SENTENCES, tiny_model, word_tokenizer

from tracerl.agent.formats import get_format
from tracerl.models.loading import load_policy_state
from tracerl.testbed.loading import load_model
from tracerl.models.precision import compute_context, grad_scaler
from tracerl.models.scoring import ReferenceScorer
from tracerl.config.schema import ConfigError, resolve_config


def test_compute_context_autocasts_low_precision_only() -> None:
    with compute_context("cpu", "float32"):
        assert not torch.is_autocast_enabled("cpu")
    with compute_context("cpu", "bfloat16"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float16"):
        compute_context("cpu", "float16")
    with pytest.raises(ValueError, match="dtype"):
        compute_context("cpu", "float8")


@pytest.mark.filterwarnings("ignore:.*CUDA is not available")
def test_compute_context_keys_autocast_by_device_type() -> None:
    """Every CUDA index shares the ``cuda`` autocast (built, not entered: no GPU needed)."""
    ctx = compute_context("cuda:1", "bfloat16")
    assert isinstance(ctx, torch.autocast) and ctx.device == "cuda"
    assert compute_context(torch.device("cuda", 0), "float16").fast_dtype == torch.float16
    assert grad_scaler("cuda:0", "float16") is not None
    assert grad_scaler("cuda", "bfloat16") is None and grad_scaler("cpu", "float32") is None


def test_float16_on_cpu_is_rejected_at_config_load(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="model.dtype = 'float16' needs model.device = 'cuda'"):
        resolve_config("grpo", smoke="random", overrides=["model.dtype=float16"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the device check must find cuda:1
    config = resolve_config("grpo", smoke="random", overrides=["model.dtype=float16", "model.device=cuda:1"])
    assert config.model.dtype == "float16"


def test_weights_load_as_float32_whatever_the_working_dtype(tmp_path: Path) -> None:
    model, tok = load_model("random-tiny", vocabulary_texts=SENTENCES, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_model(str(tmp_path), dtype="bfloat16")
    assert {p.dtype for p in again.parameters()} == {torch.float32}
    with pytest.raises(ValueError, match="dtype"):
        load_model("random-tiny", vocabulary_texts=SENTENCES, dtype="fp8")


def test_load_policy_state_restores_saved_weights_in_place(tmp_path: Path) -> None:
    tok = word_tokenizer()
    saved, other = tiny_model(len(tok), seed=1), tiny_model(len(tok), seed=2)
    saved.save_pretrained(tmp_path)
    load_policy_state(other, tmp_path)
    for (name, a), b in zip(saved.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(p.dtype == torch.float32 for p in other.parameters())
    with pytest.raises(RuntimeError, match="does not match the model: unexpected"):
        load_policy_state(tiny_model(len(tok), layers=1), tmp_path)  # the checkpoint has a second layer
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_policy_state(tiny_model(len(tok), hidden=32), tmp_path)
    with pytest.raises(FileNotFoundError):
        load_policy_state(other, tmp_path / "missing")


def test_reference_is_a_frozen_copy_in_the_working_dtype() -> None:
    tok = word_tokenizer()
    model = tiny_model(len(tok))
    scorer = ReferenceScorer(model, tok, get_format("react"), dtype=torch.bfloat16)
    assert {p.dtype for p in scorer.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the policy is untouched
    assert not any(p.requires_grad for p in scorer.model.parameters())
    with scorer.frozen():  # a plain model: the null context
        pass
