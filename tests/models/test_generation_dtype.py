"""``model.generation_dtype = 'bfloat16'``: the HF backend samples from a bf16 copy of the policy.

The copy's parameters are bf16 (buffers and ties kept), its forwards run with autocast off even
inside the trainer's bf16 autocast, its KV cache is bf16, it is refreshed at every weight sync,
and the recorded log-probs are the copy's own. The default (``auto``) keeps sampling from the
shared model (tests/models/test_backend.py)."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.config.schema import ConfigError, ModelConfig
from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.factory import make_backend
from tracerl.models.precision import low_precision_copy
from tracerl.models.weights import weight_buckets


def _policy(copy: bool = True) -> HFPolicy:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok))
    with torch.no_grad():  # sharper logits than the default init, so token choices matter
        for p in model.parameters():
            p.mul_(3.0)
    return HFPolicy(model, tok, generation_dtype=torch.bfloat16 if copy else None)


def test_copy_casts_parameters_only_and_keeps_ties() -> None:
    model = tiny_model(400)
    clone = low_precision_copy(model, torch.bfloat16)
    assert {p.dtype for p in clone.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the trainer's weights are untouched
    assert clone.lm_head.weight is clone.model.embed_tokens.weight  # tie_word_embeddings kept
    rotary, source = clone.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq
    assert rotary.dtype == torch.float32 and torch.equal(rotary, source)  # bf16 would shift every angle
    assert not any(p.requires_grad for p in clone.parameters())


def test_kv_cache_and_forwards_stay_bf16_inside_the_trainers_autocast() -> None:
    policy = _policy()
    prefix = policy.tokenizer.encode("Question: Where was the author of Blue River born?\n")
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer's compute_context around rollouts
        gen = policy.generate([prefix], params, seeds=[5])[0]
    assert policy.store is not None
    entry, reused = policy.store.lookup(prefix + gen.token_ids[:-1] + [0])
    assert entry is not None and reused == len(prefix) + len(gen.token_ids) - 1
    keys, values = entry.layers[0]
    assert keys.dtype == values.dtype == torch.bfloat16  # no fp32 promotion through k-norm / cat
    # The recorded log-probs are the copy's: one plain bf16 forward (no autocast) of the same tokens.
    with torch.no_grad():
        logits = policy.net(input_ids=torch.tensor([prefix + gen.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    expected = [logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    assert gen.logprobs == pytest.approx(expected, abs=2e-2)  # bf16: cached vs uncached sums differ slightly


def test_sync_refreshes_the_copy_from_the_model_and_from_buckets() -> None:
    policy = _policy()
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(0.5)
    before = [p.clone() for p in policy.copy.parameters()]
    policy.sync_weights(policy.model, 1)  # the trainer's call: the shared model itself
    for mine, theirs, old in zip(policy.copy.parameters(), policy.model.parameters(), before, strict=True):
        assert torch.equal(mine, theirs.to(torch.bfloat16)) and not torch.equal(mine, old)
    other = tiny_model(len(policy.tokenizer), seed=7)
    policy.sync_weights(weight_buckets(other), 2)  # a worker's call: buckets land in the model, then the copy
    for mine, theirs in zip(policy.copy.parameters(), other.parameters(), strict=True):
        assert torch.equal(mine, theirs.to(torch.bfloat16))
    assert policy.version == 2


def test_bf16_greedy_follows_the_copy_and_auto_has_no_copy() -> None:
    policy, shared = _policy(), _policy(copy=False)
    assert shared.copy is None and shared.net is shared.model
    prefix = policy.tokenizer.encode("Action: answer[")
    gen = policy.generate([prefix], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    seq = prefix + gen.token_ids
    with torch.no_grad():
        logits = policy.copy(input_ids=torch.tensor([seq])).logits[0]
    assert gen.token_ids == logits[len(prefix) - 1 : -1].argmax(-1).tolist()


def test_config_field_and_factory() -> None:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok))
    backend = make_backend(ModelConfig(generation_dtype="bfloat16"), model, tok)
    assert isinstance(backend, HFPolicy) and backend.model is model and backend.copy is not None
    assert make_backend(ModelConfig(), model, tok).copy is None  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"^model.generation_dtype = 'fp16' is not valid; allowed values: auto, "
                                          r"bfloat16$"):
        ModelConfig(generation_dtype="fp16")


def test_trainer_samples_from_the_copy_and_logs_the_gap(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer

    config = resolve_config("grpo", smoke="random", overrides=["steps=1", "eval.every=0", "eval.size=2",
                                                           "model.generation_dtype=bfloat16"])
    with Trainer(config, tmp_path / "run") as trainer:
        assert trainer.recompute_old_logprobs is True  # auto: the bf16 copy is another sampler
        backend = trainer.executor.backend
        assert backend.model is trainer.model and backend.copy is not None
        (record,) = trainer.run()
        for mine, theirs in zip(backend.copy.parameters(), trainer.model.parameters(), strict=True):
            assert torch.equal(mine, theirs.to(torch.bfloat16))  # refreshed after the update
    # bf16 sampling vs the fp32 trainer: a small, nonzero gap, logged every step
    assert 0 < record["logprob_mismatch_mean_abs"] < 0.05 and record["logprob_mismatch_max"] < 1.0
