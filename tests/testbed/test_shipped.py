"""The tiny base models shipped in the package: pinned to their presets, checked at load, never pretrained.

Every check here reads files only: a preset whose config changed without re-shipping its model
fails :func:`test_every_shipped_preset_pins_its_current_config` at once, no pretraining needed.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from helpers_cli import invoke, one_line
from tracerl.errors import UserError
from tracerl.testbed import shipped, tiny
from tracerl.testbed.provenance import base_model_record, machine_facts, provenance
from tracerl.testbed.shipped import (
    FOLDER_FILES,
    MANIFEST,
    SHIPPED_PRESETS,
    WEIGHTS_FILE,
    check_shipped,
    file_sha256,
    find_shipped,
    read_manifest,
    ship_preset,
    weights_root,
)
from tracerl.testbed.tiny_config import PRESETS, TinyModelConfig, get_preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", SHIPPED_PRESETS)
def test_every_shipped_preset_pins_its_current_config(preset: str) -> None:
    # The failure text names the preset and the command that re-makes its model.
    assert check_shipped(preset) == []
    manifest = read_manifest(weights_root() / preset)
    assert manifest is not None
    assert manifest["preset"] == preset and manifest["config_hash"] == get_preset(preset).hash()
    assert manifest["precision"] == "float32" and manifest["weights_file"] == WEIGHTS_FILE
    assert manifest["command"].endswith(f"tracerl pretrain --preset {preset} --ship")
    assert manifest["bytes"] == (weights_root() / preset / WEIGHTS_FILE).stat().st_size
    assert manifest["parameters"] > 0 and manifest["torch"]


def test_presets_default_to_float32_pretraining() -> None:
    assert TinyModelConfig().precision == "float32"
    assert all(PRESETS[p].precision == "float32" for p in SHIPPED_PRESETS)


def test_a_config_change_is_caught_without_pretraining(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = replace(get_preset("smoke"), steps=get_preset("smoke").steps + 1)
    assert find_shipped(changed) is None  # another model: loading would pretrain it, not take the shipped one
    monkeypatch.setitem(PRESETS, "smoke", changed)
    problems = check_shipped("smoke")
    assert len(problems) == 2  # the manifest's hash and tiny_config.json both disagree
    assert "config_hash 4725418f22b5e62b but preset 'smoke' hashes to" in problems[0]
    assert all("tracerl pretrain --preset smoke --ship" in p for p in problems)


def _copy_of_smoke(tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    shutil.copytree(weights_root() / "smoke", root / "smoke")
    return root


def test_a_damaged_weights_file_is_one_line_naming_it(tmp_path: Path) -> None:
    root = _copy_of_smoke(tmp_path)
    weights = root / "smoke" / WEIGHTS_FILE
    assert find_shipped(get_preset("smoke"), root) == root / "smoke"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one flipped bit in the last tensor
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError) as err:
        find_shipped(get_preset("smoke"), root)
    text = str(err.value)
    assert "\n" not in text and str(weights) in text and "does not match its manifest" in text
    assert "tracerl pretrain --preset smoke --ship" in text
    assert check_shipped("smoke", root) == [f"{weights}: sha256 does not match {root / 'smoke' / MANIFEST}; "
                                            "re-make it with `tracerl pretrain --preset smoke --ship` or reinstall tracerl"]


def test_ship_preset_writes_a_manifest_that_pins_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "weights"
    folder = ship_preset("smoke", weights_root() / "smoke", "TRACERL_THREADS=1 tracerl pretrain --preset smoke --ship",
                         root)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FOLDER_FILES, MANIFEST])
    assert check_shipped("smoke", root) == []
    ours, theirs = read_manifest(folder), read_manifest(weights_root() / "smoke")
    assert ours == theirs  # same source, same command: the same manifest
    assert [p.name for p in root.iterdir()] == ["smoke"]  # no temporary folder left
    with pytest.raises(UserError, match="another config than preset 'default'"):
        ship_preset("default", folder, "x", root)


def test_loading_the_tiny_model_takes_the_shipped_folder_and_pretrains_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    from tracerl.testbed.loading import load_model

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pretrained although a shipped model matches")

    monkeypatch.setattr(tiny, "pretrain_tiny_model", refuse)
    assert tiny.load_or_pretrain(get_preset("smoke")) == weights_root() / "smoke"
    assert tiny.existing_folder(get_preset("smoke")) == weights_root() / "smoke"
    assert tiny.existing_folder(replace(get_preset("smoke"), seed=1), cache_dir=tmp_path) is None  # would pretrain
    model, tokenizer = load_model("tiny", tiny_preset="smoke")
    assert sum(p.numel() for p in model.parameters()) == read_manifest(weights_root() / "smoke")["parameters"]
    assert len(tokenizer) == read_manifest(weights_root() / "smoke")["vocab_size"]


def test_the_package_data_globs_cover_every_shipped_file() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data.get("tracerl.testbed", [])
    package = ROOT / "tracerl" / "testbed"
    files = [p.relative_to(package).as_posix() for p in (package / "weights").rglob("*") if p.is_file()]
    assert len(files) == len(SHIPPED_PRESETS) * (len(FOLDER_FILES) + 1)  # nothing else lies there
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)] == []
    assert weights_root() == package / "weights"  # importlib.resources finds them (editable install)


def test_the_shipped_models_stay_small() -> None:
    total = sum(p.stat().st_size for p in weights_root().rglob("*") if p.is_file())
    # the package-size budget: 24 MB, five float32 models of about 1M parameters and the smoke model
    # (~20.5 MB; a wheel's limit on PyPI is 100 MB, and a checkout should stay quick to clone)
    assert total < 24_000_000


def test_provenance_records_the_shipped_sha256_and_the_machine() -> None:
    record = base_model_record("tiny", "bench_hops")
    manifest = read_manifest(weights_root() / "bench_hops")
    assert record == {"name_or_path": "tiny", "tiny_preset": "bench_hops", "config_hash": get_preset("bench_hops").hash(),
                      "source": "shipped", "sha256": manifest["sha256"], "command": manifest["command"]}
    folder = base_model_record(str(weights_root() / "smoke"))
    assert folder["sha256"] == file_sha256(weights_root() / "smoke" / WEIGHTS_FILE) and folder["source"] == "path"
    facts = machine_facts()
    assert {"torch", "transformers", "cpu", "cpu_count", "torch_threads", "platform", "python", "gpu"} <= set(facts)
    assert json.loads(json.dumps(provenance("tiny", "smoke")))["base_model"]["source"] == "shipped"


def test_pretrain_ship_refuses_overrides_in_one_line() -> None:
    result = invoke("pretrain", "--preset", "smoke", "--steps", "3", "--ship")
    one_line(result, "--ship publishes a preset's own model: drop --steps and --seed")
    assert shipped.check_shipped("smoke") == []  # the shipped copy is untouched
