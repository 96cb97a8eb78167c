"""``sample_efficiency.py --merge`` checks every shard whole before writing anything (issue 50
items 9, 17): one line naming the file and the field for each malformed shard, no JSON or PNG."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "science"))
import sample_efficiency as se  # noqa: E402


def _run(seed: int, unseen: float) -> dict[str, Any]:
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.1},
             {"step": 2, "rollouts": 32, "generated_tokens": 900, "accuracy": unseen}]
    return {"seed": seed, "curve": curve, "final": {"unseen": unseen, "train": 0.5, "redrawn": None},
            "effective_ratio": [0.5, 0.25], "reward_mean": [0.1, 0.2], "step_seconds": [1.0, 1.0], "train_seconds": 2.0}


def _shard(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"setting": {"steps": 2, "seeds": 1}, "runs": runs, "seconds": 3.0, "quick": True}


def _write(path: Path, shard: Any) -> Path:
    path.write_text(shard if isinstance(shard, str) else json.dumps(shard))
    return path


def _edited(edit: Any) -> Any:
    shard = _shard({"grpo": [_run(1, 0.4)]})
    return edit(copy.deepcopy(shard)) if callable(edit) else edit


def _set(keys: list[Any], value: Any) -> Any:
    def edit(shard: dict[str, Any]) -> dict[str, Any]:
        node = shard
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        return shard
    return edit


def _drop(keys: list[Any]) -> Any:
    def edit(shard: dict[str, Any]) -> dict[str, Any]:
        node = shard
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
        return shard
    return edit


MALFORMED = [
    ("nan_final", _set(["runs", "grpo", 0, "final", "unseen"], float("nan")), "runs.grpo[0].final.unseen is nan, not a finite number"),
    ("missing_final", _drop(["runs", "grpo", 0, "final"]), "runs.grpo[0].final must be an object"),
    ("missing_runs", _drop(["runs"]), "runs must be an object of methods"),
    ("a_list", "[1, 2]", "holds a JSON list, not a shard object"),
    ("not_json", "{\"setting\": ", "not JSON"),
    ("unknown_method", lambda s: {**s, "runs": {"bogus": s["runs"]["grpo"]}}, "runs.bogus is not a known method; valid: grpo"),
    ("string_seconds", _set(["seconds"], "3"), "seconds must be a non-negative number"),
    ("null_seed", _set(["runs", "grpo", 0, "seed"], None), "runs.grpo[0].seed must be a non-negative integer"),
    ("string_curve", _set(["runs", "grpo", 0, "curve"], "up"), "runs.grpo[0].curve must be a non-empty list"),
    ("huge", _set(["runs", "grpo", 0, "train_seconds"], 1e308), "runs.grpo[0].train_seconds is 1e+308, past the bound 1e+15"),
    ("accuracy_past_one", _set(["runs", "grpo", 0, "final", "train"], 2.0), "runs.grpo[0].final.train must be an accuracy in [0, 1]"),
    ("seed_twice", lambda s: {**s, "runs": {"grpo": [_run(1, 0.4), _run(1, 0.5)]}}, "runs.grpo[1].seed 1 appears twice"),
]


@pytest.mark.parametrize(("name", "edit", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_shard_is_refused_naming_file_and_field(tmp_path: Path, name: str, edit: Any, message: str) -> None:
    good = _write(tmp_path / "a.json", _shard({"grpo": [_run(0, 0.3)]}))
    bad = _write(tmp_path / f"{name}.json", _edited(edit))
    with pytest.raises(SystemExit) as err:
        se.merge_shards([good, bad])
    text = str(err.value.code)
    assert text.startswith(f"{bad}: ") and message in text and "\n" not in text


def test_nan_twins_and_one_seeds_nan_are_refused_through_the_script_writing_nothing(tmp_path: Path) -> None:
    """The reported cases: one seed's final NaN (exit 0 with the mean over the other seed) and two
    shards holding the same NaN run (wrote the JSON and the PNG, then crashed)."""
    a = _write(tmp_path / "a.json", _shard({"grpo": [_run(0, 0.3)]}))
    nan_run = _run(1, 0.4)
    nan_run["final"]["unseen"] = float("nan")
    b = _write(tmp_path / "b_nan.json", _shard({"grpo": [nan_run]}))
    twin = _write(tmp_path / "b_twin.json", _shard({"grpo": [nan_run]}))
    out = tmp_path / "merged.json"
    for shards in ([a, b], [b, twin]):
        done = subprocess.run([sys.executable, str(BENCH / "science" / "sample_efficiency.py"), "--merge", *map(str, shards),
                               "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=BENCH)
        assert done.returncode == 1
        assert done.stderr == f"{b}: runs.grpo[0].final.unseen is nan, not a finite number\n"
        assert not out.exists() and not out.with_suffix(".png").exists()


def test_runs_of_one_method_must_be_aligned(tmp_path: Path) -> None:
    short = _run(1, 0.4)
    short["effective_ratio"] = [0.5]
    a = _write(tmp_path / "a.json", _shard({"grpo": [_run(0, 0.3)]}))
    b = _write(tmp_path / "b.json", _shard({"grpo": [short]}))
    with pytest.raises(SystemExit, match=r"a.json, b.json: grpo seed 1 trained 1 steps, seed 0 2; merge shards of one sweep"):
        se.merge_shards([a, b])


def test_well_formed_shards_merge_as_before(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", _shard({"grpo": [_run(0, 0.3)]}))
    b = _write(tmp_path / "b.json", _shard({"grpo": [_run(1, 0.5)]}))
    runs, merged = se.merge_shards([a, b])
    assert [r["seed"] for r in runs["grpo"]] == [0, 1] and merged["seconds"] == 6.0
    assert se.summarise(runs)["methods"]["grpo"]["final_accuracy_mean"] == pytest.approx(0.4)  # (0.3 + 0.5) / 2


def test_a_merge_reports_each_arms_gain_over_its_base(tmp_path: Path) -> None:
    """Sampled success after training minus the base model's, by seed, in the JSON and on stdout."""
    shards = []
    for seed, (final, base) in enumerate(((0.06, 0.04), (0.05, 0.04), (0.07, 0.04))):
        run = _run(seed, 0.3)
        run["sampled"], run["sampled_base"] = {"all": final}, {"all": base}
        shard = _shard({"grpo": [run]})
        shard["setting"].update(overrides=[], smoke=True, final_eval_questions=4, sampled_questions=4)
        shards.append(_write(tmp_path / f"s{seed}.json", shard))
    out = tmp_path / "merged.json"
    done = subprocess.run([sys.executable, str(BENCH / "science" / "sample_efficiency.py"), "--merge", *map(str, shards),
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=BENCH,
                          env={**os.environ, "MPLCONFIGDIR": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    # gains 2, 1, 3 points: mean 2, sd 1, se 1 / sqrt 3 = 0.577, t_{0.975,2} = 4.303 -> 2 +- 2.484
    assert "sampled gain over base +2.00 [-0.48, +4.48]" in done.stdout
    gain = json.loads(out.read_text())["methods"]["grpo"]["gain_over_base"]["sampled_all"]
    assert gain["n"] == 3 and gain["mean"] == pytest.approx(0.02)
    assert gain["p_signflip"] == 0.25  # all positive: 2 of the 8 sign assignments reach |sum| 6
