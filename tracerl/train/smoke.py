"""``--smoke``: can the smoke-pretrained tiny model serve this run (the package ships it; pretraining
it, only where no shipped copy matches the preset, is said aloud).

The smoke-pretrained tiny model (``model.name_or_path=tiny``, ``model.tiny_preset=smoke``) calls
tools, earns some rewards and gives readiness credit in a run of seconds, but its word-level
vocabulary is fixed when it is pretrained: the react format, the ``search`` environment's tools and
SynthWiki's names. A run it cannot read (custom tools, another format or environment, data whose
gold answers it cannot encode) would only train on ``<unk>``, so ``--smoke`` refuses it in one line
naming ``--smoke-random`` (a random tiny model whose vocabulary is built from the run's own format,
tools and data) instead of falling back silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tracerl.errors import UserError
from tracerl.config.schema import TrainConfig, resolve_config

RANDOM_HINT = "use --smoke-random (a random tiny model whose vocabulary is built from the run's format and tools)"


def uses_smoke_model(config: TrainConfig) -> bool:
    """Whether the run's policy is the smoke-pretrained tiny model (``--smoke`` without a model override)."""
    return config.model.name_or_path == "tiny" and config.model.tiny_preset == "smoke"


def check_smoke_serves(config: TrainConfig) -> None:
    """Raise :class:`UserError` (one line, naming the field and ``--smoke-random``) when the
    smoke-pretrained model's fixed vocabulary cannot serve ``config``; nothing when another model is set."""
    if not uses_smoke_model(config):
        return  # --smoke --set model.name_or_path=...: the user's model, checked as any run's
    why = ""
    if config.model.format != "react":
        why = f"model.format = {config.model.format!r}: it was pretrained on the react format only"
    elif config.data.environment not in ("search", "http_search"):  # http_search: the same two tools
        why = f"data.environment = {config.data.environment!r}: it knows only the search environment's tools"
    elif config.data.tools:
        why = f"data.tools = {config.data.tools!r}: its vocabulary has only the search and open tools"
    if why:
        raise UserError(f"--smoke runs the smoke-pretrained tiny model, which cannot serve {why}; {RANDOM_HINT}")
    _check_data_coverage(config)


def _check_data_coverage(config: TrainConfig) -> None:
    """The training loop's coverage guard, run before the model is pretrained and the run folder exists."""
    from tracerl.envs.coverage import check_tokenizer_coverage
    from tracerl.train.data import load_task_data

    data = load_task_data(config.data, config.rollout.engine, config.seed)
    tokenizer = _smoke_tokenizer()  # a damaged shipped model is its own error (reinstall), not a --smoke-random case
    try:
        check_tokenizer_coverage(tokenizer, data.train + data.held_out, data.documents, seed=config.seed)
    except UserError as err:
        # the hint first: the CLI cuts a long line at 400 characters
        raise UserError(f"--smoke: the smoke-pretrained tiny model cannot read this data, {RANDOM_HINT}: {err}") from None


def _smoke_tokenizer() -> Any:
    """The smoke model's tokenizer: the shipped (or cached) model's, else rebuilt as pretraining builds it."""
    from transformers import AutoTokenizer

    from tracerl.testbed.tiny import existing_folder, tokenizer_for_world
    from tracerl.testbed.tiny_config import get_preset

    folder = existing_folder(get_preset("smoke"))
    if folder is not None:
        return AutoTokenizer.from_pretrained(str(folder))
    return tokenizer_for_world(get_preset("smoke").world)


def ensure_smoke_model(write: Callable[[str], None]) -> Path:
    """The smoke model's folder: the one shipped in the package (its sha256 checked), so nothing is
    pretrained; without a shipped copy of the current preset, pretrain it once and say so in one line.

    ``write`` takes raw text (stderr in the CLI): the line reads ``--smoke: pretraining ... done in
    31.2 s`` and its first half shows while the user waits. Pretraining runs on one torch thread
    whatever the run's count: the 0.08M-parameter model is fastest so (a loaded 2-core machine took
    251 s with torch's default two threads), and the shipped copy was made so too.
    """
    from tracerl.testbed.shipped import find_shipped
    from tracerl.testbed.tiny import default_cache_dir, load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    config = get_preset("smoke")
    shipped = find_shipped(config)
    if shipped is not None:
        return shipped
    folder = default_cache_dir() / config.hash()
    if (folder / "tiny_config.json").exists():
        return folder
    write(f"--smoke: pretraining the smoke tiny model once (about 30 s on one CPU core), cached in {folder} ...")
    start, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = load_or_pretrain(config, progress=False)
    finally:
        torch.set_num_threads(threads)
    write(f" done in {time.perf_counter() - start:.1f} s\n")
    return path


def pretrain_if_used(smoke: bool | str, config: TrainConfig, write: Callable[[str], None]) -> None:
    """Before a ``smoke`` run starts: pretrain the smoke model (:func:`ensure_smoke_model`) when it uses it."""
    if smoke in (True, "pretrained") and uses_smoke_model(config):
        ensure_smoke_model(write)


def pretrain_for_run(smoke: bool | str, preset: str, config_file: str | None, overrides: list[str],
                     write: Callable[[str], None]) -> None:
    """``tracerl train --smoke``: :func:`pretrain_if_used` on the config the run resolves."""
    if smoke in (True, "pretrained"):
        pretrain_if_used(smoke, resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke),
                         write)
