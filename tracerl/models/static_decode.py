"""Static KV slots for the decode loop (``model.decode_engine = 'static'``; issue 49, item 3).

The decode steps of :func:`~tracerl.models.decode_async.lagged_decode` run on transformers' own
``StaticCache``: per layer one preallocated ``[rows, kv_heads, length, head_dim]`` tensor in the
generation dtype (bf16 with ``model.generation_dtype = bfloat16``), written in place one column a
step, so every step has the same shapes. On CUDA the step is ``torch.compile(mode="reduce-overhead")``
(CUDA graphs: one graph per rows bucket, replayed every step with no per-op launches); on the CPU the
same code runs eagerly, which is what the tests compare with the eager loop.

- Rows are padded to a power-of-two bucket (pad rows repeat the last row; their outputs are never
  read), and the slot length is the prefill's width plus the step budget rounded up to a power of
  two (at least :data:`LENGTH_STEP`). A :class:`SlotPool` keeps one cache per bucket and reuses it
  in later calls whose length fits, so a graph is captured once per bucket and length, not once per
  call; buckets a call did not use are dropped after it (their memory goes back). Memory: at most
  about twice the largest bucket's ``rows x length`` KV (the buckets a compaction passes through).
- The prefill (stored prefixes, branches from a stored turn boundary, observations between turns)
  is :func:`~tracerl.models.prefill.prefill`'s, on a ``DynamicCache``; its KV is copied into the
  slots (branches reuse a prefix by copying its KV slots). Compaction (fewer than half the rows
  live) copies the live rows into the next smaller bucket's cache.
- The attention mask is passed prepared (4D, over all ``length`` columns): transformers then builds
  none, so no host sync and no shape that changes per step. Written through ``Cache.update`` with an
  explicit ``cache_position`` (transformers 5.17 writes at it; 5.25 keeps its own counter, the same
  column), so both versions the project runs on place each token in the same slot.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from tracerl.models.decode_async import DecodePolicy, Rows
from tracerl.models.prefix_cache import forward_with_cache

STATIC_ATTENTION = ("sdpa", "eager")
"""Attention implementations the prepared mask is built for (boolean for sdpa, additive for eager)."""
LENGTH_STEP = 128
"""The shortest slot length; longer ones are powers of two (few shapes: few graphs to capture)."""


def static_refusal(model: Any) -> str | None:
    """Why ``model`` cannot decode on static slots (one line), or None when it can."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in STATIC_ATTENTION:
        return (f"model.decode_engine = 'static' needs sdpa or eager attention; this model uses {impl!r} "
                "(use 'async' or 'eager')")
    layers = StaticCache(config=model.config, max_cache_len=LENGTH_STEP).layers
    if not all(type(layer) is StaticLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        return (f"model.decode_engine = 'static' needs full-attention layers only; this model's cache has "
                f"{', '.join(kinds)} (use 'async' or 'eager')")
    return None


def bucket(rows: int) -> int:
    """The smallest power of two >= ``rows``."""
    return 1 << max(0, rows - 1).bit_length()


def _takes_cache_position(model: Any) -> bool:
    """Whether the model's forward names ``cache_position`` (transformers 5.17 does; 5.25 does not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache_position" in inspect.signature(base.forward).parameters


def _step(net: Any, cache: Any, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
          extra: dict[str, torch.Tensor]) -> torch.Tensor:
    """One decode forward on the slots; the last logits [rows, V] (what CUDA graphs capture)."""
    out = forward_with_cache(net, ids, cache, attention_mask=mask, position_ids=positions, **extra)
    return out.logits[:, -1, :]


def _compiled_step() -> Any:
    """``_step`` under ``torch.compile(mode="reduce-overhead")``: CUDA graphs, one per rows bucket and
    slot length. Dynamo's automatic dynamic shapes recompile once when a second shape comes, then
    share that graph code; each shape still gets its own captured CUDA graph."""
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    # A new slot cache is a new object to dynamo's guards: room for the buckets and lengths of a run.
    setattr(torch._dynamo.config, limit, max(int(getattr(torch._dynamo.config, limit)), 64))
    return torch.compile(_step, mode="reduce-overhead")


class SlotPool:
    """The static engine's ``StaticCache`` per (rows bucket, dtype), kept across calls (module docstring)."""

    def __init__(self, compiled: bool) -> None:
        self.caches: dict[tuple[int, str], Any] = {}
        self.used: set[tuple[int, str]] = set()
        self.step: Any = _compiled_step() if compiled else _step
        self.compiled = compiled

    def get(self, config: Any, dtype: torch.dtype, rows: int, length: int) -> Any:
        """A cache of ``rows`` rows and at least ``length`` columns (a longer one replaces a short one)."""
        from transformers import StaticCache

        key = (rows, str(dtype))
        cache = self.caches.get(key)
        if cache is None or int(cache.layers[0].max_cache_len) < length:
            padded = max(LENGTH_STEP, 1 << max(0, length - 1).bit_length())
            self.caches[key] = cache = StaticCache(config=config, max_cache_len=padded)
        self.used.add(key)
        return cache

    def prune(self) -> None:
        """Drop the caches no call used since the last prune."""
        self.caches = {key: cache for key, cache in self.caches.items() if key in self.used}
        self.used = set()


class StaticSlots:
    """The :class:`~tracerl.models.decode_async.Slots` of the static engine (module docstring)."""

    def __init__(self, policy: DecodePolicy, pool: SlotPool, cache: Any, mask: torch.Tensor, max_new_tokens: int) -> None:
        self.policy, self.pool = policy, pool
        net = policy.net
        self.dtype = next(net.parameters()).dtype
        rows, self.width0 = mask.shape
        self.written = self.width0
        self.capacity = bucket(rows)
        self.cache = pool.get(net.config, self.dtype, self.capacity, self.width0 + max_new_tokens - 1)
        self.length = int(self.cache.layers[0].max_cache_len)
        index = list(range(rows)) + [rows - 1] * (self.capacity - rows)
        self._fill([(layer.keys, layer.values) for layer in cache.layers], index, self.width0)
        self.mask = mask.new_zeros((self.capacity, self.length))
        self.mask[:, : self.width0] = mask[index]
        self.extra = _takes_cache_position(net)
        self.bool_mask = (getattr(net.config, "_attn_implementation", None) or "eager") == "sdpa"

    def _fill(self, layers: list[tuple[torch.Tensor, torch.Tensor]], index: list[int], width: int) -> None:
        """Reset the slots and write rows ``index`` of ``layers``' first ``width`` columns."""
        self.cache.reset()
        sel = torch.tensor(index, device=layers[0][0].device)
        where = {"cache_position": torch.arange(width, device=sel.device)}
        for i, (keys, values) in enumerate(layers):
            self.cache.update(keys[sel, :, :width], values[sel, :, :width], i, where)

    def _mask4d(self) -> torch.Tensor:
        """[rows, 1, 1, length]: boolean (sdpa: True attends) or additive (eager: 0 or the dtype's min)."""
        if self.bool_mask:
            return self.mask[:, None, None, :].bool()
        return (1.0 - self.mask[:, None, None, :].to(self.dtype)) * torch.finfo(self.dtype).min

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        col = self.written
        self.mask[:, col] = 1
        extra = {"cache_position": torch.tensor([col], device=tokens.device)} if self.extra else {}
        with self.policy._forwards():
            logits = self.pool.step(self.policy.net, self.cache, tokens[:, None], positions[:, None], self._mask4d(), extra)
        self.written += 1
        # A CUDA graph's output buffer is overwritten by its next replay: keep this step's logits.
        return logits.clone() if self.pool.compiled else logits

    def select(self, slots: list[int]) -> list[int]:
        capacity = bucket(len(slots))
        index = slots + [slots[-1]] * (capacity - len(slots))
        old = [(layer.keys, layer.values) for layer in self.cache.layers]
        self.cache = self.pool.get(self.policy.net.config, self.dtype, capacity, self.length)
        self.length, self.capacity = int(self.cache.layers[0].max_cache_len), capacity
        self._fill(old, index, self.written)
        mask = self.mask[torch.tensor(index, device=self.mask.device)]
        self.mask = mask.new_zeros((capacity, self.length))
        self.mask[:, : self.written] = mask[:, : self.written]
        return index

    def remember(self, finished: list[tuple[int, int]], width: int, rows: Rows, tokens: list[list[int]]) -> None:
        self.policy._remember(self.cache, self.mask[:, :width], finished, rows, tokens)
