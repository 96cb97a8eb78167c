"""The shared success predictor ``Vpsi(H)`` of TRACE allocation (spec section 3).

It estimates the probability that a prefix history ends in success, from the task-agnostic
features of :mod:`tracerl.allocation.features` and/or (``PredictorConfig.features``) the policy's
own hidden state at the node, with a small float32 torch model that owns its own optimizer. After every training step :meth:`SuccessPredictor.update` first scores the step's
fresh nodes (Brier score and AUC, the calibration the allocator relies on), then trains online
with visit-weighted binary cross-entropy against the backed-up targets ``Vhat`` of those nodes
plus a bounded replay buffer of older ones.

It serves the allocator only: features are plain Python floats read from stored turns and its
outputs are returned as floats, so it has no gradient path to (and never touches) the policy.
Until its first update it predicts a prior (0.5, or the running mean reward once rewards were
seen), which makes the root and prefix allocators fall back to uniform allocation.

Its settings are :class:`~tracerl.allocation.predictor_config.PredictorConfig` (re-exported here)
and its network is built by :mod:`tracerl.allocation.predictor_net`.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from tracerl.allocation.features import (
    NUM_FEATURES,
    PromptStats,
    node_features,
    node_state,
    path_stats,
    state_features,
    success_leaves_below,
)
from tracerl.allocation.predictor_config import PredictorConfig
from tracerl.allocation.predictor_net import StateHead, build_model
from tracerl.allocation.root_targets import root_rollout_rewards
from tracerl.core.types import RolloutTree


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run the predictor's tiny matmuls on one thread: many threads only add overhead here
    (about 30x slower on a busy 2-core machine), and the caller's setting is restored."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def weighted_auc(scores: Sequence[float], wins: Sequence[float], losses: Sequence[float]) -> float:
    """P(score of a success > score of a failure), ties counting half (weighted Mann-Whitney).

    Each item stands for ``wins[i]`` successful and ``losses[i]`` failed leaves predicted with
    ``scores[i]``. Returns NaN when there are no successes or no failures.
    """
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(wins, dtype=np.float64)
    f = np.asarray(losses, dtype=np.float64)
    total_w, total_f = w.sum(), f.sum()
    if total_w <= 0 or total_f <= 0:
        return float("nan")
    uniq, inverse = np.unique(s, return_inverse=True)
    w_at = np.bincount(inverse, weights=w, minlength=len(uniq))
    f_at = np.bincount(inverse, weights=f, minlength=len(uniq))
    f_below = np.cumsum(f_at) - f_at  # failures with a strictly smaller score
    return float(((w_at * (f_below + 0.5 * f_at)).sum()) / (total_w * total_f))


class SuccessPredictor:
    """``Vpsi(H)``: P(success | prefix history) for tree nodes, trained online on backed-up targets."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config if config is not None else PredictorConfig()
        self.state_dim: int | None = None
        """Size of the policy's hidden state (``features`` hidden/both), known once a state is seen."""
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        if not self.config.uses_hidden:
            self._build()
        self._generator = torch.Generator().manual_seed(self.config.seed)
        self._prompts: OrderedDict[str, PromptStats] = OrderedDict()
        self._buf_x = torch.zeros(0, self.in_dim or 0, dtype=torch.float32)
        self._buf_y = torch.zeros(0, dtype=torch.float32)
        self._buf_w = torch.zeros(0, dtype=torch.float32)
        self._reward_sum = 0.0
        self._reward_count = 0
        self.updates = 0

    @property
    def in_dim(self) -> int | None:
        """Input width: 13 handcrafted features and/or ``1 + state_dim``; None until the state size is known."""
        cfg = self.config
        if cfg.uses_hidden and self.state_dim is None:
            return None
        return NUM_FEATURES * cfg.uses_handcrafted + ((self.state_dim or 0) + 1) * cfg.uses_hidden

    def _build(self) -> None:
        """The model and its optimizer, once the input width is known (at once for handcrafted)."""
        assert self.in_dim is not None
        self.model = build_model(self.config, self.state_dim)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.config.lr)

    # ----------------------------------------------------------------- prediction
    @property
    def is_trained(self) -> bool:
        return self.updates > 0

    @property
    def prior(self) -> float:
        """Cold-start prediction: the running mean leaf reward, or 0.5 before any was seen."""
        return self._reward_sum / self._reward_count if self._reward_count else 0.5

    def prompt_stats(self, task_id: str) -> PromptStats | None:
        return self._prompts.get(task_id)

    def features(self, trees: Sequence[RolloutTree], node_ids: Sequence[int]) -> Tensor:
        """``[N, in_dim]`` float32 inputs of ``(trees[i], node_ids[i])`` (plain data, no grad):
        the handcrafted features and/or ``[present, state]`` (:func:`state_features`)."""
        if len(trees) != len(node_ids):
            raise ValueError(f"trees ({len(trees)}) and node_ids ({len(node_ids)}) must have equal length")
        for tree, nid in zip(trees, node_ids, strict=True):
            if not 0 <= nid < len(tree.nodes):
                raise ValueError(f"tree {tree.tree_id!r} has no node {nid} ({len(tree.nodes)} nodes)")
        cfg = self.config
        rows: list[list[float]] = [[] for _ in node_ids]
        if cfg.uses_handcrafted:
            cache: dict[int, list[Any]] = {}
            for row, tree, nid in zip(rows, trees, node_ids, strict=True):
                stats = cache.setdefault(id(tree), path_stats(tree))
                row += node_features(tree, nid, stats, self._prompts.get(tree.task_id), cfg.readiness_eps)
        if cfg.uses_hidden:
            states = [node_state(tree, nid) for tree, nid in zip(trees, node_ids, strict=True)]
            if self.state_dim is None:
                self.state_dim = next((len(s) for s in states if s is not None), None)
            if self.state_dim is None:
                raise ValueError(
                    f"predictor.features = {cfg.features!r} needs the policy's hidden states, but none of "
                    f"these {len(states)} nodes has one (they are recorded by the HF backend with "
                    "HFPolicy.record_states = True; vLLM does not return hidden states)")
            for row, state in zip(rows, states, strict=True):
                row += state_features(state, self.state_dim)
        return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), self.in_dim or 0)

    def _predict_features(self, x: Tensor) -> list[float]:
        if not self.is_trained:
            return [self.prior] * x.shape[0]
        assert self.model is not None
        with torch.no_grad(), _one_thread():
            return torch.sigmoid(self.model(x).squeeze(-1)).tolist()

    def predict_nodes(self, trees: Sequence[RolloutTree], node_ids: Sequence[int]) -> list[float]:
        """P(success) of each ``(trees[i], node_ids[i])`` prefix, as plain floats in (0, 1)."""
        if not self.is_trained and self.in_dim is None and len(trees) == len(node_ids):
            return [self.prior] * len(node_ids)  # cold, state size not yet known: no input needed
        return self._predict_features(self.features(trees, node_ids))

    def predict_roots(
        self,
        task_ids: Sequence[str],
        prompt_ids: Sequence[Sequence[int]],
        states: Sequence[list[float] | None] | None = None,
    ) -> list[float]:
        """P(success) of prompts ``H_0`` (stage 1), before any rollout of them exists.

        ``prompt_ids`` are the rendered prompts' token ids, exactly as a tree's root holds them;
        ``states`` the policy's hidden state at each prompt's last token (``features`` hidden/both).
        """
        if len(task_ids) != len(prompt_ids) or (states is not None and len(states) != len(task_ids)):
            raise ValueError(f"task_ids ({len(task_ids)}), prompt_ids ({len(prompt_ids)}) and states "
                             f"({'-' if states is None else len(states)}) must have equal length")
        trees = [
            RolloutTree(tree_id=f"root:{i}", task_id=t, prompt_ids=list(ids))
            for i, (t, ids) in enumerate(zip(task_ids, prompt_ids, strict=True))
        ]
        for tree, state in zip(trees, states if states is not None else [None] * len(trees), strict=True):
            tree.root.hidden = list(state) if state is not None else None
        return self.predict_nodes(trees, [0] * len(trees))

    # ----------------------------------------------------------------- training
    def _step_nodes(
        self, trees: Sequence[RolloutTree]
    ) -> tuple[list[RolloutTree], list[int], Tensor, Tensor, list[int], list[int]]:
        """The step's trainable nodes with targets ``Vhat``, visit weights and leaf outcome counts."""
        sel_trees: list[RolloutTree] = []
        sel_ids: list[int] = []
        targets, weights, wins, losses = [], [], [], []
        for tree in trees:
            tree.backup()
            n_win, n_loss = success_leaves_below(tree)
            root = root_rollout_rewards(tree) if self.config.root_targets == "stage1" else None
            for node in tree.nodes:
                if node.visits <= 0 or node.value_target is None:
                    continue
                target, visits = node.value_target, float(node.visits)
                if root is not None and node.id == 0:
                    if not root:
                        continue
                    target, visits = sum(root) / len(root), float(len(root))
                if self.config.train_nodes == "boundaries" and not node.is_boundary:
                    continue
                if not 0.0 <= node.value_target <= 1.0:
                    raise ValueError(
                        f"tree {tree.tree_id!r} node {node.id}: value target {node.value_target} is outside "
                        "[0, 1]; the predictor's binary cross-entropy needs rewards in [0, 1]"
                    )
                sel_trees.append(tree)
                sel_ids.append(node.id)
                targets.append(target)
                weights.append(visits)
                wins.append(n_win[node.id])
                losses.append(n_loss[node.id])
        y = torch.tensor(targets, dtype=torch.float32)
        w = torch.tensor(weights, dtype=torch.float32)
        return sel_trees, sel_ids, y, w, wins, losses

    def update(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """Score the step's fresh nodes, then train on them (spec section 3, predictor targets).

        Returns ``brier`` (visit-weighted), ``auc`` (NaN when the step holds only successes or
        only failures), ``n_nodes``, ``loss`` (weighted BCE on the buffer after training),
        ``buffer`` (nodes held) and ``prior``; all computed before the prompt table learns this
        step's outcomes, so no feature ever leaks the rewards it is scored against.
        """
        sel_trees, sel_ids, y, w, wins, losses = self._step_nodes(trees)
        x = self.features(sel_trees, sel_ids)
        metrics: dict[str, float] = {"n_nodes": float(len(sel_ids))}
        if sel_ids:
            preds = torch.tensor(self._predict_features(x), dtype=torch.float32)
            metrics["brier"] = float(((preds - y) ** 2 * w).sum() / w.sum())
            metrics["auc"] = weighted_auc(preds.tolist(), wins, losses)
            self._append(x, y, w)
            if self.model is None:
                self._build()
            with _one_thread():
                metrics["loss"] = self._train()
            self.updates += 1
        else:
            metrics.update(brier=float("nan"), auc=float("nan"), loss=float("nan"))
        self._learn_prompts(trees)
        metrics["buffer"] = float(self._buf_y.numel())
        metrics["prior"] = self.prior
        return metrics

    def _append(self, x: Tensor, y: Tensor, w: Tensor) -> None:
        keep = self.config.buffer_size
        if self._buf_x.shape[1] != x.shape[1]:  # first rows of a predictor whose width was unknown
            self._buf_x = x.new_zeros((0, x.shape[1]))
        self._buf_x = torch.cat([self._buf_x, x])[-keep:]
        self._buf_y = torch.cat([self._buf_y, y])[-keep:]
        self._buf_w = torch.cat([self._buf_w, w])[-keep:]

    def _loss(self, idx: Tensor | None) -> Tensor:
        assert self.model is not None
        x, y, w = (self._buf_x, self._buf_y, self._buf_w) if idx is None else (
            self._buf_x[idx], self._buf_y[idx], self._buf_w[idx]
        )
        logits = self.model(x).squeeze(-1)
        bce = nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
        return (bce * w).sum() / w.sum()

    def _train(self) -> float:
        assert self.model is not None and self.optimizer is not None
        n = self._buf_y.numel()
        if isinstance(self.model, StateHead):
            self.model.recenter(self._buf_x)
        self.model.train()
        for _ in range(self.config.steps_per_update):
            idx = None if n <= self.config.batch_size else torch.randint(
                n, (self.config.batch_size,), generator=self._generator
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(idx)
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # leave no gradients behind between steps
        self.model.eval()
        with torch.no_grad():
            return float(self._loss(None))

    def _learn_prompts(self, trees: Sequence[RolloutTree]) -> None:
        """Fold the step's leaf outcomes into the per-prompt table and the running prior."""
        for tree in trees:
            rewards = [
                float(tree.nodes[nid].reward)  # type: ignore[arg-type]
                for nid in tree.leaves()
                if not (nid in tree.trajectories and tree.trajectories[nid].infra_failed)
            ]
            if not rewards:
                continue
            old = self._prompts.pop(tree.task_id, PromptStats(0.0, 0))
            self._prompts[tree.task_id] = PromptStats(old.successes + sum(rewards), old.count + len(rewards))
            while len(self._prompts) > self.config.prompt_table_size:
                self._prompts.popitem(last=False)  # forget the least recently seen prompt
            self._reward_sum += sum(rewards)
            self._reward_count += len(rewards)

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: weights, optimizer, buffer, tables, RNG."""
        return copy.deepcopy(
            {
                "config": asdict(self.config),
                "state_dim": self.state_dim,
                "model": self.model.state_dict() if self.model is not None else None,
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "generator": self._generator.get_state(),
                "buffer": {"x": self._buf_x, "y": self._buf_y, "w": self._buf_w},
                "prompts": [(k, v.successes, v.count) for k, v in self._prompts.items()],
                "reward_sum": self._reward_sum,
                "reward_count": self._reward_count,
                "updates": self.updates,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the model shape must match this config."""
        saved = PredictorConfig(**state["config"])
        mine = (self.config.hidden, self.config.buffer_size, self.config.features)
        if (saved.hidden, saved.buffer_size, saved.features) != mine:
            raise ValueError(
                f"predictor state was saved with hidden={saved.hidden}, buffer_size={saved.buffer_size}, "
                f"features={saved.features!r}; this predictor has hidden={mine[0]}, buffer_size={mine[1]}, "
                f"features={mine[2]!r}"
            )
        self.state_dim = state.get("state_dim")
        x = state["buffer"]["x"]
        width = self.in_dim if self.in_dim is not None else 0
        if x.dim() != 2 or (x.shape[0] and x.shape[1] != width):
            raise ValueError(f"predictor buffer has shape {tuple(x.shape)}, expected [N, {width}]")
        if state["model"] is not None:
            self._build()
            assert self.model is not None and self.optimizer is not None
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self._generator.set_state(state["generator"])
        self._buf_x = x.clone().float()
        self._buf_y = state["buffer"]["y"].clone().float()
        self._buf_w = state["buffer"]["w"].clone().float()
        self._prompts = OrderedDict((k, PromptStats(float(s), int(c))) for k, s, c in state["prompts"])
        self._reward_sum = float(state["reward_sum"])
        self._reward_count = int(state["reward_count"])
        self.updates = int(state["updates"])
