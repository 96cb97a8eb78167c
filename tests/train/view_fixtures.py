"""Rollout records for the view tests: a hand-built branching tree with readable numbers, written
with the real trace_credit estimator's advantages."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator
from tracerl.core.types import Action, RolloutTree, Task, Trajectory, Turn
from tracerl.runs.rollout_log import RolloutLog

TASK = Task(id="t1", question="Where was Ada born?", answers=("Lumen",))


def _turn(kind: str, text: str, observation: str = "", n: int = 2) -> Turn:
    action = Action(kind="answer", answer=text) if kind == "answer" else Action(kind="tool", name="search")
    return Turn(assistant_ids=list(range(n)), observation_ids=[9] * (3 if observation else 0), text=text,
                action=action, observation=observation)


def branching_tree() -> tuple[RolloutTree, list[Trajectory]]:
    """Root -> search (node 1) -> two answers: 'Lumen' (node 2, reward 1) and 'Varo' (node 3, reward 0).

    Readiness: l_0 = -2.0 at the prompt, l_1 = -0.5 after the search (credit +1.5).
    """
    tree = RolloutTree(tree_id="t1@0", task_id="t1", prompt_ids=[1, 2, 3])
    search = tree.add_child(0, _turn("tool", "Action: search[Ada]", "Ada Stone was born in Lumen."))
    trajs = []
    for answer, reward in (("Lumen", 1.0), ("Varo", 0.0)):
        leaf = tree.add_child(search, _turn("answer", f"Action: answer[{answer}]"))
        traj = Trajectory(task_id="t1", group_id="t1", prompt_ids=[1, 2, 3],
                          turns=[tree.nodes[search].turn, tree.nodes[leaf].turn],  # type: ignore[list-item]
                          answer=answer, reward=reward, readiness=[-2.0, -0.5])
        tree.add_leaf(leaf, traj)
        trajs.append(traj)
    tree.nodes[0].readiness, tree.nodes[search].readiness = -2.0, -0.5
    return tree, trajs


class ConstantPredictor:
    """A stand-in with the predictor's public API: P(success) = 0.1 * (node id + 1)."""

    def predict_nodes(self, trees, node_ids):  # noqa: ANN001, ANN201
        return [0.1 * (n + 1) for n in node_ids]


OPTIONS = AdvantageOptions()  # log_ratio values, eps 0.1, K 3, g 0.8, kappa 2, w_out 1, w_turn 0.2
V1 = math.log(2.1 / 0.6)  # V_1 = log(d_0/d_1), d_k = -l_k + 0.1: d_0 = 2.1, d_1 = 0.6 (V_0 = 0)
# One transition (T = 1): c_0 = V_1 - V_0 + kappa * g^1 * A_out, A_out = +1 (win), -1 (loss)
# (rewards 1 and 0 in one group: mean 0.5, population std 0.5).
C_WIN, C_LOSS = V1 + 2.0 * 0.8, V1 - 2.0 * 0.8


def write_run(run_dir: Path, steps: int = 2, credit: AdvantageOptions | None = OPTIONS) -> None:
    """Steps of the branching tree, advantages from the real trace_credit estimator."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RolloutLog(run_dir, {"t1": TASK}, credit=credit)
    for step in range(1, steps + 1):
        tree, trajs = branching_tree()
        advantages = get_estimator("trace_credit")(AdvantageBatch(trajs, {tree.tree_id: tree}), OPTIONS)
        log.write(step, [tree], advantages, ConstantPredictor())
    lines = [{"step": s, "reward_mean": 0.5, "loss": 0.25 * s, "rollouts": 2} for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def wide_tree(index: int, answers: int = 6) -> tuple[RolloutTree, list[Trajectory]]:
    """Root -> search -> ``answers`` answer leaves, rewards alternating 0, 1, 0, ... (tree ``t1@index``)."""
    tree = RolloutTree(tree_id=f"t1@{index}", task_id="t1", prompt_ids=[1, 2, 3])
    search = tree.add_child(0, _turn("tool", "Action: search[Ada]", "Ada Stone was born in Lumen."))
    trajs = []
    for j in range(answers):
        leaf = tree.add_child(search, _turn("answer", f"Action: answer[{j}]"))
        traj = Trajectory(task_id="t1", group_id="t1", prompt_ids=[1, 2, 3],
                          turns=[tree.nodes[search].turn, tree.nodes[leaf].turn],  # type: ignore[list-item]
                          answer=str(j), reward=float(j % 2), readiness=[-2.0, -0.5])
        tree.add_leaf(leaf, traj)
        trajs.append(traj)
    return tree, trajs
