"""Real trees of the ``grpo`` and ``trace`` presets on the tiny model: one training step with tool
calls run serially (``rollout.engine.tool_concurrency=0``, the path before issue 46) and
concurrently (the default) writes the same rollout records, byte for byte after decompression."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer

CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "eval.every=0", "eval.size=2",
         "rollout.budget=8", "rollout.pool_size=4", "rollout.schemes.group_size=2",
         "rollout.engine.max_turns=3", "log.rollouts=true", "steps=1",
         "data.environment=helpers_slow_env:jittered_search_environment"]


def _records(preset: str, folder: Path, concurrency: int) -> bytes:
    config = resolve_config(preset, smoke="random", overrides=[*CHEAP, f"rollout.engine.tool_concurrency={concurrency}"])
    with Trainer(config, folder) as trainer:
        trainer.run()
    return gzip.decompress((folder / "rollouts" / "step-000001.jsonl.gz").read_bytes())


@pytest.mark.parametrize("preset", ["grpo", "trace"])
def test_a_training_step_builds_the_same_trees_with_concurrent_tools(tmp_path: Path, preset: str) -> None:
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))
    serial = _records(preset, tmp_path / "serial", 0)
    concurrent = _records(preset, tmp_path / "concurrent", 16)
    assert serial.count(b'"tree_id"') >= 2 and serial.count(b'"action":"tool"') >= 4  # real trees with tool calls
    assert concurrent == serial
