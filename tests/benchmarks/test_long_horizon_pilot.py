"""The long-horizon pilot's verdict on a setting: which of issue 48's conditions a measured row meets."""

from __future__ import annotations

import sys

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import long_horizon_pilot as pilot  # noqa: E402


def _row(sampled: float, calls: float, flips: tuple[float | None, float | None], greedy: float = 0.1) -> dict:
    return {"sampled": {"em": sampled, "tool_calls": calls}, "greedy": {"em": greedy},
            "credit": {"sign_flip_share_success": flips[0], "sign_flip_share_failure": flips[1]}}


def test_a_row_inside_every_bound_meets_them_all() -> None:
    got = pilot.requirements(_row(0.05, 4.2, (0.0, 0.1)))
    assert got == {"sampled_in_range": True, "tool_calls_at_least_4": True, "sign_flips_in_mixed_groups": True,
                   "greedy_not_saturated": True}


def test_each_bound_fails_on_its_own() -> None:
    assert pilot.requirements(_row(0.02, 4.2, (0.1, 0.1)))["sampled_in_range"] is False  # below 3%
    assert pilot.requirements(_row(0.11, 4.2, (0.1, 0.1)))["sampled_in_range"] is False  # above 10%
    assert pilot.requirements(_row(0.05, 3.9, (0.1, 0.1)))["tool_calls_at_least_4"] is False
    assert pilot.requirements(_row(0.05, 4.2, (0.0, 0.0)))["sign_flips_in_mixed_groups"] is False
    assert pilot.requirements(_row(0.05, 4.2, (0.1, 0.1), greedy=0.95))["greedy_not_saturated"] is False


def test_no_mixed_group_leaves_the_flip_condition_unknown() -> None:
    assert pilot.requirements(_row(0.05, 4.2, (None, None)))["sign_flips_in_mixed_groups"] is None
    assert pilot.requirements(_row(0.05, 4.2, (None, 0.2)))["sign_flips_in_mixed_groups"] is True


def test_episode_stats_keeps_the_hop_split() -> None:
    metrics = {"em": 0.25, "tool_calls": 4.5, "mean_turns": 5.5, "answered": 1.0, "error_action_rate": 0.0,
               "generated_tokens": 40.0, "em_hops4": 0.3, "em_hops5": 0.2, "f1": 0.3}
    got = pilot.episode_stats(metrics)
    assert got["em_by_hops"] == {"4": 0.3, "5": 0.2} and got["tool_calls"] == 4.5 and "f1" not in got


def _chosen(rows: dict, round_name: str = "clues") -> str | None:
    rows = {name: {**row, "requirements": pilot.requirements(row)} for name, row in rows.items()}
    return pilot.choose_variant(rows, pilot.ROUNDS[round_name])


def test_the_selection_rule_takes_the_qualified_variant_nearest_the_middle() -> None:
    rows = {"clues_h4_t8": _row(0.09, 4.1, (0.0, 0.1)),
            "clues_h4_t8_temp07": _row(0.07, 4.1, (0.0, 0.1)),
            "cluesL_h4_t8": _row(0.065, 3.9, (0.0, 0.1)),  # nearest, but 3.9 calls
            "h4_t8": _row(0.065, 4.5, (0.2, 0.2))}  # not a candidate of the round
    assert _chosen(rows) == "clues_h4_t8_temp07"  # |7 - 6.5| < |9 - 6.5|
    # a tie goes to the earlier candidate: the base pretrained for fewer steps, then the higher temperature
    rows["cluesL_h4_t8"] = _row(0.06, 4.1, (0.0, 0.1))
    assert _chosen(rows) == "clues_h4_t8_temp07"
    rows["clues_h4_t8"] = _row(0.06, 4.1, (0.0, 0.1))
    assert _chosen(rows) == "clues_h4_t8"
    assert _chosen({"clues_h4_t8": _row(0.06, 4.1, (0.0, 0.0))}) is None  # no flips
    # the turns round: more turns first, then the higher temperature
    turns = {"cluesL_h4_t5_temp07": _row(0.05, 4.2, (0.0, 0.1)), "cluesL_h4_t6_temp05": _row(0.08, 4.2, (0.0, 0.1))}
    assert _chosen(turns, "turns") == "cluesL_h4_t6_temp05"  # both 1.5 points from the middle
    assert pilot.ROUNDS["turns"][0] == "cluesL_h4_t6_temp07" and set(pilot.ROUNDS["turns"]) <= set(pilot.VARIANTS)
    assert set(pilot.ROUNDS["clues"]) <= set(pilot.VARIANTS)


