"""Sizes bounded before allocation (issue 50 items 5, 16): a model folder's ``config.json`` is
checked against stated caps, this machine's memory and its own weights before a model is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_tiny import bpe_tokenizer, tiny_model

from tracerl.models.size_guard import CAPS, ModelSizeError, available_bytes, check_model_folder
from tracerl.testbed.loading import load_model


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    tok = bpe_tokenizer()
    path = tmp_path / "policy"
    tiny_model(len(tok), seed=1).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _edit(folder: Path, **values: object) -> Path:
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config.update(values)
    config_file.write_text(json.dumps(config))
    return config_file


def test_an_untouched_folder_passes_and_loads(folder: Path) -> None:
    check_model_folder(folder)
    model, _ = load_model(str(folder))
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("num_hidden_layers", 200_000, "num_hidden_layers = 200,000 is past tracerl's cap of 1,024"),
    ("vocab_size", 1e9, "vocab_size = 1,000,000,000 is past tracerl's cap of 16,777,216"),
    ("hidden_size", 10**12, "hidden_size = 1,000,000,000,000 is past tracerl's cap of 131,072"),
    ("num_hidden_layers", "2", "num_hidden_layers must be a non-negative whole number, got '2'"),
    ("intermediate_size", -1, "intermediate_size must be a non-negative whole number, got -1"),
])
def test_a_size_past_its_cap_is_refused_before_building_naming_file_and_field(
        folder: Path, field: str, value: object, shown: str) -> None:
    config_file = _edit(folder, **{field: value})
    with pytest.raises(ModelSizeError) as err:
        load_model(str(folder))
    assert str(err.value).startswith(f"{config_file}: {shown}") and "\n" not in str(err.value)


def test_a_nested_sub_config_is_checked_too(folder: Path) -> None:
    config_file = _edit(folder, text_config={"num_hidden_layers": 5000})
    with pytest.raises(ModelSizeError, match=r"text_config.num_hidden_layers = 5,000 is past"):
        check_model_folder(folder)
    assert config_file.is_file()


def test_a_model_larger_than_available_memory_is_refused_by_its_meta_count(folder: Path) -> None:
    """Within every cap, but 1,024 layers of width 16,384 and MLP 65,536 (3.3e12 parameters,
    by hand: 1,024 x (4 x 16,384^2 + 3 x 16,384 x 65,536) + 2 x 16,384 x vocab) are more than
    any machine this runs on holds as float32."""
    have = available_bytes()
    assert have is not None  # Linux: /proc/meminfo
    _edit(folder, num_hidden_layers=1024, hidden_size=16_384, intermediate_size=65_536, num_attention_heads=128,
          num_key_value_heads=128, head_dim=128, layer_types=["full_attention"] * 1024)
    with pytest.raises(ModelSizeError, match=r"config.json: the model it describes has [\d,]+ parameters, [\d.]+ GiB "
                                             r"as float32, more than this machine's"):
        check_model_folder(folder)


def test_a_config_that_disagrees_with_its_weights_names_the_weight(folder: Path) -> None:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    config_file = _edit(folder, vocab_size=vocab + 7)
    with pytest.raises(ModelSizeError) as err:
        check_model_folder(folder)
    assert str(err.value).startswith(f"{config_file} does not match model.safetensors: it makes model.embed_tokens.weight "
                                     f"of shape [{vocab + 7}, 48], the file holds [{vocab}, 48]")


def test_a_config_json_too_large_or_not_an_object_is_one_line(folder: Path) -> None:
    config_file = folder / "config.json"
    config_file.write_text("[1, 2]")
    with pytest.raises(ModelSizeError, match="holds a JSON list, not a model config object"):
        check_model_folder(folder)
    with config_file.open("w") as handle:
        handle.write('{"pad": "')
        handle.write("x" * (4 * 2**20))
        handle.write('"}')
    with pytest.raises(ModelSizeError, match="larger than 4 MiB; not a model config"):
        check_model_folder(folder)


def test_the_caps_lie_past_every_released_model() -> None:
    """Qwen3-14B's and Llama 3 405B's sizes pass; the caps are stated, not guessed per model."""
    assert CAPS["num_hidden_layers"] >= 126 and CAPS["hidden_size"] >= 16_384 and CAPS["vocab_size"] >= 262_144
    assert CAPS["intermediate_size"] >= 53_248


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-step smoke run with a checkpoint (copied by each test that changes it)."""
    from helpers_cli import smoke_run

    return smoke_run(tmp_path_factory.mktemp("round4") / "run")


@pytest.mark.parametrize(("where", "edit", "command", "needle"), [
    ("ckpt-000001/policy", {"num_hidden_layers": 200_000}, "eval", "num_hidden_layers = 200,000 is past"),
    ("initial", {"num_hidden_layers": 200_000}, "resume", "num_hidden_layers = 200,000 is past"),
    ("initial", {"vocab_size": 1e9}, "resume", "vocab_size = 1,000,000,000 is past"),
])
def test_a_run_folders_model_config_is_refused_in_one_line_before_loading(
        finished: Path, tmp_path: Path, where: str, edit: dict, command: str, needle: str) -> None:
    """Through the CLI, both load paths of a run folder (``eval --run``: the checkpoint's policy;
    ``train --resume``: ``initial/``): one line naming the file and field, no transformers load
    report (its ANSI colour codes) before it."""
    import shutil

    from helpers_cli import invoke, one_line

    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    config_file = _edit(run / where, **edit)
    args = (["eval", "--run", str(run), "--limit", "1", "--no-progress"] if command == "eval"
            else ["train", "--resume", str(run), "--steps", "2"])
    result = invoke(*args)
    line = one_line(result, str(config_file), needle)
    assert "\x1b" not in result.stderr and line.count(str(config_file)) == 1


def test_a_config_json_that_is_a_device_is_refused_before_reading(folder: Path) -> None:
    config_file = folder / "config.json"
    config_file.unlink()
    config_file.symlink_to("/dev/zero")
    with pytest.raises(ModelSizeError, match=r"config.json is not a regular file"):
        check_model_folder(folder)
