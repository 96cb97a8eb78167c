"""A run's config.yaml stays loadable on any machine; the device is checked where a run starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracerl.config.schema import config_from_yaml, config_to_yaml, resolve_config
from tracerl.config.loading import ConfigError
from tracerl.train.loop import Trainer
from tracerl.train.run import resume_training


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
def test_a_cuda_run_config_loads_here_and_resumes_on_the_device_given(tmp_path: Path) -> None:
    config = resolve_config("grpo", smoke="random", overrides=["steps=1", "data.verifier=answered"])
    with Trainer(config, tmp_path / "run") as trainer:
        trainer.run(1)
    ckpt_config = tmp_path / "run" / "ckpt-000001" / "config.yaml"
    elsewhere = config_from_yaml(ckpt_config.read_text().replace("device: cpu", "device: cuda:3"))
    assert elsewhere.model.device == "cuda:3"  # eval/plot on another machine can read it
    ckpt_config.write_text(config_to_yaml(elsewhere))
    with pytest.raises(ConfigError, match="model.device = 'cuda:3'"):
        resume_training(tmp_path / "run", steps=2)  # checked before the folder is touched
    records = resume_training(tmp_path / "run", steps=2, device="cpu")()
    assert [r["step"] for r in records] == [2]
