"""KV-cache helpers and the prefix KV store (per-sequence caches kept between ``generate`` calls).

A multi-turn episode calls the policy once per turn with a prefix that extends the previous
call's prefix and generation (``S_t = S_{t-1} + turn_t + observation_t``), and a branch
resumes from a stored boundary that is a prefix of a chain generated earlier. Keeping each
finished row's keys and values lets the next call prefill only the new tokens (the forced
observation and the last sampled token) instead of the whole prefix.

Bookkeeping: an entry holds the KV of one token sequence and is *registered* under some of
its prefix lengths (its full length, and the prefix length of the call that produced it). A
lookup returns the entry with the longest registered length whose tokens match the query's
first tokens. When a row extends an entry (the new sequence starts with the entry's tokens),
the new entry inherits the old one's registrations and the old entry is dropped, so a chain
costs one entry whose memory grows with it, and branching from any of its earlier
boundaries still hits. Entries are evicted least-recently-used beyond ``max_bytes``.

The store is only valid for fixed weights: :class:`~tracerl.models.backend.HFPolicy` clears it
when any parameter's version counter moves (an optimiser step or ``load_state_dict``).
"""

from __future__ import annotations

import inspect
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from typing import Any

import torch

_SIG = 8  # tokens hashed with the length to find candidate entries quickly


@dataclass(eq=False)
class KVEntry:
    """KV of one token sequence: per layer ``(keys, values)`` of shape [kv_heads, len, head_dim]."""

    key: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    nbytes: int
    lengths: set[int] = field(default_factory=set)
    uid: int = 0


def _sig(ids: Sequence[int], k: int) -> tuple[int, tuple[int, ...]]:
    return k, tuple(ids[max(0, k - _SIG) : k])


class PrefixKVStore:
    """LRU store of per-sequence KV caches with longest-registered-prefix lookup."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[int, KVEntry] = OrderedDict()
        self._by_sig: dict[tuple[int, tuple[int, ...]], dict[int, KVEntry]] = {}
        self._lengths: Counter[int] = Counter()
        self._uids = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._by_sig.clear()
        self._lengths.clear()
        self.nbytes = 0

    def lookup(self, ids: Sequence[int]) -> tuple[KVEntry | None, int]:
        """The entry sharing the longest registered prefix with ``ids`` and how many tokens to reuse.

        At most ``len(ids) - 1`` tokens are reused: the last token must be fed to get logits.
        """
        n = len(ids)
        for k in sorted(self._lengths, reverse=True):
            if k > n:
                continue
            for entry in self._by_sig.get(_sig(ids, k), {}).values():
                if entry.key[:k] == tuple(ids[:k]):
                    self._entries.move_to_end(entry.uid)
                    use = min(k, n - 1)
                    return (entry, use) if use > 0 else (None, 0)
        return None, 0

    def add(
        self,
        key: tuple[int, ...],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        register: Iterable[int],
        extends: KVEntry | None = None,
    ) -> None:
        """Store ``layers`` for ``key``; inherit and drop ``extends`` if ``key`` starts with its tokens."""
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        lengths = {len(key)} | {k for k in register if 0 < k <= len(key)}
        if extends is not None and key[: len(extends.key)] == extends.key:
            lengths |= extends.lengths
            self._remove(extends)
        entry = KVEntry(key, layers, nbytes, lengths, next(self._uids))
        self._entries[entry.uid] = entry
        for k in lengths:
            self._by_sig.setdefault(_sig(key, k), {})[entry.uid] = entry
            self._lengths[k] += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries.values())))

    def _remove(self, entry: KVEntry) -> None:
        if self._entries.pop(entry.uid, None) is None:
            return  # already dropped (another row extended it first, or evicted)
        for k in entry.lengths:
            sig = _sig(entry.key, k)
            bucket = self._by_sig.get(sig, {})
            bucket.pop(entry.uid, None)
            if not bucket:
                self._by_sig.pop(sig, None)
            self._lengths[k] -= 1
            if self._lengths[k] == 0:
                del self._lengths[k]
        self.nbytes -= entry.nbytes


# --- KV-cache helpers shared by the policy backend and the reference scorer -----------------


def forward_with_cache(model: Any, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Any:
    """Call ``model`` with a KV cache under the keyword the installed transformers expects.

    transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns until 5.40).
    """
    key = _cache_kwarg(model)
    out = model(input_ids=input_ids, use_cache=True, **{key: cache}, **kwargs)
    return out


def output_cache(out: Any) -> Any:
    """The updated cache of a model output, under either attribute name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _cache_kwarg(model: Any) -> str:
    key = getattr(model, "_tracerl_cache_kwarg", None)
    if key is None:
        # A peft wrapper forwards **kwargs: ask the model it wraps which keyword it takes.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        try:
            model._tracerl_cache_kwarg = key
        except AttributeError:  # pragma: no cover - exotic wrappers without attribute assignment
            pass
    return key


def new_cache(model: Any) -> Any:
    """An empty dynamic KV cache for ``model`` (croppable and batch-indexable)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad ``t`` on the left of ``dim`` up to ``width``."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def plain_dynamic(cache: Any) -> bool:
    """Only full-attention dynamic layers can be sliced per row and re-assembled."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))


def slot_layers(cache: Any) -> bool:
    """A static cache of full-attention slots (the static decode engine's): rows sliceable like
    :func:`plain_dynamic`'s."""
    from transformers.cache_utils import StaticLayer

    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is StaticLayer for layer in layers)

