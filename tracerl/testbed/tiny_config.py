"""Configuration of the embedded tiny base model: one validated dataclass plus named presets."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from tracerl.envs.synthwiki import WorldConfig
from tracerl.testbed.tiny_data import ExplorerConfig

_CACHE_VERSION = "tiny-v1"
_EXPLORER_ADDED_LATER = ("guided", "hop_aware")
"""Explorer fields added after caches existed: left out of the hash while they are 0."""
_WORLD_ADDED_LATER = ("clues",)
"""World fields added after caches existed: left out of the hash while they are 0."""


DEFAULT_WORLD = WorldConfig(num_people=250, num_cities=125, num_countries=20, num_books=125, num_bands=75,
                            num_companies=105)
"""The embedded world's size: ~700 entities keep the word-level vocabulary (and the model) small;
a 2,800-entity world (the SynthWiki default) needed about three times the pretraining compute
for the same skill at copying names out of observations."""


DEFAULT_EXPLORER = ExplorerConfig(focus=1.0, search_count_weights=(0.35, 0.3, 0.2, 0.15), top_k=3)
"""The explorer of the measured default recipe (top_k=3 although the demo searches with 2)."""


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
    """RoPE range; the rollout engine's default ``max_total_tokens`` is 2048."""
    qk_norm_init: float = 1.0
    """Initial weight of Qwen3's per-head q/k RMSNorms (normed queries and keys cap attention
    logits near ``sqrt(head_dim) * w**2``; 2.0 did not speed up copying in our runs)."""
    # --- data ---
    world: WorldConfig = DEFAULT_WORLD  # frozen, so one shared instance is safe
    """Names and sizes of every pretraining world (its fact seed is replaced per world).
    Evaluate on worlds with the same name seed and sizes (names outside the vocabulary are
    ``<unk>``) and a fact seed outside ``first_fact_seed .. first_fact_seed + num_worlds - 1``."""
    num_worlds: int = 50
    first_fact_seed: int = 1_000_000
    episodes_per_world: int = 120
    doc_rows_per_world: int = 24
    """Rows of ``docs_per_row`` random documents per world (world text, rendered as search hits)."""
    docs_per_row: int = 6
    explorer: ExplorerConfig = DEFAULT_EXPLORER  # frozen, so one shared instance is safe
    max_turns: int = 8
    """Environment turn limit while exploring (the engine's default)."""
    context_loss_weight: float = 0.3
    """Loss weight of prompt and observation tokens relative to assistant tokens (1: plain LM;
    0: assistant only). Observation text teaches copying (0 was much worse); 0.3 beat 1.0."""
    # --- optimisation ---
    steps: int = 2100
    batch_size: int = 2
    """Packed rows per optimiser step (many small steps learned copying faster than few big ones)."""
    seq_len: int = 512
    """Tokens per packed row (longer samples are cut; default episodes stay under it)."""
    lr: float = 6e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    precision: str = "float32"
    """``float32`` (the default: the same model on every machine), ``bfloat16`` (autocast) or
    ``auto`` (bfloat16 where the CPU has native bf16, about 2x faster there; the model then
    differs across machines, which is why it is never the default)."""
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
        if not self.context_loss_weight >= 0:
            raise ValueError(f"TinyModelConfig.context_loss_weight must be >= 0, got {self.context_loss_weight}")
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
        config = self.to_dict()
        for name in _EXPLORER_ADDED_LATER:  # at 0, presets keep the hash (and cache) they had before
            if not getattr(self.explorer, name):
                del config["explorer"][name]
        for name in _WORLD_ADDED_LATER:
            if not getattr(self.world, name):
                del config["world"][name]
        payload = json.dumps({"v": _CACHE_VERSION, "config": config,
                              "precision": resolve_precision(self.precision)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _check_explorer(cfg: ExplorerConfig) -> None:
    for name in ("focus", "open_prob", "guided", "hop_aware"):
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"ExplorerConfig.{name} must be in [0, 1], got {value}")
    weights = cfg.search_count_weights
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"ExplorerConfig.search_count_weights must be non-negative with a positive sum, got {weights}")
    if cfg.top_k < 1 or cfg.doc_max_tokens < 1:
        raise ValueError("ExplorerConfig.top_k and doc_max_tokens must be >= 1")


BENCH_WORLD = WorldConfig(num_people=250, num_cities=125, num_countries=20, num_books=125, num_bands=75,
                          num_companies=105, distractors=0)
"""The benchmark's world: the embedded world's sizes without look-alike distractor names."""

