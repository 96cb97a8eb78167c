"""Atomic checkpoints: a half-written checkpoint is never what a resume reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from tracerl.testbed.tiny import build_tiny_tokenizer
from tracerl.runs.checkpoint import (
    LATEST,
    CheckpointError,
    RngState,
    latest_checkpoint,
    load_trainer_state,
    save_checkpoint,
)
from tracerl.runs.metrics import MetricsLog, read_metrics


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[object, object]:
    tokenizer = build_tiny_tokenizer(["Question: who wrote Velmora ? Action: search[Velmora]"])
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), tokenizer


def test_checkpoint_round_trip_and_pointer(tmp_path: Path, model_and_tokenizer: tuple[object, object]) -> None:
    model, tokenizer = model_and_tokenizer
    generator = torch.Generator().manual_seed(3)
    state = {"step": 2, "rng": RngState.capture(generator).to_dict()}
    folder = save_checkpoint(tmp_path, 2, model, tokenizer, state, "preset: grpo\n")
    assert latest_checkpoint(tmp_path) == folder
    assert (tmp_path / LATEST).read_text() == "ckpt-000002"
    reloaded = AutoModelForCausalLM.from_pretrained(folder / "policy")
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(folder / "policy")("Velmora")["input_ids"] == tokenizer("Velmora")["input_ids"]
    expected = torch.rand(3, generator=generator)
    restored = RngState.from_dict(load_trainer_state(folder)["rng"])
    restored.restore(generator)
    assert torch.equal(torch.rand(3, generator=generator), expected)


def test_newer_checkpoint_replaces_older_and_a_crashed_save_is_ignored(
    tmp_path: Path, model_and_tokenizer: tuple[object, object]
) -> None:
    model, tokenizer = model_and_tokenizer
    save_checkpoint(tmp_path, 1, model, tokenizer, {"step": 1}, "")
    save_checkpoint(tmp_path, 2, model, tokenizer, {"step": 2}, "")
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-000002"]
    # A run killed while writing step 3 leaves a temporary folder behind: resume still sees step 2.
    (tmp_path / ".ckpt-000003.tmp-999").mkdir()
    assert load_trainer_state(latest_checkpoint(tmp_path))["step"] == 2  # type: ignore[arg-type]


def test_pointer_to_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / LATEST).write_text("ckpt-000009")
    with pytest.raises(CheckpointError, match="incomplete or missing"):
        latest_checkpoint(tmp_path)


def test_metrics_lines_after_the_resumed_step_are_dropped(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": float(step), "kl": float("nan")})
    log.truncate_after(2)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["kl"] is None  # NaN is written as null, so every JSON reader copes
