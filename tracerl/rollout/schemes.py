"""Rollout schemes: how one training step spends its budget of continuation rollouts.

Every scheme takes the same inputs (an engine, an ordered pool of candidate prompts, a budget
``M`` of continuation rollouts, a torch generator) and returns the same :class:`SchemeResult`:
rollout trees (one per sampled prompt), the sampling cost counted both ways (continuation
rollouts and generated tokens, spec section 1) and the batch's effective ratio.

* ``chain`` (GRPO): ``n`` independent rollouts for each of the first ``M // n`` prompts.
* ``dapo`` (DAPO dynamic sampling): groups of ``n``; all-same groups are dropped and refilled
  from further pool prompts; every sampled rollout counts in the cost.
* ``tree_random`` (Tree-GRPO style): ``M_init`` chains per prompt, then ``L`` rounds that each
  expand ``N`` random boundaries (after an observation) per tree with ``K`` continuations.
* ``trace`` (TRACE allocation, spec section 3): stage 1 allocates root rollouts over the pool
  from the success predictor; stage 2 spends the rest on prefixes after observations.

All schemes spend exactly ``M`` rollouts when the pool is large enough; see each class for the
cases where that is impossible. The schemes never train the predictor: the trainer calls
``predictor.update(result.trees)`` after the step (once readiness scores exist).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from tracerl.core.allocation import allocate_prefixes, allocate_roots, root_value
from tracerl.core.types import RolloutTree, Task
from tracerl.rollout.engine import RolloutCost

if TYPE_CHECKING:
    from tracerl.allocation.predictor import SuccessPredictor
    from tracerl.rollout.engine import RolloutEngine

ScoreFn = Callable[[Sequence[RolloutTree], Mapping[str, Task]], object]
"""``ReferenceScorer.score``: writes ``l_k`` (spec section 2 step 1) onto every unscored, not
infra-failed trajectory of the trees in one batched call; already scored ones are skipped."""

SCHEME_NAMES = ("chain", "dapo", "tree_random", "trace")


def _int_at_least(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"SchemeConfig.{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class SchemeConfig:
    """Knobs of all rollout schemes (each scheme reads only its own)."""

    group_size: int = 8
    """``n``: rollouts per prompt for chain and dapo; trace's uniform fallback uses it too."""
    dapo_target_groups: int | None = None
    """Kept (mixed) groups dapo wants; it stops early when reached. None: spend the whole budget."""
    tree_initial: int = 4
    """tree_random: independent chains per prompt before expansion (Tree-GRPO's M)."""
    tree_rounds: int = 2
    """tree_random: expansion rounds (L)."""
    tree_expand_nodes: int = 2
    """tree_random: random boundaries expanded per tree and round (N)."""
    tree_continuations: int = 1
    """tree_random: continuations per expanded boundary."""
    trace_stage1_fraction: float = 0.5
    """trace: share of the budget spent on root rollouts in stage 1 (rest: prefix expansion)."""
    trace_min_per_prompt: int | None = None
    """trace: rollouts a selected prompt gets at least. None: ``group_size``, a full group as chain
    gives every prompt (measured: 2.3x chain's effective ratio, against 1.2x with the spec's floor
    of 2, which spreads stage 1 over many pairs that a low success rate rarely mixes)."""
    trace_max_per_prompt: int | None = None
    """trace: cap on stage-1 rollouts per prompt (None: no cap)."""
    trace_max_per_anchor: int = 4
    """trace: cap on continuations per anchor and round."""
    trace_rounds: int = 1
    """trace: stage-2 rounds; round r > 1 branches from the boundaries that round r-1 created."""
    trace_candidates: int | None = None
    """trace: prompts of the pool considered in stage 1 (None: the whole pool)."""

    def __post_init__(self) -> None:
        for name, minimum in (
            ("group_size", 1), ("tree_initial", 1), ("tree_rounds", 0), ("tree_expand_nodes", 1),
            ("tree_continuations", 1), ("trace_max_per_anchor", 1),
            ("trace_rounds", 0),
        ):
            _int_at_least(name, getattr(self, name), minimum)
        for name in ("dapo_target_groups", "trace_candidates", "trace_min_per_prompt"):
            if getattr(self, name) is not None:
                _int_at_least(name, getattr(self, name), 1)
        if self.trace_max_per_prompt is not None:
            _int_at_least("trace_max_per_prompt", self.trace_max_per_prompt, self.min_per_prompt)
        frac = self.trace_stage1_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 < frac <= 1.0:
            raise ValueError(f"SchemeConfig.trace_stage1_fraction must lie in (0, 1], got {frac!r}")

    @property
    def min_per_prompt(self) -> int:
        """trace's stage-1 floor per selected prompt (``trace_min_per_prompt``, else ``group_size``)."""
        return self.group_size if self.trace_min_per_prompt is None else self.trace_min_per_prompt

    @property
    def tree_cost_per_prompt(self) -> int:
        """Planned rollouts per prompt of tree_random: ``M_init + L * N * K``."""
        return self.tree_initial + self.tree_rounds * self.tree_expand_nodes * self.tree_continuations


