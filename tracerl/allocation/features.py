"""Task-agnostic features of a prefix history ``H`` for the shared success predictor.

Spec section 3 asks for a predictor that generalises to unseen prompts and prefixes, so the
features describe *how the episode is going*, never *which task it is*: the prompt's length
(the only generic trait of a fresh prompt ``H_0``; longer questions tend to need more hops), turn index, tool-call
count, whether the last action failed, distinct observations seen, the prompt's running success
rate when it has been seen before (a flag says whether it has), and the frozen reference's
readiness ``l_k`` and value ``V_k`` when TRACE credit computed them (a flag says whether present).
Optionally (``PredictorConfig.features``) the policy's own hidden state at the node, recorded by
the backend during the generation forward (:func:`node_state`), replaces or joins them.

Every feature is a plain Python float computed from the tree's stored turns, so nothing here can
carry a gradient back to the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tracerl.core.credit import log_ratio_values
from tracerl.core.types import Node, RolloutTree

FEATURE_NAMES: tuple[str, ...] = (
    "prompt_length",
    "depth",
    "tool_calls",
    "last_failed",
    "errors",
    "distinct_observations",
    "is_answer",
    "seen_before",
    "seen_success_rate",
    "seen_count",
    "readiness_present",
    "readiness",
    "readiness_value",
)
NUM_FEATURES = len(FEATURE_NAMES)

DEPTH_SCALE = 8.0
"""Depth is divided by this so features stay O(1) for typical max_turns (<= ~16)."""
PROMPT_SCALE = 4.0
"""``log1p(prompt tokens)`` is divided by this (about 3-6 for real prompts)."""
READINESS_SCALE = 10.0
"""``l_k`` is a mean log-prob (about -15..0 for the tiny model); dividing keeps it O(1)."""


@dataclass(frozen=True)
class PromptStats:
    """What the predictor remembers about one prompt from earlier steps."""

    successes: float
    count: int

    @property
    def rate(self) -> float:
        return self.successes / self.count


@dataclass
class _PathStats:
    tool_calls: int
    errors: int
    observations: frozenset[str]
    transitions: int


def _turn_failed(node: Node) -> bool:
    turn = node.turn
    return turn is not None and (turn.tool_error or turn.action.kind == "invalid")


def path_stats(tree: RolloutTree) -> list[_PathStats]:
    """Cumulative counts along the root path of every node, in one pass (parents come first)."""
    out: list[_PathStats] = []
    for node in tree.nodes:
        if node.parent is None or node.turn is None:
            out.append(_PathStats(0, 0, frozenset(), 0))
            continue
        parent = out[node.parent]
        turn = node.turn
        failed = _turn_failed(node)
        seen = parent.observations
        # Only successful observations count as evidence; error texts repeat and say nothing.
        if turn.is_transition and not failed and turn.observation:
            seen = seen | {turn.observation}
        out.append(
            _PathStats(
                tool_calls=parent.tool_calls + (turn.action.kind == "tool"),
                errors=parent.errors + failed,
                observations=seen,
                transitions=parent.transitions + turn.is_transition,
            )
        )
    return out


def _leaf_below(tree: RolloutTree, node_id: int) -> int | None:
    """Some finished leaf under ``node_id`` whose trajectory carries readiness scores."""
    stack = [node_id]
    while stack:
        nid = stack.pop()
        traj = tree.trajectories.get(nid)
        if traj is not None and traj.readiness is not None:
            return nid
        stack.extend(tree.nodes[nid].children)
    return None


def node_readiness(tree: RolloutTree, node_id: int, transitions: int, eps: float) -> tuple[float, float] | None:
    """``(l_k, V_k)`` at the latest boundary ``S_k`` at or before ``node_id``, if scored.

    Every leaf below a node shares its prefix, and the frozen reference is deterministic, so any
    scored leaf below gives the same ``l_0..l_k``. Roots return None on purpose: at stage 1 no
    trajectory exists yet, and a feature present only at training time would not transfer.
    """
    if tree.nodes[node_id].parent is None:
        return None
    leaf = _leaf_below(tree, node_id)
    if leaf is None:
        return None
    scores = tree.trajectories[leaf].readiness
    assert scores is not None
    if transitions >= len(scores):
        raise ValueError(
            f"tree {tree.tree_id!r} leaf {leaf}: readiness has {len(scores)} entries but the path "
            f"to node {node_id} already holds {transitions} transitions"
        )
    prefix = torch.tensor([float(x) for x in scores[: transitions + 1]], dtype=torch.float64)
    values = log_ratio_values(prefix, eps)  # validates: finite, <= 0, positive gaps
    return float(prefix[-1]), float(values[-1])


def node_features(
    tree: RolloutTree,
    node_id: int,
    stats: list[_PathStats],
    prompt: PromptStats | None,
    eps: float,
) -> list[float]:
    """The feature vector (see :data:`FEATURE_NAMES`) of one node, as plain floats."""
    node = tree.nodes[node_id]
    st = stats[node_id]
    ready = node_readiness(tree, node_id, st.transitions, eps)
    is_answer = node.turn is not None and node.turn.action.kind == "answer"
    return [
        math.log1p(len(tree.prompt_ids)) / PROMPT_SCALE,
        node.depth / DEPTH_SCALE,
        math.log1p(st.tool_calls),
        float(_turn_failed(node)),
        math.log1p(st.errors),
        math.log1p(len(st.observations)),
        float(is_answer),
        float(prompt is not None),
        prompt.rate if prompt is not None else 0.0,
        math.log1p(prompt.count) if prompt is not None else 0.0,
        float(ready is not None),
        ready[0] / READINESS_SCALE if ready is not None else 0.0,
        ready[1] if ready is not None else 0.0,
    ]


def node_state(tree: RolloutTree, node_id: int) -> list[float] | None:
    """The policy's recorded hidden state at ``node_id``, or at its nearest ancestor that has one.

    Every node a turn started from holds the state at its prefix's last token (see
    ``Node.hidden``); a leaf does not (no turn starts there), so it takes its parent's: the state
    its final turn was sampled from. None when no node on the path was recorded.
    """
    current: int | None = node_id
    while current is not None:
        node = tree.nodes[current]
        if node.hidden is not None:
            return node.hidden
        current = node.parent
    return None


def state_features(state: list[float] | None, dim: int) -> list[float]:
    """``[present, h_1..h_dim] / sqrt(dim)``: a flag and the scaled state (zeros when absent).

    Why the scale: a final-norm output has entries of order 1, so its norm grows as ``sqrt(dim)``
    (about 21 for the 128-wide tiny model) and would swamp the 13 O(1) features at initialisation;
    scaled, it starts on an equal footing and the predictor must earn every state direction it uses.
    """
    if state is None:
        return [0.0] * (dim + 1)
    if len(state) != dim:
        raise ValueError(f"a node's hidden state has {len(state)} entries, the predictor was built for {dim} "
                         "(states from another policy model?)")
    scale = 1.0 / math.sqrt(dim)
    return [1.0, *(float(x) * scale for x in state)]


def success_leaves_below(tree: RolloutTree) -> tuple[list[int], list[int]]:
    """Per node, the number of successful (r > 0.5) and failed finished leaves below it.

    Infrastructure failures are skipped, as in :meth:`RolloutTree.backup`. Used to score the
    predictor's AUC as "does the prefix's prediction rank the leaves' outcomes correctly".
    """
    wins = [0] * len(tree.nodes)
    losses = [0] * len(tree.nodes)
    for node in reversed(tree.nodes):
        if node.is_leaf:
            traj = tree.trajectories.get(node.id)
            if traj is not None and traj.infra_failed:
                continue
            if float(node.reward) > 0.5:  # type: ignore[arg-type]
                wins[node.id] += 1
            else:
                losses[node.id] += 1
        if node.parent is not None:
            wins[node.parent] += wins[node.id]
            losses[node.parent] += losses[node.id]
    return wins, losses
