"""The parts of the vLLM backend that need no vLLM: the import hint, the output conversion and the
weight serialisation (the engine itself is tested in tests/vllm_backend with ``make test-vllm``)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load

from helpers_tiny import bpe_tokenizer, tiny_model
from tracerl.models import vllm_backend
from tracerl.models.backend import SamplingParams
from tracerl.models.vllm_backend import VLLMPolicy, state_dict_bytes

needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")


@needs_no_vllm
def test_missing_vllm_says_how_to_install() -> None:
    tok = bpe_tokenizer()
    with pytest.raises(ImportError, match=r"pip install -e \.\[vllm\].*make vllm"):
        VLLMPolicy(tiny_model(len(tok)), tok)


def _completion(ids, finish, stop_reason):
    logprobs = [{t: SimpleNamespace(logprob=-0.25 * (i + 1))} for i, t in enumerate(ids)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=finish,
                                                    stop_reason=stop_reason)])


@pytest.mark.parametrize(("finish", "stop_reason", "expected"), [
    ("length", None, "length"),  # the length cap
    ("stop", "Obs", "stop"),  # a stop string: vLLM reports the string
    ("stop", None, "eos"),  # EOS: vLLM reports no stop reason
])
def test_finish_reasons_and_logprobs_follow_hf_conventions(finish: str, stop_reason, expected: str) -> None:
    tok = bpe_tokenizer()
    policy = VLLMPolicy.__new__(VLLMPolicy)  # conversion only: no engine
    policy.tokenizer = tok
    ids = tok.encode("Lumen", add_special_tokens=False) + [tok.eos_token_id]
    gen = policy._to_generation(_completion(ids, finish, stop_reason), SamplingParams(max_new_tokens=8))
    assert gen.finish_reason == expected
    assert gen.token_ids == ids
    assert gen.logprobs == [-0.25 * (i + 1) for i in range(len(ids))]
    assert gen.text == "Lumen"  # EOS stays in the ids, not in the text


def test_state_dict_bytes_round_trips_and_sends_tied_weights_once() -> None:
    model = tiny_model(64)
    weights = load(state_dict_bytes(model))
    assert "lm_head.weight" not in weights  # the tied alias of model.embed_tokens.weight
    for name, tensor in model.state_dict().items():
        if name != "lm_head.weight":
            assert torch.equal(weights[name], tensor)
    assert len(weights) == len(model.state_dict()) - 1


def test_module_imports_without_vllm() -> None:
    assert vllm_backend.INSTALL_HINT.startswith("vLLM is not installed")
