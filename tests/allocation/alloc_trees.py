"""Hand-built rollout trees for predictor tests (readable turns, known outcomes)."""

from __future__ import annotations

import random

from tracerl.core.types import Action, RolloutTree, Trajectory, Turn


def tool_turn(observation: str = "Doc: a fact.", error: bool = False) -> Turn:
    action = Action(kind="tool", name="search", arguments={"query": "x"})
    return Turn([5, 6], [7, 8], "Action: search[x]\nObservation:", action, observation=observation, tool_error=error)


def invalid_turn() -> Turn:
    action = Action(kind="invalid", error="no action found")
    return Turn([9], [10], "hmm", action, observation="no action found", tool_error=True)


def answer_turn(answer: str = "x") -> Turn:
    return Turn([11], [], f"Action: answer[{answer}]", Action(kind="answer", answer=answer))


def add_chain(tree: RolloutTree, parent: int, turns: list[Turn], reward: float, **traj: object) -> int:
    """Append ``turns`` below ``parent`` and finish them as a leaf; returns the leaf id."""
    prefix = [tree.nodes[n].turn for n in tree.path(parent)[1:]]
    node = parent
    for turn in turns:
        node = tree.add_child(node, turn)
    trajectory = Trajectory(
        task_id=tree.task_id, group_id=tree.tree_id, prompt_ids=list(tree.prompt_ids),
        turns=prefix + turns, reward=reward, **traj,  # type: ignore[arg-type]
    )
    tree.add_leaf(node, trajectory)
    return node


def toy_step(rng: random.Random, step: int, trees: int = 8, chains: int = 4) -> list[RolloutTree]:
    """A step of fresh prompts whose chains succeed exactly when no tool call failed.

    The signal is task-agnostic and visible in the history (the errors feature), so a working
    predictor must learn it on earlier prompts and rank the unseen ones correctly.
    """
    out = []
    for i in range(trees):
        tree = RolloutTree(f"s{step}-t{i}", f"task-{step}-{i}", prompt_ids=[1] * rng.randint(5, 15))
        for _ in range(chains):
            errors = [rng.random() < 0.3 for _ in range(rng.randint(1, 3))]
            turns = [tool_turn(f"Doc{rng.randint(0, 9)}: fact.", e) for e in errors] + [answer_turn()]
            add_chain(tree, 0, turns, 0.0 if any(errors) else 1.0)
        out.append(tree)
    return out
