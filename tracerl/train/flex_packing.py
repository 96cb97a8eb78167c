"""The tree-packed forward through ``flex_attention`` (``optim.packed_attention = 'flex'``).

The dense path (:func:`~tracerl.train.packing.local_packed_logprobs`) hands the model a [R, 1, P, P]
float mask: every P x P score is computed and masked, and a float mask rules out flash kernels.
Here the same rule, token ``q`` sees ``k`` iff ``k <= q < end[k]``, is a ``BlockMask``
(``torch.nn.attention.flex_attention.create_block_mask``): tiles wholly masked are skipped, and
no P x P tensor exists. The model's attention layers call it through an attention function
registered with transformers' ``AttentionInterface`` (:data:`FLEX_ATTENTION`), switched on for
the packed forward only (:func:`attention_implementation`).

On CUDA ``flex_attention`` is compiled once (``torch.compile``; eager flex is a slow reference
implementation). On CPU it runs eager and forward-only: torch (2.13) has no FlexAttention
backward on CPU, so training with it needs CUDA (the config refuses ``flex`` on CPU); the CPU
forward is what tests compare with the dense path.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
from torch import Tensor

FLEX_ATTENTION = "tracerl_flex"
"""The name :func:`flex_tree_attention` is registered under in transformers' ``AttentionInterface``."""


def tree_block_mask(end: Tensor) -> Any:
    """The packing's tree rule as a ``BlockMask`` [R, 1, P, P]: ``q`` sees ``k`` iff ``k <= q < end[k]``."""
    from torch.nn.attention.flex_attention import create_block_mask

    rows, width = end.shape

    def rule(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        return (k <= q) & (q < end[b, k])

    return create_block_mask(rule, rows, None, width, width, device=end.device)


@functools.cache
def _kernel(device_type: str) -> Callable[..., Any]:
    """``flex_attention``, compiled once on CUDA (the fused kernel), eager elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention

    # Default dynamism: a second packed width recompiles once with dynamic shapes, not once per width.
    if device_type == "cuda":
        return torch.compile(flex_attention)  # type: ignore[return-value]
    return flex_attention


def flex_tree_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Any,
                        scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    """A transformers attention function: ``query`` [B, Hq, P, D], ``key``/``value`` [B, Hkv, P, D] and
    a ``BlockMask``; grouped heads without ``repeat_kv``. Returns [B, P, Hq, D] as the others do."""
    if dropout > 0:
        raise ValueError("optim.packed_attention = 'flex' needs attention dropout 0 (the model's attention_dropout)")
    if type(attention_mask).__name__ != "BlockMask":  # a padded forward reached this function: never guess a mask
        raise ValueError("the flex tree attention runs only the packed forward (a BlockMask), got "
                         f"{type(attention_mask).__name__}")
    kind = query.device.type
    # flex_attention is no autocast op: under autocast q/k can be fp32 (a norm's output) while v is
    # bf16, so all three take the autocast dtype, as sdpa's inputs would.
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else query.dtype
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    with warnings.catch_warnings():  # eager flex (CPU) warns that it is unfused: known, it is the reference here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = _kernel(kind)(query, key, value, block_mask=attention_mask, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def register() -> str:
    """Register :func:`flex_tree_attention` with transformers once; returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLEX_ATTENTION, flex_tree_attention)
    return FLEX_ATTENTION


def flex_scope(model: Any) -> Any:
    """The flex attention switched on for ``model`` around a packed forward *and its backward*: with
    gradient checkpointing the backward re-runs the attention layers, which must find flex then too."""
    return attention_implementation(model, register())


@contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """Every config of ``model``'s modules set to attention ``name`` inside, restored after (the
    layers read ``config._attn_implementation`` at each forward). Nests: an inner scope restores
    what the outer one set."""
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules()) if c is not None}
    saved = {key: c._attn_implementation for key, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = name
        yield
    finally:
        for key, c in configs.items():
            c._attn_implementation = saved[key]