@dataclass
class SchemeResult:
    """One step's batch: the trees to train on and what they cost."""

    trees: list[RolloutTree]
    cost: RolloutCost
    effective_ratio: float
    """Share of the batch's prompts whose group mixes success (r > 0.5) and failure."""
    consumed: int
    """Pool prompts this scheme looked at, in pool order (the trainer advances its cursor)."""
    info: dict[str, float] = field(default_factory=dict)
    """Scheme-specific counters (dropped groups, stage costs, anchors, ...)."""
    expansions: list[tuple[str, int, int]] = field(default_factory=list)
    """Every branch request made, in order: (tree id, node id, continuations); node 0 = root."""


class RolloutScheme(Protocol):
    name: str

    def collect(
        self, engine: RolloutEngine, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None
    ) -> SchemeResult: ...


# --------------------------------------------------------------------------- helpers
def _valid_rewards(tree: RolloutTree) -> list[float]:
    return [t.reward for t in tree.trajectories.values() if not t.infra_failed]


def group_outcomes(trees: Sequence[RolloutTree]) -> dict[str, list[float]]:
    """Rewards of the finished, non-infra-failed leaves of each prompt (task id), all trees pooled."""
    groups: dict[str, list[float]] = {}
    for tree in trees:
        groups.setdefault(tree.task_id, []).extend(_valid_rewards(tree))
    return groups


def is_mixed(rewards: Sequence[float]) -> bool:
    """At least one success (r > 0.5) and one failure (r <= 0.5), spec section 1."""
    return any(r > 0.5 for r in rewards) and any(r <= 0.5 for r in rewards)


def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of the prompts in ``trees`` whose group is mixed (0.0 for an empty batch)."""
    groups = group_outcomes(trees)
    return sum(is_mixed(g) for g in groups.values()) / len(groups) if groups else 0.0


def _summary(trees: Sequence[RolloutTree]) -> dict[str, float]:
    groups = group_outcomes(trees)
    mixed = [g for g in groups.values() if is_mixed(g)]
    leaves = sum(len(g) for g in groups.values())
    return {
        "prompts": float(len(groups)),
        "mixed_prompts": float(len(mixed)),
        "leaves": float(leaves),
        "informative_leaves": float(sum(len(g) for g in mixed)),
        "success_rate": sum(r > 0.5 for g in groups.values() for r in g) / leaves if leaves else 0.0,
    }


def _result(
    trees: list[RolloutTree],
    cost: RolloutCost,
    consumed: int,
    expansions: list[tuple[str, int, int]] | None = None,
    **info: float,
) -> SchemeResult:
    return SchemeResult(trees, cost, effective_ratio(trees), consumed, {**_summary(trees), **info}, expansions or [])


def _tree_ids(pool_indices: Sequence[int], pool: Sequence[Task]) -> list[str]:
    """Unique within a step even when the pool repeats a task."""
    return [f"{pool[i].id}@{i}" for i in pool_indices]


def _python_rng(generator: torch.Generator | None) -> random.Random:
    """A Python RNG seeded from the step's torch generator, so runs are reproducible."""
    return random.Random(int(torch.randint(0, 2**62, (1,), generator=generator).item()))


def _check_budget(budget: int) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be an integer >= 1 continuation rollouts, got {budget!r}")


def expandable_nodes(tree: RolloutTree, since: int = 0) -> list[int]:
    """Non-leaf nodes right after an observation (ids >= ``since``): where branching is allowed.

    The root is also a boundary but is not an *expansion* point here: a root continuation is a
    fresh independent rollout, which the schemes only use to spend leftover budget.
    """
    return [
        n.id
        for n in tree.nodes[since:]
        if n.parent is not None and n.turn is not None and n.turn.is_transition and not n.is_leaf
    ]


