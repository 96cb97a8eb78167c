"""One set of checks for a fresh run, shared by ``tracerl train`` and ``tracerl config show``.

``config show`` printing a config that ``train`` then refuses would make it a poor rehearsal,
so both call :func:`checked_config`: the resolved, validated config (field values, budgets,
device, model source) plus the checks of the data files a run would read (UTF-8, JSON,
fields, unique ids), all before any run folder exists. A resume skips this: it reloads the
run's own ``config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.config.checks import check_model_source
from tracerl.train.data import check_task_files
from tracerl.train.smoke import check_smoke_serves


def checked_config(preset: str, *, config_file: str | Path | None = None, overrides: list[str] | None = None,
                   smoke: bool | str = False) -> tuple[TrainConfig, list[str]]:
    """The resolved config of a fresh run and its notes (e.g. a model to be downloaded).

    Raises :class:`~tracerl.errors.UserError` (one line, naming the field or file:line) for
    anything ``tracerl train`` would refuse before it starts; ``smoke`` as in
    :func:`~tracerl.config.schema.resolve_config` (the pretrained smoke model must be able to serve the run).
    """
    config = resolve_config(preset, config_file=config_file, overrides=overrides, smoke=smoke)
    check_task_files(config.data)
    if smoke is True or smoke == "pretrained":
        check_smoke_serves(config)
    note = check_model_source(config.model.name_or_path)
    return config, [note] if note else []
