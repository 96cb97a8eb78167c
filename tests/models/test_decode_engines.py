"""The decode engines (``model.decode_engine``: ``async`` reads stops one step late and keeps finished
rows in the batch; ``static`` does that on transformers' StaticCache slots) against the eager loop,
on a real tiny Qwen3 model and a byte-level BPE tokenizer.

What is compared: tokens, finish reasons, texts and the prefix store's keys and registrations
exactly; log-probs and the stored KV exactly where both loops run the same batch shapes, else to
1e-4. Why not always bitwise: the CPU's matmul rounds differently for a row depending on how many
rows share the call (measured here: a decode step at 1-3 rows differs from the same rows at 12 by
~1e-5), and the eager loop shrinks its batch at every finish while the new ones keep finished rows
until fewer than half are live; the static engine also attends over its whole slot length (masked
columns change the summation blocking, not the value beyond rounding).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.models.decode_async import resolve_engine
from tracerl.models.factory import make_backend
from tracerl.models.static_decode import bucket, static_refusal

STOPS = ("e", "th", "]")
TEXTS = ["Question: Where was", "Action: search[", "The author of Blue", "Lumen"]


def _policy(engine: str, eos: int | None = None) -> HFPolicy:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok))
    with torch.no_grad():  # sharper logits: rows stop at different steps on different reasons
        for p in model.parameters():
            p.mul_(3.0)
    policy = HFPolicy(model, tok, decode_engine=engine)
    if eos is not None:  # a token the model draws often, made the end-of-sequence token: EOS endings
        policy.eos_token_id = eos
    return policy


def _gens(gens: list[Any]) -> list[tuple]:
    return [(g.token_ids, g.finish_reason, g.text) for g in gens]


def _store(policy: HFPolicy) -> list[tuple]:
    assert policy.store is not None
    return [(e.key, sorted(e.lengths), e.layers) for e in policy.store._entries.values()]


def _episode(policy: HFPolicy, temperature: float) -> tuple[list[Any], list[tuple]]:
    """Three calls: first turns (shared-prefix rows), second turns with an observation inserted
    after each first turn (prefix-store reuse), and branches from each first turn's stored prefix."""
    tok = policy.tokenizer
    prefixes = [tok.encode(t) for t in TEXTS[:3]] * 4
    params = SamplingParams(max_new_tokens=20, temperature=temperature, stop_strings=STOPS)
    first = policy.generate(prefixes, params, seeds=list(range(100, 112)))
    observed = [p + g.token_ids + tok.encode(" Observation: Lumen") for p, g in zip(prefixes, first, strict=True)]
    second = policy.generate(observed, params, seeds=list(range(200, 212)))
    branches = [p + g.token_ids for p, g in zip(prefixes[:6], first[:6], strict=True)]
    third = policy.generate(branches, SamplingParams(max_new_tokens=12, temperature=temperature), seeds=list(range(6)))
    return first + second + third, _store(policy)


def _eos_token() -> int:
    """A token the eager loop draws mid-generation in :func:`_episode` (so it ends some rows as EOS)."""
    gens, _ = _episode(_policy("eager"), 1.0)
    counts: dict[int, int] = {}
    for g in gens[:12]:
        for t in g.token_ids[1:-1]:
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=lambda t: counts[t])


@pytest.fixture(scope="module")
def eos() -> int:
    return _eos_token()


