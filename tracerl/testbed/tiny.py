"""The embedded tiny base model: a word-level tokenizer and a small Qwen3 pretrained on SynthWiki.

The project's demo needs a policy that knows the react format and reads observations, yet
rarely answers right, so RL has something to learn (issue 4 item 4). This module trains one
from scratch in a few minutes on CPU:

- :func:`build_tiny_tokenizer`: a ``tokenizers`` WordLevel model saved as a real
  :class:`~transformers.PreTrainedTokenizerFast`. A space before a capitalised word is its own
  ``"▁"`` token, so an entity name is the same single token whether it follows a space, a
  bracket or a line start (copying a name from an observation into ``search[...]`` is one
  token id). ``decode(encode(text)) == text`` for in-vocabulary text, and encoding the
  engine's pieces one by one gives the same ids as encoding their concatenation.
- :func:`pretrain_tiny_model`: plain PyTorch (AdamW, warmup + cosine LR) on SynthWiki documents
  and exploratory episodes over many re-drawn worlds (same names, fresh facts; see
  :mod:`tracerl.testbed.tiny_data`).
- :func:`load_or_pretrain`: the model shipped in the package for a preset's config
  (:mod:`tracerl.testbed.shipped`); any other config pretrained once and cached under
  ``$XDG_CACHE_HOME/tracerl/tiny/<hash>/``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from tracerl.agent.formats import get_format
from tracerl.atomic import make_temp_dir, publish_dir, remove_stale_temps
from tracerl.envs.bounded import read_limited
from tracerl.envs.synthwiki import WorldConfig
from tracerl.testbed.shipped import FOLDER_FILES, file_sha256, find_shipped, ship_preset
from tracerl.testbed.tiny_config import PRESETS, TinyModelConfig, get_preset
from tracerl.testbed.tiny_data import (
    ExplorerConfig,
    Sample,
    WorldTools,
    document_rows,
    encode_pieces,
    explore,
    pretraining_worlds,
    vocabulary_texts,
)
from tracerl.testbed.tiny_train import TrainLog, train_causal_lm

__all__ = [
    "PRESETS", "ExplorerConfig", "TinyModelConfig", "build_tiny_tokenizer", "count_parameters",
    "existing_folder", "get_preset", "load_or_pretrain", "pretrain_tiny_model", "pretrained_folder", "random_tiny_model",
    "tiny_qwen3_config", "tokenizer_for_world",
]

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
# Plain concatenation: the react format is plain text; an assistant message ends with EOS.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


# --- tokenizer ----------------------------------------------------------------------------------


def _word_level_pipeline(tok: Tokenizer) -> None:
    # 1) newlines and "a space before a capital letter" become pieces of their own, 2) other
    # spaces are kept as "▁" on the following word, 3) punctuation is isolated. The decoder
    # maps "▁" back to a space, so decoding is the exact inverse for in-vocabulary text.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n| (?=\p{Lu})"), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=True)


def build_tiny_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on ``texts`` (every word seen becomes one token).

    Special tokens: ``<pad>`` (id 0), ``<unk>`` (1), ``<eos>`` (2). No BOS is added, so the
    engine's prompts are the plain text ids. Unseen words encode to ``<unk>``.
    """
    if not texts:
        raise ValueError("build_tiny_tokenizer needs at least one training text")
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    _word_level_pipeline(tok)
    trainer = trainers.WordLevelTrainer(special_tokens=[PAD, UNK, EOS], min_frequency=1, show_progress=False)
    # Each word also on a line of its own, so it exists without a leading space too (as it is
    # written after "[" or at a line start), not only in the "▁word" form of running text.
    tok.train_from_iterator(list(texts) + [t.replace(" ", "\n") for t in texts], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, eos_token=EOS,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tokenizer_for_world(world: WorldConfig, format_name: str = "react") -> PreTrainedTokenizerFast:
    """The tokenizer :func:`pretrain_tiny_model` builds for worlds named like ``world``
    (every entity name, template word and fixed string of the format is in its vocabulary)."""
    return build_tiny_tokenizer(vocabulary_texts(world, get_format(format_name)))


# --- model --------------------------------------------------------------------------------------


def tiny_qwen3_config(tokenizer: Any, config: TinyModelConfig) -> Qwen3Config:
    """The Qwen3 architecture of ``config`` over ``tokenizer``'s vocabulary (tied embeddings)."""
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def random_tiny_model(tokenizer: Any, config: TinyModelConfig | None = None) -> Qwen3ForCausalLM:
    """A randomly initialised tiny Qwen3 (seeded by ``config.seed``), for smoke runs and tests."""
    config = config or PRESETS["smoke"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(tiny_qwen3_config(tokenizer, config))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(config.qk_norm_init)
            layer.self_attn.k_norm.weight.fill_(config.qk_norm_init)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# --- pretraining --------------------------------------------------------------------------------


def pretraining_samples(config: TinyModelConfig, tokenizer: Any) -> tuple[list[Sample], dict[str, int]]:
    """Exploratory episodes and document rows over ``config.num_worlds`` re-drawn worlds.

    Returns the samples and counts (episodes, document rows, tokens, unknown tokens).
    """
    fmt = get_format("react")
    rng = random.Random(f"tiny-data:{config.seed}")
    eos = int(tokenizer.eos_token_id)
    samples: list[Sample] = []
    stats = {"episodes": 0, "document_rows": 0}
    for world in pretraining_worlds(config.world, config.fact_seeds, config.episodes_per_world):
        wt = WorldTools(world, config.explorer, config.max_turns)
        episodes = [explore(task, wt, fmt, rng, config.explorer) for task in world.train]
        samples += encode_pieces(tokenizer, episodes, eos, config.context_loss_weight)
        rows = document_rows(world, rng, config.doc_rows_per_world, config.docs_per_row)
        if rows:
            for ids in tokenizer(rows, add_special_tokens=False)["input_ids"]:
                samples.append(Sample(ids + [eos], [1.0] * (len(ids) + 1)))
        stats["episodes"] += len(episodes)
        stats["document_rows"] += len(rows)
    stats["tokens"] = sum(len(s.ids) for s in samples)
    stats["unknown_tokens"] = sum(s.ids.count(tokenizer.unk_token_id) for s in samples)
    return samples, stats


def pretrain_tiny_model(config: TinyModelConfig | None = None, out_dir: str | Path = "tiny-model",
                        progress: bool = True) -> Path:
    """Train the tokenizer and the model from scratch and save both to ``out_dir``.

    The folder reloads with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and also holds
    ``tiny_config.json`` (this config) and ``pretrain_log.json`` (losses, timings, sizes).
    Deterministic for a config on a given machine and thread count.
    """
    config = config or PRESETS["default"]
    out = Path(out_dir)
    start = _now()
    tokenizer = tokenizer_for_world(config.world)
    samples, stats = pretraining_samples(config, tokenizer)
    data_seconds = _now() - start
    if progress:
        print(f"pretrain data: {stats['episodes']} episodes, {stats['document_rows']} document rows, "
              f"{stats['tokens']} tokens, vocab {len(tokenizer)} ({data_seconds:.1f} s)", file=sys.stderr, flush=True)
    model = random_tiny_model(tokenizer, config)
    log: TrainLog = train_causal_lm(model, samples, config, int(tokenizer.pad_token_id), progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the middle of a demo
    try:
        model.save_pretrained(out)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    (out / "tiny_config.json").write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    record = {"parameters": count_parameters(model), "vocab_size": len(tokenizer), **stats,
              "data_seconds": round(data_seconds, 2), "train_seconds": round(log.seconds, 2),
              "total_seconds": round(_now() - start, 2), "precision": log.precision,
              "torch": torch.__version__, "threads": torch.get_num_threads(), "device": log.device,
              "train_tokens": log.tokens, "losses": [round(x, 4) for x in log.losses]}
    (out / "pretrain_log.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def _now() -> float:
    return time.perf_counter()


# --- cache --------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracerl" / "tiny"


def existing_folder(config: TinyModelConfig, cache_dir: str | Path | None = None) -> Path | None:
    """The shipped folder of ``config`` (sha256 checked), else its cached one, else ``None``:
    what :func:`load_or_pretrain` would return without pretraining."""
    found = find_shipped(config)
    if found is not None:
        return found
    cached = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / config.hash()
    return cached if (cached / "tiny_config.json").exists() else None


def load_or_pretrain(config: TinyModelConfig | None = None, cache_dir: str | Path | None = None,
                     progress: bool = True, shipped: bool = True) -> Path:
    """The folder of the pretrained model for ``config``.

    With ``shipped`` (the default) a config that a shipped model was made from gets that folder,
    its sha256 checked (:func:`~tracerl.testbed.shipped.find_shipped`); nothing is pretrained.
    Otherwise the model is pretrained once and cached in ``<cache_dir>/<config hash>/`` (default
    cache dir ``$XDG_CACHE_HOME/tracerl/tiny``), written to a temporary folder first and renamed,
    so a half-written model is never found.
    """
    config = config or PRESETS["default"]
    if shipped:
        found = find_shipped(config)
        if found is not None:
            return found
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / config.hash()
    if (final / "tiny_config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(root)
    tmp = make_temp_dir(final)  # tracerl's name and marker: only such folders are ever cleaned up
    try:
        pretrain_tiny_model(config, tmp, progress=progress)
        publish_dir(tmp, final)
    except OSError:
        if not (final / "tiny_config.json").exists():
            raise
        # another process finished the same model first: keep theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final




def remove_dead_temps(root: Path) -> list[str]:
    """Remove the temporary folders of pretrainings whose process is gone (a killed one leaves one).

    Only folders tracerl made (its name and marker, :mod:`tracerl.atomic`) and whose pid is gone:
    a live pid's may be another process pretraining right now, and anything else is the user's.
    Returns the names removed."""
    return remove_stale_temps(root, holding_lock=False)


def _check_out(target: Path, config: TinyModelConfig) -> bool:
    """Whether ``pretrain --out`` ``target`` already holds ``config``'s model (its files all there; their
    bytes are compared after pretraining, :func:`out_differs`); False for an empty or new folder;
    ValueError for a folder holding something else."""
    marker = target / "tiny_config.json"
    if not marker.exists():
        if target.exists() and any(target.iterdir()):
            raise ValueError(f"--out {target} exists and is not empty")
        return False
    if TinyModelConfig.from_dict(json.loads(read_limited(marker, 1 << 20, "tiny_config.json"))) != config:
        raise ValueError(f"--out {target} already holds a tiny model with another config")
    missing = [name for name in FOLDER_FILES if (target / name).is_symlink() or not (target / name).is_file()]
    if missing:
        raise ValueError(f"--out {target} holds this model's tiny_config.json but not {missing[0]}; empty the folder "
                         "or choose another --out")
    return True


def out_differs(cached: Path, target: Path) -> str | None:
    """How ``target`` (an earlier ``pretrain --out``) differs from the pretrained ``cached`` folder it
    should copy, or None: each of its files a regular file with the same bytes (sha256)."""
    for name in FOLDER_FILES:
        path = target / name
        if path.is_symlink() or not path.is_file():
            return f"not {name}"
        if file_sha256(path) != file_sha256(cached / name):
            return f"another {name}"
    return None


def pretrained_folder(preset: str = "default", out: str | Path | None = None, steps: int | None = None,
                      seed: int | None = None, cache_dir: str | Path | None = None,
                      progress: bool = True, ship: bool = False) -> Path:
    """What ``tracerl pretrain`` does: a preset's model (with overrides) pretrained here, never the
    shipped copy (the pretraining cache of the same config hash is reused; delete it to start over).

    With ``out`` the cached folder is also copied there (an existing ``out`` must hold the
    same model or be empty). With ``ship`` it replaces the package's shipped copy of the preset
    (``tracerl/testbed/weights/<preset>``, with a new manifest; run it in a source checkout) and
    that folder is returned.
    """
    changes = {k: v for k, v in (("steps", steps), ("seed", seed)) if v is not None}
    if ship and changes:
        raise ValueError("--ship publishes a preset's own model: drop --steps and --seed")
    config = replace(get_preset(preset), **changes)
    holds_model = out is not None and _check_out(Path(out), config)  # before pretraining: a bad --out fails fast
    cached = load_or_pretrain(config, cache_dir=cache_dir, progress=progress, shipped=False)
    if ship:
        threads = json.loads((cached / "pretrain_log.json").read_text()).get("threads", torch.get_num_threads())
        shipped = ship_preset(preset, cached, f"TRACERL_THREADS={threads} tracerl pretrain --preset {preset} --ship")
        if out is None:
            return shipped
    if out is None:
        return cached
    target = Path(out)
    if holds_model:
        differs = out_differs(cached, target)
        if differs is not None:
            raise ValueError(f"--out {target} holds this model's tiny_config.json but {differs}; empty the folder "
                             "or choose another --out")
        return target
    shutil.copytree(cached, target, dirs_exist_ok=True)
    return target
