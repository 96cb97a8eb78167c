"""The decode loop's host-side savings keep every output: the stop-string pre-filter (only rows whose
new token could complete a stop string decode their tail) and one mask copy for finished rows' KV.

Each test runs the same seeded batch with the saving and with it forced off and compares tokens,
log-probs, finish reasons and stored prefixes exactly."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model, word_tokenizer

from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.stop_filter import filter_is_exact, stop_candidates

STOPS = ("e ", "th", "]")  # frequent enough that rows stop on them


def _policy(tok) -> HFPolicy:  # type: ignore[no-untyped-def]
    model = tiny_model(len(tok))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return HFPolicy(model, tok)


def _run(policy: HFPolicy, stops: tuple[str, ...], filtered: bool) -> list[tuple]:
    tok = policy.tokenizer
    if not filtered:  # the table cache holds "no filter" for this key: every live row is decoded
        policy._stop_tables[(stops, policy.model.config.vocab_size, "cpu")] = None
    prefixes = [tok.encode(t) for t in ["Question: Where was", "Action: search[", "The author of Blue"]] * 4
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop_strings=stops)
    gens = policy.generate(prefixes, params, seeds=list(range(100, 112)))
    return [(g.token_ids, g.logprobs, g.finish_reason, g.text) for g in gens]


def test_filtered_stop_check_gives_the_same_generations() -> None:
    stops = ("e", "th", "]")
    before, after = _run(_policy(bpe_tokenizer()), stops, False), _run(_policy(bpe_tokenizer()), stops, True)
    assert after == before
    assert sum(reason == "stop" for _, _, reason, _ in after) >= 3  # the stop rule was exercised
    table = stop_candidates(bpe_tokenizer(), stops, 400, "cpu")
    assert table is not None and 0 < int(table.sum()) < table.numel()  # some tokens skip the decode


def test_candidates_by_hand() -> None:
    tok = bpe_tokenizer()
    table = stop_candidates(tok, ("</x>",), len(tok) + 3, "cpu")
    assert table is not None and table.numel() == len(tok) + 3
    assert bool(table[-3:].all())  # ids the tokenizer does not know are always checked
    for i in range(len(tok)):
        text = tok.decode([i], skip_special_tokens=False)
        assert bool(table[i]) == (">" in text or "\ufffd" in text)


@pytest.mark.parametrize("stops", [("e ",), ("\ufffdx",)])
def test_no_filter_where_it_could_differ(stops: tuple[str, ...]) -> None:
    assert not filter_is_exact(bpe_tokenizer(), stops)  # trailing whitespace / replacement character
    assert stop_candidates(bpe_tokenizer(), stops, 400, "cpu") is None
    assert not filter_is_exact(word_tokenizer(), ("]",))  # WordPiece joins tokens: not a local decoder


def test_finished_rows_store_their_own_kv() -> None:
    # Rows of different prefix lengths (left padding) finishing at different steps: each stored
    # entry is its row's prefix + generated tokens (but the last), with the KV a plain forward gives.
    policy = _policy(bpe_tokenizer())
    tok = policy.tokenizer
    prefixes = [tok.encode("Question: Where was the author born?"), tok.encode("Action: search[")]
    gens = policy.generate(prefixes, SamplingParams(max_new_tokens=12, temperature=1.0, stop_strings=STOPS),
                           seeds=[7, 8])
    assert policy.store is not None
    for prefix, gen in zip(prefixes, gens, strict=True):
        key = prefix + gen.token_ids[:-1]
        entry, reused = policy.store.lookup(key + [0])
        assert entry is not None and reused == len(key)
        with torch.no_grad():
            out = policy.model(input_ids=torch.tensor([key]), use_cache=True)
        keys = out.past_key_values.layers[0].keys[0]
        assert torch.allclose(entry.layers[0][0][:, : len(key)], keys, atol=1e-4)
