"""Validation at config load: values that used to fail mid-run (or never) fail when the config
is built, naming the field and what to do."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tracerl.config import checks as config_checks
from tracerl.config.schema import ConfigError, OptimConfig, TrainConfig, config_from_yaml, resolve_config
from tracerl.config.loading import section_paths, with_field_paths


def rejects(*overrides: str, preset: str = "grpo") -> str:
    with pytest.raises(ConfigError) as info:
        resolve_config(preset, overrides=list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [("optim.lr=.inf", "optim.lr"), ("optim.clip_high=.nan", "optim.clip_high"), ("optim.betas=[0.9, .nan]", "optim.betas"),
     ("rollout.engine.top_p=.nan", "rollout.engine.top_p"), ("eval.temperature=.inf", "eval.temperature"),
     ("rollout.schemes.trace_stage1_fraction=.nan", "rollout.schemes.trace_stage1_fraction"),
     ("optim.kl_coef=.inf", "optim.kl_coef"), ("algo.advantage.omega=.inf", "algo.advantage.omega")],
)
def test_non_finite_floats_are_rejected_naming_the_field(override: str, field: str) -> None:
    assert field in rejects(override)


def test_huge_but_finite_values_still_load() -> None:
    assert resolve_config("grpo", overrides=["optim.lr=1e30"]).optim.lr == 1e30  # the update's finite check owns this


def test_training_temperature_must_be_positive_and_points_to_eval() -> None:
    message = rejects("rollout.engine.temperature=0")
    assert "rollout.engine.temperature must be > 0" in message and "eval.temperature=0" in message
    assert resolve_config("grpo", overrides=["eval.temperature=0"]).eval.temperature == 0.0


def test_negative_weight_decay_is_refused_at_load_not_at_the_first_step() -> None:
    assert rejects("optim.weight_decay=-5") == "optim.weight_decay must be >= 0, got -5.0"
    assert resolve_config("grpo", overrides=["optim.weight_decay=0.1"]).optim.weight_decay == 0.1


@pytest.mark.parametrize("betas", ["[2, 3]", "[0.9, 1.0]", "[-0.1, 0.9]"])
def test_betas_lie_in_zero_one(betas: str) -> None:
    assert "optim.betas" in rejects(f"optim.betas={betas}")
    assert OptimConfig(betas=(0.0, 0.999)).betas == (0.0, 0.999)


def test_group_size_one_names_the_field() -> None:
    assert "rollout.schemes.group_size must be >= 2, got 1" in rejects("rollout.schemes.group_size=1")


@pytest.mark.parametrize(
    ("preset", "overrides", "needle"),
    [
        ("grpo", ["rollout.budget=5"], "not a multiple of rollout.schemes.group_size = 8"),
        ("dapo", ["rollout.budget=12"], "not a multiple"),
        ("grpo", ["rollout.budget=136"], "needs 17 prompts"),  # pool_size 16
        ("tree_grpo", ["rollout.budget=7"], "a prompt costs 8 rollouts"),  # 4 + 2 * 2 * 1
        ("tree_grpo", ["rollout.budget=136"], "8 <= budget < 136"),
        ("trace", ["rollout.budget=6"], "below the 8 rollouts"),
    ],
)
def test_budget_must_fit_the_scheme(preset: str, overrides: list[str], needle: str) -> None:
    message = rejects(*overrides, preset=preset)
    assert message.startswith("rollout.budget = ") and needle in message


def test_budgets_the_schemes_accept_still_load() -> None:
    assert resolve_config("grpo", overrides=["rollout.budget=128"]).rollout.budget == 128  # 16 groups of 8
    assert resolve_config("tree_grpo", overrides=["rollout.budget=135"]).rollout.budget == 135  # 16 trees + 7 spare
    assert resolve_config("dapo", overrides=["rollout.budget=256", "rollout.schemes.dapo_target_groups=4"])


def test_device_must_exist_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "no CUDA GPU; available: cpu" in rejects("model.device=cuda:7")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    message = rejects("model.device=cuda:7")
    assert "model.device = 'cuda:7'" in message and "available: cpu, cuda, cuda:0, cuda:1" in message
    assert resolve_config("grpo", overrides=["model.device=cuda:1"]).model.device == "cuda:1"
    assert "allowed values: cpu, cuda, cuda:N, mps" in rejects("model.device=gpu")


def test_file_data_paths_must_exist(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("{}\n")
    base = ["data.source=files", f"data.tasks={tmp_path / 't.jsonl'}", f"data.corpus={tmp_path / 't.jsonl'}"]
    assert resolve_config("grpo", overrides=base).data.source == "files"
    assert "data.corpus = " in rejects(*base, f"data.corpus={tmp_path / 'missing.jsonl'}")
    assert "data.eval_tasks = " in rejects(*base, f"data.eval_tasks={tmp_path / 'missing.jsonl'}")
    assert "no such file" in rejects(*base[:2], f"data.corpus={tmp_path}")  # a folder is not a file


def test_missing_model_path_fails_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "model.name_or_path = " in rejects(f"model.name_or_path={tmp_path / 'nope'}")
    assert "no such folder" in rejects("model.name_or_path=someone/some-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(config_checks, "_in_hub_cache", lambda _: False)
    note = config_checks.check_model_source("someone/some-model")
    assert note is not None and "fetched from the Hugging Face Hub" in note
    assert "no such folder (" in rejects(f"model.name_or_path={tmp_path / 'a' / 'b' / 'c'}")  # a local path
    assert "not a Hugging Face repo id" in rejects("model.name_or_path=not a repo id")


def test_model_folder_needs_a_readable_config_and_weights(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    assert "has no config.json" in rejects(f"model.name_or_path={folder}")
    (folder / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in rejects(f"model.name_or_path={folder}")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (folder / "tokenizer.json").write_text('{"truncated": ')
    assert "tokenizer.json is not valid JSON" in rejects(f"model.name_or_path={folder}")
    (folder / "tokenizer.json").write_text("{}")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    assert resolve_config("grpo", overrides=[f"model.name_or_path={folder}"]).model.name_or_path == str(folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "model.safetensors is corrupt or truncated" in rejects(f"model.name_or_path={folder}")


def test_resume_does_not_need_the_original_model_source(tmp_path: Path) -> None:
    """A resumed run reloads its own initial policy, so a moved model folder must not block it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    text = resolve_config("grpo", overrides=[f"model.name_or_path={folder}"])
    (folder / "config.json").unlink()
    from tracerl.config.schema import config_to_yaml

    assert config_from_yaml(config_to_yaml(text)).model.name_or_path == str(folder)