def _expand(
    engine: RolloutEngine,
    plan: dict[tuple[int, int], int],
    trees: Sequence[RolloutTree],
    generator: torch.Generator | None,
    log: list[tuple[str, int, int]],
) -> RolloutCost:
    """Run one batched ``engine.expand`` for ``plan`` ((tree index, node id) -> k); log it."""
    requests = [(trees[t], nid, k) for (t, nid), k in sorted(plan.items()) if k > 0]
    log.extend((tree.tree_id, nid, k) for tree, nid, k in requests)
    return engine.expand(requests, generator=generator) if requests else RolloutCost()


# --------------------------------------------------------------------------- chain / dapo
class ChainScheme:
    """GRPO: ``n`` independent rollouts for each of the first ``budget // n`` pool prompts."""

    name = "chain"

    def __init__(self, config: SchemeConfig) -> None:
        self.config = config

    def collect(
        self, engine: RolloutEngine, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None
    ) -> SchemeResult:
        n = self.config.group_size
        prompts = _groups_for(budget, n, pool, self.name)
        trees, cost = engine.rollout(
            list(pool[:prompts]), [n] * prompts, tree_ids=_tree_ids(range(prompts), pool), generator=generator
        )
        return _result(trees, cost, prompts)


def _groups_for(budget: int, n: int, pool: Sequence[Task], scheme: str) -> int:
    _check_budget(budget)
    if budget % n:
        raise ValueError(f"{scheme}: budget {budget} is not a multiple of group_size {n}")
    if budget // n > len(pool):
        raise ValueError(f"{scheme}: budget {budget} needs {budget // n} prompts, the pool holds {len(pool)}")
    return budget // n


class DapoScheme:
    """DAPO dynamic sampling under a fixed budget.

    Samples waves of groups of ``n`` from the pool in order, drops groups whose valid rewards are
    all equal (zero advantage), and refills while budget and pool remain. With
    ``dapo_target_groups=None`` the whole budget is spent in one wave and the kept groups are
    returned (cost == budget). With a target it stops once the target is kept (cost may then be
    below the budget) and returns at most ``target`` groups. Dropped rollouts count in the cost.
    """

    name = "dapo"

    def __init__(self, config: SchemeConfig) -> None:
        self.config = config

    def collect(
        self, engine: RolloutEngine, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None
    ) -> SchemeResult:
        n, target = self.config.group_size, self.config.dapo_target_groups
        if target is None:
            _groups_for(budget, n, pool, self.name)
        else:
            _check_budget(budget)
        kept: list[RolloutTree] = []
        cost, cursor, dropped = RolloutCost(), 0, 0
        while True:
            want = (budget - cost.rollouts) // n
            if target is not None:
                want = min(want, target - len(kept))
            want = min(want, len(pool) - cursor)
            if want <= 0:
                break
            idx = list(range(cursor, cursor + want))
            trees, wave_cost = engine.rollout(
                [pool[i] for i in idx], [n] * want, tree_ids=_tree_ids(idx, pool), generator=generator
            )
            cost, cursor = cost + wave_cost, cursor + want
            for tree in trees:
                rewards = _valid_rewards(tree)
                if len(set(rewards)) > 1:
                    kept.append(tree)
                else:
                    dropped += 1
        if target is not None:
            kept = kept[:target]
        return _result(kept, cost, cursor, dropped_groups=float(dropped))


