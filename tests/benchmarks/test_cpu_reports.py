"""A merge whose seeds ran on two CPU types reports each type's block of seeds, and ``--other-cpu``
reports counted runs re-made on another type as a same-seed comparison of machines (both descriptive,
beside the verdict; neither changes what is merged)."""

from __future__ import annotations

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

AMD, INTEL = "AMD EPYC", "Intel(R) Xeon(R) Processor"


def _run(seed: int, sampled: float, greedy: float = 0.05, base: float = 0.04,
         rewards: list[float] | None = None) -> dict[str, Any]:
    curve = [{"step": 0, "rollouts": 0, "generated_tokens": 0, "accuracy": 0.04},
             {"step": 3, "rollouts": 48, "generated_tokens": 900, "accuracy": greedy}]
    return {"seed": seed, "curve": curve, "final": {"unseen": greedy, "train": 0.2, "redrawn": None},
            "sampled": {"all": sampled}, "sampled_base": {"all": base},
            "effective_ratio": [0.5, 0.25, 0.25], "reward_mean": rewards or [0.1, 0.2, 0.3],
            "step_seconds": [1.0, 1.0, 1.0], "train_seconds": 3.0}


def test_each_cpu_blocks_differences_by_hand() -> None:
    runs = {"grpo": [_run(0, 0.10), _run(1, 0.12), _run(2, 0.20), _run(3, 0.22)],
            "trace": [_run(0, 0.13, greedy=0.06), _run(1, 0.13), _run(2, 0.18), _run(3, 0.21, greedy=0.03)]}
    blocks = se.cpu_blocks(runs, {0: AMD, 1: AMD, 2: INTEL, 3: INTEL})
    assert list(blocks) == [AMD, INTEL] and blocks[AMD]["seeds"] == [0, 1] and blocks[INTEL]["seeds"] == [2, 3]
    amd, intel = (blocks[c]["paired_vs_grpo"]["trace"] for c in (AMD, INTEL))
    # AMD: +3 and +1 points, mean +2; Intel: -2 and -1, mean -1.5; greedy +1 and 0, then 0 and -2
    assert (amd["sampled_all"]["n"], amd["sampled_all"]["mean"]) == (2, pytest.approx(0.02))
    assert intel["sampled_all"]["mean"] == pytest.approx(-0.015)
    assert amd["greedy_all"]["mean"] == pytest.approx(0.005) and intel["greedy_all"]["mean"] == pytest.approx(-0.01)
    assert "grpo" not in blocks[AMD]["paired_vs_grpo"]
    assert se.cpu_blocks(runs, dict.fromkeys(range(4), AMD)) == {}  # one type: no blocks to report


def test_same_steps_counts_the_identical_prefix() -> None:
    assert se.same_steps([0.1, 0.2, 0.3], [0.1, 0.2, 0.25]) == 2
    assert se.same_steps([0.1, 0.2], [0.1, 0.2]) == 2
    assert se.same_steps([0.0], [0.1]) == 0


def _other(cpu: str, runs: dict[str, list[dict[str, Any]]], path: str = "other.json") -> tuple[Path, dict[str, Any]]:
    return Path(path), {"provenance": {"machine": {"cpu": cpu}}, "runs": runs}


