"""Stage-1 options of the trace scheme beside the paper's (floor m_min, coverage, exploration):
each plan is the exact optimum of its own objective (brute force on small pools), and a collect
spends the budget with the planned stage split."""

from __future__ import annotations

import itertools

import pytest
import torch
from alloc_world import make_engine, shared

from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor
from tracerl.allocation.trace_scheme import TraceScheme
from tracerl.core.allocation import allocate_roots, exploration_prompts, root_value
from tracerl.allocation.schemes import SchemeConfig, get_scheme
from tracerl.allocation.session import as_session
from tracerl.rollout.executor import LocalExecutor
from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError


def best(values: list[float], budget: int, choices: list[int]) -> float:
    """Brute-force optimum of sum Vroot over count vectors drawn from ``choices`` summing to ``budget``."""
    return max(sum(root_value(v, m) for v, m in zip(values, c, strict=True))
               for c in itertools.product(choices, repeat=len(values)) if sum(c) == budget)


@pytest.fixture(scope="module")
def setup():
    w, env, policy = shared()
    engine = make_engine(policy, env)
    pred = SuccessPredictor(PredictorConfig(seed=5))
    trees, _ = engine.rollout(w.train[:6], [6] * 6, generator=torch.Generator().manual_seed(5))
    pred.update(trees)
    engine.forget(trees)
    return w, engine, pred


def _plan(setup, cfg: SchemeConfig, n: int, budget: int, seed: int = 0) -> tuple[list[float], list[int]]:
    w, engine, pred = setup
    pool = w.train[:n]
    return TraceScheme(cfg, pred).plan_stage1([engine.prompt_ids(t) for t in pool], pool, budget, seed=seed)


def test_floor_is_exact_and_reaches_every_prompt(setup) -> None:
    cfg = SchemeConfig(group_size=4, trace_floor_per_prompt=2)  # counts 2 or 4..16
    values, counts = _plan(setup, cfg, 5, 32)
    assert len(set(values)) > 1  # a trained predictor: the DP, not the uniform fallback
    assert sum(counts) == 16 and min(counts) >= 2 and all(c == 2 or c >= 4 for c in counts)
    got = sum(root_value(v, m) for v, m in zip(values, counts, strict=True))
    assert got == pytest.approx(best(values, 16, [2, *range(4, 17)]), abs=1e-12)


def test_coverage_decides_how_many_not_which(setup) -> None:
    cfg = SchemeConfig(group_size=8, trace_root_mode="coverage")
    values, counts = _plan(setup, cfg, 4, 24)  # stage 1: 12 rollouts over 4 prompts, each >= 2
    assert sum(counts) == 12 and min(counts) >= 2
    got = sum(root_value(v, m) for v, m in zip(values, counts, strict=True))
    assert got == pytest.approx(best(values, 12, list(range(2, 13))), abs=1e-12)
    cold = TraceScheme(cfg, None).plan_stage1([], setup[0].train[:4], 26)[1]  # no predictor: even spread
    assert cold == [4, 3, 3, 3]


def test_coverage_collect_trains_chains_prompts(setup) -> None:
    w, engine, pred = setup
    cfg = SchemeConfig(group_size=8, trace_root_mode="coverage")
    session = as_session(LocalExecutor(engine), seed=3)
    result = get_scheme("trace", cfg, predictor=pred).collect(session, w.train[:12], 32)
    assert sorted(t.task_id for t in result.trees) == sorted(t.id for t in w.train[:4])  # chain's 32 // 8
    assert result.cost.rollouts == 32 and result.info["stage1_rollouts"] == 16
    session.forget()


def test_exploration_draws_uniformly_then_allocates_the_rest_exactly(setup) -> None:
    cfg = SchemeConfig(group_size=4, trace_min_per_prompt=2, trace_explore_fraction=0.25)
    values, counts = _plan(setup, cfg, 6, 32, seed=7)  # stage 1: 16; 4 of them on 2 drawn prompts
    drawn = exploration_prompts(6, 4, 2, seed=7)
    assert len(drawn) == 2 and all(counts[i] == 2 for i in drawn)
    rest = [i for i in range(6) if i not in drawn]
    assert sum(counts) == 16
    got = sum(root_value(values[i], counts[i]) for i in rest)
    assert got == pytest.approx(best([values[i] for i in rest], 12, [0, *range(2, 13)]), abs=1e-12)


def test_exploration_collect_reports_its_prompts(setup) -> None:
    w, engine, pred = setup
    cfg = SchemeConfig(group_size=4, trace_min_per_prompt=2, trace_explore_fraction=0.5)
    session = as_session(LocalExecutor(engine), seed=4)
    result = get_scheme("trace", cfg, predictor=pred).collect(session, w.train[:8], 32)
    assert result.info["explore_prompts"] == 4.0 and result.cost.rollouts == 32
    session.forget()


def test_default_plan_is_the_papers(setup) -> None:
    """The new knobs at their defaults leave the paper's stage 1 as it was."""
    w, engine, pred = setup
    pool = w.train[:8]
    prompts = [engine.prompt_ids(t) for t in pool]
    cfg = SchemeConfig(group_size=4, trace_min_per_prompt=2)
    values, counts = TraceScheme(cfg, pred).plan_stage1(prompts, pool, 32)
    assert counts == allocate_roots(values, 16, min_per_prompt=2)


def test_floor_that_the_budget_cannot_pay_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="trace_floor_per_prompt"):  # 16 candidates x 3 > 32 stage-1 rollouts
        resolve_config("trace_alloc", overrides=["rollout.schemes.trace_floor_per_prompt=3"])
    with pytest.raises(ConfigError, match="trace_explore_fraction"):
        resolve_config("trace_alloc", overrides=["rollout.schemes.trace_root_mode=coverage",
                                                 "rollout.schemes.trace_explore_fraction=0.2"])


@pytest.mark.parametrize(("field", "value", "match"), [
    ("trace_floor_per_prompt", -1, "trace_floor_per_prompt"),
    ("trace_root_mode", "all", "trace_root_mode must be one of select, coverage"),
    ("trace_explore_fraction", 1.0, "trace_explore_fraction"),
])
def test_options_are_validated(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SchemeConfig(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        resolve_config("trace_alloc", overrides=[f"rollout.schemes.{field}={value}"])
