"""Accuracy per hop count (``em_hops{k}``): hand-made records and a scripted policy."""

from __future__ import annotations

import pytest
from helpers_tiny import ScriptedPolicy, bpe_tokenizer

from tracerl.agent.formats import get_format
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world
from tracerl.envs.verifiers import exact_match
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.evaluate import em_by_hops, evaluate

WORLD = WorldConfig(num_people=20, num_cities=10, num_countries=4, num_books=10, num_bands=6,
                    num_companies=8, num_train=6, num_test=0, max_hops=3)


def test_em_by_hops_groups_by_hop_count_and_skips_unknown() -> None:
    records = [{"hops": 1, "em": 1.0}, {"hops": 1, "em": 0.0}, {"hops": 3, "em": 0.0},
               {"hops": 2, "em": 1.0}, {"hops": None, "em": 1.0}, {"em": 1.0}]
    assert em_by_hops(records) == {1: 0.5, 2: 1.0, 3: 0.0}
    assert list(em_by_hops(records)) == [1, 2, 3]  # increasing hop order
    assert em_by_hops([{"hops": None, "em": 1.0}]) == {}


def test_scripted_policy_right_on_one_hop_only(tmp_path) -> None:
    """Gold on one-hop questions, a wrong name otherwise: em_hops1 = 1, em_hops2 = em_hops3 = 0."""
    world = build_world(WORLD)
    hops = {t.question: t.hops for t in world.train}
    assert sorted(hops.values()) == [1, 1, 2, 2, 3, 3]  # the world cycles hop counts 1..3
    gold = {t.question: t.gold for t in world.train}

    def respond(prefix: str) -> str:
        q = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        return f"Action: answer[{gold[q] if hops[q] == 1 else 'Nobody'}]"

    tok = bpe_tokenizer()
    env = ToolEnvironment(search_tools(SearchIndex(world.documents, cache_dir=tmp_path), top_k=1),
                          EnvConfig(max_turns=2))
    engine = RolloutEngine(ScriptedPolicy(tok, respond), env, get_format("react"), exact_match,
                           EngineConfig(max_turns=2, max_turn_tokens=64, max_total_tokens=600))
    report = evaluate(engine, world.train, samples=2)
    assert report.metrics["em"] == pytest.approx(2 / 6)
    assert report.metrics["em_hops1"] == 1.0
    assert report.metrics["em_hops2"] == 0.0 and report.metrics["em_hops3"] == 0.0
    assert [r["hops"] for r in report.records] == [hops[r["question"]] for r in report.records]