@pytest.mark.parametrize(("flag", "module"), [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_missing_logger_extras_fail_at_load(monkeypatch: pytest.MonkeyPatch, flag: str, module: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    assert f"pip install -e '.[{flag}]'" in rejects(f"log.{flag}=true")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == module else real(name, *a))
    assert getattr(resolve_config("grpo", overrides=[f"log.{flag}=true"]).log, flag) is True


def test_steps_and_new_fields() -> None:
    assert "steps must be >= 1, got 0" in rejects("steps=0")
    assert "optim.max_nonfinite_steps must be > 0" in rejects("optim.max_nonfinite_steps=0")
    assert "data.max_failed_tool_steps must be > 0" in rejects("data.max_failed_tool_steps=0")
    assert "null for no limit" in rejects("data.tool_timeout_s=0")
    config = TrainConfig()
    assert (config.optim.max_nonfinite_steps, config.data.max_failed_tool_steps, config.data.tool_timeout_s) == (3, 3, 30.0)
    assert resolve_config("grpo", overrides=["data.tool_timeout_s=null"]).data.tool_timeout_s is None


def test_nested_sections_are_named_by_their_path() -> None:
    paths = section_paths(TrainConfig)
    assert paths["EngineConfig"] == "rollout.engine" and paths["SchemeConfig"] == "rollout.schemes"
    assert paths["WorldConfig"] == "data.world"
    assert with_field_paths(TrainConfig, "EngineConfig.top_p must be in (0, 1]") == "rollout.engine.top_p must be in (0, 1]"
    assert "rollout.schemes.tree_initial must be" in rejects("rollout.schemes.tree_initial=0")


def test_a_broken_run_config_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_from_yaml("optim: [unclosed\n")


def test_reference_backend_is_validated_at_config_load(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_config("trace").algo.reference_backend == "hf"
    with pytest.raises(ConfigError, match="algo.reference_backend = 'sglang' is not valid; allowed values: hf, vllm"):
        resolve_config("trace", overrides=["algo.reference_backend=sglang"])
    real = importlib.util.find_spec
    present = {"vllm": False, "peft": True}  # found (not imported) or not, whatever this venv holds
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present[name] else None) if name in present else real(name, *a))
    with pytest.raises(ConfigError, match=r"algo.reference_backend = 'vllm' needs vLLM: pip install -e '\.\[vllm\]'"):
        resolve_config("trace", overrides=["algo.reference_backend=vllm"])
    present["vllm"] = True  # found (not imported): the config loads
    assert resolve_config("trace", overrides=["algo.reference_backend=vllm"]).algo.reference_backend == "vllm"
    with pytest.raises(ConfigError, match="does not work with a LoRA adapter"):
        resolve_config("trace", overrides=["algo.reference_backend=vllm", "model.lora.r=4"])
    with pytest.raises(ConfigError, match="needs model.backend = 'hf'"):
        resolve_config("trace", overrides=["algo.reference_backend=vllm", "model.backend=vllm"])
