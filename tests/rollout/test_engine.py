"""Rollout engine: real environment (SynthWiki + bm25 search), random and scripted policies."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import ScriptedPolicy, assert_old_logprobs_recompute, tiny_model

from tracerl.agent.formats import get_format
from tracerl.core.types import RolloutTree
from tracerl.envs.base import EnvConfig, Observation, ToolEnvironment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import HFPolicy
from tracerl.core.protocol import RolloutCost
from tracerl.rollout.engine import EngineConfig, RolloutEngine

FMT = get_format("react")
@pytest.fixture(scope="module")
def policy(tok) -> HFPolicy:
    return HFPolicy(tiny_model(len(tok), seed=4), tok)


def _engine(backend, env, **overrides) -> RolloutEngine:
    turn_tokens = 16 if isinstance(backend, HFPolicy) else 96  # scripted replies are long
    cfg = dict(max_turns=3, max_turn_tokens=turn_tokens, max_total_tokens=400, temperature=1.0)
    cfg.update(overrides)
    return RolloutEngine(backend, env, FMT, exact_match, EngineConfig(**cfg))


def _question(prefix: str) -> str:
    return prefix.split("Question: ", 1)[1].split("\n", 1)[0]


def _new_assistant_tokens(tree: RolloutTree, first_new_node: int) -> int:
    return sum(len(n.turn.assistant_ids) for n in tree.nodes[first_new_node:] if n.turn is not None)


# --- random HF model, end to end -------------------------------------------------------------


def test_random_model_end_to_end(policy, env, world, tok) -> None:
    engine = _engine(policy, env)
    tasks = world.train[:2]
    trees, cost = engine.rollout(tasks, [3, 2], generator=torch.Generator().manual_seed(0))
    assert [t.task_id for t in trees] == [t.id for t in tasks]
    assert [len(t.leaves()) for t in trees] == [3, 2]
    assert cost.rollouts == 5
    assert cost.generated_tokens == sum(_new_assistant_tokens(t, 1) for t in trees)
    for tree, task in zip(trees, tasks, strict=True):
        assert tree.prompt_ids == tok.encode(FMT.render_prompt(task, env.tools))
        for leaf, traj in tree.trajectories.items():
            assert traj.group_id == tree.tree_id and traj.node_path == tree.path(leaf)
            assert traj.token_ids == tree.prefix_ids(leaf)
            assert 1 <= len(traj.turns) <= 3 and len(traj.token_ids) <= 400
            assert traj.reward == 0.0  # garbage never answers correctly
            for turn in traj.turns:
                assert turn.text == tok.decode(turn.assistant_ids, skip_special_tokens=True)
                if turn.is_transition:  # forced: what the turn left of "\nObservation:", then the observation
                    forced = tok.decode(turn.observation_ids)
                    rendered = FMT.render_observation(
                        Observation(turn.observation, done=False, error=turn.tool_error,
                                    valid_actions=(("search", "query"), ("open", "title"))))
                    if "Observation:" in turn.text:  # the turn stopped on the marker itself
                        assert forced == rendered
                    else:  # it stopped on "]" or the cap: the marker is forced
                        assert (turn.text + forced).endswith("\nObservation:" + rendered)
                        assert 0 < len(forced) - len(rendered) <= len("\nObservation:")


def test_old_logprobs_match_a_forward_over_the_trajectory(policy, env, world) -> None:
    engine = _engine(policy, env, temperature=0.8, max_turns=2)
    trees, _ = engine.rollout(world.train[:2], [2, 1], generator=torch.Generator().manual_seed(1))
    for traj in (t for tree in trees for t in tree.trajectories.values()):
        assert_old_logprobs_recompute(policy.model, traj, 0.8, unsampled_zero=True)


def test_same_seed_same_trees(policy, env, world) -> None:
    def run() -> list[list[int]]:
        trees, _ = _engine(policy, env).rollout(world.train[:2], [2, 2], generator=torch.Generator().manual_seed(7))
        return [tr.token_ids for t in trees for tr in t.trajectories.values()]

    assert run() == run()


def test_branching_reproduces_the_stored_prefix(policy, env, world) -> None:
    engine = _engine(policy, env)
    gen = torch.Generator().manual_seed(2)
    (tree,), _ = engine.rollout(world.train[:1], [2], generator=gen)
    anchor = next(n.id for n in tree.nodes if n.depth == 1 and engine.can_expand(tree, n.id))
    prefix, path = tree.prefix_ids(anchor), tree.path(anchor)
    stored_turns = [tree.nodes[i].turn for i in path[1:]]
    first_new = len(tree.nodes)
    cost = engine.expand([(tree, anchor, 3), (tree, 0, 1)], generator=gen)
    new_leaves = [leaf for leaf in tree.leaves() if leaf >= first_new]
    assert len(new_leaves) == 4 and len(tree.leaves()) == 6
    assert cost == RolloutCost(rollouts=4, generated_tokens=_new_assistant_tokens(tree, first_new))
    branched = [tree.trajectories[leaf] for leaf in new_leaves if path[1] in tree.path(leaf)]
    assert len(branched) == 3
    for traj in branched:
        assert traj.token_ids[: len(prefix)] == prefix
        assert traj.node_path[: len(path)] == path
        assert traj.turns[: len(stored_turns)] == stored_turns
        stored_mask = [False] * len(tree.prompt_ids)
        for turn in stored_turns:
            stored_mask += [True] * len(turn.assistant_ids) + [False] * len(turn.observation_ids)
        assert traj.sampled[: len(prefix)] == stored_mask
        assert traj.token_ids == tree.prefix_ids(traj.node_path[-1])
    assert len(tree.nodes[anchor].children) == 4  # the original child plus three branches


def test_expand_rejects_non_boundaries(policy, env, world) -> None:
    engine = _engine(policy, env, max_turns=1)
    (tree,), _ = engine.rollout(world.train[:1], [1])
    leaf = tree.leaves()[0]
    with pytest.raises(ValueError, match="no turns remain"):
        engine.expand([(tree, leaf, 1)])  # max_turns=1: the leaf ended on the turn limit
    with pytest.raises(ValueError, match="no node 99"):
        engine.expand([(tree, 99, 1)])
    with pytest.raises(ValueError, match="not produced by this engine"):
        engine.expand([(RolloutTree("x", "t", [1, 2]), 0, 1)])
    with pytest.raises(ValueError, match="not produced by this engine"):
        _engine(policy, env).expand([(tree, 0, 1)])
    with pytest.raises(ValueError, match=">= 0"):
        engine.expand([(tree, 0, -1)])
    assert engine.expand([(tree, 0, 0)]) == RolloutCost()


# --- scripted policy: exact actions through the real environment ------------------------------


def _oracle(world, wrong: bool = False, invalid_first: bool = False):
    gold = {t.question: t.gold for t in world.train}

    def respond(prefix: str) -> str:
        turn = prefix.count("Action:") + prefix.count("Nonsense")
        q = _question(prefix)
        if invalid_first and turn == 0:
            return "Nonsense without an action\nObservation:"
        if turn <= int(invalid_first):
            return f"Thought: look it up.\nAction: search[{q}]\nObservation:"
        return f"Action: answer[{'nobody' if wrong else gold[q]}]"

    return respond


def test_scripted_answers_get_verifier_rewards(env, world, tok) -> None:
    tasks = world.train[:3]
    right = ScriptedPolicy(tok, _oracle(world))
    trees, cost = _engine(right, env).rollout(tasks, [2, 2, 2])
    assert right.calls == [6, 6]  # every live episode advances in one batched call per turn
    for tree, task in zip(trees, tasks, strict=True):
        for traj in tree.trajectories.values():
            assert traj.reward == 1.0 and traj.answer == task.gold
            assert [t.action.kind for t in traj.turns] == ["tool", "answer"]
            assert traj.num_transitions == 1 and len(traj.boundaries) == 2
            # the answer turn ends at the bracket closing its action: no EOS is sampled after it
            assert tok.decode(traj.turns[-1].assistant_ids) == f"Action: answer[{task.gold}]"
            assert traj.turns[-1].observation_ids == []
            assert not tree.nodes[traj.node_path[-1]].is_boundary
    wrong_trees, _ = _engine(ScriptedPolicy(tok, _oracle(world, wrong=True)), env).rollout(tasks[:1], [2])
    assert [t.reward for t in wrong_trees[0].trajectories.values()] == [0.0, 0.0]
    engine = _engine(ScriptedPolicy(tok, _oracle(world)), env)
    trees, _ = engine.rollout(tasks[:1], [1])
    with pytest.raises(ValueError, match="not a boundary"):
        engine.expand([(trees[0], trees[0].leaves()[0], 1)])


def test_masks_cover_assistant_and_observation_text(env, world, tok) -> None:
    engine = _engine(ScriptedPolicy(tok, _oracle(world, invalid_first=True)), env)
    (tree,), _ = engine.rollout(world.train[:1], [1])
    traj = next(iter(tree.trajectories.values()))
    assert [t.action.kind for t in traj.turns] == ["invalid", "tool", "answer"]
    assert traj.turns[0].tool_error and not traj.turns[1].tool_error
    pieces: list[tuple[bool, str]] = []
    for sampled, token in zip(traj.sampled, traj.token_ids, strict=True):
        if pieces and pieces[-1][0] == sampled:
            pieces[-1] = (sampled, pieces[-1][1] + tok.decode([token]))
        else:
            pieces.append((sampled, tok.decode([token])))
    texts = [text for _, text in pieces]
    assert [s for s, _ in pieces] == [False, True, False, True, False, True]
    assert texts[1] == "Nonsense without an action\nObservation:"
    assert texts[2] == " Error: no action found. Valid actions: search[query], open[title], answer[text].\n"
    assert texts[3].startswith("Thought: look it up.\nAction: search[")
    assert texts[4] == FMT.render_observation(Observation(traj.turns[1].observation, False, False))
    assert texts[5] == f"Action: answer[{world.train[0].gold}]"
    assert traj.boundaries == [len(traj.prompt_ids), traj.turn_spans[1][0], traj.turn_spans[2][0]]


def test_limits_end_episodes_without_reward(env, world, tok) -> None:
    long_obs = _engine(ScriptedPolicy(tok, _oracle(world)), env, max_observation_tokens=12)
    (tree,), _ = long_obs.rollout(world.train[:1], [1])
    obs_ids = next(iter(tree.trajectories.values())).turns[0].observation_ids
    assert len(obs_ids) <= 12 and tok.decode(obs_ids).endswith("...\n")

    budget = _engine(ScriptedPolicy(tok, _oracle(world)), env, max_total_tokens=60)
    (tree,), cost = budget.rollout(world.train[:1], [2])
    for traj in tree.trajectories.values():
        assert len(traj.token_ids) <= 60
        assert traj.answer is None and traj.reward == 0.0 and not traj.infra_failed
        assert not budget.can_expand(tree, traj.node_path[-1])

    looping = ScriptedPolicy(tok, lambda prefix: "Action: search[Lumen]\nObservation:")
    (tree,), _ = _engine(looping, env, max_turns=2).rollout(world.train[:1], [1])
    traj = next(iter(tree.trajectories.values()))
    assert len(traj.turns) == 2 and traj.answer is None and traj.num_transitions == 2


def test_tool_crash_is_an_infra_failure(world, tok) -> None:
    def search(query: str) -> str:
        """Always broken."""
        raise RuntimeError("index offline")

    env = ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=4))
    engine = _engine(ScriptedPolicy(tok, lambda p: "Action: search[x]\nObservation:"), env)
    (tree,), cost = engine.rollout(world.train[:1], [2])
    for leaf, traj in tree.trajectories.items():
        assert traj.infra_failed and traj.reward == 0.0 and len(traj.turns) == 1
        assert not engine.can_expand(tree, leaf)
    assert cost.rollouts == 2


def test_rollout_argument_checks(env, world, tok) -> None:
    engine = _engine(ScriptedPolicy(tok, _oracle(world)), env)
    with pytest.raises(ValueError, match="n has"):
        engine.rollout(world.train[:2], [1])
    with pytest.raises(ValueError, match="tree_ids"):
        engine.rollout(world.train[:2], [1, 1], tree_ids=["a"])
    trees, _ = engine.rollout(world.train[:2], [1, 0], tree_ids=["a", "b"])
    assert [t.tree_id for t in trees] == ["a", "b"] and trees[1].leaves() == []
    with pytest.raises(ValueError, match="max_total_tokens"):
        _engine(ScriptedPolicy(tok, _oracle(world)), env, max_total_tokens=5).rollout(world.train[:1], [1])
    with pytest.raises(ValueError, match="max_turns"):
        EngineConfig(max_turns=0)
    with pytest.raises(ValueError, match="top_p"):
        EngineConfig(top_p=1.5)
    assert RolloutCost(1, 10) + RolloutCost(2, 5) == RolloutCost(3, 15)
