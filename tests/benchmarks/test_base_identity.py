"""base_identity.py's reading of older results files: which setting, which base figures, which verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))
from base_identity import compare, recorded, setting_of, verdict  # noqa: E402


def _file(overrides: list[str], runs: dict) -> dict:
    return {"setting": {"overrides": overrides}, "runs": runs}


def _run(seed: int, greedy: float, sampled: dict | None) -> dict:
    return {"seed": seed, "curve": [{"step": 0, "accuracy": greedy, "accuracy_by_hops": {"2": greedy}}],
            "sampled_base": sampled}


def test_the_setting_is_the_recorded_name_or_read_from_the_overrides() -> None:
    assert setting_of({"setting": {"name": "credit", "overrides": []}}) == "credit"
    assert setting_of(_file(["model.tiny_preset=bench_hops", "data.world.min_hops=2"], {})) == "credit"
    assert setting_of(_file(["model.tiny_preset=bench_hops"], {})) == "bench"
    assert setting_of(_file(["model.tiny_preset=bench_hops_lookalike", "data.world.min_hops=2"], {})) == "lookalike"
    assert setting_of(_file(["eval.size=100"], {})) == "demo"
    assert setting_of(_file(["model.tiny_preset=smoke"], {})) is None
    assert setting_of({"rows": []}) is None


def test_each_seed_takes_its_first_run_and_the_figures_compare_at_four_digits() -> None:
    data = _file([], {"grpo": [_run(0, 0.01, {"all": 0.0058})], "trace": [_run(0, 0.5, None), _run(1, 0.02, None)]})
    figures = recorded(data)
    assert figures == {0: {"greedy": 0.01, "greedy_by_hops": {"2": 0.01}, "sampled": {"all": 0.0058}},
                       1: {"greedy": 0.02, "greedy_by_hops": {"2": 0.02}, "sampled": None}}
    mine = {"greedy": 0.010001, "greedy_by_hops": {"2": 0.0100004}, "sampled": {"all": 0.0059}}
    assert compare(mine, figures[0]) == {"greedy": True, "greedy_by_hops": True,
                                         "sampled": {"file": {"all": 0.0058}, "shipped": {"all": 0.0059}}}
    assert compare(mine, figures[1]) == {"greedy": {"file": 0.02, "shipped": 0.010001},
                                         "greedy_by_hops": {"file": {"2": 0.02}, "shipped": {"2": 0.0100004}}}


def test_identified_needs_every_shared_figure_equal_and_one_of_them_not_zero() -> None:
    mine = {0: {"greedy": 0.01, "sampled": {"all": 0.0}}, 1: {"greedy": 0.0}}
    assert verdict({0: {"greedy": True, "sampled": True}}, mine) == "identified"
    assert verdict({0: {"greedy": True, "sampled": {"file": 1, "shipped": 0}}}, mine) == "differs"
    assert verdict({1: {"greedy": True}}, mine) == "not comparable"  # an all-zero base rate identifies nothing
    assert verdict({0: {}}, mine) == "not comparable"


def test_a_table_names_its_base_recorded_identified_or_unrecorded(tmp_path: Path) -> None:
    from common import base_label

    shipped = {"provenance": {"base_model": {"source": "shipped", "tiny_preset": "bench_hops", "sha256": "33c5e173ab"}}}
    assert base_label(tmp_path / "a.json", shipped, tmp_path) == "base: shipped `bench_hops` 33c5e173"
    assert base_label(tmp_path / "old.json", {}, tmp_path) == "base: an earlier pretraining draw, not recorded"
    (tmp_path / "base_identity.json").write_text(json.dumps({
        "base_models": {"credit": {"tiny_preset": "bench_hops", "sha256": "33c5e173ab"}},
        "files": {"old.json": {"setting": "credit", "verdict": "identified"},
                  "other.json": {"setting": "credit", "verdict": "differs"}}}))
    assert base_label(tmp_path / "old.json", {}, tmp_path) == (
        "base: identified as the shipped `bench_hops` 33c5e173 by its base figures (`base_identity.json`)")
    assert base_label(tmp_path / "other.json", {}, tmp_path) == "base: an earlier pretraining draw, not recorded"
