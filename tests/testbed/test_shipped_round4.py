"""Every file of a shipped model is pinned (issue 50 items 10, 16): an edited config or tokenizer, a
symlinked weights file, a damaged manifest, an extra file are one line; ``pretrain --out`` checks its
output; a checkpoint's model fields cannot change on resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tracerl.errors import UserError
from tracerl.runs.folder import RunFolderError
from tracerl.runs.model_identity import check_same_model
from tracerl.testbed import shipped
from tracerl.testbed.shipped import FOLDER_FILES, MANIFEST, WEIGHTS_FILE, check_shipped, find_shipped, weights_root
from tracerl.testbed.tiny import out_differs
from tracerl.testbed.tiny_config import get_preset

SMOKE = get_preset("smoke")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    shutil.copytree(weights_root() / "smoke", root / "smoke")
    return root


def test_every_shipped_manifest_pins_every_file() -> None:
    for preset in shipped.SHIPPED_PRESETS:
        manifest = shipped.read_manifest(weights_root() / preset)
        assert manifest is not None and sorted(manifest["files"]) == sorted(FOLDER_FILES)
        assert manifest["files"][WEIGHTS_FILE] == manifest["sha256"]


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_an_edited_config_or_tokenizer_is_refused_naming_the_file(root: Path, name: str) -> None:
    path = root / "smoke" / name
    path.write_text(path.read_text().replace("1e-06", "1e-05") if name == "config.json" else path.read_text() + " ")
    with pytest.raises(UserError) as err:
        find_shipped(SMOKE, root)
    text = str(err.value)
    assert text.startswith(f"{path}: sha256 ") and "does not match its manifest" in text and "\n" not in text
    assert "--smoke-random" not in text and "tracerl pretrain --preset smoke --ship" in text
    assert check_shipped("smoke", root) == [f"{text}"]


def test_a_symlinked_weights_file_is_refused(root: Path, tmp_path: Path) -> None:
    weights = root / "smoke" / WEIGHTS_FILE
    elsewhere = tmp_path / "elsewhere.safetensors"
    shutil.move(weights, elsewhere)
    weights.symlink_to(elsewhere)  # the same bytes: only the link is wrong
    with pytest.raises(UserError, match=r"model.safetensors: a shipped file must be a regular file, not a link"):
        find_shipped(SMOKE, root)


def test_an_extra_file_beside_the_shipped_model_is_refused(root: Path) -> None:
    (root / "smoke" / "model-00002.safetensors").write_bytes(b"x")
    with pytest.raises(UserError, match=r"model-00002.safetensors: not a file of the shipped model"):
        find_shipped(SMOKE, root)


@pytest.mark.parametrize(("edit", "message"), [
    ({"sha256": 12345}, "sha256 must be 64 hex digits, got 12345"),
    ({"preset": "smo\x1b]0;owned\x07ke"}, "preset must be a plain word, got 'smo\\x1b]0;owned\\x07ke'"),
    ({"files": {"config.json": "0" * 64}}, "files must give the sha256 of each of model.safetensors"),
    ({"files": {"model.safetensors": None}}, "files.'model.safetensors' must be 64 hex digits, got None"),
])
def test_a_damaged_manifest_is_one_line_naming_the_field(root: Path, edit: dict, message: str) -> None:
    path = root / "smoke" / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(UserError) as err:
        find_shipped(SMOKE, root)
    assert str(err.value).startswith(f"{path}: {message}")
    assert "\x1b" not in str(err.value) and "\x07" not in str(err.value)


def test_a_huge_manifest_is_not_read_whole(root: Path) -> None:
    path = root / "smoke" / MANIFEST
    with path.open("w") as handle:
        handle.write('{"pad": "' + "x" * (2 * shipped.MAX_MANIFEST_BYTES) + '"}')
    with pytest.raises(UserError, match=r"not a readable manifest \(larger than 64 KiB\)"):
        find_shipped(SMOKE, root)


def test_pretrain_out_holding_only_tiny_config_is_not_taken_for_the_model(tmp_path: Path) -> None:
    cached = weights_root() / "smoke"
    out = tmp_path / "D"
    out.mkdir()
    shutil.copyfile(cached / "tiny_config.json", out / "tiny_config.json")
    assert out_differs(cached, out) == "not model.safetensors"
    for name in FOLDER_FILES:
        shutil.copyfile(cached / name, out / name)
    assert out_differs(cached, out) is None
    (out / "tokenizer.json").write_text("{}")
    assert out_differs(cached, out) == "another tokenizer.json"


def test_pretrain_out_is_checked_before_pretraining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.testbed import tiny

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pretrained although --out was refused")

    monkeypatch.setattr(tiny, "load_or_pretrain", refuse)
    out = tmp_path / "D"
    out.mkdir()
    shutil.copyfile(weights_root() / "smoke" / "tiny_config.json", out / "tiny_config.json")
    with pytest.raises(ValueError, match=r"holds this model's tiny_config.json but not model.safetensors; empty"):
        tiny.pretrained_folder("smoke", out=out)
    assert sorted(p.name for p in out.iterdir()) == ["tiny_config.json"]  # nothing of the user's touched


def _config_yaml(preset: str, name: str, tiny_preset: str) -> str:
    return f"preset: {preset}\nmodel:\n  name_or_path: {name}\n  tiny_preset: {tiny_preset}\nseed: 0\n"


@pytest.mark.parametrize(("field", "edited", "shown"), [
    ("preset", ("trace", "tiny", "smoke"), "preset = 'trace' but the run started with 'grpo'"),
    ("model", ("grpo", "Qwen/Qwen3-0.6B", "smoke"), "model.name_or_path = 'Qwen/Qwen3-0.6B' but the run started with 'tiny'"),
    ("tiny_preset", ("grpo", "tiny", "default"), "model.tiny_preset = 'default' but the run started with 'smoke'"),
])
def test_a_checkpoint_naming_another_model_is_refused(tmp_path: Path, field: str, edited: tuple, shown: str) -> None:
    run = tmp_path / "run"
    ckpt = run / "ckpt-000002"
    ckpt.mkdir(parents=True)
    (run / "config.yaml").write_text(_config_yaml("grpo", "tiny", "smoke"))
    (ckpt / "config.yaml").write_text(_config_yaml("grpo", "tiny", "smoke"))
    check_same_model(run, ckpt)  # untouched: nothing to say
    (ckpt / "config.yaml").write_text(_config_yaml(*edited))
    with pytest.raises(RunFolderError) as err:
        check_same_model(run, ckpt)
    assert str(err.value).startswith(f"{ckpt / 'config.yaml'}: {shown} ({run / 'config.yaml'})")
