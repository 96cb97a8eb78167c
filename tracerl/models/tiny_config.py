"""Configuration of the embedded tiny base model: one validated dataclass plus named presets."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from tracerl.envs.synthwiki import WorldConfig
from tracerl.models.tiny_data import ExplorerConfig

_CACHE_VERSION = "tiny-v1"


@dataclass(frozen=True)
class TinyModelConfig:
    """Everything that determines the tiny base model (its hash keys the cache)."""

    # --- architecture (Qwen3) ---
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 2048
    qk_norm_init: float = 1.0
    """Initial weight of Qwen3's per-head q/k RMSNorms. Normed queries and keys cap attention
    logits near ``sqrt(head_dim) * w**2``; a larger start lets heads attend sharply (copy one
    name out of hundreds of tokens) early in a short pretraining."""
    """RoPE range; the rollout engine's default ``max_total_tokens`` is 2048."""
    # --- data ---
    world: WorldConfig = field(default_factory=WorldConfig)
    """Names and sizes of every pretraining world (its fact seed is replaced per world).
    Evaluate on worlds with the same name seed and sizes and a fact seed outside
    ``first_fact_seed .. first_fact_seed + num_worlds - 1``."""
    num_worlds: int = 50
    first_fact_seed: int = 1_000_000
    episodes_per_world: int = 120
    doc_rows_per_world: int = 24
    """Rows of ``docs_per_row`` random documents per world (world text, rendered as search hits)."""
    docs_per_row: int = 6
    explorer: ExplorerConfig = field(default_factory=ExplorerConfig)
    max_turns: int = 8
    """Environment turn limit while exploring (the engine's default)."""
    loss_on: str = "all"
    """Episode tokens with loss: ``all`` or ``assistant`` (documents always train on all)."""
    # --- optimisation ---
    steps: int = 700
    batch_size: int = 6
    """Packed rows per optimiser step."""
    seq_len: int = 512
    """Tokens per packed row (longer samples are cut; default episodes stay under it)."""
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    precision: str = "auto"
    """``float32``, ``bfloat16`` (CPU autocast) or ``auto`` (bfloat16 where the CPU has native bf16)."""
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_layers", "num_heads", "head_dim", "intermediate_size",
                    "max_position_embeddings", "num_worlds", "episodes_per_world", "docs_per_row",
                    "max_turns", "steps", "batch_size", "seq_len")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TinyModelConfig.{name} must be a positive integer, got {value!r}")
        for name in ("doc_rows_per_world", "warmup_steps", "first_fact_seed", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TinyModelConfig.{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.world, WorldConfig):
            raise ValueError("TinyModelConfig.world must be a WorldConfig")
        if not isinstance(self.explorer, ExplorerConfig):
            raise ValueError("TinyModelConfig.explorer must be an ExplorerConfig")
        _check_explorer(self.explorer)
        if self.loss_on not in ("all", "assistant"):
            raise ValueError(f"TinyModelConfig.loss_on must be 'all' or 'assistant', got {self.loss_on!r}")
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"TinyModelConfig.precision must be auto, float32 or bfloat16, got {self.precision!r}")
        if not self.qk_norm_init > 0:
            raise ValueError(f"TinyModelConfig.qk_norm_init must be > 0, got {self.qk_norm_init}")
        if not self.lr > 0:
            raise ValueError(f"TinyModelConfig.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"TinyModelConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not self.weight_decay >= 0 or not self.grad_clip > 0:
            raise ValueError("TinyModelConfig.weight_decay must be >= 0 and grad_clip > 0")
        if len(self.explorer.search_count_weights) >= self.max_turns:
            raise ValueError("TinyModelConfig.max_turns must exceed the explorer's largest search count")

    @property
    def fact_seeds(self) -> list[int]:
        """The fact seeds of the pretraining worlds (keep evaluation worlds out of this range)."""
        return list(range(self.first_fact_seed, self.first_fact_seed + self.num_worlds))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TinyModelConfig:
        """Inverse of :meth:`to_dict`; unknown keys fail naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TinyModelConfig: unknown field {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        data = dict(data)
        if isinstance(data.get("world"), dict):
            data["world"] = WorldConfig(**data["world"])
        if isinstance(data.get("explorer"), dict):
            explorer = dict(data["explorer"])
            explorer["search_count_weights"] = tuple(explorer.get("search_count_weights", ()))
            data["explorer"] = ExplorerConfig(**explorer)
        return cls(**data)

    def hash(self) -> str:
        """Stable key of this config (and the resolved precision) for the cache folder."""
        payload = json.dumps({"v": _CACHE_VERSION, "config": self.to_dict(),
                              "precision": resolve_precision(self.precision)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _check_explorer(cfg: ExplorerConfig) -> None:
    for name in ("focus", "open_prob"):
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"ExplorerConfig.{name} must be in [0, 1], got {value}")
    weights = cfg.search_count_weights
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"ExplorerConfig.search_count_weights must be non-negative with a positive sum, got {weights}")
    if cfg.top_k < 1 or cfg.doc_max_tokens < 1:
        raise ValueError("ExplorerConfig.top_k and doc_max_tokens must be >= 1")


SMOKE_WORLD = WorldConfig(num_people=24, num_cities=12, num_countries=6, num_books=10, num_bands=8,
                          num_companies=10, max_hops=2, num_train=20, num_test=10)

PRESETS: dict[str, TinyModelConfig] = {
    "default": TinyModelConfig(),
    # Seconds on a CPU: for tests and --smoke runs (knows the format a little, nothing more).
    "smoke": TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, head_dim=16, intermediate_size=64,
                             max_position_embeddings=512, world=SMOKE_WORLD, num_worlds=3,
                             episodes_per_world=8, doc_rows_per_world=2, docs_per_row=3, steps=8,
                             batch_size=2, seq_len=256, warmup_steps=2, lr=1e-2, precision="float32"),
}


def get_preset(name: str) -> TinyModelConfig:
    """A named config; unknown names fail listing the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown tiny model preset {name!r}; valid: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def resolve_precision(precision: str) -> str:
    """``auto`` -> ``bfloat16`` when the CPU does bf16 natively (about 2x faster here), else float32."""
    if precision != "auto":
        return precision
    try:
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    except AttributeError:  # pragma: no cover - older torch without the probes
        native = False
    return "bfloat16" if native else "float32"
