"""Resolve a model name to a Hugging Face model and tokenizer, and reload a saved policy.

``tiny`` is the embedded base model (pretrained once, cached by config); ``random-tiny`` is a
randomly initialised model of the same family with a tokenizer built from the given texts
(smoke runs and tests); anything else goes to ``from_pretrained``.

Weights always load as float32 master weights whatever ``model.dtype`` says: the working
precision is applied by autocast (:mod:`tracerl.models.precision`), never by casting the
parameters, so AdamW updates far below bf16 resolution still land.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from tracerl.models.lora import is_peft_model
from tracerl.models.precision import DTYPES

hf_logging.disable_progress_bar()  # "Writing model shards" bars drown the training log

__all__ = ["DTYPES", "load_model", "load_policy_state"]


def load_model(
    name_or_path: str,
    *,
    vocabulary_texts: list[str] | None = None,
    tiny_preset: str = "default",
    dtype: str = "float32",
    device: str = "cpu",
    seed: int = 0,
) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` with float32 weights on ``device``; nothing is downloaded
    for the embedded names. ``dtype`` is the working precision: it is validated here, but the
    weights stay float32 (see the module docstring)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if name_or_path == "random-tiny":
        from tracerl.models.tiny import build_tiny_tokenizer, random_tiny_model
        from tracerl.models.tiny_config import get_preset

        if not vocabulary_texts:
            raise ValueError("model 'random-tiny' needs vocabulary texts to build its tokenizer")
        tokenizer = build_tiny_tokenizer(vocabulary_texts)
        torch.manual_seed(seed)
        model = random_tiny_model(tokenizer, get_preset("smoke"))
    else:
        path: str | Path = name_or_path
        if name_or_path == "tiny":
            from tracerl.models.tiny import load_or_pretrain
            from tracerl.models.tiny_config import get_preset

            path = load_or_pretrain(get_preset(tiny_preset))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device=device, dtype=torch.float32), tokenizer


def load_policy_state(model: Any, folder: str | Path) -> None:
    """Load a policy saved by ``model.save_pretrained(folder)`` into ``model`` in place.

    Plain models: every ``*.safetensors`` shard of ``folder`` (one file or an indexed set) is
    read on the CPU and copied into the parameters, which stay on the model's device and in
    float32; only a tied ``lm_head`` may be missing. peft models: ``folder`` holds the adapter
    (``adapter_model.safetensors``), which is loaded into the active adapter; the base weights
    are not in a LoRA checkpoint (they come from the run's ``initial/`` folder).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    if is_peft_model(model):
        from peft import set_peft_model_state_dict  # only reached when peft is installed and used

        adapter = folder / "adapter_model.safetensors"
        if not adapter.exists():
            raise FileNotFoundError(f"{folder} has no adapter_model.safetensors to load into the LoRA policy")
        try:
            adapter_weights = load_file(str(adapter))
        except Exception as err:  # safetensors raises its own error type for damaged headers
            raise ValueError(f"{adapter} is corrupted or truncated ({type(err).__name__})") from None
        result = set_peft_model_state_dict(model, adapter_weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"adapter in {folder} does not match the model: unexpected {unexpected}")
        return
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights")
    expected = set(model.state_dict())
    loaded: set[str] = set()
    for shard in shards:
        try:
            weights = load_file(str(shard))
        except Exception as err:  # safetensors raises its own error type for damaged headers
            raise ValueError(f"{shard} is corrupted or truncated ({type(err).__name__})") from None
        _, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected:
            raise RuntimeError(f"checkpoint {shard} does not match the model: unexpected {unexpected}")
        loaded.update(weights)
    missing = sorted(k for k in expected - loaded if "lm_head" not in k)  # lm_head may be tied
    if missing:
        raise RuntimeError(f"checkpoint {folder} does not match the model: missing {missing}")
