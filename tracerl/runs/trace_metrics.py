"""Per-step readings of the TRACE options: who gets trained (per stratum) and what credit does.

* Strata: a task's hop count where every pool task knows it, else (with a success predictor) the
  quartile bin of its predicted root value ``v`` (``[0, .25)``, ..., ``[.75, 1]``). Logged per
  stratum ``s``: ``stratum_share_s`` (share of the step's trained prompts), ``stratum_rollouts_s``
  (share of its valid rollouts), ``stratum_success_s`` (their success rate) and, with a
  handcrafted-feature predictor, ``stratum_pred_s`` (its mean predicted root value before this
  step's update: calibration is ``pred`` against ``success``). A stratum that holds at least
  ``min_pool_share`` of the pool over the last ``window`` steps while getting under ``floor`` of
  the trained prompts raises a warning once (stage 1 is starving it).
* Credit: :func:`tracerl.core.tree_advantages.credit_diagnostics` when the estimator is
  ``trace_credit``.

The window is diagnostic state only (not checkpointed): a resumed run warns afresh.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

from tracerl.core.advantages import AdvantageBatch
from tracerl.core.tree_advantages import credit_diagnostics
from tracerl.core.types import RolloutTree, Task

V_BINS = 4


def _v_bin(v: float) -> str:
    return f"v{min(int(v * V_BINS), V_BINS - 1)}"


class TraceMetrics:
    """Stratum shares, calibration and credit diagnostics of one run (see the module docstring)."""

    def __init__(self, estimator: str, options: Any, *, window: int = 10, floor: float = 0.02,
                 min_pool_share: float = 0.1) -> None:
        self.estimator, self.options = estimator, options
        self.window, self.floor, self.min_pool_share = window, floor, min_pool_share
        self._pool: deque[dict[str, float]] = deque(maxlen=window)
        self._trained: deque[dict[str, float]] = deque(maxlen=window)
        self.warned: set[str] = set()

    def observe(self, pool: Sequence[Task], trees: Sequence[RolloutTree], tasks: dict[str, Task],
                batch: AdvantageBatch, predictor: Any = None) -> dict[str, float]:
        """The step's readings; call before the predictor learns the step (calibration is honest)."""
        out = self._strata(pool, trees, tasks, predictor)
        if self.estimator == "trace_credit":
            out.update(credit_diagnostics(batch, self.options))
        return out

    def _strata(self, pool: Sequence[Task], trees: Sequence[RolloutTree], tasks: dict[str, Task],
                predictor: Any) -> dict[str, float]:
        trained = [t for t in trees if any(not x.infra_failed for x in t.trajectories.values())]
        preds = self._predictions(trained, predictor)
        if pool and all(t.hops is not None for t in pool):
            key = {t.tree_id: f"hops{tasks[t.task_id].hops}" for t in trained}
            pool_keys = [f"hops{t.hops}" for t in pool]
        elif preds is not None:
            key = {t.tree_id: _v_bin(p) for t, p in zip(trained, preds, strict=True)}
            pool_keys = []
        else:
            return {}
        out: dict[str, float] = {}
        strata = sorted(set(key.values()) | set(pool_keys))
        rewards = {t.tree_id: [float(x.reward) for x in t.trajectories.values() if not x.infra_failed] for t in trained}
        n_rollouts = sum(len(r) for r in rewards.values())
        for s in strata:
            mine = [t for t in trained if key[t.tree_id] == s]
            got = [r for t in mine for r in rewards[t.tree_id]]
            out[f"stratum_share_{s}"] = len(mine) / len(trained) if trained else 0.0
            out[f"stratum_rollouts_{s}"] = len(got) / n_rollouts if n_rollouts else 0.0
            if got:
                out[f"stratum_success_{s}"] = sum(r > 0.5 for r in got) / len(got)
            if preds is not None and mine:
                out[f"stratum_pred_{s}"] = sum(p for t, p in zip(trained, preds, strict=True) if key[t.tree_id] == s) / len(mine)
        self._warn(strata, pool_keys, out)
        return out

    def _predictions(self, trained: Sequence[RolloutTree], predictor: Any) -> list[float] | None:
        """Root predictions of the trained prompts (handcrafted features only: a hidden-state
        predictor needs the prompt states, which only the planner's prefill holds)."""
        if predictor is None or not trained or predictor.config.features != "handcrafted":
            return None
        roots = [RolloutTree(tree_id=t.tree_id, task_id=t.task_id, prompt_ids=list(t.prompt_ids)) for t in trained]
        return list(predictor.predict_nodes(roots, [0] * len(roots)))

    def _warn(self, strata: list[str], pool_keys: list[str], out: dict[str, float]) -> None:
        if pool_keys:
            self._pool.append({s: pool_keys.count(s) / len(pool_keys) for s in strata})
        self._trained.append({s: out.get(f"stratum_share_{s}", 0.0) for s in strata})
        if len(self._trained) < self.window:
            return
        for s in strata:
            offered = sum(p.get(s, 0.0) for p in self._pool) / len(self._pool) if self._pool else 1.0
            share = sum(t.get(s, 0.0) for t in self._trained) / len(self._trained)
            if s not in self.warned and offered >= self.min_pool_share and share < self.floor:
                self.warned.add(s)
                warnings.warn(f"stratum {s}: {share:.1%} of the trained prompts over the last {self.window} steps "
                              f"while the pool offers {offered:.0%}; stage 1 is starving it (see "
                              "rollout.schemes.trace_floor_per_prompt / trace_root_mode / trace_explore_fraction)",
                              stacklevel=2)
