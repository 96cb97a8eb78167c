"""A stand-in for verl's vLLM server on CPU: a Ray actor serving verl's server ``generate``
signature (``prompt_ids``, ``sampling_params`` as vLLM reads them, ``request_id``) from tracerl's
:class:`~tracerl.models.backend.HFPolicy`, answering with verl's ``TokenOutput`` and the weights
step it holds (``extra_fields["global_steps"]``, as verl's server reports it). It logs every
request's prompt ids, so a test can tell which server each tree reached, and fails on request
(:meth:`HFServer.fail_requests_containing`) the way a crashed engine does: the call raises.

verl's real ``LLMServerClient`` and router sit in front of it; only the inference engine is
tracerl's (no vLLM on this machine)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf
from verl.workers.rollout.replica import TokenOutput

from tracerl.models.backend import HFPolicy, SamplingParams

CONFIG = OmegaConf.create({
    "actor_rollout_ref": {"rollout": {"name": "vllm", "val_kwargs": {"n": 2, "temperature": 1.0}}},
    "reward": {"reward_model": {"enable": False}},
})
"""The verl config of the tests' managers and server client (the settings they read)."""


class HFServer:
    """``generate`` of verl's vLLM server over one :class:`HFPolicy` (one row per request)."""

    def __init__(self, model: Any, tokenizer: Any, name: str, global_steps: int | None = 0) -> None:
        torch.set_num_threads(1)
        self.policy = HFPolicy(model, tokenizer)
        self.tokenizer = tokenizer
        self.fail_text: str | None = None
        self.name = name
        self.global_steps = global_steps
        self.requests: list[list[int]] = []
        self.max_tokens: list[int] = []
        """Each request's ``max_tokens``, in arrival order (:meth:`take_max_tokens`)."""

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                 image_data: Any = None, video_data: Any = None, **_: Any) -> TokenOutput:
        if self.fail_text is not None and self.fail_text in self.tokenizer.decode(list(prompt_ids)):
            raise RuntimeError(f"{self.name}: injected engine failure")
        sp = dict(sampling_params)
        if sp.get("prompt_logprobs") is not None:  # a frozen-reference (teacher) request
            return self.prompt_logprobs(list(prompt_ids), sp)
        if sp.get("include_stop_str_in_output") is not True:
            raise ValueError("include_stop_str_in_output must be True (tracerl trains on stop tokens)")
        params = SamplingParams(max_new_tokens=int(sp["max_tokens"]), temperature=float(sp["temperature"]),
                                top_p=float(sp["top_p"]), stop_strings=tuple(sp.get("stop") or ()))
        seed = sp.get("seed")
        gen = self.policy.generate([list(prompt_ids)], params, None if seed is None else [int(seed)])[0]
        self.requests.append(list(prompt_ids))
        self.max_tokens.append(int(sp["max_tokens"]))
        return TokenOutput(token_ids=gen.token_ids, log_probs=gen.logprobs if sp.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    @torch.no_grad()
    def prompt_logprobs(self, prompt_ids: list[int], sp: dict[str, Any]) -> TokenOutput:
        """vLLM's answer to ``prompt_logprobs=0, max_tokens=1`` as verl's server returns it
        (``extract_prompt_logprobs``): ``extra_fields["prompt_logprobs"][i] = [log p(prompt[i + 1])]``
        and ``prompt_ids[i] = [prompt[i + 1]]`` at temperature 1, a dummy ``[0.0]`` / ``[0]`` last;
        like vLLM, it reads no prefix cache for such a request (``num_cached_tokens = 0``)."""
        if int(sp["prompt_logprobs"]) != 0 or int(sp.get("max_tokens", 1)) != 1:
            raise ValueError("the stand-in answers prompt_logprobs=0 with max_tokens=1 only")
        ids = torch.tensor([prompt_ids])
        logp = torch.log_softmax(self.policy.model(input_ids=ids).logits[0].float(), dim=-1)
        taken = logp[:-1].gather(-1, ids[0, 1:, None])[:, 0].tolist()
        self.requests.append(list(prompt_ids))
        extra = {"global_steps": self.global_steps, "num_cached_tokens": 0,
                 "prompt_logprobs": [[x] for x in taken] + [[0.0]], "prompt_ids": [[t] for t in prompt_ids[1:]] + [[0]]}
        return TokenOutput(token_ids=[int(logp[-1].argmax())], log_probs=None, stop_reason="completed",
                           extra_fields=extra)

    def fail_requests_containing(self, text: str | None) -> None:
        """Raise on every request whose prompt holds ``text`` ("": all; None: none)."""
        self.fail_text = text

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def take_max_tokens(self) -> list[int]:
        out, self.max_tokens = self.max_tokens, []
        return out

    def take_requests(self) -> list[list[int]]:
        out, self.requests = self.requests, []
        return out
