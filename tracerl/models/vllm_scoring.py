"""Reference readiness through vLLM's ``prompt_logprobs`` (an option; the HF scorer is the default).

For each cut ``c`` of a :class:`~tracerl.models.scoring_plan.ScoreRequest` the prompt is
``input_ids[:c] + opener + answer`` and vLLM is asked for one token with ``prompt_logprobs=0``:
the log-prob of every prompt token given the tokens before it. The last ``|answer|`` of them are
the answer's teacher-forced log-probs, and readiness is their mean,
``l_c = (1/|y*|) sum_j log pi_ref(y*_j | ids[:c] + A, y*_<j)``, as in
:func:`tracerl.models.prefix_scoring.score_prefixes`.

Distinct ``(ids[:c], opener, answer)`` prompts are sent once (leaves of one tree share their
upper boundaries). Prompt log-probs are computed from the raw logits (temperature 1) whatever the
engine's ``logprobs_mode``. Agreement with the HF scorer on the tiny test model is checked in
``tests/vllm_backend``.

:class:`VLLMReference` is the trainer's option ``algo.reference_backend = 'vllm'``: an engine
built once from the initial policy, never synced, called as the reference scorer's batch scorer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tracerl.models.batched_scoring import ScoreStats
from tracerl.models.scoring_plan import ScoreRequest, validate_request

__all__ = ["VLLMReference", "vllm_readiness"]


def _engine(llm: Any) -> Any:
    """A ``vllm.LLM`` from itself or a :class:`~tracerl.models.vllm_backend.VLLMPolicy`."""
    return getattr(llm, "llm", None) or llm


def vllm_readiness(llm: Any, requests: Sequence[ScoreRequest], stats: ScoreStats | None = None) -> list[torch.Tensor]:
    """``l`` at every cut of every request, through vLLM (``llm``: an ``LLM`` or a ``VLLMPolicy``).

    Returns one float32 CPU tensor [len(request.cut_points)] per request, in request and cut
    order, like :func:`~tracerl.models.batched_scoring.score_prefixes_batched`. The engine must
    hold the reference weights (a policy engine scores under the policy's current weights).
    ``stats`` (optional) counts requests, cuts, distinct prompts (``unique_cuts``), prompt tokens
    computed (``prefill_tokens``, without vLLM's prefix-cache hits) and engine calls (``forwards``).
    """
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    for req in requests:
        validate_request(req)
    keys: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], int] = {}
    for req in requests:
        for c in req.cut_points:
            keys.setdefault((tuple(req.input_ids[:c]), tuple(req.opener_ids), tuple(req.answer_ids)), len(keys))
    if stats is not None:
        stats.requests += len(requests)
        stats.cuts += sum(len(r.cut_points) for r in requests)
        stats.unique_cuts += len(keys)
    if not keys:
        return []
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in ids + opener + answer]) for ids, opener, answer in keys]
    params = VSamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, logprobs=None, detokenize=False)
    outputs = _engine(llm).generate(prompts, params, use_tqdm=False)
    if stats is not None:
        stats.forwards += 1
        stats.prefill_tokens += sum(len(p["prompt_token_ids"]) - int(getattr(o, "num_cached_tokens", 0) or 0)
                                    for p, o in zip(prompts, outputs, strict=True))
    means = [_answer_mean(out, answer) for out, (_, _, answer) in zip(outputs, keys, strict=True)]
    return [
        torch.tensor([means[keys[(tuple(r.input_ids[:c]), tuple(r.opener_ids), tuple(r.answer_ids))]]
                      for c in r.cut_points], dtype=torch.float32)
        for r in requests
    ]


def _answer_mean(out: Any, answer: tuple[int, ...]) -> float:
    """Mean prompt log-prob of the last ``len(answer)`` prompt tokens (the answer)."""
    prompt_logprobs = out.prompt_logprobs
    ids = list(out.prompt_token_ids)
    n = len(ids)
    total = 0.0
    for j, token in enumerate(answer):
        pos = n - len(answer) + j
        if ids[pos] != token:  # pragma: no cover - vLLM returns the prompt it was given
            raise RuntimeError("vLLM's prompt ids do not end with the answer")
        total += float(prompt_logprobs[pos][token].logprob)
    return total / len(answer)


class VLLMReference:
    """The frozen reference served by its own vLLM engine: a :data:`~tracerl.models.scoring.BatchScorer`.

    ``policy`` is a :class:`~tracerl.models.vllm_backend.VLLMPolicy` built from the initial
    policy's weights and never synced. Called like
    :func:`~tracerl.models.batched_scoring.score_prefixes_batched`; the HF ``model`` and
    ``max_batch_tokens`` it is handed are ignored (vLLM schedules its own batches).
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __call__(self, model: Any, requests: Sequence[ScoreRequest], *, max_batch_tokens: int = 0,
                 stats: ScoreStats | None = None) -> list[torch.Tensor]:
        return vllm_readiness(self.policy, requests, stats)

    def close(self) -> None:
        """Shut the engine down (see :meth:`VLLMPolicy.close`)."""
        self.policy.close()