# --------------------------------------------------------------------------- tree_random
class TreeRandomScheme:
    """Tree-GRPO style random expansion (no predictor).

    ``P = budget // (M_init + L*N*K)`` prompts each start ``M_init`` chains; each of ``L`` rounds
    picks ``N`` distinct random expandable boundaries per tree (after an observation, not a
    leaf) and gives each ``K`` continuations. Shortfalls (a tree with fewer boundaries) and the
    budget remainder are spent on random boundaries of any tree, and, when no tree has one
    (every rollout answered without a tool call), on root continuations, so cost == budget.
    """

    name = "tree_random"

    def __init__(self, config: SchemeConfig) -> None:
        self.config = config

    def collect(
        self, engine: RolloutEngine, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None
    ) -> SchemeResult:
        cfg = self.config
        _check_budget(budget)
        per_prompt = cfg.tree_cost_per_prompt
        prompts = budget // per_prompt
        if prompts < 1:
            raise ValueError(f"tree_random: budget {budget} is below one prompt's planned cost {per_prompt}")
        if prompts > len(pool):
            raise ValueError(f"tree_random: budget {budget} needs {prompts} prompts, the pool holds {len(pool)}")
        rng = _python_rng(generator)
        trees, cost = engine.rollout(
            list(pool[:prompts]), [cfg.tree_initial] * prompts, tree_ids=_tree_ids(range(prompts), pool),
            generator=generator,
        )
        log: list[tuple[str, int, int]] = []
        per_round = prompts * cfg.tree_expand_nodes * cfg.tree_continuations
        for rnd in range(cfg.tree_rounds):
            left = budget - cost.rollouts
            spend = left if rnd == cfg.tree_rounds - 1 else min(left, per_round)
            cost = cost + _expand(engine, self._plan(trees, spend, rng), trees, generator, log)
        left = budget - cost.rollouts
        if left > 0:  # tree_rounds == 0: spend the remainder on root continuations
            cost = cost + _expand(engine, _round_robin_roots(len(trees), left), trees, generator, log)
        return _result(trees, cost, prompts, log)

    def _plan(self, trees: Sequence[RolloutTree], spend: int, rng: random.Random) -> dict[tuple[int, int], int]:
        cfg = self.config
        plan: dict[tuple[int, int], int] = {}
        candidates = [expandable_nodes(tree) for tree in trees]
        left = spend
        for t, nodes in enumerate(candidates):
            for nid in rng.sample(nodes, min(cfg.tree_expand_nodes, len(nodes))):
                k = min(cfg.tree_continuations, left)
                if k > 0:
                    plan[(t, nid)] = plan.get((t, nid), 0) + k
                    left -= k
        anywhere = [(t, nid) for t, nodes in enumerate(candidates) for nid in nodes]
        while left > 0 and anywhere:
            key = rng.choice(anywhere)
            plan[key] = plan.get(key, 0) + 1
            left -= 1
        for key, k in _round_robin_roots(len(trees), left).items():
            plan[key] = plan.get(key, 0) + k
        return plan


def _round_robin_roots(num_trees: int, rollouts: int) -> dict[tuple[int, int], int]:
    """Spread ``rollouts`` root continuations over the trees, earlier trees first."""
    plan: dict[tuple[int, int], int] = {}
    for i in range(rollouts if num_trees else 0):
        plan[(i % num_trees, 0)] = plan.get((i % num_trees, 0), 0) + 1
    return plan


