"""Advantage estimators: hand-computed cases, loop-vs-vectorised, properties, errors."""

from __future__ import annotations

import math

import pytest
import torch
from core_factories import make_traj, make_tree
from core_reference import SLOW, slow_group_adv
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.core.advantages import (
    AdvantageBatch,
    AdvantageOptions,
    available_estimators,
    get_estimator,
    group_outcome_advantage,
    register_estimator,
)
from tracerl.core.types import RolloutTree, Trajectory

ESTIMATORS = ["grpo", "rloo", "gigpo", "tree_anchor", "tree_grpo", "trace_credit"]
SQRT2 = math.sqrt(2.0)


def run(name: str, batch: AdvantageBatch, **options: float | int | str) -> list[torch.Tensor]:
    return get_estimator(name)(batch, AdvantageOptions(**options))  # type: ignore[arg-type]


def assistant_values(traj: Trajectory, adv: torch.Tensor) -> list[list[float]]:
    """The advantage on each turn's assistant span (asserting it is constant there)."""
    out = []
    for start, end in traj.turn_spans:
        span = adv[start:end]
        assert torch.all(span == span[0])
        out.append(span[0].item())
    return out


# ----------------------------------------------------------------------------- group helper


def test_group_outcome_advantage_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = ["a", "a", "a", "a", "b", "b"]
    adv = group_outcome_advantage(rewards, groups)
    # group a: mean 0.5, population std 0.5 -> +-1; group b: std 0 -> 0.
    assert adv.tolist() == [1.0, -1.0, -1.0, 1.0, 0.0, 0.0]
    unbiased = group_outcome_advantage(rewards, groups, std="unbiased")
    s = math.sqrt(4 * 0.25 / 3)
    assert torch.allclose(unbiased, torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0]))
    none = group_outcome_advantage(rewards, groups, std="none")
    assert none.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0]


def test_group_outcome_advantage_excludes_invalid_rows() -> None:
    rewards = torch.tensor([1.0, 0.0, float("nan"), 0.0])
    valid = torch.tensor([True, True, False, True])
    adv = group_outcome_advantage(rewards, [0, 0, 0, 0], valid=valid)
    mean, sd = 1 / 3, math.sqrt(2 / 9)
    expected = [(1 - mean) / sd, -mean / sd, 0.0, -mean / sd]
    assert torch.allclose(adv, torch.tensor(expected))


def test_unbiased_single_valid_member_gets_zero() -> None:
    adv = group_outcome_advantage(
        torch.tensor([1.0, 0.0]), ["a", "a"], std="unbiased", valid=torch.tensor([True, False])
    )
    assert adv.tolist() == [0.0, 0.0]


def test_group_ids_may_be_a_tensor_and_dtype_follows_rewards() -> None:
    adv = group_outcome_advantage(
        torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([7, 7])
    )
    assert adv.dtype == torch.float64 and adv.tolist() == [1.0, -1.0]
    assert group_outcome_advantage(torch.tensor([1, 0]), [0, 0]).dtype == torch.float32


@settings(deadline=None, max_examples=150)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.25, 1.0]) | st.floats(-5, 5),
            st.integers(0, 3),
            st.booleans() | st.just(True),
        ),
        min_size=1,
        max_size=16,
    ),
    std=st.sampled_from(["population", "unbiased", "none"]),
)
def test_group_advantage_matches_loop_and_sums_to_zero(rows: list, std: str) -> None:
    rewards = [r for r, _, _ in rows]
    groups = [g for _, g, _ in rows]
    valid = [v for _, _, v in rows]
    adv = group_outcome_advantage(
        torch.tensor(rewards, dtype=torch.float64), groups, std=std, valid=torch.tensor(valid)
    )
    slow = slow_group_adv(rewards, groups, valid, std)
    assert torch.allclose(adv, torch.tensor(slow, dtype=torch.float64), atol=1e-9)
    for g in set(groups):
        assert abs(sum(adv[i].item() for i in range(len(rows)) if groups[i] == g)) < 1e-9
    assert all(adv[i].item() == 0.0 for i in range(len(rows)) if not valid[i])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: group_outcome_advantage(torch.zeros(2), ["a"]), "group_ids has 1"),
        (lambda: group_outcome_advantage(torch.zeros(2, 1), ["a", "b"]), "1-D"),
        (
            lambda: group_outcome_advantage(torch.tensor([1.0, float("nan")]), ["a", "a"]),
            "non-finite",
        ),
        (lambda: group_outcome_advantage(torch.zeros(2), ["a", "a"], std="mad"), "population"),
        (lambda: group_outcome_advantage(torch.zeros(2), ["a", "a"], eps=0.0), "eps"),
        (lambda: group_outcome_advantage(torch.zeros(2), ["a", "a"], valid=torch.ones(2)), "bool"),
        (
            lambda: group_outcome_advantage(
                torch.zeros(2), ["a", "a"], valid=torch.ones(3, dtype=torch.bool)
            ),
            "shape",
        ),
    ],
)
def test_group_outcome_advantage_errors(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------- registry/options


def test_registry_lists_estimators_and_rejects_unknown_names() -> None:
    assert set(ESTIMATORS) <= set(available_estimators())
    with pytest.raises(ValueError) as info:
        get_estimator("ppo")
    for name in ESTIMATORS:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda batch, options: [])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("std", "mad"),
        ("eps", 0.0),
        ("eps", float("nan")),
        ("omega", float("inf")),
        ("step_gamma", 1.5),
        ("horizon", -1),
        ("horizon", 2.5),
        ("gamma_td", -0.1),
        ("terminal_scale", float("nan")),
        ("credit_eps", 0.0),
        ("w_out", float("inf")),
        ("w_turn", "0.2"),
        ("credit_value", "log"),
    ],
)
def test_options_validation_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AdvantageOptions(**{field: value})  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- hand-computed


