"""A training run whose search hangs while holding the GIL: each call is killed at the timeout,
and the per-tool health check stops the run naming the tool (on main: no progress, no stop)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tracerl.envs.health import ToolHealthError
from tracerl.envs.isolation import shared_worker
from tracerl.config.schema import resolve_config
from tracerl.train.loop import Trainer

CHEAP = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
         "eval.size=2", "rollout.budget=4", "rollout.pool_size=2", "rollout.schemes.group_size=2",
         "rollout.engine.max_turns=3", "log.rollouts=false"]


def test_a_gil_holding_search_is_killed_per_call_and_stops_the_run(tmp_path: Path) -> None:
    from tracerl.testbed.tiny import load_or_pretrain
    from tracerl.testbed.tiny_config import get_preset

    load_or_pretrain(get_preset("smoke"))
    config = resolve_config("grpo", smoke="random", overrides=[
        *CHEAP, "steps=10", "data.environment=helpers_faults:hung_search_environment", "data.tool_timeout_s=0.5",
        "data.max_failed_tool_steps=2"])
    threads, started = threading.active_count(), shared_worker().started
    clock = time.monotonic()
    with Trainer(config, tmp_path) as trainer, \
            pytest.raises(ToolHealthError, match=r"tool 'search' failed every call in 2 consecutive steps .*"
                                                 r"timed out after 0\.5 s \(its worker process was killed\)"):
        trainer.run()
    assert trainer.step_index == 1  # step 2 stopped after its rollouts
    assert time.monotonic() - clock < 120  # a liveness bound: each hung call costs 0.5 s, not hours
    assert shared_worker().started - started >= 2  # killed workers were replaced
    assert threading.active_count() <= threads + 1
