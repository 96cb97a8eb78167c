"""data.train_hops: training keeps the listed hop counts, the held-out and re-drawn splits keep every one."""

from __future__ import annotations

import pytest

from tracerl.config.schema import ConfigError, resolve_config
from tracerl.train.data import load_task_data


def test_train_hops_filters_training_questions_only() -> None:
    config = resolve_config("grpo_twohop", smoke="random")  # the smoke world: 1-2 hops
    data = load_task_data(config.data, config.rollout.engine, config.seed)
    everything = load_task_data(resolve_config("grpo", smoke="random").data, config.rollout.engine, config.seed)
    assert {t.hops for t in data.train} == {2}
    assert sorted(t.id for t in data.train) == sorted(t.id for t in everything.train if t.hops == 2)
    assert {t.hops for t in data.held_out} == {1, 2} and {t.hops for t in data.redrawn} == {1, 2}
    assert [t.id for t in data.held_out] == [t.id for t in everything.held_out]


@pytest.mark.parametrize("value", ["[3]", "[0]", "[true]"])
def test_train_hops_outside_the_world_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(ConfigError, match=r"data.train_hops must be a list of hop counts within .*\(1..2\)"):
        resolve_config("grpo", smoke="random", overrides=[f"data.train_hops={value}"])
