"""Backend lifecycle: explicit weight sync, per-request seeds, the backend factory."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.models import factory
from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.core.seeds import derive_seed
from tracerl.models.sampling import row_uniforms, sample_next_seeded
from tracerl.config.schema import ModelConfig


@pytest.fixture(scope="module")
def tok():
    return bpe_tokenizer()


def _policy(tok, cache: bool = True) -> HFPolicy:
    model = tiny_model(len(tok), seed=2)
    with torch.no_grad():  # sharper logits than the default init, so token choices matter
        for p in model.parameters():
            p.mul_(3.0)
    return HFPolicy(model, tok, prefix_cache_bytes=256 * 2**20 if cache else 0)


def test_a_request_gives_the_same_tokens_alone_or_batched(tok) -> None:
    policy = _policy(tok, cache=False)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9)
    p, q = tok.encode("Question: Who wrote Blue River?\n"), tok.encode("The city of")
    alone = policy.generate([p], params, [41])[0]
    batched = policy.generate([q, p, p, q[:2]], params, [7, 41, 42, 8])
    assert batched[1].token_ids == alone.token_ids
    assert batched[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert batched[2].token_ids != alone.token_ids  # same prefix, another seed: another draw
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prefixes"):
        policy.generate([p, q], params, [1])


def test_seeded_sampling_draws_from_the_tempered_nucleus() -> None:
    """Inverse CDF with one hashed uniform per row: frequencies follow softmax(logits / T) in the top-p set."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    seeds = torch.arange(4000, dtype=torch.int64) * 7919
    tokens, logp = sample_next_seeded(logits, 1.0, 1.0, seeds, torch.zeros(4000, dtype=torch.int64))
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.03)
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1))
    # top_p = 0.7: softmax is [.64, .24, .09, .03]; the nucleus is {0, 1} (mass before token 1 is .64 < .7).
    nucleus, _ = sample_next_seeded(logits, 1.0, 0.7, seeds, torch.zeros(4000, dtype=torch.int64))
    assert set(nucleus.tolist()) == {0, 1}
    u = row_uniforms(torch.tensor([5, 5, 6, -3]), torch.tensor([0, 1, 0, 0]))
    assert torch.all((u > 0) & (u < 1)) and len(set(u.tolist())) == 4
    many = row_uniforms(torch.arange(20000) * 31, torch.zeros(20000, dtype=torch.int64))
    assert abs(many.mean().item() - 0.5) < 0.01 and abs((many < 0.1).float().mean().item() - 0.1) < 0.01
    assert derive_seed(0, "step", 1) == derive_seed(0, "step", 1) != derive_seed(0, "step", 2)


def test_sync_weights_clears_the_prefix_store_and_changes_outputs(tok) -> None:
    policy = _policy(tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    prefix = tok.encode("Question: Who wrote Blue River?\n")
    first = policy.generate([prefix], params, [3])[0]
    assert len(policy.store) > 0
    with torch.no_grad():  # what an optimiser step does, without telling the backend
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reused = policy.stats["reused_prefix_tokens"]
    policy.generate([prefix + first.token_ids], params, [4])
    assert policy.stats["reused_prefix_tokens"] > reused  # no hidden polling: the store is still used
    policy.sync_weights(policy.model, 1)
    assert len(policy.store) == 0 and policy.version == 1
    after = policy.generate([prefix], params, [3])[0]
    assert (after.token_ids, after.logprobs) != (first.token_ids, first.logprobs)
    # A state dict from another model is loaded into the policy's model.
    other = tiny_model(len(tok), seed=9)
    policy.sync_weights(other.state_dict(), 2)
    assert all(torch.equal(a, b) for a, b in zip(policy.model.parameters(), other.parameters(), strict=True))


def test_make_backend_builds_hf_and_names_the_vllm_extra(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(len(tok))
    backend = factory.make_backend(ModelConfig(), model, tok)
    assert isinstance(backend, HFPolicy) and backend.model is model
    monkeypatch.setattr(factory, "vllm_available", lambda: False)
    cfg = ModelConfig()
    cfg.backend = "vllm"  # set after validation: the factory checks again
    with pytest.raises(ValueError, match=r"pip install -e '\.\[vllm\]' \(or make vllm\)"):
        factory.make_backend(cfg, model, tok)


def test_vllm_is_found_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: seen.append(name) or real(name, *a))
    factory.vllm_available()
    assert seen == ["vllm"]
