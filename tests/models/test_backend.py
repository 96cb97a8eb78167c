"""HFPolicy: sampling-time log-probs match a plain forward, stop rules, determinism, prefix reuse."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.agent.formats import encode_prompt
from tracerl.models.backend import HFPolicy, PolicyBackend, SamplingParams, sample_next


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    tok = bpe_tokenizer()
    model = tiny_model(len(tok))
    with torch.no_grad():  # sharper logits than the default init, so token choices matter
        for p in model.parameters():
            p.mul_(3.0)
    return HFPolicy(model, tok)


def _recomputed(policy: HFPolicy, prefix: list[int], gen_ids: list[int], temperature: float) -> list[float]:
    """Log-probs of ``gen_ids`` after ``prefix`` from one unpadded, uncached forward."""
    seq = torch.tensor([prefix + gen_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=seq).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(gen_ids)]


def test_protocol_is_satisfied(policy: HFPolicy) -> None:
    assert isinstance(policy, PolicyBackend)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_match_unpadded_forward(policy: HFPolicy, temperature: float, top_p: float) -> None:
    tok = policy.tokenizer
    long = tok.encode("Question: Where was the author of Blue River born?\n")
    prefixes = [long, long[:4], long, long[:9]]  # mixed lengths (left padding) and a repeat
    params = SamplingParams(max_new_tokens=12, temperature=temperature, top_p=top_p)
    gens = policy.generate(prefixes, params, generator=torch.Generator().manual_seed(3))
    assert len(gens) == len(prefixes)
    for prefix, gen in zip(prefixes, gens, strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) >= 1
        expected = _recomputed(policy, prefix, gen.token_ids, temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)
        assert gen.text == tok.decode(gen.token_ids, skip_special_tokens=True)


def test_greedy_takes_the_argmax(policy: HFPolicy) -> None:
    prefix = policy.tokenizer.encode("Action: answer[")
    gen = policy.generate([prefix], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    seq = prefix + gen.token_ids
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([seq])).logits[0]
    assert gen.token_ids == logits[len(prefix) - 1 : -1].argmax(-1).tolist()


def test_same_seed_same_samples_and_seeds_differ(policy: HFPolicy) -> None:
    prefixes = [policy.tokenizer.encode("Thought: I should search")] * 3
    params = SamplingParams(max_new_tokens=10)
    a = policy.generate(prefixes, params, generator=torch.Generator().manual_seed(0))
    b = policy.generate(prefixes, params, generator=torch.Generator().manual_seed(0))
    c = policy.generate(prefixes, params, generator=torch.Generator().manual_seed(1))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_identical_prefixes_are_prefilled_once(policy: HFPolicy) -> None:
    """Each distinct prefix is prefilled once (bucketed by length); decoding then runs every row."""
    fresh = HFPolicy(policy.model, policy.tokenizer)  # empty prefix store
    seen: list[tuple[int, int]] = []
    hook = fresh.model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(tuple(args[0].shape))
    )
    p, q = fresh.tokenizer.encode("Question: Who wrote Blue River?"), fresh.tokenizer.encode("Action:")
    assert len(p) > 2 * len(q)  # different length buckets
    try:
        fresh.generate([p, q, p, p], SamplingParams(max_new_tokens=3), generator=torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert sorted(seen[:2]) == sorted([(1, len(p)), (1, len(q))])  # prefill: one row per distinct prefix
    assert seen[2] == (4, 1)  # first decode step: all four rows
    assert fresh.stats["prefill_tokens"] == len(p) + len(q)
    assert fresh.stats["reused_prefix_tokens"] == 2 * len(p)


def test_stats_count_prefill_sharing_and_train_mode_survives() -> None:
    tok = bpe_tokenizer()
    policy = HFPolicy(tiny_model(len(tok)), tok)
    policy.model.train()
    gens = policy.generate([[5, 6, 7], [5, 6, 7], [8]], SamplingParams(max_new_tokens=3))
    assert policy.stats["prefill_tokens"] == 4 and policy.stats["reused_prefix_tokens"] == 3
    assert policy.stats["generated_tokens"] == sum(len(g.token_ids) for g in gens)
    assert policy.model.training


def test_stop_string_ends_row_at_first_occurrence(policy: HFPolicy) -> None:
    tok = policy.tokenizer
    prefixes = [tok.encode("The city of")] * 6
    gens = policy.generate(
        prefixes, SamplingParams(max_new_tokens=40, stop_strings=("e",)), generator=torch.Generator().manual_seed(0)
    )
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "a random BPE model writes an 'e' within 40 tokens"
    for gen in stopped:
        assert "e" in tok.decode(gen.token_ids)
        assert "e" not in tok.decode(gen.token_ids[:-1])  # the stop token is kept, nothing after it


def test_eos_is_kept_in_ids_and_dropped_from_text(policy: HFPolicy) -> None:
    eos = policy.tokenizer.eos_token_id
    boost = torch.zeros(len(policy.tokenizer))
    boost[eos] = 100.0
    hook = policy.model.get_output_embeddings().register_forward_hook(lambda m, a, out: out + boost)
    try:
        gens = policy.generate([[5, 6, 7], [8]], SamplingParams(max_new_tokens=5))
    finally:
        hook.remove()
    for gen in gens:
        assert gen.token_ids == [eos]
        assert gen.finish_reason == "eos"
        assert gen.text == ""


def test_length_cap(policy: HFPolicy) -> None:
    gens = policy.generate([[5, 6], [7]], SamplingParams(max_new_tokens=4), generator=torch.Generator().manual_seed(0))
    for gen in gens:
        if gen.finish_reason == "length":
            assert len(gen.token_ids) == 4
        assert len(gen.token_ids) <= 4


def test_top_p_keeps_only_the_nucleus() -> None:
    # probabilities 0.5, 0.3, 0.2 (then tiny): top_p 0.6 keeps the first two tokens only
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-9]]))
    draws = {
        sample_next(logits, 1.0, 0.6, torch.Generator().manual_seed(s))[0].item() for s in range(200)
    }
    assert draws == {0, 1}
    token, logp = sample_next(logits, 1.0, 0.6, torch.Generator().manual_seed(0))
    assert logp.item() == pytest.approx(torch.log(torch.tensor([0.5, 0.3]))[token.item()].item(), abs=1e-5)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p"),
        ({"max_new_tokens": 4, "stop_strings": ("",)}, "stop_strings"),
    ],
)
def test_sampling_params_are_validated(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_empty_prefix_is_rejected(policy: HFPolicy) -> None:
    with pytest.raises(ValueError, match="prefix"):
        policy.generate([[1, 2], []], SamplingParams(max_new_tokens=2))


def test_encode_prompt_adds_bos_only_when_defined(policy: HFPolicy) -> None:
    tok = policy.tokenizer
    assert tok.bos_token_id is None
    assert encode_prompt(tok, "Question: x") == tok.encode("Question: x", add_special_tokens=False)


def test_from_pretrained_round_trip(policy: HFPolicy, tmp_path) -> None:
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    loaded = HFPolicy.from_pretrained(str(tmp_path), dtype=torch.float32)
    params = SamplingParams(max_new_tokens=6)
    prefix = [policy.tokenizer.encode("Question: Who wrote Blue River?")]
    a = policy.generate(prefix, params, generator=torch.Generator().manual_seed(0))[0]
    b = loaded.generate(prefix, params, generator=torch.Generator().manual_seed(0))[0]
    assert a.token_ids == b.token_ids


def test_same_device_treats_a_bare_cuda_as_any_index() -> None:
    from tracerl.models.backend import same_device

    assert same_device("cpu", torch.device("cpu")) and same_device("cuda", "cuda:1")
    assert same_device("cuda:0", "cuda:0") and not same_device("cuda:0", "cuda:1") and not same_device("cpu", "cuda")


def test_generator_on_the_model_device_is_used_as_is(policy: HFPolicy) -> None:
    gen = torch.Generator().manual_seed(5)
    assert policy.device_generator(gen) is gen and policy.device_generator(None) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_generator_seeds_a_device_generator_once_per_call(policy: HFPolicy) -> None:
    cuda = HFPolicy(policy.model.to("cuda"), policy.tokenizer)
    try:
        params = SamplingParams(max_new_tokens=5)
        a = cuda.generate([[5, 6, 7]], params, generator=torch.Generator().manual_seed(0))
        b = cuda.generate([[5, 6, 7]], params, generator=torch.Generator().manual_seed(0))
        assert a[0].token_ids == b[0].token_ids
        cpu_gen = torch.Generator().manual_seed(0)
        state = cpu_gen.get_state()
        cuda.generate([[5, 6, 7]], params, generator=cpu_gen)
        assert not torch.equal(cpu_gen.get_state(), state)  # one draw advanced it
        with pytest.raises(ValueError, match="create it on the model's device"):
            sample_next(torch.zeros(1, 4, device="cuda"), 1.0, 1.0, torch.Generator().manual_seed(0))
    finally:
        policy.model.to("cpu")