def test_the_amended_rule_counts_flips_in_pilot_training() -> None:
    rows = {name: {**row, "requirements": pilot.requirements(row)} for name, row in {
        "exact_h4_t8": _row(0.08, 4.1, (0.0, 0.0)),  # 1.5 points from the middle, no flip in its pools
        "exact_h4_t8_temp05": _row(0.055, 4.1, (0.0, 0.0)),  # 1.0 point: ranked first
        "cluesL_h45_t10_temp04": _row(0.05, 3.9, (None, None)),  # too few calls: never a candidate
    }.items()}
    order = pilot.ROUNDS["exact"]
    assert pilot.choose_with_training(rows, {}, order) == (None, ["exact_h4_t8_temp05"])  # train it first
    none = {"trace_credit": {"credit_mixed_flip_share": [0.0, float("nan"), None]}}
    some = {"trace_credit_k1": {"credit_mixed_flip_share": [0.0, 0.125]}}
    assert pilot.training_flips(none) is False and pilot.training_flips(some) is True
    assert pilot.training_flips({"grpo": {"step_seconds": [1.0]}}) is None
    assert pilot.choose_with_training(rows, {"exact_h4_t8_temp05": some}, order) == ("exact_h4_t8_temp05", [])
    assert pilot.choose_with_training(rows, {"exact_h4_t8_temp05": none}, order) == (None, ["exact_h4_t8"])
    both = {"exact_h4_t8_temp05": none, "exact_h4_t8": {**none, **some}}
    assert pilot.choose_with_training(rows, both, order) == ("exact_h4_t8", [])
    assert pilot.choose_with_training(rows, {"exact_h4_t8_temp05": none, "exact_h4_t8": none}, order) == (None, [])


def test_the_fifth_round_trains_its_one_candidate_at_the_lower_rate(tmp_path: Path) -> None:
    assert pilot.ROUNDS["lr3e4"] == ["cluesL_h45_t10_temp04"] and pilot.TRAINED_ROUNDS["lr3e4"] == "3e-4"
    out = tmp_path / "round.json"
    out.write_text('{"variants": {}, "step_cost": {"v": {"trace_credit": {"credit_mixed_flip_share": [0.0]}}}}')
    # two processes add their arms to one file: each keeps the other's
    pilot.record_cost(out, "v", pilot.cost_key("trace_credit", 1), {"credit_mixed_flip_share": [None, 0.0]})
    pilot.record_cost(out, "v", pilot.cost_key("trace_credit_k1", 2), {"credit_mixed_flip_share": [0.25]})
    import json

    costs = json.loads(out.read_text())["step_cost"]["v"]
    assert sorted(costs) == ["trace_credit", "trace_credit_k1_seed2", "trace_credit_seed1"]
    assert pilot.training_flips(costs) is True
    del costs["trace_credit_k1_seed2"]
    assert pilot.training_flips(costs) is False


def test_a_trained_round_registers_at_its_pilots_rate() -> None:
    import long_horizon_registration as registration
    import pytest

    assert registration.registered_lr("lr3e4", None) == "3e-4"
    assert registration.registered_lr("lr3e4", "0.0003") == "3e-4"
    with pytest.raises(SystemExit, match="trained at 3e-4"):
        registration.registered_lr("lr3e4", "1e-3")
    assert registration.registered_lr("clues", None) == "1e-3" and registration.registered_lr("turns", "5e-4") == "5e-4"


def test_the_long_setting_is_the_chosen_pilot_variant() -> None:
    """``--setting long`` trains exactly the configuration the fifth round's pilots measured."""
    from dataclasses import asdict

    from common import LONG_SETTING, resolve

    pilot_config = resolve("grpo", pilot.LONG_BASE + pilot.VARIANTS["cluesL_h45_t10_temp04"], False)
    assert asdict(resolve("grpo", LONG_SETTING, False)) == asdict(pilot_config)
    assert pilot_config.data.world.clues == 1 and pilot_config.model.tiny_preset == "bench_hops_clues_longer"
    assert (pilot_config.data.world.min_hops, pilot_config.data.world.max_hops) == (4, 5)


def test_the_registered_overrides_name_each_key_once_at_its_resolved_value() -> None:
    import long_horizon_registration as registration

    got = registration.last_wins(["a=1", "b=2", "a=3", "c=4", "optim.lr=1e-3", "optim.lr=3e-4"])
    assert got == ["a=3", "b=2", "c=4", "optim.lr=3e-4"]


def _grpo_sweep(final: float, base: float) -> dict:
    return {"runs": {"grpo": [{"sampled": {"all": final}, "sampled_base": {"all": base}}]}}