SMOKE_WORLD = WorldConfig(num_people=24, num_cities=12, num_countries=6, num_books=10, num_bands=8,
                          num_companies=10, max_hops=2, num_train=20, num_test=10)

PRESETS: dict[str, TinyModelConfig] = {
    # About 3-5 minutes on 2 CPU cores; scores a few percent on unseen-world questions, so RL has
    # something to learn (the demo takes it from ~0-5% to ~25% in a few minutes).
    # The recipe measured end to end (pretraining, then RL in the demo): 4 layers, 2.1M training
    # tokens. Longer recipes copied names better but did not fit the demo's 15-minute budget.
    "default": TinyModelConfig(),
    # Two layers, 4.3M tokens in 8,400 steps of one row: about 1.1x the default's pretraining
    # time (a 2-layer step is ~1.75x cheaper per token). Copies names out of observations about
    # twice as well (answer-slot probability of the explorer's choice 0.28 vs 0.13 on an unseen
    # world); base accuracy on the demo's 1-2 hop questions 6.5% / 1.0% vs 6.0% / 0.0%.
    # Not yet measured end to end with RL.
    "two_layer": TinyModelConfig(num_layers=2, steps=8400, batch_size=1, warmup_steps=100),
    # The first issue-13 testbed model (docs/results/setting.md, "Choosing the setting"): the
    # default architecture (0.99M parameters) on 200 worlds without look-alike names, 4.2k steps
    # (4.0M tokens; ~10 min on an idle core, 41 min on the loaded 2-core machine). On 1-3 hop
    # questions of an unseen world, 3 results per call, it succeeds in 4.3% / 0.8% / 0.0% of
    # sampled 1 / 2 / 3-hop episodes (the default model, 2 results: 2.1% / 0.0% / 0.7%); GRPO
    # takes 1-hop to ~40% in 20-80 steps and 2-3 hop stays at 0%. Superseded by bench_hops.
    "bench": TinyModelConfig(world=BENCH_WORLD, num_worlds=200, steps=4200, warmup_steps=100),
    # bench plus 20% demonstrations (gold search path, then the gold answer) among the episodes,
    # 2.1k steps (8 min): sampled 3.6% / 0.0% / 0.0%, greedy 10.9% / 0% / 0%; GRPO 60 steps:
    # 44% / 0% / 0%. No better on multi-hop questions than bench, so the benchmark keeps bench.
    "bench_guided": TinyModelConfig(world=BENCH_WORLD, num_worlds=200, steps=2100, warmup_steps=100,
                                    explorer=replace(DEFAULT_EXPLORER, guided=0.2)),
    # The sample-efficiency testbed's model (issue 13; docs/results/setting.md, "Choosing
    # the setting"): bench with a hop-aware explorer. 70% of the exploratory episodes make as many
    # searches as the question has hops, still following random links and answering a random link,
    # so the base model knows how many lookups a question needs but not which ones (the explorer
    # itself succeeds on 47% / 26% / 12% of 1 / 2 / 3-hop questions, bench's on 19% / 8% / 2%).
    # 4.2k steps, 11 min on an idle core. Base model, 1-3 hop questions of an unseen world, 3
    # results per call: sampled 22% / 6.3% / 0.9%, greedy 35% / 25% / 7%; GRPO (lr 1e-3) takes
    # greedy two-hop to 38-48% and three-hop to 13-16% in 75-150 steps.
    "bench_hops": TinyModelConfig(world=BENCH_WORLD, num_worlds=200, steps=4200, warmup_steps=100,
                                  explorer=replace(DEFAULT_EXPLORER, hop_aware=0.7)),
    # bench_hops on the world with one look-alike per name (the credit testbed's look-alike variant,
    # benchmarks/common.py LOOKALIKE_SETTING): a search for the look-alike returns a document of the
    # same shape without the gold. Shipped (weights/bench_hops_lookalike); its base rates not yet measured here.
    "bench_hops_lookalike": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1), num_worlds=200, steps=4200,
                                            warmup_steps=100, explorer=replace(DEFAULT_EXPLORER, hop_aware=0.7)),
    # The long-horizon testbed's candidate base (issue 48; benchmarks/science/long_horizon_pilot.py): bench_hops_lookalike
    # on 1-5 hop worlds, so that its hop-aware explorer also makes five searches. The shipped
    # bench_hops_lookalike (pretrained on at most four hops) makes 4.0 greedy calls on 4-5 hop questions
    # and solves no sampled five-hop question. Five searches of three results reach ~610 tokens, hence rows
    # of 768. Not pretrained or shipped yet: about 1.5x bench_hops_lookalike's 22 min on an idle core.
    "bench_hops_long": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, max_hops=5), num_worlds=200,
                                       steps=4200, warmup_steps=100, seq_len=768, max_turns=10,
                                       explorer=replace(DEFAULT_EXPLORER, hop_aware=0.7,
                                                        search_count_weights=(0.3, 0.25, 0.2, 0.15, 0.1))),
    # The long-horizon testbed's bases (issue 48; benchmarks/science/long_horizon_pilot.py): the look-alike
    # world with clue sentences (each document ends by naming its two-hop entities, so the gold is in
    # context one search before the last), a more hop-aware explorer (four-hop questions need four
    # calls), rows of 768; ``_longer`` pretrains 1.5x as many steps.
    "bench_hops_clues": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1), num_worlds=200,
                                        steps=4200, warmup_steps=100, seq_len=768,
                                        explorer=replace(DEFAULT_EXPLORER, hop_aware=0.85)),
    "bench_hops_clues_longer": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1), num_worlds=200,
                                               steps=6300, warmup_steps=100, seq_len=768,
                                               explorer=replace(DEFAULT_EXPLORER, hop_aware=0.85)),
    # ``_longer`` pretrained twice as long: 4,200 -> 6,300 steps took four-hop greedy success from 2% to 8%
    # and sampled (temperature 0.5) from 1.5% to 5%, and nothing learned on ``_longer`` in 150-300 RL steps
    # (sampled success there is no lower than greedy: no sharpening to be had). Not shipped.
    "bench_hops_clues_2x": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1), num_worlds=200,
                                           steps=12600, warmup_steps=100, seq_len=768,
                                           explorer=replace(DEFAULT_EXPLORER, hop_aware=0.85)),
    # The clue world on one- to five-hop worlds (the clue bases above saw at most four hops, so they make
    # four calls on every four- and five-hop question, greedy or sampled, and answer early when sampling
    # adds noise: no temperature kept four calls with sampled success below greedy). Five-entry search
    # counts, ten turns, rows of 896 (five searches reach ~830 tokens); ``_2x`` pretrains twice as many
    # steps. Ninth long-horizon pilot round: chosen there (four and five hops, temperature 0.7: sampled
    # 5.5% with 4.46 calls, greedy 5%; a GRPO pilot +2.7 points), shipped; ``_2x`` not measured, not shipped.
    "bench_hops_clues5": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1, max_hops=5), num_worlds=200,
                                         steps=6300, warmup_steps=100, seq_len=896, max_turns=10,
                                         explorer=replace(DEFAULT_EXPLORER, hop_aware=0.85,
                                                          search_count_weights=(0.3, 0.25, 0.2, 0.15, 0.1))),
    "bench_hops_clues5_2x": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1, max_hops=5),
                                            num_worlds=200, steps=12600, warmup_steps=100, seq_len=896, max_turns=10,
                                            explorer=replace(DEFAULT_EXPLORER, hop_aware=0.85,
                                                             search_count_weights=(0.3, 0.25, 0.2, 0.15, 0.1))),
    # ``_longer`` with an explorer that always searches once per hop (sampled four-hop episodes of
    # ``_longer`` averaged 3.98 valid calls: some answer early).
    "bench_hops_clues_exact": TinyModelConfig(world=replace(BENCH_WORLD, distractors=1, clues=1), num_worlds=200,
                                              steps=6300, warmup_steps=100, seq_len=768,
                                              explorer=replace(DEFAULT_EXPLORER, hop_aware=1.0)),
    # The same data on two layers (8.4k steps of one row, 7 min): sampled 7.3% / 0.0% / 0.9%, and
    # GRPO stayed at 0% on two and three hops in 100 steps; measured and not used.
    "bench_hops_2l": TinyModelConfig(world=BENCH_WORLD, num_worlds=200, num_layers=2, steps=8400, batch_size=1,
                                     warmup_steps=100, explorer=replace(DEFAULT_EXPLORER, hop_aware=0.7)),
    # Seconds on a CPU: for tests and smoke runs; knows the format and the tiny world's text well
    # enough to answer some one-hop questions, so a few RL steps see mixed groups.
    "smoke": TinyModelConfig(hidden_size=48, num_layers=2, num_heads=3, head_dim=32, intermediate_size=96,
                             max_position_embeddings=512, world=SMOKE_WORLD, num_worlds=8,
                             episodes_per_world=40, doc_rows_per_world=4, docs_per_row=3, steps=500,
                             batch_size=4, seq_len=256, warmup_steps=20, lr=6e-3, context_loss_weight=0.3,
                             explorer=ExplorerConfig(focus=1.0, search_count_weights=(0.35, 0.3, 0.2, 0.15))),
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
