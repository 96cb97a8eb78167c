"""GPU memory of a training step, computed from the model's shape (the table on docs/gpu.md).

Bytes per parameter, as tracerl trains (see :mod:`tracerl.models.precision`):

- full fine-tuning: float32 master weight 4 + float32 gradient 4 + AdamW moments 8, plus the
  bf16 weight copies autocast keeps for backward 2, plus the frozen reference in bf16 2 (when
  credit or a KL term needs it) = 20 B/param;
- LoRA: the frozen base in bf16 2 (it is also the reference: adapter disabled, no copy), and
  16 B per adapter parameter (fp32 weight, gradient, AdamW).

Activations (bf16 compute, fp32 residual stream, gradient checkpointing on): each layer's
fp32 input is kept (``4 * T * H``), one layer is recomputed at a time (about
``T * (16 H + 8 I)`` bytes for attention projections, SDPA and the SwiGLU MLP), the final
hidden states and their gradient (``8 * T * H``) and one lm_head chunk of fp32 logits with its
log-softmax and gradient (``3 * 4 * chunk * V``). Without checkpointing every layer keeps its
working set. Generation's KV cache is not counted (it lives in the rollout phase, when no
gradients exist), nor is a vLLM engine, nor the CUDA context and allocator slack (the
``overhead_gib`` margin).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes (Qwen3 naming)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q/k/v/o projections and the SwiGLU MLP (norms omitted)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params() + embeddings

    def lora_params(self, rank: int) -> int:
        """Adapter parameters on all seven projections of every layer: ``r * (in + out)`` each."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return self.layers * rank * per_layer


# Qwen3 dense models (their config.json values).
QWEN3: dict[str, ModelShape] = {
    "Qwen3-0.6B": ModelShape(1024, 28, 3072, 16, 8, 128, 151_936, True),
    "Qwen3-1.7B": ModelShape(2048, 28, 6144, 16, 8, 128, 151_936, True),
    "Qwen3-4B": ModelShape(2560, 36, 9728, 32, 8, 128, 151_936, True),
    "Qwen3-8B": ModelShape(4096, 36, 12288, 32, 8, 128, 151_936, False),
    "Qwen3-14B": ModelShape(5120, 40, 17408, 40, 8, 128, 151_936, False),
}


def activation_bytes(shape: ModelShape, tokens: int, *, checkpointing: bool = True, chunk: int = 1024) -> float:
    """Activation memory of one micro-batch of ``tokens`` tokens in the update (see module docstring)."""
    h, i = shape.hidden, shape.intermediate
    layer_working = tokens * (16 * h + 8 * i)
    layers = shape.layers * 4 * tokens * h + layer_working if checkpointing else shape.layers * layer_working
    head = 8 * tokens * h + 12 * min(chunk, tokens) * shape.vocab
    return float(layers + head)


def training_memory_gib(shape: ModelShape, *, lora_rank: int = 0, tokens: int = 16_384, reference: bool = True,
                        checkpointing: bool = True, chunk: int = 1024) -> dict[str, float]:
    """Peak memory of the update phase in GiB, by part, and its ``total``.

    ``tokens``: tokens per micro-batch (e.g. 4 trajectories x 4,096); ``reference``: the run scores
    readiness or has a KL term (only matters for full fine-tuning, where it is a bf16 copy).
    """
    n = shape.params()
    if lora_rank > 0:
        weights = 2.0 * n + 16.0 * shape.lora_params(lora_rank)
        ref = 0.0
    else:
        weights = 18.0 * n  # master 4 + grad 4 + AdamW 8 + autocast bf16 copies 2 (reference below)
        ref = 2.0 * n if reference else 0.0
    act = activation_bytes(shape, tokens, checkpointing=checkpointing, chunk=chunk)
    parts = {"weights_and_optimizer": weights / GIB, "reference": ref / GIB, "activations": act / GIB}
    parts["total"] = sum(parts.values())
    return parts


def fits(shape: ModelShape, gpu_gib: float, *, overhead_gib: float = 4.0, **kwargs: int | bool) -> bool:
    """Whether :func:`training_memory_gib` plus ``overhead_gib`` (CUDA context, fragmentation) fits."""
    return training_memory_gib(shape, **kwargs)["total"] + overhead_gib <= gpu_gib  # type: ignore[arg-type]


def enable_gradient_checkpointing(model: object) -> None:
    """Non-reentrant activation checkpointing of the decoder layers (transformers 5 name, old name as fallback)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[attr-defined]
