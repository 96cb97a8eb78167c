"""What a sample-efficiency shard must hold before ``--merge`` summarises it (issue 50 items 9, 17).

A shard is read with a size cap, parsed, and checked whole before anything is written: every
number finite and of bounded size (a seed's final ``NaN`` used to drop out of the mean silently,
``1e308`` overflowed the sums), the fields the summary and the plot read present and of the right
type, known methods only, each seed once per method and shard, and the runs of one method aligned
(same evaluation steps, same number of steps). A failure is one ``SystemExit`` line naming the file
and the field, e.g. ``b.json: runs.grpo[0].final.unseen is NaN, not a finite number``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAX_SHARD_BYTES = 64 * 2**20
"""A shard of 8 presets x 5 seeds x 200 steps is well under 1 MB; past this it is not a shard."""
MAX_NUMBER = 1e15
"""Largest magnitude of any number in a shard (tokens, seconds, accuracies are all far below)."""
_RUN_LISTS = ("effective_ratio", "reward_mean", "step_seconds")
_SPLITS = ("unseen", "train", "redrawn")


class ShardError(SystemExit):
    """A shard that cannot be merged; the message is one line naming the file and the field."""


def read_shard(path: Path) -> dict[str, Any]:
    """``path`` parsed as a JSON object, or :class:`ShardError` (missing, too big, not JSON, not an object)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SHARD_BYTES + 1)
    except OSError as err:
        raise ShardError(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    if len(data) > MAX_SHARD_BYTES:
        raise ShardError(f"{path}: larger than {MAX_SHARD_BYTES // 2**20} MiB; not a benchmark shard")
    try:
        shard = json.loads(data)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ShardError(f"{path}: not JSON ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(shard, dict):
        raise ShardError(f"{path}: holds a JSON {type(shard).__name__}, not a shard object")
    return shard


def check_numbers(path: Path, value: Any, where: str = "") -> None:
    """Every number under ``value`` finite and at most :data:`MAX_NUMBER` in magnitude."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            raise ShardError(f"{path}: {at} is {item}, not a finite number")
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and abs(item) > MAX_NUMBER:
            shown = f"{item:.3g}" if isinstance(item, float) else f"an integer of {len(str(abs(item)))} digits"
            raise ShardError(f"{path}: {at} is {shown}, past the bound {MAX_NUMBER:g}")


def _is_number(value: Any, optional: bool = False) -> bool:
    return (value is None and optional) or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _need(path: Path, ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ShardError(f"{path}: {where} must be {what}")


def _number_map(path: Path, value: Any, where: str) -> None:
    """``{key: number or null}`` (per-hop accuracies, sampled success, hop shares)."""
    _need(path, isinstance(value, dict), where, "an object of numbers")
    for key, v in value.items():
        _need(path, _is_number(v, optional=True), f"{where}.{key}", "a number or null")


def _check_curve(path: Path, curve: Any, where: str) -> None:
    _need(path, isinstance(curve, list) and len(curve) > 0, where, "a non-empty list of evaluation points")
    for i, point in enumerate(curve):
        at = f"{where}[{i}]"
        _need(path, isinstance(point, dict), at, "an object")
        _need(path, isinstance(point.get("step"), int) and not isinstance(point.get("step"), bool), f"{at}.step",
              "an integer")
        for key in ("rollouts", "generated_tokens"):
            _need(path, _is_number(point.get(key)), f"{at}.{key}", "a number")
        _need(path, _is_number(point.get("accuracy"), optional=True), f"{at}.accuracy", "a number or null")
        if "accuracy_by_hops" in point:
            _number_map(path, point["accuracy_by_hops"], f"{at}.accuracy_by_hops")


def check_run(path: Path, run: Any, where: str) -> None:
    """One run of one method: the fields :func:`sample_efficiency.summarise` and the plot read."""
    _need(path, isinstance(run, dict), where, "an object")
    seed = run.get("seed")
    _need(path, isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, f"{where}.seed",
          "a non-negative integer")
    _check_curve(path, run.get("curve"), f"{where}.curve")
    final = run.get("final")
    _need(path, isinstance(final, dict), f"{where}.final", "an object of unseen, train and redrawn accuracies")
    for split in _SPLITS:
        _need(path, _is_number(final.get(split), optional=True) and (final.get(split) is None or 0 <= final[split] <= 1),
              f"{where}.final.{split}", "an accuracy in [0, 1] or null")
    for key in _RUN_LISTS:
        values = run.get(key)
        _need(path, isinstance(values, list) and all(_is_number(v) for v in values), f"{where}.{key}",
              "a list of numbers")
    _need(path, _is_number(run.get("train_seconds"), optional=True), f"{where}.train_seconds", "a number")
    for key in ("sampled", "sampled_base", "hop_share"):
        if run.get(key) is not None:
            _number_map(path, run[key], f"{where}.{key}")
    by_hops = run.get("final_by_hops", {})
    _need(path, isinstance(by_hops, dict), f"{where}.final_by_hops", "an object")
    for split, hops in by_hops.items():
        _number_map(path, hops, f"{where}.final_by_hops.{split}")


def check_shard(path: Path, shard: dict[str, Any], methods: Iterable[str]) -> None:
    """The whole shard: its numbers, ``setting``, ``seconds``, ``provenance`` and every run of a known method."""
    check_numbers(path, shard)
    _need(path, isinstance(shard.get("setting"), dict), "setting", "an object")
    _need(path, _is_number(shard.get("seconds")) and shard["seconds"] >= 0, "seconds", "a non-negative number")
    _need(path, isinstance(shard.get("quick", False), bool), "quick", "true or false")
    provenance = shard.get("provenance")
    _need(path, provenance is None or (isinstance(provenance, dict) and isinstance(provenance.get("base_model") or {}, dict)),
          "provenance", "an object (with base_model an object)")
    runs = shard.get("runs")
    _need(path, isinstance(runs, dict) and len(runs) > 0, "runs", "an object of methods to lists of runs")
    known = tuple(methods)
    for method, rs in runs.items():
        if method not in known:
            raise ShardError(f"{path}: runs.{method} is not a known method; valid: {', '.join(known)}")
        _need(path, isinstance(rs, list) and len(rs) > 0, f"runs.{method}", "a non-empty list of runs")
        seeds: set[int] = set()
        for i, run in enumerate(rs):
            check_run(path, run, f"runs.{method}[{i}]")
            if run["seed"] in seeds:
                raise ShardError(f"{path}: runs.{method}[{i}].seed {run['seed']} appears twice for {method}")
            seeds.add(run["seed"])


def check_aligned(runs: dict[str, list[dict[str, Any]]], paths: list[Path]) -> None:
    """The runs of one method evaluate at the same steps and train the same number of steps
    (the seed mean of a curve and the per-step plot pair them up by position)."""
    names = ", ".join(p.name for p in paths)
    for method, rs in runs.items():
        first = rs[0]
        steps = [p["step"] for p in first["curve"]]
        for run in rs[1:]:
            if [p["step"] for p in run["curve"]] != steps:
                raise ShardError(f"{names}: {method} seed {run['seed']}'s curve evaluates at other steps than seed "
                                 f"{first['seed']}'s; merge shards of one sweep")
            if len(run["effective_ratio"]) != len(first["effective_ratio"]):
                raise ShardError(f"{names}: {method} seed {run['seed']} trained {len(run['effective_ratio'])} steps, "
                                 f"seed {first['seed']} {len(first['effective_ratio'])}; merge shards of one sweep")
