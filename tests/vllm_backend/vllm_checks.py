"""Every VLLMPolicy check against one engine, run as a script; prints one JSON line of facts.

The pytest module runs this in a subprocess: one engine start (~20-40 s on CPU) serves all checks,
and vLLM's in-process CPU worker (thread binding, a no-op ``torch.set_num_threads``) never touches
the pytest process. Values are measured here and judged by ``test_vllm_backend.py``.

    python tests/vllm_backend/vllm_checks.py  # from the repository root, in .venv-vllm
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

# this checkout's tracerl and the tiny-model helpers, whichever tracerl the venv has installed
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]
from helpers_tiny import SENTENCES, bpe_tokenizer  # noqa: E402

from tracerl.models.backend import HFPolicy, SamplingParams  # noqa: E402
from tracerl.models.batched_scoring import ScoreRequest, score_prefixes_batched  # noqa: E402


def vllm_model(tokenizer, seed: int):
    """A random Qwen3 vLLM's CPU attention accepts (head_dim 32 is its smallest supported size)."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, intermediate_size=128, max_position_embeddings=1024,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def eos_model(model, eos: int):
    """``model`` rewired so greedy decoding writes EOS after any token: the layers add nothing
    (o_proj = down_proj = 0, so the last hidden state is the token's own embedding) and every
    embedding shares a unit component in dimension 0 that EOS's row holds five times over."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        emb.mul_(0.01)
        emb[:, 0] = 1.0
        emb[eos, 0] = 5.0
    return model


@torch.no_grad()
def hf_logprobs(model, prefix: list[int], ids: list[int], temperature: float) -> list[float]:
    logits = model(torch.tensor([prefix + ids])).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [logp[len(prefix) - 1 + i, t].item() for i, t in enumerate(ids)]


def main() -> None:
    from tracerl.models.vllm_backend import VLLMPolicy
    from tracerl.models.vllm_scoring import vllm_readiness

    tok = bpe_tokenizer()
    model_a = vllm_model(tok, 0)
    out: dict = {"eos_token_id": tok.eos_token_id}
    start = time.perf_counter()
    policy = VLLMPolicy(model_a, tok, max_model_len=1024, enforce_eager=True)
    out["engine_start_s"] = round(time.perf_counter() - start, 2)
    # longer than two of vLLM's CPU KV blocks (128 tokens): only full blocks are prefix-cached
    long_prefix = tok.encode(" ".join(SENTENCES * 3), add_special_tokens=False)[:300]
    out["block_size"] = policy.llm.llm_engine.vllm_config.cache_config.block_size
    out["long_prefix_len"] = len(long_prefix)

    # branching: k requests with one prefix in one call, then one more from the same prefix
    sample = SamplingParams(max_new_tokens=12, temperature=1.0)
    before = dict(policy.stats)
    gens = policy.generate([long_prefix] * 4, sample, seeds=[1, 2, 3, 4])
    mid = dict(policy.stats)
    policy.generate([long_prefix], sample, seeds=[5])
    after = dict(policy.stats)
    out["branch_call"] = {k: mid[k] - before[k] for k in before}
    out["second_call"] = {k: after[k] - mid[k] for k in before}
    out["branch_distinct"] = len({tuple(g.token_ids) for g in gens})

    # per-request seeds: a row's sample depends on its seed, not on its batch
    prefix = tok.encode("The city of Lumen lies on", add_special_tokens=False)
    batch = policy.generate([prefix, prefix, long_prefix, prefix], sample, seeds=[7, 8, 9, 7])
    alone = policy.generate([prefix], sample, seeds=[7])[0]
    out["seed_same"] = batch[0].token_ids == batch[3].token_ids == alone.token_ids
    out["seed_other_differs"] = batch[0].token_ids != batch[1].token_ids
    g1 = torch.Generator().manual_seed(3)
    g2 = torch.Generator().manual_seed(3)
    out["generator_reproducible"] = (policy.generate([prefix] * 2, sample, generator=g1)[1].token_ids
                                     == policy.generate([prefix] * 2, sample, generator=g2)[1].token_ids)

    # a seeded batch larger than one engine step's token budget (8192 on CPU) still runs
    # (40 distinct 300-token prompts: rotations of the long prefix, so none shares a cached block)
    rotations = [long_prefix[i:] + long_prefix[:i] for i in range(1, 41)]
    two = SamplingParams(max_new_tokens=2, temperature=1.0)
    big = policy.generate(rotations, two, seeds=list(range(40)))
    out["big_seeded_batch_rows"] = len(big)
    out["big_seeded_batch_row7_reproducible"] = big[7].token_ids == policy.generate([rotations[7]], two, seeds=[7])[0].token_ids

    # sampled log-probs vs the HF recomputation (tempered full distribution; greedy at T = 1)
    diffs = {}
    for temperature in (1.0, 0.7, 0.0):
        rows = policy.generate([prefix, long_prefix], SamplingParams(max_new_tokens=16, temperature=temperature),
                               seeds=[11, 12])
        diffs[str(temperature)] = max(abs(a - b) for p, g in zip([prefix, long_prefix], rows, strict=True)
                                      for a, b in zip(g.logprobs, hf_logprobs(model_a, p, g.token_ids, temperature), strict=True))
    out["logprob_max_abs_diff"] = diffs

    # stop strings: rows end on the token completing the string, which is kept
    stop = SamplingParams(max_new_tokens=24, temperature=1.0, stop_strings=("e",))
    rows = policy.generate([prefix] * 6, stop, seeds=list(range(6)))
    out["stop_rows"] = [
        {"reason": g.finish_reason, "ends_with_stop": "e" in tok.decode(g.token_ids[-4:]),
         "stop_before_last": "e" in tok.decode(g.token_ids[:-1]), "n": len(g.token_ids)}
        for g in rows
    ]

    # weight sync: greedy output follows the pushed weights and the prefix cache is reset
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    hf_a = HFPolicy(model_a, tok, prefix_cache_bytes=0)
    v_a = policy.generate([prefix, long_prefix], greedy)
    out["greedy_matches_hf_before"] = [g.token_ids for g in v_a] == [g.token_ids for g in hf_a.generate([prefix, long_prefix], greedy)]
    model_b = vllm_model(tok, 1)
    policy.sync_weights(model_b, version=1)
    cached_before = policy.stats["reused_prefix_tokens"]
    v_b = policy.generate([prefix, long_prefix], greedy)
    out["reused_after_sync"] = policy.stats["reused_prefix_tokens"] - cached_before
    hf_b = HFPolicy(model_b, tok, prefix_cache_bytes=0).generate([prefix, long_prefix], greedy)
    out["greedy_matches_hf_after"] = [g.token_ids for g in v_b] == [g.token_ids for g in hf_b]
    # (greedy ids of a random tied model often just repeat the last token, so compare log-probs)
    out["sync_logprob_change"] = max(abs(x - y) for ga, gb in zip(v_a, v_b, strict=True) for x, y in zip(ga.logprobs, gb.logprobs, strict=True))
    out["after_sync_vs_hf_b"] = max(abs(a - b) for p, g in zip([prefix, long_prefix], v_b, strict=True)
                                    for a, b in zip(g.logprobs, hf_logprobs(model_b, p, g.token_ids, 0.0), strict=True))
    out["version"] = policy.version

    # reference readiness through prompt_logprobs vs the HF batched scorer (weights of model_b)
    opener = tok.encode(" Answer:", add_special_tokens=False)
    answer = tok.encode(" Lumen", add_special_tokens=False)
    requests = [ScoreRequest(tuple(long_prefix), (3, 17, len(long_prefix)), tuple(answer), tuple(opener)),
                ScoreRequest(tuple(long_prefix), (17, 40), tuple(answer)),
                ScoreRequest(tuple(prefix), (1, len(prefix)), tuple(answer), tuple(opener))]
    start = time.perf_counter()
    v_scores = vllm_readiness(policy, requests)
    out["readiness_vllm_s"] = round(time.perf_counter() - start, 3)
    hf_scores = score_prefixes_batched(model_b, requests)
    out["readiness_shapes_ok"] = [len(v) for v in v_scores] == [len(r.cut_points) for r in requests]
    out["readiness_max_abs_diff"] = max((v - h).abs().max().item() for v, h in zip(v_scores, hf_scores, strict=True))
    out["readiness_mean_abs"] = torch.cat(hf_scores).abs().mean().item()

    # EOS: a row that ends on EOS keeps it (and its log-prob)
    policy.sync_weights(eos_model(vllm_model(tok, 2), tok.eos_token_id), version=2)
    eos_row = policy.generate([prefix], greedy)[0]
    out["eos_row"] = {"reason": eos_row.finish_reason, "token_ids": eos_row.token_ids,
                      "text": eos_row.text, "logprob": eos_row.logprobs}

    # independent vs lockstep scheduling of rollouts (weights of a ragged-turn model)
    from scheduling_checks import scheduling_facts

    out["scheduling"] = scheduling_facts(policy, tok, vllm_model)
    policy.close()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
