"""``tracerl eval --run RUN_DIR``: evaluate a run's latest checkpoint with the run's own config.

The run's ``config.yaml`` (the one inside the checkpoint) gives the agent format and system
prompt, the episode limits (``rollout.engine``), the verifier and the data: by default the
held-out split training evaluated on (``data.eval_tasks``, or SynthWiki's unseen world), with
the same search environment. ``--tasks``/``--corpus`` replace the data.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tracerl.runs.checkpoint import (
    CheckpointError,
    check_tokenizer,
    latest_checkpoint,
    load_policy_into,
    model_load_error,
)
from tracerl.config.schema import TrainConfig
from tracerl.runs.run_config import read_run_config
from tracerl.runs.folder import RunFolderError, check_run_folder


_ATTEMPTS = 3
"""Times ``--run`` re-reads ``LATEST`` when a live run pruned the checkpoint being loaded."""


def load_run_policy(run_dir: Path, device: str, *, trust_code: bool = False) -> tuple[Any, Any, TrainConfig, Path]:
    """``(model, tokenizer, config, checkpoint folder)`` of a run's ``LATEST`` checkpoint.

    The run may be live: when the checkpoint being read is pruned under us (``LATEST`` moved on),
    the new ``LATEST`` is read, up to :data:`_ATTEMPTS` times, then one line says so. The folder
    is checked first (no links inside, runs/folder.py) and its config refuses plug-in import
    paths unless ``trust_code`` (runs/run_config.py).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(f"--run {run_dir}: no such folder")
    check_run_folder(run_dir)
    tried = []
    for _ in range(_ATTEMPTS):
        folder = latest_checkpoint(run_dir)
        if folder is None:
            raise RunFolderError(f"--run {run_dir} has no checkpoint yet (no LATEST); train it first, "
                                 "or evaluate a model folder with --model")
        try:
            model, tokenizer, config = _load_checkpoint(run_dir, folder, device, trust_code)
        except (OSError, ValueError):
            if folder.is_dir() and _is_latest(run_dir, folder):
                raise  # a damaged checkpoint, not a moving one
            tried.append(folder.name)
            continue
        return model, tokenizer, config, folder
    raise RunFolderError(f"--run {run_dir}: the checkpoint moved while it was read ({', '.join(tried)} pruned by "
                         "the live run each time); try again, or raise log.keep_last of that run")


def _is_latest(run_dir: Path, folder: Path) -> bool:
    try:
        return latest_checkpoint(run_dir) == folder
    except ValueError:
        return False


def _load_checkpoint(run_dir: Path, folder: Path, device: str, trust_code: bool) -> tuple[Any, Any, TrainConfig]:
    """Model, tokenizer and config of checkpoint ``folder``; a LoRA checkpoint holds only the adapter:
    the base comes from the run's ``initial/`` and the adapter is loaded into it."""
    from tracerl.testbed.loading import load_model
    from tracerl.runs.initial import initial_source
    from tracerl.train.loop import INITIAL

    config = read_run_config(folder / "config.yaml", trust_code=trust_code)
    policy = folder / "policy"
    if not policy.is_dir():  # else load_model would read the path as a hub name
        raise CheckpointError(f"{policy} is missing")
    source = initial_source(run_dir / INITIAL) if (policy / "adapter_config.json").is_file() else str(policy)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a stranger's mismatched folder: the one line below, not the load report
    try:
        model, tokenizer = load_model(source, device=device)
    except Exception as err:  # noqa: BLE001 - a stranger's folder fails in any way; memory errors excepted
        raise model_load_error(err, source, "evaluate another checkpoint or restore this one") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_tokenizer(tokenizer, source)
    if source != str(policy):  # a LoRA checkpoint: the adapter into the run's base
        from tracerl.models.lora import apply_lora

        lora = config.model.lora
        model = apply_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules)
        load_policy_into(model, folder)
    model.eval()
    return model, tokenizer, config


def eval_run(run_dir: str | Path, *, tasks_path: str | None = None, corpus_path: str | None = None,
             samples: int = 1, limit: int | None = None, out: str | None = None, temperature: float = 0.0,
             seed: int = 0, device: str = "cpu", show_progress: bool = False,
             trust_code: bool = False) -> dict[str, Any]:
    """Evaluate the latest checkpoint of ``run_dir`` (see the module docstring); returns the metrics
    plus ``checkpoint`` (the folder evaluated)."""
    from tracerl.agent.formats import get_format
    from tracerl.envs.verifiers import get_verifier
    from tracerl.models.backend import HFPolicy
    from tracerl.rollout.engine import RolloutEngine
    from tracerl.rollout.evaluate import evaluate_and_write

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if (tasks_path is None) != (corpus_path is None):
        raise ValueError("give both --tasks and --corpus, or neither (then the run's held-out data is used)")
    model, tokenizer, config, folder = load_run_policy(Path(run_dir), device, trust_code=trust_code)
    engine_config = replace(config.rollout.engine, temperature=temperature)
    tasks, env = _run_data(config, engine_config, tasks_path, corpus_path, tokenizer=tokenizer, run_dir=run_dir)
    fmt = get_format(config.model.format, tokenizer=tokenizer, system=config.model.system_prompt,
                     tool_list=config.model.tool_list)
    engine = RolloutEngine(HFPolicy(model, tokenizer), env, fmt, get_verifier(config.data.verifier), engine_config)
    metrics: dict[str, Any] = dict(evaluate_and_write(engine, tasks[:limit], samples, seed, device,
                                                      out=out, show_progress=show_progress))
    metrics["checkpoint"] = str(folder)
    return metrics


def _run_data(config: TrainConfig, engine_config: Any, tasks_path: str | None,
              corpus_path: str | None, *, tokenizer: Any = None,
              run_dir: str | Path = "") -> tuple[list[Any], Any]:
    """The tasks and environment to evaluate on: given files (refused when ``tokenizer`` cannot encode
    their answers, as training refuses them), or the run's held-out split."""
    if tasks_path is not None and corpus_path is not None:
        from tracerl.envs.coverage import check_eval_coverage
        from tracerl.envs.data import load_corpus, load_tasks
        from tracerl.train.data import run_environment

        tasks, documents = load_tasks(tasks_path), load_corpus(corpus_path)
        if tokenizer is not None:
            check_eval_coverage(tokenizer, tasks, documents, who=f"the model of run {run_dir}", tasks_path=tasks_path,
                                tiny=config.model.name_or_path == "tiny")
        return tasks, run_environment(documents, config.data, engine_config)
    from tracerl.train.data import load_task_data

    data = load_task_data(config.data, engine_config, config.seed)
    if not data.held_out:
        raise ValueError("the run's data has no held-out tasks (data.eval_tasks is empty); "
                         "give --tasks and --corpus")
    return data.held_out, data.environment
