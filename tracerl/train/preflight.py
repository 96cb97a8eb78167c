"""One set of checks for a fresh run, shared by ``tracerl train``, ``tracerl config show`` and ``trainer()``.

``config show`` printing a config that ``train`` then refuses would make it a poor rehearsal,
so both call :func:`checked_config`: the resolved, validated config (field values, budgets,
device, model source) plus the checks of the data files a run would read (UTF-8, JSON,
fields, unique ids), all before any run folder exists and before any model is built or
pretrained: own data must fit the embedded tiny model's tokenizer (it would otherwise be
pretrained for minutes first), and the corpus must hold the answers of the tasks
(``data.min_reachability``). A resume skips this: it reloads the run's own ``config.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.config.checks import check_model_source, check_wandb
from tracerl.core.types import Task
from tracerl.envs.data import Document
from tracerl.envs.health import check_reachability
from tracerl.errors import UserError
from tracerl.train.data import _read_files
from tracerl.train.smoke import check_smoke_serves

REACHABILITY_SAMPLE = 200
"""Tasks of ``data.tasks`` (the first ones) the reachability check runs the oracle on."""


def checked_config(preset: str, *, config_file: str | Path | None = None, overrides: list[str] | None = None,
                   smoke: bool | str = False) -> tuple[TrainConfig, list[str]]:
    """The resolved config of a fresh run and its notes (e.g. a model to be downloaded).

    Raises :class:`~tracerl.errors.UserError` (one line, naming the field or file:line) for
    anything ``tracerl train`` would refuse before it starts; ``smoke`` as in
    :func:`~tracerl.config.schema.resolve_config` (the pretrained smoke model must be able to serve the run).
    """
    config = resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)
    check_wandb(config)  # a missing W&B key fails here in one line, not in wandb.init after the folder exists
    notes: list[str] = []
    smoke_model = smoke is True or smoke == "pretrained"
    if config.data.source == "files":
        tasks, held_out, documents = _read_files(config.data)
        if not smoke_model:  # --smoke checks its model's coverage below, naming --smoke-random
            check_tiny_coverage(config, tasks + held_out, documents)
    if smoke_model:
        check_smoke_serves(config)
    if config.data.source == "files":
        notes += check_data_reachability(config)
    note = check_model_source(config.model.name_or_path)
    return config, notes + ([note] if note else [])


def check_tiny_coverage(config: TrainConfig, tasks: list[Task], documents: list[Document]) -> None:
    """Own data with the embedded ``tiny`` model: its word-level tokenizer must encode the gold
    answers, checked on the tokenizer alone before the model is pretrained (minutes the first time)."""
    if config.model.name_or_path != "tiny":
        return  # a real checkpoint is checked when it is loaded (random-tiny's vocabulary is built from the data)
    from tracerl.envs.coverage import check_tokenizer_coverage

    try:
        check_tokenizer_coverage(tiny_tokenizer(config.model.tiny_preset), tasks, documents, seed=config.seed)
    except UserError as err:
        # what to do first: the CLI cuts a long line at 400 characters
        raise UserError("model.name_or_path = 'tiny' (the embedded model, built for SynthWiki) cannot read this data "
                        "(nothing was pretrained); set model.name_or_path to a model folder whose tokenizer covers it "
                        f"(a byte-level BPE model, as in docs/own-data.md): {err}") from None


def tiny_tokenizer(preset: str) -> Any:
    """The tokenizer of the embedded tiny preset: the shipped (or cached) model's, else built as
    pretraining builds it."""
    from transformers import AutoTokenizer

    from tracerl.testbed.tiny import existing_folder, tokenizer_for_world
    from tracerl.testbed.tiny_config import get_preset

    folder = existing_folder(get_preset(preset))
    if folder is not None:
        return AutoTokenizer.from_pretrained(str(folder))
    return tokenizer_for_world(get_preset(preset).world)


def check_data_reachability(config: TrainConfig) -> list[str]:
    """Refuse (one line) a task file whose answers its corpus does not hold (``data.min_reachability``);
    returns a note when the check cannot judge the sample (tasks citing no supporting documents)."""
    data = config.data
    if data.min_reachability == 0 or data.environment != "search":
        return []
    from tracerl.rollout.env_check import run_env_check

    summary = run_env_check(data.tasks, data.corpus, limit=REACHABILITY_SAMPLE, top_k=data.search_top_k,
                            tool_timeout_s=data.tool_timeout_s)
    if summary["tasks_without_supporting_refs"]:
        return [f"data.min_reachability not checked: {summary['tasks_without_supporting_refs']} of the first "
                f"{summary['tasks']} tasks in {data.tasks} cite no supporting_ids or supporting_titles"]
    check_reachability(summary["answer_reachability"], data.min_reachability, summary["tasks"],
                       f"tasks {data.tasks} over corpus {data.corpus}",
                       "set data.min_reachability=0 to train anyway")
    return []
