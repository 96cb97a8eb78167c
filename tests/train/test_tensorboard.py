"""TensorBoard logging (extra ``tracerl[tensorboard]``): tags grouped under train/, eval/, time/
and the config as hparams. Skipped when tensorboard is missing (the default environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.extras
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from tracerl.config.schema import TrainConfig  # noqa: E402
from tracerl.runs.metrics import MetricsLog  # noqa: E402


def test_tags_are_grouped_and_hparams_written(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=True, config=TrainConfig())
    log.write({"step": 1, "loss": 0.5, "time_rollout": 2.0, "eval_accuracy": 0.25})
    log.write({"step": 2, "loss": 0.25, "time_rollout": 1.0})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "time/rollout", "eval/accuracy"} <= set(scalars)
    assert [e.value for e in events.Scalars("train/loss")] == [0.5, 0.25]
    plugins = events.PluginTagToContent("hparams")
    assert plugins  # the hparams session summary is there