def test_grpo_and_rloo_hand_computed() -> None:
    trajs = [make_traj(["s1", "ans"], r) for r in (1.0, 0.0, 0.0, 1.0)]
    trajs.append(make_traj(["ans"], 1.0, group="alone"))
    batch = AdvantageBatch(trajs)
    grpo = run("grpo", batch)
    assert [assistant_values(t, a) for t, a in zip(trajs, grpo, strict=True)] == [
        [1.0, 1.0],
        [-1.0, -1.0],
        [-1.0, -1.0],
        [1.0, 1.0],
        [0.0],
    ]
    rloo = run("rloo", batch)
    # r_i - mean(others): 1 - 1/3 and 0 - 2/3; the singleton gets 0.
    got = [assistant_values(t, a)[0] for t, a in zip(trajs, rloo, strict=True)]
    assert got == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0])


def test_gigpo_hand_computed() -> None:
    # A and B share their first observation (state after "s1"), C saw something else.
    trajs = [
        make_traj(["s1", "ansA"], 1.0),
        make_traj(["s1", "ansB"], 0.0),
        make_traj(["s2", "ansC"], 1.0),
    ]
    out = run("gigpo", AdvantageBatch(trajs), step_gamma=0.5, omega=1.0)
    sd = math.sqrt(2 / 9)
    episode = [(1 - 2 / 3) / sd, (0 - 2 / 3) / sd, (1 - 2 / 3) / sd]
    # Turn 0: all share the root state, R_0 = 0.5 * r: normalising a scaled copy of the
    # rewards gives the episode advantage again. Turn 1: {A, B} -> +-1, C alone -> 0.
    step1 = [1.0, -1.0, 0.0]
    for i, (traj, adv) in enumerate(zip(trajs, out, strict=True)):
        assert assistant_values(traj, adv) == pytest.approx([2 * episode[i], episode[i] + step1[i]])


def test_tree_anchor_hand_computed() -> None:
    # root -> s1 -> {ans1 (r=1), ans2 (r=0)};  root -> s2 -> ans3 (r=0). Anchor: s1.
    tree, trajs = make_tree("t", [["s1", "ans1"], ["s1", "ans2"], ["s2", "ans3"]], [1.0, 0.0, 0.0])
    assert tree.branch_anchors() == [1]
    out = run("tree_anchor", AdvantageBatch(trajs, {"t": tree}))
    g = [SQRT2, -1 / SQRT2, -1 / SQRT2]  # (r - 1/3) / sqrt(2/9)
    expected = [[g[0], g[0] + 1.0], [g[1], g[1] - 1.0], [g[2], g[2]]]
    for traj, adv, exp in zip(trajs, out, expected, strict=True):
        assert assistant_values(traj, adv) == pytest.approx(exp)


