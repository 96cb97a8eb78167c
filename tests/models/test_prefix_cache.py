"""Prefix KV store: lookup, inheritance, eviction; HFPolicy reuses stored KV across calls exactly."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.prefix_cache import PrefixKVStore


def _kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer, one head, head_dim 2, float32: 16 bytes per token."""
    return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]


def test_lookup_returns_the_longest_registered_prefix() -> None:
    store = PrefixKVStore(max_bytes=10_000)
    store.add((1, 2, 3, 4, 5, 6), _kv(6), register=(3,))
    entry, use = store.lookup([1, 2, 3, 4, 5, 6, 7, 8])
    assert entry is not None and use == 6
    entry, use = store.lookup([1, 2, 3, 9])  # only the registered length 3 matches
    assert entry is not None and use == 3
    assert store.lookup([1, 2, 3, 4, 9])[1] == 3  # length 4 is not registered
    assert store.lookup([1, 2, 3])[1] == 2  # the last token is always fed again for its logits
    assert store.lookup([7, 2, 3, 4]) == (None, 0)


def test_extending_entry_inherits_registrations_and_replaces_it() -> None:
    store = PrefixKVStore(max_bytes=10_000)
    store.add((1, 2, 3), _kv(3), register=(2,))
    first, _ = store.lookup([1, 2, 3, 4])
    store.add((1, 2, 3, 4, 5, 6), _kv(6), register=(4,), extends=first)
    assert len(store) == 1 and store.nbytes == 6 * 16  # keys + values, 2 floats each per token
    for query, expected in [([1, 2, 9], 2), ([1, 2, 3, 9], 3), ([1, 2, 3, 4, 9], 4), ([1, 2, 3, 4, 5, 6, 7], 6)]:
        entry, use = store.lookup(query)
        assert entry is not None and entry.key == (1, 2, 3, 4, 5, 6) and use == expected


def test_lru_eviction_by_bytes() -> None:
    per_token = 2 * 2 * 4  # keys and values, head_dim 2, float32
    store = PrefixKVStore(max_bytes=10 * per_token)
    store.add((1, 1, 1, 1), _kv(4), register=())
    store.add((2, 2, 2, 2), _kv(4), register=())
    store.lookup([1, 1, 1, 1, 0])  # touch the first entry: the second is now the oldest
    store.add((3, 3, 3, 3), _kv(4), register=())
    assert store.lookup([2, 2, 2, 2, 0]) == (None, 0)
    assert store.lookup([1, 1, 1, 1, 0])[1] == 4 and store.lookup([3, 3, 3, 3, 0])[1] == 4
    assert store.nbytes == 8 * per_token
    store.add(tuple(range(20)), _kv(20), register=())  # larger than the whole budget: not stored
    assert len(store) == 2
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixKVStore(-1)


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok), seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return HFPolicy(model, tok)


def _check_logprobs(policy: HFPolicy, prefix: list[int], gen) -> None:
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prefix + gen.token_ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    expected = [logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    assert gen.logprobs == pytest.approx(expected, abs=1e-4)


def test_next_turn_prefills_only_new_tokens_and_stays_exact(policy: HFPolicy) -> None:
    tok, gen = policy.tokenizer, torch.Generator().manual_seed(0)
    policy.clear_prefix_cache()
    params = SamplingParams(max_new_tokens=8)
    first = [tok.encode("Question: Where was the author of Blue River born?\n"), tok.encode("Action:")]
    turn1 = policy.generate(first, params, generator=gen)
    obs = tok.encode(" Blue River is a novel by Ada Stone.\n")
    second = [first[0] + turn1[0].token_ids + obs, first[1] + turn1[1].token_ids + obs]
    new_prompt = tok.encode("Question: Who founded Varo and where is the city of Lumen?\n")  # a miss
    before = dict(policy.stats)
    turn2 = policy.generate(second + [new_prompt], params, generator=gen)
    computed = policy.stats["prefill_tokens"] - before["prefill_tokens"]
    assert computed == 2 * (len(obs) + 1) + len(new_prompt)  # last sampled token + observation
    for prefix, g in zip(second + [new_prompt], turn2, strict=True):
        _check_logprobs(policy, prefix, g)


def test_branch_from_an_earlier_boundary_hits_the_chain(policy: HFPolicy) -> None:
    tok, gen = policy.tokenizer, torch.Generator().manual_seed(1)
    policy.clear_prefix_cache()
    params = SamplingParams(max_new_tokens=6)
    s0 = tok.encode("Question: Who wrote Blue River?\n")
    t1 = policy.generate([s0], params, generator=gen)[0]
    s1 = s0 + t1.token_ids + tok.encode(" Ada Stone.\n")
    t2 = policy.generate([s1], params, generator=gen)[0]
    policy.generate([s1 + t2.token_ids + tok.encode(" Lumen.\n")], params, generator=gen)
    assert len(policy.store) == 1  # the chain's entries were merged as it grew
    before = policy.stats["prefill_tokens"]
    branches = policy.generate([s1, s1, s1], params, generator=gen)  # three continuations from boundary S_1
    assert policy.stats["prefill_tokens"] - before == 1
    for g in branches:
        _check_logprobs(policy, s1, g)


def test_store_is_cleared_when_weights_are_synced() -> None:
    tok = bpe_tokenizer()
    policy = HFPolicy(tiny_model(len(tok), seed=6), tok)
    prefix = tok.encode("Question: Who wrote Blue River?\n")
    out = policy.generate([prefix], SamplingParams(max_new_tokens=4))[0]
    nxt = prefix + out.token_ids + [5]
    with torch.no_grad():
        next(policy.model.parameters()).add_(0.1)  # what an optimiser step does
    policy.sync_weights(policy.model, 1)  # what the trainer does after an optimiser step
    assert policy.version == 1
    before = policy.stats["prefill_tokens"]
    gen = policy.generate([nxt], SamplingParams(max_new_tokens=4))[0]
    assert policy.stats["prefill_tokens"] - before == len(nxt)
    _check_logprobs(policy, nxt, gen)
    disabled = HFPolicy(policy.model, tok, prefix_cache_bytes=0)
    assert disabled.store is None
