"""tracerl rollout trees as verl rows, and verl rows back as tracerl trajectories.

A verl row is one leaf: ``prompts`` (the prompt ids) and ``responses`` ``[B, W]`` (every token
after the prompt: assistant turns and forced observations), ``response_mask`` ``[B, W]`` (1 on
sampled tokens) and ``token_level_rewards`` ``[B, W]``. The tree fields ride in verl's
``non_tensor_batch`` (numpy object arrays of length B), under :data:`TREE_FIELDS`:

* ``tracerl_tree_id`` (str): the rollout tree, also the estimator's group;
* ``tracerl_node_path`` (list[int]): tree node ids from the root to the leaf;
* ``tracerl_turn_spans`` (list[[start, end]]): each turn's assistant tokens in response
  coordinates;
* ``tracerl_readiness`` (list[float] | None): the reference readiness ``l_0..l_T``;
* ``tracerl_reward`` (float): the verifier's reward (not verl's ``token_level_rewards``, which
  may carry a KL penalty);
* ``tracerl_infra_failed`` (bool): the leaf failed for infrastructure reasons.

The estimators need only lengths, rewards, readiness and the tree's shape, so
:func:`batch_from_fields` rebuilds trajectories with placeholder token ids. The tree is rebuilt
from the node paths of its leaves in the batch: every leaf of a tree must be in the batch
(infra-failed ones included), else a branch would look like a chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tracerl.core.advantages import AdvantageBatch
from tracerl.core.types import Action, Node, RolloutTree, Trajectory, Turn

TREE_FIELDS = (
    "tracerl_tree_id",
    "tracerl_node_path",
    "tracerl_turn_spans",
    "tracerl_readiness",
    "tracerl_reward",
    "tracerl_infra_failed",
)


@dataclass
class VerlRows:
    """Leaves as verl's padded tensors (``prompts`` left-padded ``[B, P]``, the rest ``[B, W]``)
    and ``non_tensor`` (the tree fields and ``uid``, object arrays of length B)."""

    prompts: Tensor
    responses: Tensor
    response_mask: Tensor
    token_level_rewards: Tensor
    non_tensor: dict[str, np.ndarray]
    trajectories: list[Trajectory]


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array (``np.array`` would turn equal-length lists into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def rows_from_trees(trees: Sequence[RolloutTree], pad_id: int = 0) -> VerlRows:
    """Every leaf of ``trees`` as one verl row; the reward sits on the last sampled token."""
    trajs = [t for tree in trees for _, t in sorted(tree.trajectories.items())]
    width = max((len(t.token_ids) - len(t.prompt_ids) for t in trajs), default=0)
    p_width = max((len(t.prompt_ids) for t in trajs), default=0)
    b = len(trajs)
    prompts = torch.full((b, p_width), pad_id, dtype=torch.long)
    responses = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    rewards = torch.zeros((b, width), dtype=torch.float32)
    for i, t in enumerate(trajs):
        p = len(t.prompt_ids)
        if p:
            prompts[i, p_width - p:] = torch.tensor(t.prompt_ids)
        resp = t.token_ids[p:]
        responses[i, : len(resp)] = torch.tensor(resp, dtype=torch.long)
        mask[i, : len(resp)] = torch.tensor(t.sampled[p:], dtype=torch.long)
        sampled = torch.nonzero(mask[i]).flatten()
        if sampled.numel():
            rewards[i, int(sampled[-1])] = float(t.reward)
    fields = {
        "uid": [t.tree_id for t in trajs],
        "tracerl_tree_id": [t.tree_id for t in trajs],
        "tracerl_node_path": [list(t.node_path) for t in trajs],
        "tracerl_turn_spans": [[[s - len(t.prompt_ids), e - len(t.prompt_ids)] for s, e in t.turn_spans] for t in trajs],
        "tracerl_readiness": [None if t.readiness is None else list(t.readiness) for t in trajs],
        "tracerl_reward": [float(t.reward) for t in trajs],
        "tracerl_infra_failed": [bool(t.infra_failed) for t in trajs],
    }
    return VerlRows(prompts, responses, mask, rewards, {k: object_array(v) for k, v in fields.items()}, trajs)


def neutral_padding(fields: Mapping[str, Any], padding: Sequence[bool], keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The tree fields with verl's padding rows made neutral.

    verl pads a batch to a multiple of its mini-batch and data-parallel sizes with copies of the
    first sample (every field, the tree fields included) under a new ``uid``, an all-zero
    ``response_mask`` and the tag ``is_padding`` (``upsample_batch_to_divisible_size`` in
    ``verl/trainer/ppo/padding_utils.py``). Read as they are, those rows would join the first
    leaf's tree. Here each padding row is a tree of its own (id: its key) with no turns, reward 0,
    no readiness and ``infra_failed``, so its advantage is 0 and it is left out of every group
    statistic; the real rows are untouched.

    Args:
        fields: the tree fields, B rows each.
        padding: ``is_padding`` of each row's tag.
        keys: each row's TransferQueue key.
    """
    rows = len(padding)
    out = {name: object_array(_field(fields, name, rows)) for name in TREE_FIELDS}
    for i, pad in enumerate(padding):
        if pad:
            for name, value in (("tracerl_tree_id", f"padding:{keys[i]}"), ("tracerl_node_path", [0]),
                                ("tracerl_turn_spans", []), ("tracerl_readiness", None), ("tracerl_reward", 0.0),
                                ("tracerl_infra_failed", True)):
                out[name][i] = value
    return out


