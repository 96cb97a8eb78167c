"""Builders for core tests: trajectories and rollout trees made directly, no model involved.

Turns are described by short labels. A label starting with ``"ans"`` is the final answer
turn (no observation); any other label is a tool turn whose observation ids are derived from
the label, so two turns with the same label reach the same state (GiGPO anchors) and two
paths sharing their first labels share tree nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracerl.core.types import Action, RolloutTree, Trajectory, Turn

PROMPT = [1, 2, 3]


def _label_ids(label: str, salt: int) -> list[int]:
    return [10 + (ord(c) * 7 + salt) % 90 for c in label]


def make_turn(label: str, n_assistant: int = 2, n_obs: int | None = None) -> Turn:
    """A tool turn (observation derived from the label) or, for ``ans*``, an answer turn."""
    if label.startswith("ans"):
        action = Action(kind="answer", answer=label)
        obs: list[int] = []
    else:
        action = Action(kind="tool", name="search", arguments={"query": label})
        obs = _label_ids(label, 3)
        if n_obs is not None:
            obs = (obs * (n_obs // max(len(obs), 1) + 1))[:n_obs]
    assistant = [100 + (len(label) + i) % 50 for i in range(n_assistant)]
    return Turn(
        assistant_ids=assistant,
        observation_ids=obs,
        text=label,
        action=action,
        observation=label if obs else "",
        logprobs=[-0.5] * n_assistant,
    )


def make_traj(
    labels: Sequence[str],
    reward: float,
    *,
    group: str = "g",
    infra_failed: bool = False,
    readiness: Sequence[float] | None = None,
    n_assistant: int | Sequence[int] = 2,
) -> Trajectory:
    """A chain trajectory (no tree) from turn labels."""
    sizes = [n_assistant] * len(labels) if isinstance(n_assistant, int) else list(n_assistant)
    return Trajectory(
        task_id=f"task-{group}",
        group_id=group,
        prompt_ids=list(PROMPT),
        turns=[make_turn(label, n) for label, n in zip(labels, sizes, strict=True)],
        reward=reward,
        infra_failed=infra_failed,
        readiness=list(readiness) if readiness is not None else None,
    )


def make_tree(
    tree_id: str,
    paths: Sequence[Sequence[str]],
    rewards: Sequence[float],
    *,
    group: str | None = None,
    infra_failed: Sequence[bool] | None = None,
    n_assistant: int = 2,
) -> tuple[RolloutTree, list[Trajectory]]:
    """A tree whose leaves are ``paths`` (shared label prefixes share nodes), one trajectory
    per path in the given order, added with ``add_leaf`` so ``node_path`` is set."""
    tree = RolloutTree(tree_id=tree_id, task_id=f"task-{tree_id}", prompt_ids=list(PROMPT))
    failed = list(infra_failed) if infra_failed is not None else [False] * len(paths)
    trajs = []
    for path, reward, bad in zip(paths, rewards, failed, strict=True):
        node = 0
        for label in path:
            match = [c for c in tree.nodes[node].children if tree.nodes[c].turn.text == label]  # type: ignore[union-attr]
            node = match[0] if match else tree.add_child(node, make_turn(label, n_assistant))
        turns = [tree.nodes[n].turn for n in tree.path(node)[1:]]
        traj = Trajectory(
            task_id=tree.task_id,
            group_id=group or tree_id,
            prompt_ids=list(PROMPT),
            turns=turns,  # type: ignore[arg-type]
            reward=reward,
            infra_failed=bad,
        )
        tree.add_leaf(node, traj)
        trajs.append(traj)
    return tree, trajs
