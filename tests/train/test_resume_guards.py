"""Exact resume of the state that only some runs have: evaluation sampled at ``temperature > 0``
(the engine's tree counter seeds its episodes) and the per-tool failure streaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tracerl.envs.health import ToolHealthError
from tracerl.rollout import executor as executor_module
from tracerl.runs import state as runstate_module
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import is_timing_key, read_metrics

CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=8", "rollout.pool_size=2", "rollout.engine.max_turns=3", "optim.lr=1e-3",
         "log.checkpoint_every=1"]


@pytest.fixture(autouse=True, scope="module")
def _pretrained() -> None:
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))


class SimulatedKill(BaseException):
    """Raised where a SIGKILL would have ended the process."""


def config(*extra: str) -> TrainConfig:
    return resolve_config("grpo", smoke="random", overrides=[*CHEAP, *extra])


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


def recording_evaluations(patch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record every evaluation's sampled turn texts (the metrics of the smoke model saturate)."""
    real, seen = executor_module.evaluate, []

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        report = real(*args, **kwargs)
        seen.append([turn["text"] for record in report.records for turn in record["turns"]])
        return report

    patch.setattr(executor_module, "evaluate", evaluate)
    return seen


def test_resume_with_sampled_evaluation_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """On main a resumed evaluation restarted the tree counter at 0: its episodes were other draws
    (the ids of the first evaluation, whose seeds differ from those of the uninterrupted run)."""
    extra = ("steps=3", "eval.every=1", "eval.size=4", "eval.temperature=1.0")
    with pytest.MonkeyPatch.context() as patch, Trainer(config(*extra), tmp_path / "straight") as straight:
        straight_evals = recording_evaluations(patch)
        straight.run()
        assert straight.executor.eval_engine.trees_started == 3 * 4  # 3 evaluations of 4 trees
    run_killed_at(config(*extra), tmp_path / "killed", 3)  # steps 1-3 evaluated, killed before ckpt 3
    with pytest.MonkeyPatch.context() as patch, Trainer(config(*extra), tmp_path / "killed", resume=True) as resumed:
        resumed_evals = recording_evaluations(patch)
        assert resumed.executor.eval_engine.trees_started == 2 * 4  # restored from ckpt-000002
        resumed.run()
    assert len(resumed_evals) == 1 and resumed_evals[0] == straight_evals[-1]  # step 3's evaluation, redone
    assert comparable(read_metrics(tmp_path / "killed")) == comparable(read_metrics(tmp_path / "straight"))


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
