"""Benchmark shards merge only when they started from the same base model (provenance sha256), and a
seed's runs only when they ran on one CPU type (provenance machine cpu)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from common import check_one_base_model, check_one_cpu_per_seed  # noqa: E402


def _shard(sha: str | None) -> dict:
    return {"provenance": {"base_model": {"sha256": sha}, "machine": {}}} if sha else {"seconds": 1.0}


def test_shards_of_one_base_model_merge_and_others_are_refused_naming_the_file() -> None:
    paths = [Path("a.json"), Path("b.json")]
    check_one_base_model(paths, [_shard("abc"), _shard("abc")])
    check_one_base_model(paths, [_shard(None), _shard(None)])  # older shards, neither recorded
    with pytest.raises(SystemExit, match=r"b.json: base model sha256 def differs from a.json's \(abc\)"):
        check_one_base_model(paths, [_shard("abc"), _shard("def")])
    with pytest.raises(SystemExit, match="b.json: base model sha256 None differs"):
        check_one_base_model(paths, [_shard("abc"), _shard(None)])  # an unrecorded base is not the same base


def _ran(cpu: str | None, **seeds: list[int]) -> dict:
    runs = {arm: [{"seed": s} for s in ss] for arm, ss in seeds.items()}
    return {"provenance": {"machine": {"cpu": cpu}}, "runs": runs} if cpu else {"runs": runs}


def test_a_seeds_runs_merge_only_from_one_cpu_type() -> None:
    paths = [Path("a.json"), Path("b.json"), Path("c.json")]
    # seeds 0-1 on one type, seed 2 on another: each seed is whole on one type
    check_one_cpu_per_seed(paths, [_ran("AMD EPYC", grpo=[0, 1]), _ran("AMD EPYC", arm=[0, 1]), _ran("Intel", grpo=[2], arm=[2])])
    check_one_cpu_per_seed(paths[:2], [_ran(None, grpo=[0]), _ran(None, arm=[0])])  # older shards, neither recorded
    with pytest.raises(SystemExit, match=r"c.json: seed 1 ran on Intel, in a.json on AMD EPYC; merge runs of one seed"):
        check_one_cpu_per_seed(paths, [_ran("AMD EPYC", grpo=[0, 1]), _ran("AMD EPYC", arm=[0]), _ran("Intel", arm=[1])])
    with pytest.raises(SystemExit, match=r"b.json: seed 0 ran on None, in a.json on AMD EPYC"):
        check_one_cpu_per_seed(paths[:2], [_ran("AMD EPYC", grpo=[0]), _ran(None, arm=[0])])
