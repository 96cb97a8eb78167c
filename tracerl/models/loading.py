"""Reload a saved policy into a model in place (plain models and LoRA adapters).

Resolving a model *name* (the embedded ``tiny`` names included) is
:func:`tracerl.testbed.loading.load_model`.

"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.utils import logging as hf_logging

from tracerl.models.lora import is_peft_model

hf_logging.disable_progress_bar()  # "Writing model shards" bars drown the training log

__all__ = ["load_policy_state"]


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