def test_tree_anchor_uses_the_deepest_anchor() -> None:
    # s1 branches into s2 / ansX; s2 branches into ansA / ansB. Turn 2 contrasts under s2.
    paths = [["s1", "s2", "ansA"], ["s1", "s2", "ansB"], ["s1", "ansX"]]
    tree, trajs = make_tree("t", paths, [1.0, 0.0, 0.0])
    out = run("tree_anchor", AdvantageBatch(trajs, {"t": tree}))
    g = [SQRT2, -1 / SQRT2, -1 / SQRT2]
    # Under s1 (all three leaves) the local advantage is the group one again.
    assert assistant_values(trajs[0], out[0]) == pytest.approx([g[0], 2 * g[0], g[0] + 1.0])
    assert assistant_values(trajs[1], out[1]) == pytest.approx([g[1], 2 * g[1], g[1] - 1.0])
    assert assistant_values(trajs[2], out[2]) == pytest.approx([g[2], 2 * g[2]])


def test_tree_grpo_hand_computed() -> None:
    # Two Tree-GRPO trees of one prompt under one RolloutTree root: tree s1 holds leaves
    # {A: 1, B: 0, C: 0} (B branched at s2, C at s1), tree s3 holds {D: 1}; a chain E (r=0) of
    # the same prompt is a tree of its own.
    paths = [["s1", "s2", "ansA"], ["s1", "s2", "ansB"], ["s1", "ansC"], ["s3", "ansD"]]
    tree, trajs = make_tree("t", paths, [1.0, 0.0, 0.0, 1.0], group="p")
    chain = make_traj(["s1", "ansE"], 0.0, group="p")
    batch = AdvantageBatch([*trajs, chain], {"t": tree})
    out = run("tree_grpo", batch)
    # Inter-tree: group {1, 0, 0, 1, 0}, mean 0.4, population std sqrt(0.24).
    sd = math.sqrt(0.24)
    inter = [0.6 / sd, -0.4 / sd, -0.4 / sd, 0.6 / sd, -0.4 / sd]
    # Intra-tree: tree s1 {1, 0, 0}: mean 1/3, std sqrt(2/9); D and E are alone: 0.
    intra = [SQRT2, -1 / SQRT2, -1 / SQRT2, 0.0, 0.0]
    for i, (traj, adv) in enumerate(zip(batch.trajectories, out, strict=True)):
        value = inter[i] + intra[i]
        # One value on every sampled token, prefix turns included; none elsewhere.
        assert assistant_values(traj, adv) == pytest.approx([value] * len(traj.turns))
        assert not adv[~torch.tensor(traj.sampled)].any()
    # The authors' normalisation (unbiased std) is the std option: intra for A = (2/3)/sqrt(1/3).
    unbiased = run("tree_grpo", batch, std="unbiased")
    sd_u = math.sqrt(1.2 / 4)
    assert assistant_values(trajs[0], unbiased[0])[0] == pytest.approx(0.6 / sd_u + (2 / 3) / math.sqrt(1 / 3))


def test_tree_grpo_ignores_branch_depth_unlike_tree_anchor() -> None:
    # One search tree: the whole contrast is intra-tree, the same on every turn of a leaf.
    paths = [["s1", "s2", "ansA"], ["s1", "s2", "ansB"], ["s1", "ansX"]]
    tree, trajs = make_tree("t", paths, [1.0, 0.0, 0.0])
    out = run("tree_grpo", AdvantageBatch(trajs, {"t": tree}))
    g = [SQRT2, -1 / SQRT2, -1 / SQRT2]
    for traj, adv, gi in zip(trajs, out, g, strict=True):
        assert assistant_values(traj, adv) == pytest.approx([2 * gi] * len(traj.turns))


def test_trace_credit_hand_computed() -> None:
    # A: readiness gaps d = [2, 1, 0.5] -> V = [0, ln2, ln4]; B: d = [1, 2] -> V = [0, -ln2].
    a = make_traj(["s1", "s2", "ansA"], 1.0, readiness=[-1.9, -0.9, -0.4])
    b = make_traj(["s1", "ansB"], 0.0, readiness=[-0.9, -1.9])
    opts = {"horizon": 2, "gamma_td": 0.5, "terminal_scale": 2.0, "w_out": 1.0, "w_turn": 0.5}
    out = run("trace_credit", AdvantageBatch([a, b]), **opts)
    ln2 = math.log(2)
    c_a = [ln2 + 2 * 0.25 * 1.0, ln2 + 2 * 0.5 * 1.0]  # both windows reach the end (T = 2)
    c_b = [-ln2 + 2 * 0.5 * -1.0]
    assert assistant_values(a, out[0]) == pytest.approx([1 + 0.5 * c_a[0], 1 + 0.5 * c_a[1], 1.0])
    assert assistant_values(b, out[1]) == pytest.approx([-1 + 0.5 * c_b[0], -1.0])