def test_the_sixth_round_takes_the_first_candidate_where_grpo_learns() -> None:
    first, second, third = pilot.TRAINING_CANDIDATES
    assert first == ("1e-3", 150) and pilot.training_file(*first) == "long_horizon_pilot_round6_lr1e-3_150.json"
    assert pilot.choose_training({}) == (None, [first])
    flat, learns = _grpo_sweep(0.0483, 0.0483), _grpo_sweep(0.0700, 0.0500)  # +0.0 and exactly +2 points
    assert pilot.grpo_gain(learns) == pytest.approx(0.02)
    assert pilot.choose_training({first: learns}) == (first, [])
    assert pilot.choose_training({first: flat}) == (None, [second])
    assert pilot.choose_training({first: flat, second: flat, third: learns}) == (third, [])
    assert pilot.choose_training({first: flat, second: learns, third: flat}) == (second, [])
    assert pilot.choose_training({first: flat, second: flat, third: _grpo_sweep(0.069, 0.05)}) == (None, [])


def test_the_seventh_round_registers_when_any_other_arm_learns() -> None:
    def sweep(arm: str, final: float, base: float = 0.05) -> dict:
        return {"runs": {arm: [{"sampled": {"all": final}, "sampled_base": {"all": base}}]}}

    assert pilot.LEARNING_ARMS[0] == "trace_alloc_notree" and pilot.learning_file("trace") == "long_horizon_pilot_round7_trace.json"
    assert pilot.choose_learning_arm({}) == (None, list(pilot.LEARNING_ARMS))
    flat = {"trace_alloc_notree": sweep("trace_alloc_notree", 0.06)}  # +1 point
    assert pilot.choose_learning_arm(flat) == (None, ["trace_credit_k1", "trace_credit", "trace"])
    # a later arm that learns decides, even before the ones between have run
    assert pilot.choose_learning_arm({**flat, "trace_credit": sweep("trace_credit", 0.07)}) == ("trace_credit", [])
    every = {arm: sweep(arm, 0.069) for arm in pilot.LEARNING_ARMS}
    assert pilot.choose_learning_arm(every) == (None, [])


def test_the_eighth_round_tries_the_longer_pretrained_base_from_the_highest_temperature() -> None:
    names = pilot.ROUNDS["clues2x"]
    assert names[0] == "clues2x_h45_t10" and set(names) <= set(pilot.VARIANTS)
    assert "model.tiny_preset=bench_hops_clues_2x" in pilot.VARIANTS[names[1]]
    assert "rollout.engine.temperature=0.7" in pilot.VARIANTS[names[1]]
    assert not any(s.startswith("rollout.engine.temperature") for s in pilot.VARIANTS[names[0]])


def test_the_eighth_round_needs_base_rates_then_grpo_learning_then_a_flip() -> None:
    a, b, c, d = pilot.ROUNDS["clues2x"]
    rows = {name: {**row, "requirements": pilot.requirements(row)} for name, row in {
        a: _row(0.02, 4.1, (None, None)),  # 2% sampled: never a candidate
        b: _row(0.07, 4.1, (0.0, 0.0)),  # 0.5 points from the middle: first
        c: _row(0.055, 4.1, (0.0, 0.1)),  # 1.0 point, a flip in its pools
        d: _row(0.05, 4.2, (None, None)),  # 1.5 points
    }.items()}
    order = pilot.ROUNDS["clues2x"]
    learns, flat = _grpo_sweep(0.09, 0.07), _grpo_sweep(0.07, 0.07)
    some = {"trace_credit_k1_seed1": {"credit_mixed_flip_share": [0.0, 0.1]}}
    none = {"trace_credit_seed1": {"credit_mixed_flip_share": [0.0]}}
    assert pilot.choose_with_grpo(rows, {}, {}, order) == (None, [("grpo", b)])
    assert pilot.choose_with_grpo(rows, {}, {b: learns}, order) == (None, [("flips", b)])
    assert pilot.choose_with_grpo(rows, {b: some}, {b: learns}, order) == (b, [])
    assert pilot.choose_with_grpo(rows, {b: none}, {b: learns}, order) == (None, [("grpo", c)])
    assert pilot.choose_with_grpo(rows, {}, {b: flat, c: learns}, order) == (c, [])  # c's pools flipped
    assert pilot.choose_with_grpo(rows, {d: none}, {b: flat, c: flat, d: learns}, order) == (None, [])


