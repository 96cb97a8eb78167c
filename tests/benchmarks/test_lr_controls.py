"""The lr 1e-3 controls: two shard sets that differ only in the learning rate, paired by seed, with
hand-computed intervals; every other difference is refused in one line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
import lr_controls  # noqa: E402
import tables  # noqa: E402  (benchmarks/ is on the path once lr_controls is imported)

SHA = "ab" * 32
BASE = 0.005  # every seed's base sampled success: escaping needs >= 0.025
SAMPLED = {  # arm name -> sampled success on seeds 0, 1, 2 (seed 3 only in the reference)
    "trace_alloc_notree": [0.10, 0.08, 0.09, 0.07],
    "grpo@3e-4": [0.01, 0.01, 0.01, 0.01],
    "grpo_twohop@3e-4": [0.02, 0.02, 0.02, 0.02],
    "grpo@1e-3": [0.06, 0.06, 0.06],
    "grpo_twohop@1e-3": [0.09, 0.09, 0.09],
}


def run(seed: int, sampled: float, base: float = BASE) -> dict[str, Any]:
    """One run record as sample_efficiency.py writes it (greedy = sampled, for brevity)."""
    return {"seed": seed, "final": {"unseen": sampled, "train": sampled, "redrawn": sampled},
            "final_by_hops": {"unseen": {"2": sampled, "3": sampled}},
            "curve": [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.01,
                       "accuracy_by_hops": {"2": 0.02, "3": 0.0}},
                      {"step": 2, "rollouts": 128, "generated_tokens": 900, "accuracy": sampled}],
            "effective_ratio": [0.1, 0.1], "reward_mean": [0.0, 0.0], "step_seconds": [1.0, 1.0], "train_seconds": 2.0,
            "sampled": {"all": sampled, "2": sampled, "3": sampled}, "sampled_base": {"all": base, "2": base, "3": base}}


def shard(lr: str, runs: dict[str, list[dict[str, Any]]], sha: str = SHA, **setting: Any) -> dict[str, Any]:
    overrides = ["data.world.min_hops=2", "optim.lr=1e-3", "eval.every=20", f"optim.lr={lr}"]
    return {"setting": {"name": "credit", "lr": float(lr), "steps": 150, "seeds": 1, "sampled_questions": 300,
                        "sampled_samples": 4, "final_eval_questions": 200, "overrides": overrides, **setting},
            "seconds": 1.0, "quick": False, "questions_per_hop": {"sampled": {"2": 151, "3": 149}},
            "provenance": {"base_model": {"sha256": sha}}, "runs": runs}


def write(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))  # json writes NaN as NaN: the shard checks must catch it
    return path


def reference(tmp_path: Path) -> list[Path]:
    """Four seeds at lr 3e-4, one shard per seed, as the mechanisms sweep wrote them."""
    return [write(tmp_path, f"ref_s{s}.json", shard("3e-4", {
        "trace_alloc_notree": [run(s, SAMPLED["trace_alloc_notree"][s])], "grpo": [run(s, SAMPLED["grpo@3e-4"][s])],
        "grpo_twohop": [run(s, SAMPLED["grpo_twohop@3e-4"][s])]})) for s in range(4)]


def control(tmp_path: Path, seeds: tuple[int, ...] = (2, 0, 1), base: float = BASE, **setting: Any) -> list[Path]:
    """The seeds done so far at lr 1e-3, in the order given (pairing must not depend on it)."""
    return [write(tmp_path, f"ctl_s{s}.json", shard("1e-3", {
        "grpo": [run(s, SAMPLED["grpo@1e-3"][s % 3], base)], "grpo_twohop": [run(s, SAMPLED["grpo_twohop@1e-3"][s % 3], base)]},
        **setting)) for s in seeds]


def test_pairs_by_seed_with_hand_computed_intervals(tmp_path: Path) -> None:
    result = lr_controls.summarise(reference(tmp_path), control(tmp_path))
    assert result["seeds"] == [0, 1, 2] and result["n"] == 3  # seed 3 has no control run yet
    assert result["base_equal_per_seed"] == {"0": True, "1": True, "2": True}
    assert result["arms"]["trace_alloc_notree"]["sampled_all"]["mean"] == pytest.approx(0.09)  # (0.10+0.08+0.09)/3
    assert result["arms"]["trace_alloc_notree"]["escape"]["count"] == 3  # 0.08 >= 0.005 + 0.02
    assert result["arms"]["grpo@3e-4"]["escape"]["count"] == 0
    roots = result["comparisons"]["learned roots minus GRPO at lr 1e-3"]["sampled_all"]
    # deltas 0.04, 0.02, 0.03: mean 0.03, sd 0.01, se 0.01/sqrt(3); t(0.975, 2) = 4.302653
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert (roots["n"], roots["higher"], roots["lower"]) == (3, 3, 0)
    assert roots["mean"] == pytest.approx(0.03) and roots["sd"] == pytest.approx(0.01)
    assert (roots["lo"], roots["hi"]) == (pytest.approx(0.03 - half, abs=1e-6), pytest.approx(0.03 + half, abs=1e-6))
    # t = 0.03 / (0.01/sqrt(3)) = sqrt(27); with 2 df the two-sided p is 1 - t / sqrt(2 + t^2) = 1 - sqrt(27/29)
    assert roots["p_t"] == pytest.approx(1 - math.sqrt(27 / 29), abs=1e-9)
    assert roots["p_signflip"] == pytest.approx(2 / 8)  # only all-plus and all-minus reach |sum| 0.09
    twohop = result["comparisons"]["learned roots minus GRPO two-hop-only at lr 1e-3"]["sampled_all"]
    assert twohop["mean"] == pytest.approx(0.0, abs=1e-12) and twohop["p_t"] == pytest.approx(1.0)  # +0.01, -0.01, 0
    lr = result["comparisons"]["GRPO at lr 1e-3 minus GRPO at lr 3e-4"]["sampled_all"]
    assert lr["mean"] == pytest.approx(0.05) and lr["p_t"] is None  # equal differences: no t-test, no Holm
    # Holm over the two t-tests: 2 x 0.0351 = 0.0702, then max(0.0702, 1 x 1.0) = 1
    assert roots["p_holm"] == pytest.approx(2 * (1 - math.sqrt(27 / 29)), abs=1e-9)
    assert twohop["p_holm"] == pytest.approx(1.0) and lr["p_holm"] is None
    assert roots["decision"] == "unresolved"  # Holm p 0.07 > 0.05
    assert result["per_seed"]["1"]["grpo@1e-3"]["sampled_all"] == 0.06
    text = tables.lr_controls_table(result)
    assert "+3.0 [+0.5, +5.5] (n 3; Holm p 0.07, sign-flip p 0.25)" in text and text.startswith("**lr_controls**")


def test_refuses_a_setting_that_differs_beyond_the_learning_rate(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        lr_controls.summarise(reference(tmp_path), control(tmp_path, steps=100))
    assert "setting.steps is 100" in str(err.value) and "only in optim.lr" in str(err.value)


def test_refuses_another_base_model(tmp_path: Path) -> None:
    ctl = [write(tmp_path, "ctl.json", shard("1e-3", {"grpo": [run(0, 0.06)], "grpo_twohop": [run(0, 0.09)]}, sha="cd" * 32))]
    with pytest.raises(SystemExit, match="base model sha256 cdcd"):
        lr_controls.summarise(reference(tmp_path), ctl)


def test_refuses_a_seed_whose_base_figures_differ(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        lr_controls.summarise(reference(tmp_path), control(tmp_path, seeds=(1,), base=0.0067))
    message = str(err.value)
    assert message.startswith("ctl_s1.json: grpo seed 1's base figures") and "in ref_s1.json" in message
    assert "\n" not in message


def test_refuses_a_control_seed_the_reference_lacks(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="^ctl_s5.json: grpo seed 5 has no run of every reference arm"):
        lr_controls.summarise(reference(tmp_path), control(tmp_path, seeds=(0, 5)))


def test_refuses_a_broken_shard_before_anything_is_paired(tmp_path: Path) -> None:
    broken = shard("1e-3", {"grpo": [run(0, 0.06)], "grpo_twohop": [run(0, float("nan"))]})
    with pytest.raises(SystemExit, match=r"runs\.grpo_twohop\[0\]\..* is nan, not a finite number"):
        lr_controls.summarise(reference(tmp_path), [write(tmp_path, "ctl.json", broken)])


def test_refuses_a_control_set_at_another_learning_rate(tmp_path: Path) -> None:
    wrong = [write(tmp_path, "ctl.json", shard("3e-4", {"grpo": [run(0, 0.06)], "grpo_twohop": [run(0, 0.09)]}))]
    with pytest.raises(SystemExit, match="setting.lr is 0.0003, expected 0.001"):
        lr_controls.summarise(reference(tmp_path), wrong)
