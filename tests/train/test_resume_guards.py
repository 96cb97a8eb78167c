"""Exact resume of the state that only some runs have: evaluation sampled at ``temperature > 0``
(the engine's tree counter seeds its episodes) and the per-tool failure streaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracerl.envs.health import ToolHealthError
from tracerl.train import runstate as runstate_module
from tracerl.train.config import TrainConfig, resolve_config
from tracerl.train.loop import Trainer
from tracerl.train.metrics import is_timing_key, read_metrics

CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3", "optim.lr=1e-3",
         "log.checkpoint_every=1"]


@pytest.fixture(autouse=True, scope="module")
def _pretrained() -> None:
    from tracerl.models.tiny import load_or_pretrain
    from tracerl.models.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))


class SimulatedKill(BaseException):
    """Raised where a SIGKILL would have ended the process."""


def config(*extra: str) -> TrainConfig:
    return resolve_config("grpo", smoke=True, overrides=[*CHEAP, *extra])


def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in records]


def run_killed_at(cfg: TrainConfig, run_dir: Path, step: int) -> None:
    """Train until checkpoint ``step`` is about to be written, and die there."""
    real = runstate_module.save_checkpoint

    def save(folder: Path, at: int, *args: Any) -> Path:
        if at == step:
            raise SimulatedKill(f"killed before checkpoint {at}")
        return real(folder, at, *args)

    trainer = Trainer(cfg, run_dir)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SimulatedKill):
        patch.setattr(runstate_module, "save_checkpoint", save)
        trainer.run()
    trainer.close()


def test_resume_with_sampled_evaluation_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """On main a resumed evaluation restarted the tree counter at 0: its episodes were other draws.

    Six evaluations of 4 questions each at temperature 1.5: a restarted counter reuses the ids (and
    seeds) of the first evaluations, so the evaluations after the resume differ."""
    extra = ("steps=3", "eval.every=1", "eval.size=4", "eval.temperature=1.5", "eval.at_start=true")
    with Trainer(config(*extra), tmp_path / "straight") as straight:
        straight.run()
        assert straight.eval_engine.trees_started == 4 * 4  # at start + 3 steps, 4 trees each
    run_killed_at(config(*extra), tmp_path / "killed", 3)
    with Trainer(config(*extra), tmp_path / "killed", resume=True) as resumed:
        assert resumed.eval_engine.trees_started == 3 * 4  # restored from ckpt-000002
        resumed.run()
    straight_records, resumed_records = (comparable(read_metrics(tmp_path / d)) for d in ("straight", "killed"))
    assert [r["step"] for r in resumed_records] == [0, 1, 2, 3]
    assert resumed_records == straight_records


def test_resume_keeps_the_tool_failure_streak(tmp_path: Path) -> None:
    """A dead search stops the run at step 3 (max_failed_tool_steps=3); killed before checkpoint 2 and
    resumed from checkpoint 1 (streak 1), the run still stops at step 3. On main the streak restarted
    at 0 and the resumed run trained to step 4 before stopping."""
    extra = ("steps=10", "data.environment=helpers_faults:dead_search_environment", "data.max_failed_tool_steps=3")
    with Trainer(config(*extra), tmp_path / "straight") as straight, \
            pytest.raises(ToolHealthError, match="tool 'search' failed every call in 3 consecutive steps"):
        straight.run()
    run_killed_at(config(*extra), tmp_path / "killed", 2)
    with Trainer(config(*extra), tmp_path / "killed", resume=True) as resumed, \
            pytest.raises(ToolHealthError, match="tool 'search' failed every call in 3 consecutive steps"):
        assert resumed.tool_health.streaks["search"] == 1
        resumed.run()
    assert resumed.step_index == straight.step_index == 2  # step 3 stopped after its rollouts, before its update
    resumed_records = comparable(read_metrics(tmp_path / "killed"))
    assert [r["step"] for r in resumed_records] == [1, 2]
    assert resumed_records == comparable(read_metrics(tmp_path / "straight"))
