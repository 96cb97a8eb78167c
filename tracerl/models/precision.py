"""Working precision: fp32 master weights, low-precision compute through autocast.

``model.dtype`` names the *working* precision. Weights and AdamW state always stay float32
(a bf16 weight cannot absorb an update smaller than its resolution: at lr = 1e-6,
``w + lr * g`` rounds back to ``w`` for every ``|w| > ~2e-4 * |g|``), and the forwards of
generation, scoring and the update run under :func:`compute_context`, which autocasts matmuls
to bf16/fp16. Log-softmax, log-probs and the loss are computed in float32 by the callers.

float16 needs loss scaling (:func:`grad_scaler`) and autocast on CUDA; it is rejected on CPU
at config load (``model.dtype``), where bfloat16 is the supported low precision.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, ContextManager

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s first parameter (``cpu``, ``cuda:N``, ...)."""
    return next(model.parameters()).device


def _resolve(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def compute_context(device: str | torch.device, dtype: str | torch.dtype) -> ContextManager[Any]:
    """Autocast to ``dtype`` on ``device``'s type; a null context for float32.

    ``device`` may be ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a :class:`torch.device`: autocast is
    keyed by the device *type*, so every CUDA index shares one context. float16 on CPU raises
    (CPU autocast supports it only partially and there is no loss scaling there).
    """
    resolved = _resolve(dtype)
    kind = torch.device(device).type
    if resolved == torch.float32:
        return contextlib.nullcontext()
    if resolved == torch.float16 and kind != "cuda":
        raise ValueError(f"model.dtype = 'float16' needs a CUDA device (got {kind!r}); use 'bfloat16' on CPU")
    return torch.autocast(device_type=kind, dtype=resolved)


def grad_scaler(device: str | torch.device, dtype: str | torch.dtype) -> torch.amp.GradScaler | None:
    """A loss scaler for float16 compute on CUDA (fp16 gradients underflow without one), else None."""
    if _resolve(dtype) == torch.float16 and torch.device(device).type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


GENERATION_DTYPES = ("auto", "bfloat16")
"""``model.generation_dtype``: ``auto`` samples from the trainer's model under ``model.dtype``;
``bfloat16`` from a bf16 copy of it, with no autocast (:func:`low_precision_copy`)."""


def low_precision_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen eval-mode copy of ``model`` whose floating parameters are ``dtype``.

    Only parameters are cast: buffers keep their dtype (a rotary ``inv_freq`` rounded to bf16 would
    move every position's angle), and a tied parameter stays tied in the copy (one memo per tensor).
    The forwards of the copy run without autocast, so activations and the KV cache stay ``dtype``
    (no fp32 promotion through normalised keys and ``torch.cat``), which is what makes the copy
    cheaper than autocast: no per-op casts of fp32 weights. Built without a full-precision copy."""
    # deepcopy meets each parameter in the memo already cast: no full-precision intermediate copy,
    # and two modules sharing a parameter share its one copy.
    memo: dict[int, Any] = {id(p): torch.nn.Parameter(p.detach().to(dtype) if p.is_floating_point() else p.detach().clone(),
                                                      requires_grad=False) for p in model.parameters()}
    clone = copy.deepcopy(model, memo)
    clone.eval()
    return clone


@torch.no_grad()
def refresh_copy(clone: torch.nn.Module, source: torch.nn.Module) -> None:
    """Copy ``source``'s parameters and buffers into ``clone`` (cast to its dtypes), by name."""
    clone.load_state_dict(source.state_dict())


def no_autocast(device: str | torch.device) -> ContextManager[Any]:
    """Autocast off on ``device``'s type (a caller's ``compute_context`` would re-cast the bf16 copy)."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)
