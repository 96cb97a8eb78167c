"""LoRA through ``peft`` (optional extra ``tracerl[lora]``), imported only when ``model.lora.r > 0``.

With LoRA only the adapter weights train; the frozen reference is the *same* model with the
adapter disabled (peft's ``disable_adapter()`` context), so no second copy of the base weights
is kept. Nothing here imports peft at module import time.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, ContextManager, Sequence

import torch

PEFT_MISSING = "model.lora.r > 0 needs peft: pip install -e '.[lora]'"


def peft_available() -> bool:
    """Whether peft can be imported (checked without importing it)."""
    return importlib.util.find_spec("peft") is not None


def is_peft_model(model: Any) -> bool:
    """Duck-typed test for a peft model (no peft import): it has a peft config and can disable its adapter."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def apply_lora(model: Any, r: int, alpha: float, dropout: float, target_modules: Sequence[str]) -> Any:
    """Wrap ``model`` with a fresh LoRA adapter of rank ``r``; base weights are frozen by peft.

    The adapter's ``B`` matrix starts at zero, so the wrapped model computes exactly what the
    base model does until the first update. The base may be in bf16 (frozen weights need no
    master copy); the adapter weights are float32 whatever the base's dtype.
    """
    if not peft_available():
        raise ImportError(PEFT_MISSING)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                        task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, config)
    for param in trainable_parameters(wrapped):  # adapters are trained: float32 master weights
        param.data = param.data.float()
    return wrapped


def adapter_disabled(model: Any) -> ContextManager[Any]:
    """The base model's forward for a peft model (adapter off), a null context for any other model."""
    return model.disable_adapter() if is_peft_model(model) else contextlib.nullcontext()


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters that receive gradients: all of a plain model, only the adapters of a peft model."""
    return [p for p in model.parameters() if p.requires_grad]
