"""The TRACE rollout scheme (spec section 3): the planner that spends a step's budget with the
success predictor. It lives with the predictor it plans from; the optimisation itself (stage 1
:func:`allocate_roots`, stage 2 :func:`allocate_prefixes`) is pure math in
:mod:`tracerl.core.allocation` and runs on the driver, whatever executor runs the rollouts.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from tracerl.core.allocation import allocate_prefixes, allocate_roots, exploration_prompts, root_value
from tracerl.core.types import RolloutTree, Task
from tracerl.core.seeds import derive_seed
from tracerl.allocation.schemes import (
    SchemeConfig,
    SchemeResult,
    Target,
    _check_budget,
    _result,
    _tree_ids,
    expandable_nodes,
    plan_requests,
)
from tracerl.allocation.session import RolloutSession, as_session

if TYPE_CHECKING:
    from tracerl.allocation.predictor import SuccessPredictor


class TraceScheme:
    """TRACE allocation (spec section 3): predictor-driven root allocation, then prefix expansion.

    Stage 1 spends ``round(fraction * M)`` rollouts over the candidate prompts with
    :func:`allocate_roots` on the predictor's root values. When those values are all equal (no
    predictor, or a cold-start one predicting its prior) the objective cannot tell prompts apart
    and stage 1 falls back to uniform allocation: ``group_size`` rollouts for each of the first
    ``M_1 // group_size`` prompts (the chain baseline's shape). Stage 2 takes the boundaries after
    an observation on the stage-1 rollouts as anchors, scores them with the predictor and spends
    the rest with :func:`allocate_prefixes` (cap per anchor); rounds > 1 branch from the
    boundaries the previous round created. Budget that stage 2 cannot place (too few anchors,
    e.g. rollouts that answered without any tool call) becomes extra root rollouts of the
    sampled prompts, greedy by marginal :func:`root_value` gain, so cost == budget always.

    With ``score`` the session asks the executor for the readiness of new leaves (one batched call) before their prefixes
    are valued, so the predictor sees ``l_k``/``V_k`` at allocation time as it did when trained;
    the scores stay on the trajectories (and tree nodes) for TRACE credit to reuse, and the
    trainer's own score call finds them scored.

    Allocation 2x2 ablation (``trace_roots`` / ``trace_prefixes``): a ``uniform`` arm ignores the
    predictor in its stage. Uniform roots are the fallback above (and a round-robin top-up);
    uniform prefixes spend the same stage-2 budget, with the same cap, on anchors in a random
    order drawn from the step's seed (:func:`uniform_prefixes`). Budget accounting is unchanged.

    With ``PredictorConfig.features`` hidden/both and learned roots, a trained predictor values
    the candidate prompts from the policy's hidden state at their last token: one prefill of the
    candidates (``session.prompt_states``) whose KV the stage-1 rollouts then reuse.

    :meth:`plan_stage1` and :meth:`plan_stage2` are pure functions of the snapshot, the predictor
    and the seed: the same snapshot gives the same plan.
    """

    name = "trace"

    def __init__(
        self,
        config: SchemeConfig,
        predictor: SuccessPredictor | None = None,
        score: bool | None = None,
    ) -> None:
        self.config = config
        self.predictor = predictor
        self.score = bool(score)

    def collect(
        self, target: Target, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> SchemeResult:
        cfg = self.config
        _check_budget(budget)
        cands = list(pool[: cfg.trace_candidates or len(pool)])
        if cfg.trace_root_mode == "coverage":  # the prompts chain would train, in its order
            cands = list(pool[: budget // cfg.group_size])
        if not cands:
            raise ValueError("trace: the prompt pool is empty")
        session = as_session(target, generator, seed)
        learned = self._learned_roots
        clock = time.perf_counter()
        states = session.prompt_states(cands) if learned and self._needs_states else None
        state_seconds = time.perf_counter() - clock  # the one extra forward: the candidates' prefill
        values, counts = self.plan_stage1(session.prompt_ids(cands) if learned else [], cands, budget, states,
                                          seed=derive_seed(session.seed, "trace_explore"))
        chosen = [i for i, c in enumerate(counts) if c > 0]
        trees, cost = session.start([cands[i] for i in chosen], [counts[i] for i in chosen], _tree_ids(chosen, cands))
        self._score(session, trees)
        info = {"stage1_prompts": float(len(chosen)), "stage1_rollouts": float(cost.rollouts),
                "explore_prompts": float(len(self._explored(len(cands), budget, derive_seed(session.seed, "trace_explore"))))}
        if states is not None:
            info["prompt_state_seconds"] = state_seconds
        info["anchors"], info["stage2_rollouts"] = 0.0, 0.0
        since = [0] * len(trees)  # round 0 branches from every stage-1 boundary
        for rnd in range(cfg.trace_rounds):
            spend = (budget - cost.rollouts) // (cfg.trace_rounds - rnd)
            requests, anchors = self.plan_stage2(trees, since, spend, derive_seed(session.seed, "trace_prefixes", rnd))
            since = [len(t.nodes) for t in trees]
            if not requests:
                continue
            step_cost = session.expand(requests)
            cost = cost + step_cost
            info["anchors"] += anchors
            info["stage2_rollouts"] += step_cost.rollouts
            self._score(session, trees)
        left = budget - cost.rollouts
        if left > 0:
            cost = cost + session.expand(plan_requests(_root_topup(trees, [values[i] for i in chosen], left), trees))
        info["root_topup"] = float(left)
        return _result(trees, cost, len(cands), session.expansions, **info)

    @property
    def _learned_roots(self) -> bool:
        return self.predictor is not None and self.config.trace_roots == "learned"

    @property
    def _needs_states(self) -> bool:
        """A trained predictor that reads hidden states (a cold one predicts its prior anyway)."""
        pred = self.predictor
        return pred is not None and pred.config.uses_hidden and pred.is_trained

    def plan_stage1(
        self, prompt_ids: Sequence[Sequence[int]], cands: Sequence[Task], budget: int,
        states: Sequence[list[float] | None] | None = None, seed: int = 0,
    ) -> tuple[list[float], list[int]]:
        """Root values and stage-1 rollout counts per candidate (``prompt_ids`` and ``states``, the
        prompts' hidden states, are unused without a predictor or with uniform roots; ``seed``
        draws the exploration prompts of ``trace_explore_fraction``)."""
        values = self._root_values(prompt_ids, cands, states)
        stage1 = self._stage1_budget(budget, len(cands))
        if self.config.trace_root_mode == "coverage":
            return values, self._coverage_counts(values, stage1)
        explored = self._explored(len(cands), budget, seed)
        counts = [0] * len(cands)
        group = max(self.config.min_per_prompt, self.config.trace_floor_per_prompt)
        for i in explored:
            counts[i] = group
        rest = [i for i in range(len(cands)) if i not in set(explored)]
        left = stage1 - group * len(explored)
        if rest and (left >= self.config.min_per_prompt or self.config.trace_floor_per_prompt > 0):
            for i, c in zip(rest, self._root_counts([values[i] for i in rest], left), strict=True):
                counts[i] = c
        return values, counts

    def _explored(self, candidates: int, budget: int, seed: int) -> list[int]:
        """Candidates stage 1 gives to exploration (none unless ``trace_explore_fraction`` > 0)."""
        cfg = self.config
        if cfg.trace_explore_fraction <= 0 or cfg.trace_root_mode == "coverage":
            return []
        stage1 = self._stage1_budget(budget, candidates)
        group = max(cfg.min_per_prompt, cfg.trace_floor_per_prompt)
        return exploration_prompts(candidates, round(cfg.trace_explore_fraction * stage1), group, seed)

    def _coverage_counts(self, values: Sequence[float], stage1: int) -> list[int]:
        """Coverage: every candidate gets ``max(2, trace_floor_per_prompt)`` or more; an uninformative
        predictor spreads ``stage1`` evenly, else :func:`allocate_roots` places the rest exactly."""
        cfg = self.config
        floor, n = max(2, cfg.trace_floor_per_prompt), len(values)
        if stage1 < n * floor:
            raise ValueError(f"trace coverage: stage 1's {stage1} rollouts cannot give each of the {n} prompts "
                             f"chain trains at least {floor}")
        if max(values) - min(values) <= 1e-9:
            base, extra = divmod(stage1, n)
            cap = cfg.trace_max_per_prompt
            if cap is None or base + (extra > 0) <= cap:
                return [base + 1] * extra + [base] * (n - extra)
        for spend in range(stage1, n * floor - 1, -1):  # a cap may leave some of stage 1 to stage 2
            try:
                return allocate_roots(values, spend, min_per_prompt=floor, max_per_prompt=cfg.trace_max_per_prompt,
                                      floor_per_prompt=floor)
            except ValueError:
                continue
        raise ValueError(f"trace coverage: no stage-1 allocation of at most {stage1} rollouts fits the per-prompt bounds")

    def plan_stage2(
        self, trees: Sequence[RolloutTree], since: Sequence[int], spend: int, seed: int = 0
    ) -> tuple[list[tuple[str, int, int]], int]:
        """``(tree_id, node_id, k)`` requests spending ``spend`` on the boundaries created at or
        after node ``since[i]`` of tree ``i``, and the number of anchors considered. ``seed``
        orders the anchors of uniform prefixes (``trace_prefixes = uniform``); learned ignores it."""
        anchors = self._anchors(trees, since)
        if not anchors or spend <= 0:
            return [], 0
        cap = self.config.trace_max_per_anchor
        if self.config.trace_prefixes == "uniform":
            ks = uniform_prefixes(len(anchors), spend, cap, random.Random(seed))
        else:
            probs = self._node_values([trees[t] for t, _, _ in anchors], [nid for _, nid, _ in anchors])
            ks = allocate_prefixes(probs, [r for _, _, r in anchors], spend, max_per_anchor=cap)
        plan = {(t, nid): k for (t, nid, _), k in zip(anchors, ks, strict=True) if k > 0}
        return plan_requests(plan, trees), len(anchors)

    def _stage1_budget(self, budget: int, candidates: int) -> int:
        cfg = self.config
        if budget < cfg.min_per_prompt:
            raise ValueError(
                f"trace: budget {budget} is below the {cfg.min_per_prompt} rollouts a selected prompt gets at least "
                "(trace_min_per_prompt, or group_size when unset)"
            )
        stage1 = max(cfg.min_per_prompt, round(cfg.trace_stage1_fraction * budget))
        if cfg.trace_max_per_prompt is not None:  # the rest moves to stage 2 / top-up
            stage1 = min(stage1, candidates * cfg.trace_max_per_prompt)
        return stage1

    def _root_values(
        self, prompt_ids: Sequence[Sequence[int]], cands: Sequence[Task], states: Sequence[list[float] | None] | None
    ) -> list[float]:
        if self.predictor is None or not self._learned_roots:
            return [0.5] * len(cands)  # constant values: uniform stage 1 and round-robin top-up
        return self.predictor.predict_roots([t.id for t in cands], [list(p) for p in prompt_ids], states)

    def _node_values(self, trees: Sequence[RolloutTree], node_ids: Sequence[int]) -> list[float]:
        if self.predictor is None:
            return [0.5] * len(node_ids)
        return self.predictor.predict_nodes(trees, node_ids)

    def _root_counts(self, values: Sequence[float], stage1: int) -> list[int]:
        """Stage-1 counts spending ``stage1``, or the most below it that the bounds allow.

        (Only odd corners need less, e.g. ``min == max == 2`` and an odd ``stage1``; the rest then
        goes to stage 2.)
        """
        floor = self.config.trace_floor_per_prompt
        constant = max(values) - min(values) <= 1e-9 and floor == 0  # a floor: the DP's tie-break spreads
        for spend in range(stage1, self.config.min_per_prompt - 1 if floor == 0 else -1, -1):
            counts = self._uniform_counts(len(values), spend) if constant else self._optimal_counts(values, spend)
            if counts is not None:
                return counts
        raise ValueError(f"trace: no stage-1 allocation of at most {stage1} rollouts fits the per-prompt bounds")

    def _optimal_counts(self, values: Sequence[float], spend: int) -> list[int] | None:
        cfg = self.config
        try:
            return allocate_roots(
                values, spend, min_per_prompt=cfg.min_per_prompt, max_per_prompt=cfg.trace_max_per_prompt,
                floor_per_prompt=cfg.trace_floor_per_prompt,
            )
        except ValueError:
            return None

    def _uniform_counts(self, prompts: int, spend: int) -> list[int] | None:
        """Uninformative predictor: groups of about ``group_size`` on the first prompts."""
        cfg = self.config
        cap = cfg.trace_max_per_prompt
        k = max(1, spend // cfg.group_size, math.ceil(spend / cap) if cap else 1)
        k = min(k, prompts, spend // cfg.min_per_prompt)
        base, extra = divmod(spend, k)
        if cap is not None and base + (extra > 0) > cap:
            return None
        return [base + 1] * extra + [base] * (k - extra) + [0] * (prompts - k)

    def _anchors(self, trees: Sequence[RolloutTree], since: Sequence[int]) -> list[tuple[int, int, float]]:
        """(tree index, node id, observed reward of the one rollout through it) per new boundary."""
        out = []
        for t, tree in enumerate(trees):
            for nid in expandable_nodes(tree, since[t]):
                leaf = nid
                while not tree.nodes[leaf].is_leaf:  # new nodes lie on exactly one rollout
                    leaf = tree.nodes[leaf].children[0]
                traj = tree.trajectories.get(leaf)
                if traj is not None and not traj.infra_failed:
                    out.append((t, nid, float(traj.reward)))
        return out

    def _score(self, session: RolloutSession, trees: Sequence[RolloutTree]) -> None:
        """Readiness is the executor's "score new nodes" call, made through the session."""
        if self.score:
            session.score(trees)


