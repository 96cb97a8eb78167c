"""Resolve a model name to a Hugging Face model and tokenizer.

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

from tracerl.models.precision import DTYPES
from tracerl.models.size_guard import check_model_folder

hf_logging.disable_progress_bar()  # "Writing model shards" bars drown the training log

__all__ = ["load_model"]


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
        from tracerl.testbed.tiny import build_tiny_tokenizer, random_tiny_model
        from tracerl.testbed.tiny_config import get_preset

        if not vocabulary_texts:
            raise ValueError("model 'random-tiny' needs vocabulary texts to build its tokenizer")
        tokenizer = build_tiny_tokenizer(vocabulary_texts)
        torch.manual_seed(seed)
        model = random_tiny_model(tokenizer, get_preset("smoke"))
    else:
        path: str | Path = name_or_path
        if name_or_path == "tiny":
            from tracerl.testbed.tiny import load_or_pretrain
            from tracerl.testbed.tiny_config import get_preset

            path = load_or_pretrain(get_preset(tiny_preset))
        check_model_folder(path)  # sizes from config.json, refused before anything is allocated
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device=device, dtype=torch.float32), tokenizer