def test_the_eighth_rounds_grpo_pilots_run_each_variant_from_the_long_setting() -> None:
    from dataclasses import asdict

    from common import LONG_SETTING, resolve

    for name in pilot.ROUNDS["clues2x"]:
        as_run = resolve("grpo", LONG_SETTING + ["optim.lr=3e-4"] + pilot.sweep_sets(name), False)
        measured = resolve("grpo", pilot.LONG_BASE + pilot.VARIANTS[name] + ["optim.lr=3e-4"], False)
        assert asdict(as_run) == asdict(measured), name
    assert pilot.grpo_pilot_file("x") == "long_horizon_pilot_round8_grpo_x.json"


def test_the_ninth_round_tries_the_shorter_pretrained_base_first_and_the_widest_gap_within_a_base() -> None:
    names = pilot.ROUNDS["clues5"]
    assert len(names) == 6 and set(names) <= set(pilot.VARIANTS)
    assert all("model.tiny_preset=bench_hops_clues5" in pilot.VARIANTS[n] for n in names[:3])
    assert all("model.tiny_preset=bench_hops_clues5_2x" in pilot.VARIANTS[n] for n in names[3:])
    a1, a07, a05, b1, b07, b05 = names
    rows = {name: {**row, "requirements": pilot.requirements(row)} for name, row in {
        a1: _row(0.04, 4.1, (None, None), greedy=0.08),  # gap 4 points
        a07: _row(0.05, 4.3, (None, None), greedy=0.08),  # gap 3
        a05: _row(0.07, 3.9, (None, None), greedy=0.08),  # under four calls: never a candidate
        b1: _row(0.03, 4.2, (None, None), greedy=0.12),  # gap 9, but the second base
        b07: _row(0.06, 4.4, (None, None), greedy=0.12),  # gap 6
        b05: _row(0.02, 4.5, (None, None), greedy=0.12),  # 2% sampled: never a candidate
    }.items()}
    assert pilot.sharpening_order(rows, names) == [a1, a07, b1, b07]
    tie = {**rows, a07: {**rows[a07], "sampled": {**rows[a07]["sampled"], "em": 0.04}}}
    assert pilot.sharpening_order(tie, names)[:2] == [a1, a07]  # equal gaps: the candidates' order
    learns, flat = _grpo_sweep(0.07, 0.04), _grpo_sweep(0.04, 0.04)
    some = {"trace_credit_k1_seed1": {"credit_mixed_flip_share": [0.0, 0.1]}}
    assert pilot.choose_with_grpo(rows, {}, {}, names, "clues5") == (None, [("grpo", a1)])
    assert pilot.choose_with_grpo(rows, {}, {a1: flat}, names, "clues5") == (None, [("grpo", a07)])
    assert pilot.choose_with_grpo(rows, {b1: some}, {a1: flat, a07: flat, b1: learns}, names, "clues5") == (b1, [])
    # the eighth round's order on the same rows would start nearest 6.5%: b07
    assert pilot.choose_with_grpo(rows, {}, {}, names) == (None, [("grpo", b07)])
    assert pilot.grpo_pilot_file("x", "clues5") == "long_horizon_pilot_round9_grpo_x.json"
    # base by base: the second base's statistics are needed only once the first base has nothing
    first = {n: rows[n] for n in (a1, a07, a05)}
    assert pilot.choose_base_by_base(first, {}, {}, names) == (None, [("grpo", a1)])
    assert pilot.choose_base_by_base({a1: rows[a1]}, {}, {}, names) == (None, [("measure", a07), ("measure", a05)])
    assert pilot.choose_base_by_base(first, {}, {a1: flat, a07: flat}, names) == (
        None, [("measure", b1), ("measure", b07), ("measure", b05)])
    grpo = {a1: flat, a07: flat, b1: learns}
    assert pilot.choose_base_by_base(rows, {b1: some}, grpo, names) == pilot.choose_with_grpo(
        rows, {b1: some}, grpo, names, "clues5") == (b1, [])
    assert pilot.choose_base_by_base(rows, {}, {**grpo, b1: flat, b07: flat}, names) == (None, [])
    assert pilot.TRAINED_ROUNDS["clues5"] == "3e-4"


def test_a_pilot_round_file_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    done = tmp_path / "round.json"
    done.write_text('{"variants": {"kept": {}}}')
    monkeypatch.setattr(sys, "argv", ["long_horizon_pilot.py", "--variants", "h4_t8", "--out", str(done)])
    with pytest.raises(SystemExit):
        pilot._args()
    assert "exists" in capsys.readouterr().err and done.read_text() == '{"variants": {"kept": {}}}'
    monkeypatch.setattr(sys, "argv", ["long_horizon_pilot.py", "--variants", "h4_t8", "--out", str(done), "--overwrite"])
    assert pilot._args().overwrite