@pytest.mark.parametrize(
    ("form", "c_a", "c_b"),
    [
        # A: l = [-1.9, -0.9, -0.4] (d = [2, 1, 0.5]); B: l = [-0.9, -1.9] (d = [1, 2]).
        # raw_diff: V_A = [0, 1, 1.5], V_B = [0, -1]; remaining_gap: V_A = [0, .5, .75], V_B = [0, -1].
        ("raw_diff", [(1.0 + 0.5 * 0.5) / 1.5 + 0.5, 0.5 + 1.0], -1.0 - 1.0),
        ("remaining_gap", [(0.5 + 0.5 * 0.25) / 1.5 + 0.5, 0.25 + 1.0], -1.0 - 1.0),
        ("log_ratio", [math.log(2) + 0.5, math.log(2) + 1.0], -math.log(2) - 1.0),
    ],
)
def test_trace_credit_value_forms_hand_computed(form: str, c_a: list[float], c_b: float) -> None:
    a = make_traj(["s1", "s2", "ansA"], 1.0, readiness=[-1.9, -0.9, -0.4])
    b = make_traj(["s1", "ansB"], 0.0, readiness=[-0.9, -1.9])
    opts = {"horizon": 2, "gamma_td": 0.5, "terminal_scale": 2.0, "w_turn": 0.5, "credit_value": form}
    out = run("trace_credit", AdvantageBatch([a, b]), **opts)
    assert assistant_values(a, out[0]) == pytest.approx([1 + 0.5 * c_a[0], 1 + 0.5 * c_a[1], 1.0])
    assert assistant_values(b, out[1]) == pytest.approx([-1 + 0.5 * c_b, -1.0])


def test_trace_credit_needs_readiness_of_the_right_length() -> None:
    good = make_traj(["s1", "ans"], 1.0, readiness=[-1.0, -0.5])
    bad = make_traj(["s1", "s2", "ans"], 0.0, group="g", readiness=[-1.0, -0.5])
    bad.task_id = "broken-task"
    with pytest.raises(ValueError, match="broken-task.*3 prefixes.*2 scores"):
        run("trace_credit", AdvantageBatch([good, bad]))
    missing = make_traj(["ans"], 0.0)
    with pytest.raises(ValueError, match="got none"):
        run("trace_credit", AdvantageBatch([missing]))
    positive = make_traj(["s1", "ans"], 1.0, readiness=[-1.0, 0.3])
    positive.task_id = "scorer-bug"
    with pytest.raises(ValueError, match="scorer-bug.*<= 1e-06"):
        run("trace_credit", AdvantageBatch([positive]))
    # Infra failures need no readiness: they get zeros.
    failed = make_traj(["s1"], 0.0, infra_failed=True)
    out = run("trace_credit", AdvantageBatch([good, failed]))
    assert not out[1].any()


def test_tree_node_path_mismatch_is_an_error() -> None:
    tree, trajs = make_tree("t", [["s1", "ans1"], ["s1", "ans2"]], [1.0, 0.0])
    trajs[0].node_path = trajs[0].node_path[:-1]
    for name in ("tree_anchor", "tree_grpo"):
        with pytest.raises(ValueError, match="node_path"):
            run(name, AdvantageBatch(trajs, {"t": tree}))
    for wrong in ([0, 2, 3], [0, 1, 9]):  # not a parent chain / no such node
        trajs[0].node_path = wrong
        for name in ("tree_anchor", "tree_grpo"):
            with pytest.raises(ValueError, match="root-to-leaf"):
                run(name, AdvantageBatch(trajs, {"t": tree}))


@pytest.mark.parametrize("name", ESTIMATORS)
def test_empty_batch_and_zero_turn_trajectories(name: str) -> None:
    assert run(name, AdvantageBatch([])) == []
    empty = make_traj([], 1.0, readiness=[-1.0])
    other = make_traj(["ans"], 0.0, readiness=[-1.0])
    out = run(name, AdvantageBatch([empty, other]))
    assert out[0].shape == (len(empty.token_ids),) and not out[0].any()


# ----------------------------------------------------------------------------- random batches


LABELS = st.sampled_from(["s1", "s2"])
REWARDS = st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0.0, 1.0)


