"""A causal LM split into decoder and LM head, so log-probs of chosen tokens never need the full
``[positions, vocab]`` logits at once (the update and the batched reference scorer both do this)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Transform = Callable[[Tensor], Tensor]


def logit_transform(config: Any) -> Transform:
    """What a family's ``ForCausalLM.forward`` does to ``lm_head`` output before returning logits.

    Covered: Cohere's ``logit_scale`` (multiply), Granite's ``logits_scaling`` (divide), Gemma 2/3's
    ``final_logit_softcapping`` (``c * tanh(x / c)``). Llama, Qwen2/3, Mistral and most others
    return ``lm_head(h)`` unchanged. A family not listed that rescales logits would need adding here.
    """
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    cap = getattr(config, "final_logit_softcapping", None)

    def transform(logits: Tensor) -> Tensor:
        if scale is not None:
            logits = logits * scale
        if divide is not None:
            logits = logits / divide
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def rescales_logits(config: Any) -> bool:
    """Whether :func:`logit_transform` of ``config`` is anything but the identity."""
    return any(getattr(config, name, None) not in (None, 1.0)
               for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


def split_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of a Hugging Face causal LM (plain or peft-wrapped: both expose
    ``get_decoder``/``get_output_embeddings``), or None when the model does not split that way."""
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if not (callable(get_decoder) and callable(get_head)):
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def head_logprobs(hidden: Tensor, targets: Tensor, head: Any, transform: Transform | None = None,
                  temperature: float = 1.0) -> Tensor:
    """float32 ``log_softmax(transform(head(hidden)) / T)[targets]``: hidden [N, H], targets [N] -> [N]."""
    logits = head(hidden)
    if transform is not None:
        logits = transform(logits)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # fused: faster on CPU than x[y] - lse
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def chunked_head_logprobs(hidden: Tensor, targets: Tensor, head: Any, transform: Transform | None,
                          temperature: float, chunk: int) -> Tensor:
    """:func:`head_logprobs` over ``chunk`` rows at a time, each chunk under activation
    checkpointing when gradients flow: hidden [N, H], targets [N] -> float32 [N]. Neither forward
    nor backward then holds more than one chunk's [chunk, vocab] logits."""
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    pieces = []
    for start in range(0, targets.numel(), chunk):
        args = (hidden[start : start + chunk], targets[start : start + chunk], head, transform, temperature)
        pieces.append(checkpoint(head_logprobs, *args, use_reentrant=False) if recompute else head_logprobs(*args))
    return torch.cat(pieces) if pieces else hidden.new_zeros(0).float()