def pad_rows(vectors: Sequence[Tensor], width: int) -> Tensor:
    """Per-row response-coordinate vectors (each ``[<= width]``) as verl's ``[B, width]`` float32,
    zero-padded on the right."""
    out = torch.zeros((len(vectors), width), dtype=torch.float32)
    for i, vec in enumerate(vectors):
        if vec.numel() > width:
            raise ValueError(f"row {i}: {vec.numel()} response tokens do not fit the width {width}")
        out[i, : vec.numel()] = vec
    return out


def _field(fields: Mapping[str, Any], name: str, rows: int) -> list[Any]:
    if name not in fields:
        raise ValueError(f"verl batch has no field {name!r} (tracerl's tree fields: {', '.join(TREE_FIELDS)})")
    values = list(fields[name])
    if len(values) != rows:
        raise ValueError(f"verl field {name!r} has {len(values)} rows for a batch of {rows}")
    return values


def _turns(
    row: int, spans: Sequence[Sequence[int]], readiness: Sequence[float] | None, width: int
) -> tuple[int, list[Turn]]:
    """Placeholder turns with the row's span lengths; the last is the answer when the readiness
    counts one transition fewer than turns (only an answer ends without an observation)."""
    if readiness is not None and len(readiness) - 1 not in (len(spans), len(spans) - 1):
        raise ValueError(f"row {row}: tracerl_readiness has {len(readiness)} scores for {len(spans)} turns "
                         "(need turns + 1, or turns when the last turn answers)")
    last_answers = readiness is not None and len(readiness) - 1 == len(spans) - 1
    turns = []
    for k, (start, end) in enumerate(spans):
        nxt = spans[k + 1][0] if k + 1 < len(spans) else end
        if not 0 <= start <= end <= nxt <= width:
            raise ValueError(
                f"row {row}: tracerl_turn_spans {[list(s) for s in spans]} are not ordered spans within {width} tokens"
            )
        kind = "answer" if last_answers and k == len(spans) - 1 else "tool"
        turns.append(Turn([0] * (end - start), [0] * (nxt - end), "", Action(kind=kind)))
    return (spans[0][0] if spans else 0), turns


def _tree(tree_id: str, paths: list[list[int]], rewards: list[float]) -> RolloutTree:
    """The tree's shape from its leaves' root-to-leaf node paths (ids index ``tree.nodes``)."""
    top = max(n for p in paths for n in p)
    tree = RolloutTree(tree_id=tree_id, task_id=tree_id, prompt_ids=[],
                       nodes=[Node(id=i, parent=None, depth=0) for i in range(top + 1)])
    for path, reward in zip(paths, rewards, strict=True):
        if path[0] != 0:
            raise ValueError(f"tree {tree_id!r}: node path {path} does not start at the root 0")
        for depth, (parent, child) in enumerate(zip(path, path[1:], strict=False), start=1):
            node = tree.nodes[child]
            if node.parent not in (None, parent):
                raise ValueError(f"tree {tree_id!r}: node {child} has two parents ({node.parent}, {parent})")
            node.parent, node.depth = parent, depth
            if child not in tree.nodes[parent].children:
                tree.nodes[parent].children.append(child)
        tree.nodes[path[-1]].reward = reward
    return tree


def batch_from_fields(fields: Mapping[str, Any], response_mask: Tensor) -> AdvantageBatch:
    """tracerl trajectories and trees rebuilt from verl's tree fields (module docstring).

    Args:
        fields: the tree fields (``non_tensor_batch`` or a mapping of lists), B rows each.
        response_mask: ``[B, W]``; must be 1 exactly on the rows' turn spans.
    """
    rows, width = response_mask.shape
    cols = {name: _field(fields, name, rows) for name in TREE_FIELDS}
    trajs = []
    for i in range(rows):
        readiness = cols["tracerl_readiness"][i]
        readiness = None if readiness is None else [float(x) for x in readiness]
        spans = [(int(s), int(e)) for s, e in cols["tracerl_turn_spans"][i]]
        lead, turns = _turns(i, spans, readiness, width)
        mask = torch.zeros(width, dtype=torch.bool)
        for s, e in spans:
            mask[s:e] = True
        if not torch.equal(mask, response_mask[i].bool()):
            raise ValueError(f"row {i}: response_mask differs from tracerl_turn_spans {[list(s) for s in spans]}")
        tree_id = str(cols["tracerl_tree_id"][i])
        trajs.append(Trajectory(
            task_id=tree_id, group_id=tree_id, prompt_ids=[0] * lead, turns=turns,
            reward=float(cols["tracerl_reward"][i]), infra_failed=bool(cols["tracerl_infra_failed"][i]),
            tree_id=tree_id, node_path=[int(n) for n in cols["tracerl_node_path"][i]], readiness=readiness,
        ))
    by_tree: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_tree.setdefault(t.tree_id, []).append(t)
    trees = {tid: _tree(tid, [t.node_path for t in ts], [t.reward for t in ts]) for tid, ts in by_tree.items()}
    return AdvantageBatch(trajectories=trajs, trees=trees)
