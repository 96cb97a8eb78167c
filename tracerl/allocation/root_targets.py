"""The root target from the root rollouts alone (``predictor.root_targets = 'stage1'``).

The spec's visit-weighted backup gives the root the mean reward of *every* leaf of the tree,
stage-2 continuations included. Those continuations branch from anchors the allocator chose
because it expected them to flip an outcome, so a prompt's backed-up root value is not an
unbiased sample of its success rate ``v(x)``; the root rollouts are (each one is sampled from the
prompt alone). Stage 1 plans on ``v(x)``, so its targets can come from those rollouts only.
"""

from __future__ import annotations

from tracerl.core.types import RolloutTree


def root_rollout_rewards(tree: RolloutTree) -> list[float]:
    """Rewards of the rollouts that started at the root (stage 1 and root top-ups), in order.

    Each root child starts one such rollout; its own leaf is the one reached by following the
    first child down (branches added later are appended after it). Infra-failed leaves, and a
    child whose rollout left no leaf, are skipped.
    """
    out = []
    for child in tree.root.children:
        node = tree.nodes[child]
        while not node.is_leaf and node.children:
            node = tree.nodes[node.children[0]]
        traj = tree.trajectories.get(node.id)
        if node.is_leaf and not (traj is not None and traj.infra_failed):
            out.append(float(node.reward))  # type: ignore[arg-type]
    return out
