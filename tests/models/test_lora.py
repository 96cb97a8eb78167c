"""LoRA through peft (extra ``tracerl[lora]``): adapters train, the base stays, the reference is the
base model with the adapter disabled. Run with ``make test-extras``; skipped when peft is missing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

pytestmark = pytest.mark.extras
peft = pytest.importorskip("peft")

from tracerl.agent.formats import get_format  # noqa: E402
from tracerl.core.types import Action, Task, Trajectory, Turn  # noqa: E402
from tracerl.models.loading import load_policy_state  # noqa: E402
from tracerl.models.lora import apply_lora, is_peft_model, trainable_parameters  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.train.update import UpdateSettings, policy_update, token_logprobs  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _trajectory(tok) -> tuple[Trajectory, Task]:
    task = Task("t1", "Where was the author of Blue River born?", ("Lumen",))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    search = Action(kind="tool", name="search", arguments={"query": "Blue River"})
    turns = [
        Turn(enc("Action: search[Blue River]\nObservation:"), enc(" Blue River is a novel by Ada Stone.\n"), "", search),
        Turn(enc("Action: answer[Lumen]") + [tok.eos_token_id], [], "", Action(kind="answer", answer="Lumen")),
    ]
    return Trajectory("t1", "g", enc("Question: " + task.question + "\n"), turns), task


def _settings(kl: float = 0.0) -> UpdateSettings:
    return UpdateSettings(micro_batch_size=2, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=kl,
                          loss_agg="token-mean", grad_clip=1e9)


def _on_policy(model, traj: Trajectory) -> torch.Tensor:
    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logprobs = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0].tolist()
    for turn, (start, end) in zip(traj.turns, traj.turn_spans, strict=True):
        turn.logprobs = logprobs[start:end]
    return torch.tensor(traj.sampled, dtype=torch.float32)


def _wrapped(seed: int = 2):
    tok = bpe_tokenizer()
    base = tiny_model(len(tok), seed=seed)
    return tok, base, apply_lora(copy.deepcopy(base), r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)


def test_only_adapter_parameters_train_and_an_update_moves_only_them() -> None:
    tok, _, model = _wrapped()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert {p.dtype for p in trainable_parameters(model)} == {torch.float32}
    traj, _ = _trajectory(tok)
    adv = _on_policy(model, traj) * 1.0
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    metrics = policy_update(model, optimizer, [traj], [adv], _settings(), pad_id=tok.pad_token_id)
    assert metrics["nonfinite_skipped"] == 0.0
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all("lora_" in n for n in moved)


def test_reference_is_the_base_model_with_the_adapter_disabled() -> None:
    tok, base, model = _wrapped()
    fmt = get_format("react")
    traj, task = _trajectory(tok)
    scorer = ReferenceScorer(model, tok, fmt)
    assert scorer.model is model  # no second copy
    adv = _on_policy(model, traj)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    for _ in range(3):  # train the adapter away from zero
        policy_update(model, optimizer, [traj], [adv], _settings(), pad_id=tok.pad_token_id)
    model.eval()
    expected = ReferenceScorer(base, tok, fmt).readiness(traj, task)
    assert scorer.readiness(traj, task) == pytest.approx(expected, abs=1e-5)
    with torch.no_grad():  # with the adapter on, the trained policy scores differently
        ids = torch.tensor([traj.token_ids])
        on = token_logprobs(model, ids, torch.ones_like(ids), 1.0)
        with scorer.frozen():
            off = token_logprobs(model, ids, torch.ones_like(ids), 1.0)
        plain = token_logprobs(base, ids, torch.ones_like(ids), 1.0)
    assert torch.allclose(off, plain, atol=1e-5)
    assert not torch.allclose(on, plain, atol=1e-3)


def test_kl_reference_through_the_scorer_is_zero_before_training() -> None:
    tok, _, model = _wrapped()
    traj, _ = _trajectory(tok)
    adv = _on_policy(model, traj)
    scorer = ReferenceScorer(model, tok, get_format("react"))
    optimizer = torch.optim.SGD(trainable_parameters(model), lr=0.0)
    metrics = policy_update(model, optimizer, [traj], [adv], _settings(kl=0.1), tok.pad_token_id, scorer)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # lora_B starts at zero: policy == base


def test_adapter_checkpoint_round_trip(tmp_path: Path) -> None:
    tok, base, model = _wrapped()
    with torch.no_grad():
        for p in trainable_parameters(model):
            p.normal_()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists()
    fresh = apply_lora(copy.deepcopy(base), r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)
    assert is_peft_model(fresh) and not is_peft_model(base)
    load_policy_state(fresh, tmp_path)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_two_trainer_steps_of_trace_with_lora(tmp_path: Path) -> None:
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer

    config = resolve_config("trace", smoke="random", overrides=[
        "model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
        "eval.size=4", "steps=2", "model.lora.r=4", "optim.lr=1e-2", "model.dtype=bfloat16"])
    trainer = Trainer(config, tmp_path)
    assert trainer.reference is not None and trainer.reference.model is trainer.model
    # bf16 compute: the frozen base is kept in bf16 (no master copy needed), the adapter in float32.
    dtypes = {p.dtype for n, p in trainer.model.named_parameters() if "lora_" not in n}
    assert dtypes == {torch.bfloat16}
    assert {p.dtype for p in trainable_parameters(trainer.model)} == {torch.float32}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    records = trainer.run()
    assert len(records) == 2 and all(r["nonfinite_skipped"] == 0.0 for r in records)
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all("lora_" in n for n in moved)
    assert (tmp_path / "ckpt-000002" / "policy" / "adapter_model.safetensors").exists()
