"""The comparison protocol: paired tests by seed (t, sign-flip, Holm), collapse, escape, the table."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import protocol  # noqa: E402
import sample_efficiency as se  # noqa: E402
import stats  # noqa: E402


def run(seed: int, sampled: float, base: float = 0.1, greedy: float = 0.2, rewards: list[float] | None = None,
        eff: float = 0.5, hop2: float = 0.3) -> dict:
    return {"seed": seed, "sampled": {"all": sampled, "1": sampled + 0.1, "2": sampled - 0.1},
            "sampled_base": {"all": base}, "final": {"unseen": greedy},
            "final_by_hops": {"unseen": {"1": greedy, "2": greedy / 2}},
            "reward_mean": rewards if rewards is not None else [0.5] * 10, "effective_ratio": [eff],
            "hop_share": {"1": 1 - hop2, "2": hop2}}


def test_bootstrap_of_equal_differences_is_a_point_and_needs_two_seeds() -> None:
    assert stats.paired_bootstrap([0.02, 0.02, 0.02]) == {"mean": 0.02, "lo": 0.02, "hi": 0.02, "n": 3}
    assert stats.paired_bootstrap([0.05]) == {"mean": 0.05, "lo": None, "hi": None, "n": 1}
    assert stats.paired_bootstrap([])["n"] == 0
    got = stats.paired_bootstrap([-0.1, 0.1, 0.3, 0.5])
    assert got["mean"] == pytest.approx(0.2) and -0.1 <= got["lo"] < 0.2 < got["hi"] <= 0.5
    assert got == stats.paired_bootstrap([-0.1, 0.1, 0.3, 0.5])  # seeded


def test_deltas_pair_by_seed() -> None:
    arm, base = [run(0, 0.3), run(2, 0.5)], [run(0, 0.2), run(1, 0.9), run(2, 0.4)]
    assert protocol.paired_deltas(arm, base, lambda r: r["sampled"]["all"]) == pytest.approx([0.1, 0.1])


def test_collapse_rule() -> None:
    assert not protocol.collapsed(run(0, 0.3))
    assert protocol.collapsed(run(0, 0.3, rewards=[0.4] + [0.0] * 10))  # no reward on the last 10 steps
    assert protocol.collapsed(run(0, 0.04, base=0.1))  # below half the base model's sampled success
    assert not protocol.collapsed(run(0, 0.05, base=0.1))


def test_summary_and_table() -> None:
    grpo = [run(0, 0.2, eff=0.25, hop2=0.5), run(1, 0.3, eff=0.25, hop2=0.5)]
    arm = [run(0, 0.25, eff=0.5), run(1, 0.33, rewards=[0.0] * 10, eff=0.5)]
    got = se.protocol_summary(arm, grpo)
    assert got["collapses"] == 1
    assert got["sampled_by_hops"]["all"]["mean"] == pytest.approx(0.29)
    assert got["paired_vs_grpo"]["sampled_all"]["mean"] == pytest.approx(0.04)
    assert got["paired_vs_grpo"]["sampled_2"]["n"] == 2
    assert got["paired_vs_grpo"]["sampled_all"]["p_signflip"] == 0.5  # deltas 0.05, 0.03: sums +-0.08, +-0.02
    assert got["escape"]["n"] == 2 and got["escape"]["count"] == 2  # 0.25 and 0.33 against a base of 0.1
    assert got["hop_share_mean"] == {"1": pytest.approx(0.7), "2": pytest.approx(0.3)}
    # the arm's own gain over its base, by seed: 0.25 - 0.1 and 0.33 - 0.1, so mean 19.0 points, sd 0.08 / sqrt 2,
    # se 4.0 points, 19.0 +- 12.706 x 4.0 = [-31.8, +69.8]; both positive: sign-flip p = 2 / 4
    gain = got["gain_over_base"]["sampled_all"]
    assert (gain["n"], gain["mean"], gain["lo"], gain["hi"]) == (2, pytest.approx(0.19), pytest.approx(-0.31824, abs=1e-4),
                                                                pytest.approx(0.69824, abs=1e-4))
    assert gain["p_signflip"] == 0.5 and got["gain_over_base"]["sampled_1"]["n"] == 0  # no per-hop base in these runs
    methods = {"grpo": {"seeds": 2, **se.protocol_summary(grpo, grpo)}, "arm": {"seeds": 2, **got}}
    protocol.add_holm(methods)
    assert methods["arm"]["paired_vs_grpo"]["sampled_all"]["p_holm"] == methods["arm"]["paired_vs_grpo"]["sampled_all"]["p_t"]
    assert methods["grpo"]["paired_vs_grpo"]["sampled_all"]["p_holm"] is None  # the baseline is no arm of the family
    table = protocol.protocol_table("x", {"methods": methods, "setting": {"sampled_samples": 4, "sampled_questions": 300},
                                          "questions_per_hop": {"sampled": {"1": 151, "2": 149}}})
    assert "| arm | 2 | 29.0 ± 5.7% |" in table and "300 unseen-world questions (1-hop 151, 2-hop 149)" in table
    # deltas 0.05 and 0.03: mean 4.0, se 1.0 point, t_{0.975,1} = 12.706 -> [-8.7, +16.7]; t = 4 on 1 df (Cauchy):
    # p = 1 - 2 atan(4) / pi = 0.156, Holm over one arm leaves it as it is
    assert "+4.0 [-8.7, +16.7] (n 2; Holm p 0.16, sign-flip p 0.5)" in table
    assert "| 2/2 (34-100%, median step 10) |" in table  # Wilson(2, 2); seed 0's reward 0.5 >= 0.1 + 0.02 at step 10


def test_merge_keeps_one_of_identical_twins_and_rejects_different_ones(tmp_path) -> None:
    import json

    def shard(name: str, runs: dict) -> Path:
        path = tmp_path / name
        curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.1}]  # what a merge checks is there
        whole = {m: [{**r, "curve": curve, "step_seconds": [1.0], "final": {"train": None, "redrawn": None, **r["final"]}}
                     for r in rs] for m, rs in runs.items()}
        path.write_text(json.dumps({"setting": {"seeds": 1}, "runs": whole, "seconds": 1.0}))
        return path

    a = shard("a.json", {"grpo": [run(0, 0.2)], "trace_alloc": [run(0, 0.3)]})
    b = shard("b.json", {"grpo": [run(0, 0.2)], "trace_alloc_coverage": [run(0, 0.25)]})
    runs, _ = se.merge_shards([a, b])
    assert [len(runs[m]) for m in ("grpo", "trace_alloc", "trace_alloc_coverage")] == [1, 1, 1]
    assert list(se.merge_shards([a, b], ["grpo", "trace_alloc_coverage"])[0]) == ["grpo", "trace_alloc_coverage"]
    c = shard("c.json", {"grpo": [run(0, 0.9)]})
    with pytest.raises(SystemExit, match="grpo seed 0 differs"):
        se.merge_shards([a, c])


def test_t_quantiles_match_the_tables() -> None:
    assert stats.t_quantile(0.975, 6) == pytest.approx(2.4469, abs=1e-4)
    assert stats.t_quantile(0.975, 11) == pytest.approx(2.2010, abs=1e-4)
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert stats.t_quantile(0.025, 6) == pytest.approx(-2.4469, abs=1e-4)  # symmetric
    for t in (0.3, 1.0, 4.0):  # df 1 is Cauchy: P(T > t) = 1/2 - atan(t) / pi
        assert stats.t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-12)


def test_paired_t_by_hand() -> None:
    # [1, 2, 3]: mean 2, sd 1, t = 2 / (1 / sqrt 3) = sqrt 12 on 2 df, where P(T > t) = (1 - t / sqrt(2 + t^2)) / 2
    got = stats.paired_t([1.0, 2.0, 3.0])
    p = 1 - math.sqrt(12) / math.sqrt(14)
    half = stats.t_quantile(0.975, 2) / math.sqrt(3)  # 4.3027 / 1.7321 = 2.4841
    assert got == pytest.approx({"mean": 2.0, "sd": 1.0, "lo": 2 - half, "hi": 2 + half, "p_t": p, "n": 3})
    assert half == pytest.approx(2.4841, abs=1e-4) and p == pytest.approx(0.0742, abs=1e-4)
    assert stats.paired_t([0.5]) == {"mean": 0.5, "sd": None, "lo": None, "hi": None, "p_t": None, "n": 1}
    assert stats.paired_t([])["mean"] is None
    equal = stats.paired_t([0.01, 0.01])  # no spread: no t statistic (a p of 0 would claim certainty)
    assert (equal["lo"], equal["hi"], equal["p_t"]) == (0.01, 0.01, None)


def test_sign_flip_is_exact_by_hand() -> None:
    assert stats.sign_flip([1.0, 2.0, 3.0]) == 0.25  # only +-(1, 2, 3) reach |sum| 6: 2 of 8
    assert stats.sign_flip([3.0, 1.0]) == 0.5  # sums 4, 2, -2, -4
    assert stats.sign_flip([1.0, -1.0]) == 1.0
    assert stats.sign_flip([0.01] * 7) == 2 / 128  # the smallest p seven seeds can give
    assert stats.sign_flip([]) is None
    many = stats.sign_flip([1.0] * 20)  # Monte Carlo above 16: (1 + hits) / (1 + resamples), seeded
    assert many == stats.sign_flip([1.0] * 20) and 0 < many < 0.001


def test_holm_steps_down_and_stays_monotone() -> None:
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert stats.holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert stats.holm([0.5, 0.5]) == [1.0, 1.0]
    adjusted = stats.holm([0.2, 0.001, 0.04, 0.03, 0.5])
    order = sorted(range(5), key=lambda i: [0.2, 0.001, 0.04, 0.03, 0.5][i])
    assert all(adjusted[a] <= adjusted[b] for a, b in zip(order, order[1:], strict=False))


def test_holm_thresholds_are_the_step_of_each_p_value() -> None:
    # sorted 0.01, 0.03, 0.04 (m = 3): 0.05 / 3, 0.05 / 2, 0.05 / 1
    assert stats.holm_thresholds([0.01, 0.04, 0.03, None]) == pytest.approx([0.05 / 3, 0.05, 0.025, None])


def test_decision_needs_holm_and_the_sign_flip_at_the_same_step() -> None:
    # Two arms (the look-alike test's family): p_t 0.01 and 0.04 -> Holm 0.02 and 0.04, both <= 0.05;
    # their steps are 0.025 and 0.05. The first's sign flip (0.02) is under 0.025: resolved; the
    # second's (0.06) is over 0.05: unresolved although its t-test passes.
    methods = {"grpo": {},
               "a": {"paired_vs_grpo": {"m": {"mean": 0.03, "p_t": 0.01, "p_signflip": 0.02}}},
               "b": {"paired_vs_grpo": {"m": {"mean": -0.02, "p_t": 0.04, "p_signflip": 0.06}}}}
    protocol.add_holm(methods)
    a, b = methods["a"]["paired_vs_grpo"]["m"], methods["b"]["paired_vs_grpo"]["m"]
    assert (a["p_holm"], b["p_holm"]) == pytest.approx((0.02, 0.04))
    assert (a["decision"], b["decision"]) == ("higher", "unresolved")
    # A negative mean that passes both reads "lower"; a sign flip of 0.03 fails the first step (0.025).
    assert protocol.decide(-0.02, 0.02, 0.02, 0.025) == "lower"
    assert protocol.decide(0.02, 0.02, 0.03, 0.025) == "unresolved"
    # Holm 0.06 > 0.05: unresolved whatever the sign flip says; missing tests: unresolved.
    assert protocol.decide(0.05, 0.06, 0.001, 0.05) == "unresolved"
    assert protocol.decide(0.05, None, 0.001, 0.05) == "unresolved"

def test_wilson_interval_by_hand() -> None:
    assert stats.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # z^2 / (n + z^2) = 3.8415 / 13.8415
    assert stats.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert stats.wilson(0, 0) is None


def test_bootstrap_is_reported_from_ten_seeds() -> None:
    few = protocol.paired_stats([0.01 * i for i in range(7)])
    assert few["bootstrap_lo"] is None and "7 seeds < 10" in few["bootstrap_note"]
    ten = protocol.paired_stats([0.01 * i for i in range(10)])
    assert ten["bootstrap_note"] is None and ten["lo"] < ten["bootstrap_lo"] < ten["bootstrap_hi"] < ten["hi"]


def test_escape_rule_and_time() -> None:
    assert protocol.escaped(run(0, 0.025, base=0.005)) and not protocol.escaped(run(0, 0.0249, base=0.005))
    assert protocol.escaped({"seed": 0}) is None
    # base 0: the threshold is 0.02; the trailing 10-step mean reaches it when two 0.1 steps are in the window
    climbing = run(0, 0.1, base=0.0, rewards=[0.0] * 12 + [0.1] * 5)
    assert protocol.time_to_escape(climbing) == 14
    assert protocol.time_to_escape(run(0, 0.1, base=0.0, rewards=[0.015] * 30)) is None
    got = protocol.escape_summary([climbing, run(1, 0.0, base=0.0, rewards=[0.0] * 20)])
    assert (got["count"], got["n"], got["probability"], got["timed"], got["median_step"]) == (1, 2, 0.5, 1, 14)
    assert (got["lo"], got["hi"]) == pytest.approx(stats.wilson(1, 2))


def test_factorial_2x2_by_hand() -> None:
    # sampled success per seed: trace_alloc (tree, learned roots), trace_alloc_ul (tree, uniform roots),
    # trace_alloc_notree (no tree, learned roots), grpo (neither); seed 3 lacks trace_alloc_ul: skipped
    cells = {"trace_alloc": [0.05, 0.06, 0.02, 0.09], "trace_alloc_ul": [0.01, 0.02, 0.00],
             "trace_alloc_notree": [0.04, 0.03, 0.05, 0.07], "grpo": [0.00, 0.01, 0.01, 0.02]}
    runs = {arm: [run(s, v) for s, v in enumerate(values)] for arm, values in cells.items()}
    got = protocol.factorial_2x2(runs, lambda r: r["sampled"]["all"])
    # roots: ((ta - ul) + (nt - g)) / 2 = (0.04+0.04)/2, (0.04+0.02)/2, (0.02+0.04)/2 = 0.04, 0.03, 0.03
    assert got["learned roots"]["n"] == 3
    assert got["learned roots"]["mean"] == pytest.approx(0.1 / 3)
    assert got["learned roots"]["sd"] == pytest.approx(math.sqrt((2 * (0.01 / 3) ** 2 + (0.02 / 3) ** 2) / 2))
    # tree: ((ta - nt) + (ul - g)) / 2 = (0.01+0.01)/2, (0.03+0.01)/2, (-0.03-0.01)/2 = 0.01, 0.02, -0.02
    assert got["tree"]["mean"] == pytest.approx(0.01 / 3)
    # interaction: (ta - ul) - (nt - g) = 0.00, 0.02, -0.02
    assert got["interaction"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert got["interaction"]["p_signflip"] == 1.0
    assert "learned roots without the tree minus GRPO on two-hop prompts only" not in got  # no grpo_twohop runs
    runs["grpo_twohop"] = [run(0, 0.01), run(2, 0.06)]
    pair = protocol.factorial_2x2(runs, lambda r: r["sampled"]["all"])[
        "learned roots without the tree minus GRPO on two-hop prompts only"]
    assert pair["n"] == 2 and pair["mean"] == pytest.approx((0.03 - 0.01) / 2)  # notree - twohop: 0.03, -0.01
    runs.pop("trace_alloc_ul")
    assert protocol.factorial_2x2(runs, lambda r: r["sampled"]["all"]) is None  # a cell without runs: no design


def test_factorial_table_reads_the_contrasts() -> None:
    cells = {"trace_alloc": [0.05, 0.06], "trace_alloc_ul": [0.01, 0.02], "trace_alloc_notree": [0.04, 0.03],
             "grpo": [0.00, 0.01]}
    def full(seed: int, sampled: float) -> dict:  # what summarise reads beside the protocol's fields
        r = run(seed, sampled)
        r["final"].update(train=0.2, redrawn=None)
        return {**r, "curve": [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.0}], "step_seconds": [1.0]}

    runs = {arm: [full(s, v) for s, v in enumerate(values)] for arm, values in cells.items()}
    summary = se.summarise(runs)
    text = protocol.factorial_table("mechanisms", summary)
    assert "| learned root allocation (main effect) | +3.5 [" in text  # roots: 0.04 and 0.03 per seed
    # tree: ((ta - nt) + (ul - g)) / 2 = 0.01, 0.02; 2-hop = all - 0.1 in every cell, so the same contrasts
    assert summary["factorial_2x2"]["sampled_2"]["tree"]["mean"] == pytest.approx(0.015)


def test_paired_t_power_matches_the_noncentral_t() -> None:
    """Monte Carlo power against the noncentral t's (G*Power, two-sided one-sample t): n = 12 and an
    effect of one sd at alpha 0.05 has power 0.8845; n = 10 and half an sd, 0.2932; no effect, alpha."""
    from stats import detectable_difference, paired_t_power

    assert abs(paired_t_power(0.0, 1.0, 12, 0.05) - 0.05) < 0.003
    assert abs(paired_t_power(1.0, 1.0, 12, 0.05) - 0.8845) < 0.005
    assert abs(paired_t_power(0.5, 2.0, 10, 0.05) - paired_t_power(0.25, 1.0, 10, 0.05)) < 1e-12  # scale-free
    assert abs(paired_t_power(1.0, 2.0, 10, 0.05) - 0.2932) < 0.005
    # 80% power at alpha 0.05 with 12 differences needs about 0.88 sd (noncentral t: 0.8832)
    assert 0.87 <= detectable_difference(1.0, 12, 0.05, sims=40_000) <= 0.90