@st.composite
def random_batch(draw: st.DrawFn, *, one_branch: bool = False) -> AdvantageBatch:
    """Groups of trees (some registered, some absent -> chains) plus chain trajectories."""
    trajs: list[Trajectory] = []
    trees: dict[str, RolloutTree] = {}
    for g in range(draw(st.integers(1, 3))):
        for k in range(draw(st.integers(1, 2))):
            n_leaves = 1 if one_branch else draw(st.integers(1, 5))
            paths = []
            for leaf in range(n_leaves):
                tools = draw(st.lists(LABELS, max_size=3))
                paths.append(tools + [draw(st.sampled_from([f"ans{leaf}", f"cut{leaf}"]))])
            rewards = draw(st.lists(REWARDS, min_size=n_leaves, max_size=n_leaves))
            failed = draw(st.lists(st.booleans(), min_size=n_leaves, max_size=n_leaves))
            failed = [f and draw(st.booleans()) for f in failed]  # failures are rarer
            tree, leaves = make_tree(
                f"g{g}t{k}", paths, rewards, group=f"g{g}", infra_failed=failed
            )
            if one_branch or draw(st.booleans()) or draw(st.booleans()):
                trees[tree.tree_id] = tree
            trajs += leaves
        for _ in range(draw(st.integers(0, 2))):
            tools = draw(st.lists(LABELS, max_size=3))
            trajs.append(make_traj(tools + ["ansC"], draw(REWARDS), group=f"g{g}"))
    for traj in trajs:
        traj.readiness = draw(
            st.lists(
                st.floats(-8.0, 0.0),
                min_size=traj.num_transitions + 1,
                max_size=traj.num_transitions + 1,
            )
        )
    return AdvantageBatch(draw(st.permutations(trajs)), trees)


OPTIONS = st.builds(
    AdvantageOptions,
    std=st.sampled_from(["population", "unbiased", "none"]),
    omega=st.sampled_from([1.0, 0.5]),
    step_gamma=st.sampled_from([0.95, 0.5]),
    horizon=st.integers(0, 4),
    gamma_td=st.sampled_from([0.8, 0.5, 0.0, 1.0]),
    terminal_scale=st.sampled_from([2.0, 0.0, -1.0]),
    w_turn=st.sampled_from([0.2, 1.0]),
    credit_value=st.sampled_from(["log_ratio", "raw_diff", "remaining_gap"]),
)


@settings(deadline=None, max_examples=60)
@given(batch=random_batch(), options=OPTIONS)
def test_vectorised_estimators_equal_slow_loops(
    batch: AdvantageBatch, options: AdvantageOptions
) -> None:
    for name in ESTIMATORS:
        fast = get_estimator(name)(batch, options)
        slow = SLOW[name](batch, options)
        assert len(fast) == len(batch.trajectories)
        for traj, f, s in zip(batch.trajectories, fast, slow, strict=True):
            assert f.dtype == torch.float32 and f.shape == (len(traj.token_ids),)
            assert torch.allclose(f, torch.tensor(s, dtype=torch.float32), atol=1e-5), name
            # Prompt and observation tokens never get an advantage; infra failures get none.
            sampled = torch.tensor(traj.sampled)
            assert not f[~sampled].any()
            if traj.infra_failed:
                assert not f.any()


@settings(deadline=None, max_examples=40)
@given(batch=random_batch(one_branch=True), options=OPTIONS)
def test_one_branch_per_node_tree_equals_chain(
    batch: AdvantageBatch, options: AdvantageOptions
) -> None:
    chains = AdvantageBatch(batch.trajectories, {})
    for tree_name, chain_name in [
        ("tree_anchor", "grpo"),
        ("tree_anchor", "tree_anchor"),
        ("tree_grpo", "grpo"),
        ("tree_grpo", "tree_grpo"),
        ("trace_credit", "trace_credit"),
    ]:
        as_tree = get_estimator(tree_name)(batch, options)
        as_chain = get_estimator(chain_name)(chains, options)
        for a, b in zip(as_tree, as_chain, strict=True):
            assert torch.equal(a, b)


def test_root_only_branching_equals_grpo() -> None:
    # Branching at the root is the group contrast itself, not a local anchor.
    tree, trajs = make_tree("t", [["s1", "ansA"], ["s2", "ansB"], ["ansC"]], [1.0, 0.0, 0.5])
    batch = AdvantageBatch(trajs, {"t": tree})
    for name in ("tree_anchor", "tree_grpo"):  # tree_grpo: each root child is a one-leaf tree
        for a, b in zip(run(name, batch), run("grpo", batch), strict=True):
            assert torch.equal(a, b)