# --------------------------------------------------------------------------- trace
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

    With ``score`` (``ReferenceScorer.score``) new leaves are scored in one batched call before
    their prefixes are valued, so the predictor sees ``l_k``/``V_k`` at allocation time as it did
    when trained; the scores stay on the trajectories (and tree nodes) for TRACE credit to reuse,
    and the trainer's own call with the same callable finds them scored.
    """

    name = "trace"

    def __init__(
        self,
        config: SchemeConfig,
        predictor: SuccessPredictor | None = None,
        score: ScoreFn | None = None,
    ) -> None:
        self.config = config
        self.predictor = predictor
        self.score = score

    def collect(
        self, engine: RolloutEngine, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None
    ) -> SchemeResult:
        cfg = self.config
        _check_budget(budget)
        cands = list(pool[: cfg.trace_candidates or len(pool)])
        if not cands:
            raise ValueError("trace: the prompt pool is empty")
        values = self._root_values(engine, cands)
        counts = self._root_counts(values, self._stage1_budget(budget, len(cands)))
        chosen = [i for i, c in enumerate(counts) if c > 0]
        trees, cost = engine.rollout(
            [cands[i] for i in chosen], [counts[i] for i in chosen], tree_ids=_tree_ids(chosen, cands),
            generator=generator,
        )
        tasks = {t.id: t for t in cands}
        self._score(trees, tasks)
        info = {"stage1_prompts": float(len(chosen)), "stage1_rollouts": float(cost.rollouts)}
        info["anchors"], info["stage2_rollouts"] = 0.0, 0.0
        log: list[tuple[str, int, int]] = []
        since = [0] * len(trees)  # round 0 branches from every stage-1 boundary
        for rnd in range(cfg.trace_rounds):
            spend = (budget - cost.rollouts) // (cfg.trace_rounds - rnd)
            anchors = self._anchors(trees, since)
            since = [len(t.nodes) for t in trees]
            if not anchors or spend <= 0:
                continue
            probs = self._node_values([trees[t] for t, _, _ in anchors], [nid for _, nid, _ in anchors])
            ks = allocate_prefixes(probs, [r for _, _, r in anchors], spend, max_per_anchor=cfg.trace_max_per_anchor)
            plan = {(t, nid): k for (t, nid, _), k in zip(anchors, ks) if k > 0}
            step_cost = _expand(engine, plan, trees, generator, log)
            cost = cost + step_cost
            info["anchors"] += len(anchors)
            info["stage2_rollouts"] += step_cost.rollouts
            self._score(trees, tasks)
        left = budget - cost.rollouts
        if left > 0:
            topup = _root_topup(trees, [values[i] for i in chosen], left)
            cost = cost + _expand(engine, topup, trees, generator, log)
        info["root_topup"] = float(left)
        return _result(trees, cost, len(cands), log, **info)

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

    def _root_values(self, engine: RolloutEngine, cands: Sequence[Task]) -> list[float]:
        if self.predictor is None:
            return [0.5] * len(cands)
        prompts = [engine.prompt_ids(t) for t in cands]
        return self.predictor.predict_roots([t.id for t in cands], prompts)

    def _node_values(self, trees: Sequence[RolloutTree], node_ids: Sequence[int]) -> list[float]:
        if self.predictor is None:
            return [0.5] * len(node_ids)
        return self.predictor.predict_nodes(trees, node_ids)

    def _root_counts(self, values: Sequence[float], stage1: int) -> list[int]:
        """Stage-1 counts spending ``stage1``, or the most below it that the bounds allow.

        (Only odd corners need less, e.g. ``min == max == 2`` and an odd ``stage1``; the rest then
        goes to stage 2.)
        """
        constant = max(values) - min(values) <= 1e-9
        for spend in range(stage1, self.config.min_per_prompt - 1, -1):
            counts = self._uniform_counts(len(values), spend) if constant else self._optimal_counts(values, spend)
            if counts is not None:
                return counts
        raise ValueError(f"trace: no stage-1 allocation of at most {stage1} rollouts fits the per-prompt bounds")

    def _optimal_counts(self, values: Sequence[float], spend: int) -> list[int] | None:
        cfg = self.config
        try:
            return allocate_roots(
                values, spend, min_per_prompt=cfg.min_per_prompt, max_per_prompt=cfg.trace_max_per_prompt
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

    def _score(self, trees: Sequence[RolloutTree], tasks: dict[str, Task]) -> None:
        if self.score is not None:
            self.score(trees, tasks)


def _root_topup(trees: Sequence[RolloutTree], values: Sequence[float], left: int) -> dict[tuple[int, int], int]:
    """Extra root rollouts, greedy by marginal ``root_value`` gain (concave for m >= 1)."""
    sizes = [len(tree.leaves()) for tree in trees]
    plan: dict[tuple[int, int], int] = {}
    for _ in range(left if trees else 0):
        gains = [root_value(v, m + 1) - root_value(v, m) for v, m in zip(values, sizes)]
        best = max(range(len(gains)), key=lambda i: (gains[i], -i))
        sizes[best] += 1
        plan[(best, 0)] = plan.get((best, 0), 0) + 1
    return plan


# --------------------------------------------------------------------------- registry
def get_scheme(
    name: str,
    config: SchemeConfig | None = None,
    predictor: SuccessPredictor | None = None,
    score: ScoreFn | None = None,
) -> RolloutScheme:
    """The scheme called ``name``; ``predictor``/``score`` are used by ``trace`` only.

    ``trace`` without a predictor is the uniform+uniform ablation (every value 0.5).
    """
    cfg = config if config is not None else SchemeConfig()
    if name == "chain":
        return ChainScheme(cfg)
    if name == "dapo":
        return DapoScheme(cfg)
    if name == "tree_random":
        return TreeRandomScheme(cfg)
    if name == "trace":
        return TraceScheme(cfg, predictor, score)
    raise ValueError(f"unknown rollout scheme {name!r}; valid names: {', '.join(SCHEME_NAMES)}")
