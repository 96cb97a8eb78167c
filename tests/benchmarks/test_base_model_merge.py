"""Benchmark shards merge only when they started from the same base model (provenance sha256)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from common import check_one_base_model  # noqa: E402


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
