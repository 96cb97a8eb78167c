"""The allocation 2x2 ablation: uniform or learned roots x uniform or learned prefixes."""

from __future__ import annotations

import random

import pytest
import torch
from alloc_world import make_engine, shared
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor
from tracerl.allocation.trace_scheme import TraceScheme, uniform_prefixes
from tracerl.allocation.schemes import SchemeConfig, get_scheme
from tracerl.rollout.executor import LocalExecutor
from tracerl.allocation.session import as_session
from tracerl.config.schema import PRESETS, resolve_config
from tracerl.config.loading import ConfigError

BUDGET = 32
ARMS = [("learned", "learned"), ("uniform", "uniform"), ("uniform", "learned"), ("learned", "uniform")]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 40), st.integers(1, 4), st.integers(0, 10**6))
def test_uniform_prefixes_spend_what_the_learned_allocator_spends(anchors: int, spend: int, cap: int, seed: int) -> None:
    ks = uniform_prefixes(anchors, spend, cap, random.Random(seed))
    assert sum(ks) == min(spend, anchors * cap)  # allocate_prefixes' documented total
    assert max(ks) <= cap and max(ks) - min(ks) <= 1
    assert ks == uniform_prefixes(anchors, spend, cap, random.Random(seed))  # seeded: deterministic


def test_uniform_prefixes_choose_anchors_at_random() -> None:
    # 2 continuations over 10 anchors: each anchor is picked with probability 1/5.
    picks = [0] * 10
    for seed in range(2000):
        for a, k in enumerate(uniform_prefixes(10, 2, 4, random.Random(seed))):
            picks[a] += k
    assert sum(picks) == 4000
    assert all(abs(p / 2000 - 0.2) < 0.04 for p in picks), picks


def test_arms_are_validated_naming_the_field() -> None:
    with pytest.raises(ValueError, match="SchemeConfig.trace_prefixes must be one of learned, uniform"):
        SchemeConfig(trace_prefixes="random")
    with pytest.raises(ConfigError, match="rollout.schemes.trace_roots must be one of learned, uniform"):
        resolve_config("trace_alloc", overrides=["rollout.schemes.trace_roots=greedy"])


@pytest.mark.parametrize("roots,prefixes", ARMS)
def test_presets_differ_from_trace_alloc_only_in_the_arms(roots: str, prefixes: str) -> None:
    name = "trace_alloc" if (roots, prefixes) == ("learned", "learned") else f"trace_alloc_{roots[0]}{prefixes[0]}"
    cfg, base = resolve_config(name), resolve_config("trace_alloc")
    assert (cfg.rollout.schemes.trace_roots, cfg.rollout.schemes.trace_prefixes) == (roots, prefixes)
    assert cfg.algo == base.algo and cfg.rollout.scheme == "trace" and cfg.rollout.budget == base.rollout.budget
    assert name in PRESETS


def _predictor(engine, tasks, seed: int) -> SuccessPredictor:
    pred = SuccessPredictor(PredictorConfig(seed=seed))
    trees, _ = engine.rollout(tasks, [6] * len(tasks), generator=torch.Generator().manual_seed(seed))
    pred.update(trees)
    engine.forget(trees)
    return pred


@pytest.fixture(scope="module")
def setup():
    w, env, policy = shared()
    engine = make_engine(policy, env)
    # Two predictors that disagree (trained on different prompts and seeds).
    return w, engine, _predictor(engine, w.train[:6], 5), _predictor(engine, w.train[6:12], 9)


def test_uniform_plans_do_not_depend_on_the_predictor(setup) -> None:
    w, engine, pred_a, pred_b = setup
    pool = w.train[:8]
    prompts = [engine.prompt_ids(t) for t in pool]
    cfg = SchemeConfig(group_size=4, trace_min_per_prompt=2, trace_max_per_anchor=2)
    assert pred_a.predict_roots([t.id for t in pool], prompts) != pred_b.predict_roots([t.id for t in pool], prompts)
    # Stage 1: learned roots follow the predictor; uniform roots do not (groups of 4 on the first prompts).
    learned = [TraceScheme(cfg, p).plan_stage1(prompts, pool, BUDGET)[1] for p in (pred_a, pred_b)]
    uniform_cfg = SchemeConfig(**{**cfg.__dict__, "trace_roots": "uniform"})
    uniform = [TraceScheme(uniform_cfg, p).plan_stage1(prompts, pool, BUDGET)[1] for p in (pred_a, pred_b, None)]
    assert uniform[0] == uniform[1] == uniform[2] == [4, 4, 4, 4, 0, 0, 0, 0]
    assert sum(learned[0]) == sum(learned[1]) == sum(uniform[0]) == BUDGET // 2
    # Stage 2 on one snapshot: same seed, same uniform requests whatever the predictor.
    trees, _ = engine.rollout(pool[:4], [4] * 4, generator=torch.Generator().manual_seed(1))
    since = [0] * len(trees)
    plans = {}
    for arm in ("learned", "uniform"):
        arm_cfg = SchemeConfig(**{**cfg.__dict__, "trace_prefixes": arm})
        plans[arm] = [TraceScheme(arm_cfg, p).plan_stage2(trees, since, 12, seed=3) for p in (pred_a, pred_b)]
    (ua, na), (ub, nb) = plans["uniform"]
    assert ua == ub and na == nb > 0
    if 12 < 2 * na:  # not every anchor is full: another seed draws other anchors
        other = SchemeConfig(**{**cfg.__dict__, "trace_prefixes": "uniform"})
        assert TraceScheme(other, pred_a).plan_stage2(trees, since, 12, seed=4)[0] != ua
    for requests, anchors in plans["learned"]:  # the learned planner spends exactly as much on as many anchors
        assert anchors == na and sum(k for *_, k in requests) == sum(k for *_, k in ua) == min(12, 2 * na)
    engine.forget(trees)


@pytest.mark.parametrize("roots,prefixes", ARMS)
def test_every_arm_spends_the_budget_with_the_same_stage_split(setup, roots: str, prefixes: str) -> None:
    w, engine, pred_a, _ = setup
    cfg = SchemeConfig(group_size=4, trace_roots=roots, trace_prefixes=prefixes)
    session = as_session(LocalExecutor(engine), seed=11)
    result = get_scheme("trace", cfg, predictor=pred_a).collect(session, w.train[:8], BUDGET)
    assert result.cost.rollouts == BUDGET
    assert result.info["stage1_rollouts"] == BUDGET // 2
    assert result.info["stage2_rollouts"] + result.info["root_topup"] == BUDGET // 2
    session.forget()