def uniform_prefixes(anchors: int, spend: int, cap: int, rng: random.Random) -> list[int]:
    """Continuations per anchor for uniform prefixes: ``min(spend, anchors * cap)`` in total (as
    :func:`allocate_prefixes` spends), one at a time round-robin over a uniformly random order of
    the anchors, so counts differ by at most one and which anchors get the extra ones is random.

    Why round-robin rather than independent draws: per anchor the first continuation is worth more
    than the second (gain ``1 - q`` vs ``q (1 - q)``), so the learned allocator also tends to spread
    before it stacks; round-robin keeps that shape and changes only *which* anchors are chosen.
    """
    order = rng.sample(range(anchors), anchors)
    counts = [0] * anchors
    for i in range(min(spend, anchors * cap)):
        counts[order[i % anchors]] += 1
    return counts


def _root_topup(trees: Sequence[RolloutTree], values: Sequence[float], left: int) -> dict[tuple[int, int], int]:
    """Extra root rollouts, greedy by marginal ``root_value`` gain (concave for m >= 1)."""
    sizes = [len(tree.leaves()) for tree in trees]
    plan: dict[tuple[int, int], int] = {}
    for _ in range(left if trees else 0):
        gains = [root_value(v, m + 1) - root_value(v, m) for v, m in zip(values, sizes, strict=True)]
        best = max(range(len(gains)), key=lambda i: (gains[i], -i))
        sizes[best] += 1
        plan[(best, 0)] = plan.get((best, 0), 0) + 1
    return plan
