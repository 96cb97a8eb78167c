"""Demonstration episodes in the tiny model's pretraining data (ExplorerConfig.guided)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tracerl.agent.formats import get_format
from tracerl.envs.synthwiki import build_world
from tracerl.envs.verifiers import exact_match
from tracerl.testbed.tiny_config import PRESETS, SMOKE_WORLD, TinyModelConfig
from tracerl.testbed.tiny_data import ExplorerConfig, WorldTools, demonstrate, explore


@pytest.fixture(scope="module")
def world_tools() -> WorldTools:
    world = build_world(replace(SMOKE_WORLD, max_hops=3, num_train=12, num_test=0))
    return WorldTools(world, ExplorerConfig(top_k=2), max_turns=8)


def test_demonstration_searches_the_chain_then_answers_gold(world_tools: WorldTools) -> None:
    fmt = get_format("react")
    for task in world_tools.world.train:
        pieces = demonstrate(task, world_tools, fmt)
        actions = [text for text, is_assistant in pieces if is_assistant]
        assert len(actions) == task.hops + 1  # one search per hop, then the answer
        for title, action in zip(task.supporting_titles, actions[:-1], strict=True):  # then the answer
            assert f"search[{title}]" in action
        answer = actions[-1].split("answer[", 1)[1].split("]", 1)[0]
        assert exact_match(answer, task) == 1.0


def test_guided_share_switches_between_demonstrations_and_exploration(world_tools: WorldTools) -> None:
    fmt = get_format("react")
    tasks = world_tools.world.train
    always = ExplorerConfig(top_k=2, guided=1.0)
    assert all(explore(t, world_tools, fmt, random.Random(0), always) == demonstrate(t, world_tools, fmt) for t in tasks)
    # guided = 0 draws exactly as before the option existed: same episodes as the default explorer
    plain = [explore(t, world_tools, fmt, random.Random(1), ExplorerConfig(top_k=2)) for t in tasks]
    zero = [explore(t, world_tools, fmt, random.Random(1), ExplorerConfig(top_k=2, guided=0.0)) for t in tasks]
    assert plain == zero


def test_guided_enters_the_cache_key_only_when_set() -> None:
    base = PRESETS["bench"]
    guided = replace(base, explorer=replace(base.explorer, guided=0.2))
    assert guided.hash() != base.hash()
    assert replace(base, explorer=replace(base.explorer, guided=0.0)).hash() == base.hash()
    with pytest.raises(ValueError, match="guided"):
        TinyModelConfig(explorer=ExplorerConfig(guided=1.5))


# --- hop-aware search counts (ExplorerConfig.hop_aware) ---------------------------------------


def _searches(pieces: list[tuple[str, bool]]) -> int:
    return sum(1 for text, is_assistant in pieces if is_assistant and "answer[" not in text)


def test_hop_aware_explorer_searches_once_per_hop(world_tools: WorldTools) -> None:
    fmt = get_format("react")
    always = ExplorerConfig(top_k=2, hop_aware=1.0)
    rng = random.Random(3)
    tasks = world_tools.world.train
    assert {t.hops for t in tasks} == {1, 2, 3}
    for task in tasks:
        pieces = explore(task, world_tools, fmt, rng, always)
        assert _searches(pieces) == task.hops


def test_hop_aware_zero_draws_as_before_and_keeps_the_cache_key(world_tools: WorldTools) -> None:
    fmt = get_format("react")
    tasks = world_tools.world.train
    plain = [explore(t, world_tools, fmt, random.Random(5), ExplorerConfig(top_k=2)) for t in tasks]
    zero = [explore(t, world_tools, fmt, random.Random(5), ExplorerConfig(top_k=2, hop_aware=0.0)) for t in tasks]
    assert plain == zero
    # question-agnostic counts: over many draws some episode's count differs from its hop count
    rng = random.Random(6)
    counts = [(_searches(explore(t, world_tools, fmt, rng, ExplorerConfig(top_k=2))), t.hops) for t in tasks * 5]
    assert any(n != h for n, h in counts)
    base = PRESETS["bench"]
    assert replace(base, explorer=replace(base.explorer, hop_aware=0.0)).hash() == base.hash()
    assert PRESETS["bench_hops"].hash() != base.hash()
    with pytest.raises(ValueError, match="hop_aware"):
        TinyModelConfig(explorer=ExplorerConfig(hop_aware=-0.1))