@pytest.mark.parametrize("engine", ["async", "static"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_engines_sample_what_the_eager_loop_samples(engine: str, temperature: float, eos: int) -> None:
    eager, eager_store = _episode(_policy("eager", eos), temperature)
    new, new_store = _episode(_policy(engine, eos), temperature)
    assert _gens(new) == _gens(eager)
    reasons = {g.finish_reason for g in eager[:24]}
    assert {"eos", "stop", "length"} <= reasons or temperature == 0.0  # every ending exercised (seeded)
    assert len({len(g.token_ids) for g in eager[:12]}) >= 2  # rows of one batch end at different steps
    for a, b in zip(new, eager, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert [(k, n) for k, n, _ in new_store] == [(k, n) for k, n, _ in eager_store]
    for (_, _, layers), (_, _, ref) in zip(new_store, eager_store, strict=True):
        for (k, v), (rk, rv) in zip(layers, ref, strict=True):
            assert torch.allclose(k, rk, atol=1e-4) and torch.allclose(v, rv, atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_async_is_bitwise_equal_when_the_batch_shapes_are(temperature: float) -> None:
    # No stop strings and no EOS: no row ends before the cap, neither loop compacts, so both run
    # the same forwards at the same batch size, and everything is equal to the last bit.
    def run(engine: str) -> tuple[list[tuple], list[tuple]]:
        policy = _policy(engine)
        policy.eos_token_id = None
        tok = policy.tokenizer
        gens = policy.generate([tok.encode(t) for t in TEXTS] * 2, SamplingParams(max_new_tokens=16, temperature=temperature),
                               seeds=list(range(8)))
        return [(g.token_ids, g.logprobs, g.finish_reason) for g in gens], _store(policy)

    (eager, eager_store), (new, new_store) = run("eager"), run("async")
    assert new == eager and {r for _, _, r in new} == {"length"}
    for (key, lengths, layers), (rkey, rlengths, ref) in zip(new_store, eager_store, strict=True):
        assert (key, lengths) == (rkey, rlengths)
        assert all(torch.equal(k, rk) and torch.equal(v, rv) for (k, v), (rk, rv) in zip(layers, ref, strict=True))


class _Counting:
    """Wraps an engine's slots to record each compaction's size (the slots themselves are real)."""

    def __init__(self, inner: Any, log: list[tuple[int, int]]) -> None:
        self.inner, self.log = inner, log

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def select(self, slots: list[int]) -> list[int]:
        self.log.append((self.inner.capacity, len(slots)))
        return self.inner.select(slots)


def test_async_compacts_only_below_half_live(monkeypatch: pytest.MonkeyPatch) -> None:
    import tracerl.models.backend as backend

    log: list[tuple[int, int]] = []
    real = backend.DynamicSlots
    monkeypatch.setattr(backend, "DynamicSlots", lambda *a: _Counting(real(*a), log))
    policy = _policy("async")
    tok = policy.tokenizer
    gens = policy.generate([tok.encode(t) for t in TEXTS[:3]] * 4,
                           SamplingParams(max_new_tokens=20, temperature=1.0, stop_strings=STOPS), seeds=list(range(12)))
    ends = sorted(len(g.token_ids) for g in gens)
    assert len(set(ends)) > 2  # rows ended at several steps
    assert log and all(2 * kept < before for before, kept in log)  # each compaction: fewer than half live


def test_static_slots_are_bucketed_and_reused_across_calls() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 128, 129)] == [1, 2, 4, 8, 8, 16, 128, 256]
    policy = _policy("static")
    tok = policy.tokenizer
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_strings=STOPS)
    policy.generate([tok.encode(t) for t in TEXTS[:3]], params, seeds=[1, 2, 3])
    first = dict(policy.static_pool.caches)
    assert (4, "torch.float32") in first  # 3 rows ran in the 4-row bucket
    assert all(int(c.layers[0].max_cache_len) == 128 for c in first.values())  # prefix + 7 steps: the shortest length
    policy.generate([tok.encode(t) for t in TEXTS[1:]], params, seeds=[4, 5, 6])
    assert policy.static_pool.caches[(4, "torch.float32")] is first[(4, "torch.float32")]  # the same slots again
    policy.generate([tok.encode(t) for t in TEXTS[:1]], params, seeds=[7])
    assert set(policy.static_pool.caches) == {(1, "torch.float32")}  # buckets this call did not use are dropped


def test_record_states_and_stats_are_the_same_under_every_engine() -> None:
    def run(engine: str) -> tuple[list[Any], dict[str, int]]:
        policy = _policy(engine)
        policy.record_states = True
        tok = policy.tokenizer
        gens = policy.generate([tok.encode(t) for t in TEXTS], SamplingParams(max_new_tokens=6, temperature=0.0))
        return [g.state for g in gens], policy.stats

    assert run("async") == run("eager") == run("static")


def test_auto_is_eager_on_cpu_and_static_on_cuda() -> None:
    assert resolve_engine("auto", torch.device("cpu")) == "eager"
    assert resolve_engine("auto", torch.device("cuda", 0)) == "eager"  # opt-in until validated on a GPU
    with pytest.raises(ValueError, match="model.decode_engine = 'fast' is not valid"):
        resolve_engine("fast", torch.device("cpu"))


def test_static_is_refused_in_one_line_for_a_sliding_window_model() -> None:
    config = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, use_sliding_window=True,
                         sliding_window=8, max_window_layers=0)
    model = AutoModelForCausalLM.from_config(config)
    assert static_refusal(tiny_model(64)) is None
    message = static_refusal(model)
    assert message is not None and "\n" not in message and "model.decode_engine = 'static'" in message

    class Cfg:
        backend, generation_dtype, decode_engine = "hf", "auto", "static"

    with pytest.raises(ValueError, match="needs full-attention layers only"):
        make_backend(Cfg(), model, bpe_tokenizer())


def test_the_config_field_reaches_the_backend() -> None:
    from tracerl.config.schema import ConfigError, ModelConfig

    tok = bpe_tokenizer()
    model = tiny_model(len(tok))
    assert make_backend(ModelConfig(), model, tok).decode_engine == "eager"  # auto on a CPU: today's loop
    assert make_backend(ModelConfig(decode_engine="async"), model, tok).decode_engine == "async"
    assert make_backend(ModelConfig(decode_engine="static"), model, tok).decode_engine == "static"
    with pytest.raises(ConfigError, match="model.decode_engine = 'fast' is not valid"):
        ModelConfig(decode_engine="fast")


@pytest.mark.skipif(os.environ.get("TRACERL_COMPILE_TESTS") != "1",
                    reason="compiles the decode step with torch.compile (~2 min on a busy CPU): TRACERL_COMPILE_TESTS=1")
def test_the_compiled_static_step_samples_the_same_tokens(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The path CUDA runs (dynamo through transformers' StaticCache and the prepared mask), compiled by
    # inductor for the CPU (CUDA graphs need CUDA): the same tokens, compactions through three buckets,
    # and a second call that reuses the compiled code.
    from tracerl.models.static_decode import SlotPool

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiled kernels stay in tmp_path
    tok = bpe_tokenizer()
    prefixes = [tok.encode(t) for t in TEXTS[:3]] * 4
    params = SamplingParams(max_new_tokens=20, temperature=1.0, stop_strings=STOPS)
    eager = _policy("eager").generate(prefixes, params, seeds=list(range(12)))
    policy = _policy("static")
    policy.static_pool = SlotPool(compiled=True)
    for _ in range(2):
        gens = policy.generate(prefixes, params, seeds=list(range(12)))
        assert _gens(gens) == _gens(eager)
    assert len(policy.static_pool.caches) >= 2
