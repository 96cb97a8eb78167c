"""Config loading: presets, YAML + overrides, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.config.schema import PRESETS, ConfigError, config_from_yaml, config_to_yaml, resolve_config
from tracerl.config.loading import parse_override


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_resolves_and_round_trips_through_yaml(preset: str) -> None:
    config = resolve_config(preset)
    assert config.preset == preset
    assert config_from_yaml(config_to_yaml(config)) == config


def test_presets_pick_their_scheme_and_estimator() -> None:
    assert resolve_config("grpo").rollout.scheme == "chain"
    assert resolve_config("trace").rollout.scheme == "trace"
    assert resolve_config("trace").algo.estimator == "trace_credit"
    assert resolve_config("trace").algo.credit is True
    assert resolve_config("tree_grpo").rollout.scheme == "tree_random"
    assert resolve_config("trace_alloc").algo.credit is False


def test_overrides_and_yaml_layer_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 0.001\n  micro_batch_size: 4\nrollout:\n  budget: 32\n")
    config = resolve_config("grpo", config_file=path, overrides=["optim.lr=1e-5", "rollout.engine.max_turns=5"])
    assert config.optim.lr == pytest.approx(1e-5)  # --set wins over the file
    assert config.optim.micro_batch_size == 4  # the file wins over the preset defaults
    assert config.rollout.budget == 32
    assert config.rollout.engine.max_turns == 5


def test_smoke_overlay_uses_a_random_tiny_model_and_a_tiny_world() -> None:
    config = resolve_config("grpo", smoke="random")
    assert config.model.name_or_path == "random-tiny"
    assert config.data.world.num_people < 100


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr'; valid keys in 'optim': lr,"),
        ("nonsense=1", "unknown config key 'nonsense'"),
        ("optim.schedule=sometimes", "allowed values: constant, cosine, linear"),
        ("algo.estimator=ppo", "algo.estimator = 'ppo' is not valid; allowed values:"),
        ("rollout.scheme=beam", "allowed values: chain, dapo, trace, tree_random or a package.module:attribute path"),
        ("optim.lr=fast", 'field "optim.lr"'),
        ("rollout.engine.max_turns=0", "rollout.engine.max_turns must be >= 1"),
        ("data.world.max_hops=7", "data.world.max_hops must be <= 5"),
        ("optim.lr=-1", "optim.lr must be > 0"),
    ],
)
def test_bad_values_fail_at_load_time_naming_the_field(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        resolve_config("grpo", overrides=[override])
    assert expected in str(info.value)


def test_trace_budget_below_its_group_floor_fails_at_load_time() -> None:
    with pytest.raises(ConfigError, match="rollout.budget = 6 is below the 8 rollouts"):
        resolve_config("trace", overrides=["rollout.budget=6"])
    assert resolve_config("trace", overrides=["rollout.budget=6", "rollout.schemes.trace_min_per_prompt=2"])


def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown preset 'ppo'; valid presets: grpo, grpo_\{4x16,twohop\}, dapo, gigpo"):
        resolve_config("ppo")


def test_trace_credit_estimator_requires_reference_scoring() -> None:
    with pytest.raises(ConfigError, match="needs algo.credit = true"):
        resolve_config("grpo", overrides=["algo.estimator=trace_credit"])


def test_override_values_parse_like_yaml() -> None:
    assert parse_override("optim.lr=1e-5") == {"optim": {"lr": 1e-5}}
    assert parse_override("algo.credit=true") == {"algo": {"credit": True}}
    assert parse_override("optim.betas=[0.9, 0.95]") == {"optim": {"betas": [0.9, 0.95]}}
    with pytest.raises(ConfigError, match="section.field=value"):
        parse_override("optim.lr")


def test_bad_yaml_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("optim: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        resolve_config("grpo", config_file=path)


def test_a_partial_nested_override_keeps_the_sections_defaults() -> None:
    """Overriding one field of data.world must not reset the world to WorldConfig's own defaults."""
    default = resolve_config("grpo").data.world
    changed = resolve_config("grpo", overrides=["data.world.max_hops=2"]).data.world
    assert changed.max_hops == 2
    assert changed.num_people == default.num_people != 1000  # the embedded world, not the class default


def test_lora_without_peft_fails_at_config_load(monkeypatch) -> None:
    import tracerl.config.schema as config_module

    monkeypatch.setattr(config_module, "peft_available", lambda: False)
    with pytest.raises(ConfigError, match=r"model.lora.r > 0 needs peft: pip install -e '\.\[lora\]'"):
        resolve_config("grpo", overrides=["model.lora.r=8"])
    assert resolve_config("grpo", overrides=["model.lora.r=0"]).model.lora.r == 0
    with pytest.raises(ConfigError, match="model.lora.r must be >= 0"):
        resolve_config("grpo", overrides=["model.lora.r=-1"])