def test_machine_pairs_by_hand_and_their_refusals() -> None:
    counted = {"grpo": [_run(6, 0.10), _run(7, 0.09)], "trace": [_run(6, 0.12, greedy=0.07)]}
    seed_cpu = {6: INTEL, 7: INTEL}
    other = _other(AMD, {"grpo": [_run(6, 0.08, greedy=0.06, rewards=[0.1, 0.2, 0.25])],
                         "trace": [_run(6, 0.11, greedy=0.07, base=0.05)]})
    got = se.machine_pairs(counted, seed_cpu, [other])
    assert got["difference"] == f"{AMD} minus {INTEL}"
    grpo, trace = got["pairs"]
    assert (grpo["arm"], grpo["seed"], grpo["shard"], grpo["cpus"]) == ("grpo", 6, "other.json", [AMD, INTEL])
    assert grpo["sampled_all"] == pytest.approx(-0.02) and grpo["greedy_all"] == pytest.approx(0.01)
    assert grpo["base_sampled_all"] == 0.0 and grpo["same_reward_steps"] == 2
    assert trace["sampled_all"] == pytest.approx(-0.01) and trace["base_sampled_all"] == pytest.approx(0.01)
    assert trace["same_reward_steps"] == 3
    assert (got["sampled_all"]["n"], got["sampled_all"]["mean"]) == (2, pytest.approx(-0.015))
    # the orientation is by name, whichever run is the counted one: Intel re-made against AMD counted
    flipped = se.machine_pairs({"grpo": [_run(6, 0.08)]}, {6: AMD}, [_other(INTEL, {"grpo": [_run(6, 0.10)]})])
    assert flipped["difference"] == f"{AMD} minus {INTEL}" and flipped["pairs"][0]["sampled_all"] == pytest.approx(-0.02)
    with pytest.raises(SystemExit, match="other.json: no merged grpo run of seed 9 to compare it with"):
        se.machine_pairs(counted, seed_cpu, [_other(AMD, {"grpo": [_run(9, 0.1)]})])
    with pytest.raises(SystemExit, match=r"other.json: grpo seed 6 ran on Intel\(R\) Xeon\(R\) Processor, as the merged"):
        se.machine_pairs(counted, seed_cpu, [_other(INTEL, {"grpo": [_run(6, 0.1)]})])
    with pytest.raises(SystemExit, match="--other-cpu: runs from 3 CPU types"):
        se.machine_pairs(counted, {6: INTEL, 7: "Zen"}, [other])


def _write(path: Path, cpu: str, runs: dict[str, list[dict[str, Any]]]) -> Path:
    setting = {"steps": 3, "seeds": 1, "overrides": [], "smoke": True, "final_eval_questions": 4, "sampled_questions": 4}
    path.write_text(json.dumps({"setting": setting, "runs": runs, "seconds": 3.0, "quick": True,
                                "provenance": {"machine": {"cpu": cpu}, "base_model": {"sha256": "ab"}}}))
    return path


def _script(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / "science" / "sample_efficiency.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=BENCH,
                          env={**os.environ, "MPLCONFIGDIR": str(tmp_path), "HF_HUB_OFFLINE": "1"})


def test_the_script_reports_blocks_and_other_cpu_pairs_beside_the_merge(tmp_path: Path) -> None:
    counted = [_write(tmp_path / "s0.json", AMD, {"grpo": [_run(0, 0.10)], "trace": [_run(0, 0.13)]}),
               _write(tmp_path / "s1.json", INTEL, {"grpo": [_run(1, 0.20)], "trace": [_run(1, 0.18)]})]
    other = _write(tmp_path / "o1.json", AMD, {"grpo": [_run(1, 0.23)]})
    out = tmp_path / "merged.json"
    done = _script("--merge", *map(str, counted), "--other-cpu", str(other), "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"seeds [0] on {AMD} (descriptive): trace +3.00" in done.stdout
    assert f"seeds [1] on {INTEL} (descriptive): trace -2.00" in done.stdout
    assert f"same arm and seed on two CPU types, {AMD} minus {INTEL} (1 pairs): sampled +3.00" in done.stdout
    merged = json.loads(out.read_text())
    assert [r["seed"] for r in merged["runs"]["grpo"]] == [0, 1]  # the other CPU's run is not merged
    assert merged["methods"]["grpo"]["sampled_by_hops"]["all"]["mean"] == pytest.approx(0.15)
    assert merged["other_cpu"]["pairs"][0]["sampled_all"] == pytest.approx(0.03)
    assert merged["cpu_blocks"][INTEL]["paired_vs_grpo"]["trace"]["sampled_all"]["mean"] == pytest.approx(-0.02)
    # another base model is refused, naming the file
    bad = _write(tmp_path / "o2.json", AMD, {"grpo": [_run(1, 0.23)]})
    bad.write_text(bad.read_text().replace('"ab"', '"cd"'))
    done = _script("--merge", *map(str, counted), "--other-cpu", str(bad), "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith(f"{bad}: base model sha256 cd differs")
    done = _script("--other-cpu", str(other), "--out", str(out), tmp_path=tmp_path)
    assert done.returncode == 2 and "--other-cpu compares shards with the runs of --merge" in done.stderr
