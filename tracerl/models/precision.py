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
