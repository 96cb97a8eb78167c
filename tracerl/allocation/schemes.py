"""Rollout schemes: how one training step spends its budget of continuation rollouts.

Schemes are planners: they read tree snapshots (and the success predictor) and emit requests
through a :class:`~tracerl.allocation.session.RolloutSession` (start trees, expand
``(tree_id, node_id, k)``, score readiness); an executor runs them
(:mod:`tracerl.rollout.executor`). Every scheme takes the same inputs (a session, or an
executor it wraps in one; an ordered pool of candidate prompts; a budget ``M``
of continuation rollouts; a torch generator for its own random choices and, without an
explicit ``seed``, the step's seed) and returns the same :class:`SchemeResult`:
rollout trees (one per sampled prompt), the sampling cost counted both ways (continuation
rollouts and generated tokens, spec section 1) and the batch's effective ratio.

* ``chain`` (GRPO): ``n`` independent rollouts for each of the first ``M // n`` prompts.
* ``dapo`` (DAPO dynamic sampling): groups of ``n``; all-same groups are dropped and refilled
  from further pool prompts; every sampled rollout counts in the cost.
* ``tree_random`` (Tree-GRPO style): ``M_init`` chains per prompt, then ``L`` rounds that each
  expand ``N`` random boundaries (after an observation) per tree with ``K`` continuations.
* ``trace`` (TRACE allocation, spec section 3): stage 1 allocates root rollouts over the pool
  from the success predictor; stage 2 spends the rest on prefixes after observations.

Outcome statistics (groups, mixed, effective ratio) live in :mod:`tracerl.allocation.outcomes`.
All schemes spend exactly ``M`` rollouts when the pool is large enough; see each class for the
cases where that is impossible. The schemes never train the predictor: the trainer calls
``predictor.update(result.trees)`` after the step (once readiness scores exist).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tracerl.core.registry import Registry
from tracerl.core.types import RolloutTree, Task
from tracerl.core.protocol import RolloutCost
from tracerl.allocation.outcomes import (  # noqa: F401 - group_outcomes, is_mixed re-exported (home: outcomes.py)
    _summary,
    _valid_rewards,
    effective_ratio,
    group_outcomes,
    is_mixed,
)
from tracerl.allocation.session import RolloutSession, as_session

if TYPE_CHECKING:
    from tracerl.allocation.predictor import SuccessPredictor

Target = Any
"""What ``collect`` runs on: a RolloutSession or a rollout executor (wrapped in a session)."""

SCHEME_NAMES = ("chain", "dapo", "tree_random", "trace")
"""The built-in schemes (:data:`SCHEMES` holds them and any registered later)."""


TRACE_ARMS = ("learned", "uniform")
"""Values of ``trace_roots`` / ``trace_prefixes``: predictor-driven or uniform (the 2x2 ablation)."""


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
    trace_roots: str = "learned"
    """trace stage 1: ``learned`` (allocate_roots on the predictor's root values) or ``uniform``
    (the same budget in groups of about ``group_size`` on the first pool prompts, as chain does,
    and the root top-up round-robin): the roots arm of the allocation 2x2 ablation."""
    trace_prefixes: str = "learned"
    """trace stage 2: ``learned`` (allocate_prefixes on the predictor's anchor values) or
    ``uniform`` (the same budget on anchors drawn uniformly at random, seeded by the step, one
    continuation each in turn up to ``trace_max_per_anchor``): the prefixes arm of the 2x2."""

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
        for name in ("trace_roots", "trace_prefixes"):
            if getattr(self, name) not in TRACE_ARMS:
                raise ValueError(f"SchemeConfig.{name} must be one of {', '.join(TRACE_ARMS)}, got {getattr(self, name)!r}")
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
        self, target: Target, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> SchemeResult: ...


# --------------------------------------------------------------------------- helpers
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


def plan_requests(plan: dict[tuple[int, int], int], trees: Sequence[RolloutTree]) -> list[tuple[str, int, int]]:
    """``(tree_id, node_id, k)`` requests of ``plan`` ((tree index, node id) -> k), in a canonical order."""
    return [(trees[t].tree_id, nid, k) for (t, nid), k in sorted(plan.items()) if k > 0]


def _expand(session: RolloutSession, plan: dict[tuple[int, int], int], trees: Sequence[RolloutTree]) -> RolloutCost:
    """Send ``plan`` as one batched expansion (the session logs it)."""
    return session.expand(plan_requests(plan, trees))


# --------------------------------------------------------------------------- chain / dapo
class ChainScheme:
    """GRPO: ``n`` independent rollouts for each of the first ``budget // n`` pool prompts."""

    name = "chain"

    def __init__(self, config: SchemeConfig) -> None:
        self.config = config

    def collect(
        self, target: Target, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> SchemeResult:
        n = self.config.group_size
        prompts = _groups_for(budget, n, pool, self.name)
        session = as_session(target, generator, seed)
        trees, cost = session.start(list(pool[:prompts]), [n] * prompts, _tree_ids(range(prompts), pool))
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
        self, target: Target, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> SchemeResult:
        n, wanted = self.config.group_size, self.config.dapo_target_groups
        if wanted is None:
            _groups_for(budget, n, pool, self.name)
        else:
            _check_budget(budget)
        session = as_session(target, generator, seed)
        kept: list[RolloutTree] = []
        cost, cursor, dropped = RolloutCost(), 0, 0
        while True:
            want = (budget - cost.rollouts) // n
            if wanted is not None:
                want = min(want, wanted - len(kept))
            want = min(want, len(pool) - cursor)
            if want <= 0:
                break
            idx = list(range(cursor, cursor + want))
            trees, wave_cost = session.start([pool[i] for i in idx], [n] * want, _tree_ids(idx, pool))
            cost, cursor = cost + wave_cost, cursor + want
            for tree in trees:
                rewards = _valid_rewards(tree)
                if len(set(rewards)) > 1:
                    kept.append(tree)
                else:
                    dropped += 1
        if wanted is not None:
            kept = kept[:wanted]
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
        self, target: Target, pool: Sequence[Task], budget: int, generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> SchemeResult:
        cfg = self.config
        _check_budget(budget)
        per_prompt = cfg.tree_cost_per_prompt
        prompts = budget // per_prompt
        if prompts < 1:
            raise ValueError(f"tree_random: budget {budget} is below one prompt's planned cost {per_prompt}")
        if prompts > len(pool):
            raise ValueError(f"tree_random: budget {budget} needs {prompts} prompts, the pool holds {len(pool)}")
        session = as_session(target, generator, seed)
        rng = _python_rng(generator)
        trees, cost = session.start(list(pool[:prompts]), [cfg.tree_initial] * prompts, _tree_ids(range(prompts), pool))
        per_round = prompts * cfg.tree_expand_nodes * cfg.tree_continuations
        for rnd in range(cfg.tree_rounds):
            left = budget - cost.rollouts
            spend = left if rnd == cfg.tree_rounds - 1 else min(left, per_round)
            cost = cost + _expand(session, self._plan(trees, spend, rng), trees)
        left = budget - cost.rollouts
        if left > 0:  # tree_rounds == 0: spend the remainder on root continuations
            cost = cost + _expand(session, _round_robin_roots(len(trees), left), trees)
        return _result(trees, cost, prompts, session.expansions)

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


# --------------------------------------------------------------------------- registry
SchemeFactory = Any
"""``(config, predictor, score) -> RolloutScheme``: what :data:`SCHEMES` holds."""


def _plain(cls: type) -> SchemeFactory:
    """A factory for a scheme that needs neither the predictor nor the scorer."""

    def make(config: SchemeConfig, predictor: Any = None, score: Any = None) -> RolloutScheme:
        return cls(config)

    make.__name__ = f"make_{cls.__name__}"
    return make


SCHEMES: Registry[SchemeFactory] = Registry("rollout scheme")
"""Rollout schemes by name (``rollout.scheme``); a ``package.module:factory`` path works too."""
SCHEMES.add("chain", _plain(ChainScheme))
SCHEMES.add("dapo", _plain(DapoScheme))
SCHEMES.add("tree_random", _plain(TreeRandomScheme))
SCHEMES.add_lazy("trace", "tracerl.allocation.trace_scheme:TraceScheme")  # lives with the predictor


def get_scheme(
    name: str,
    config: SchemeConfig | None = None,
    predictor: SuccessPredictor | None = None,
    score: bool | None = None,
) -> RolloutScheme:
    """The scheme called ``name`` (or at an import path); ``predictor``/``score`` are used by ``trace``.

    ``score``: trace asks the executor for readiness after each stage (the executor holds the
    scorer). ``trace`` without a predictor spreads both stages evenly in pool
    and anchor order; the allocation 2x2 ablation arms are ``trace_roots`` / ``trace_prefixes``.
    """
    return SCHEMES.get(name)(config if config is not None else SchemeConfig(), predictor, score)
