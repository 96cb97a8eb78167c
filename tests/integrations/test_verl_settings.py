"""The manager's start-up refusals against verl 0.9.1's own default config (run with `make test-verl`;
skipped where verl is missing): verl's defaults pass, each refused setting stops in one line naming
it, tracerl `optim` settings verl would not apply are refused, the tokenizer follows verl's model
config, and readiness on verl's reference worker needs no KL forward. Config-level: no cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tracerl.config.schema import resolve_config  # noqa: E402
from tracerl.errors import UserError  # noqa: E402
from tracerl.integrations.verl.settings import (  # noqa: E402
    REFUSED,
    check_optim,
    check_verl_config,
    failure_settings,
    verl_tokenizer,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_world import shared  # noqa: E402

DEFAULTS = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def verl_defaults():
    """verl's own full default config (what main_ppo starts from), with the manager's rollout name
    and a validation batch size (its own refusal)."""
    config = OmegaConf.load(DEFAULTS)
    config.actor_rollout_ref.rollout.name = "vllm"
    config.data.val_batch_size = 64
    return config


def test_verls_defaults_pass_and_every_refused_key_is_verls() -> None:
    config = verl_defaults()
    check_verl_config(config)
    for key, _, _ in REFUSED:  # each key exists in verl 0.9.1's config (no guessed names)
        assert OmegaConf.select(config, key, default="absent") != "absent", key


@pytest.mark.parametrize("key, value, why", [
    ("algorithm.rollout_correction.rollout_rs", "token_k1", "rejection sampling zeroes rejected tokens"),
    ("actor_rollout_ref.rollout.full_determinism", True, "request id is the tree id"),
    ("actor_rollout_ref.rollout.n", 4, "repeat each prompt n times"),
    ("algorithm.use_kl_in_reward", True, "silently ignored"),
    ("algorithm.filter_groups.enable", True, "spends a whole TRACE budget"),
    ("trainer.v1.sampler.sync_refill_failed_groups", True, "spends a whole TRACE budget"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size", 32, "log_prob_micro_batch_size_per_gpu instead"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", 32, "log_prob_micro_batch_size_per_gpu instead"),
])
def test_each_refused_setting_stops_in_one_line(key: str, value: object, why: str) -> None:
    config = verl_defaults()
    OmegaConf.update(config, key, value)
    with pytest.raises(UserError) as err:
        check_verl_config(config)
    line = str(err.value)
    assert line.startswith(f"{key} = {value}: not supported with TraceAgentLoopManager") and why in line
    assert "\n" not in line


def test_rollout_n_of_one_and_importance_weights_pass() -> None:
    config = verl_defaults()
    OmegaConf.update(config, "algorithm.rollout_correction.rollout_is", "token")
    check_verl_config(config)


def _optim(**changes: object):
    cfg = resolve_config("trace", overrides=[f"optim.{k}={v}" for k, v in changes.items()])
    return cfg.optim, resolve_config("trace").optim


def test_tracerl_optim_settings_verl_would_not_apply_are_refused() -> None:
    config = verl_defaults()
    check_optim(config, *_optim())  # left at the preset's defaults: they follow verl's (lr 1e-6 there)
    check_optim(config, *_optim(lr=1e-6, grad_clip=1.0, clip_high=0.2))  # verl's own values
    with pytest.raises(UserError, match=r"^tracerl's optim.lr = 0.001 but verl's actor_rollout_ref.actor.optim.lr = "
                                        r"1e-06: verl's actor trains with its own"):
        check_optim(config, *_optim(lr=1e-3))
    with pytest.raises(UserError, match=r"optim.clip_high = 0.3 but verl's actor_rollout_ref.actor.clip_ratio_high"):
        check_optim(config, *_optim(clip_high=0.3))
    with pytest.raises(UserError, match=r"^tracerl's optim.micro_batch_size = 4 is not read inside verl"):
        check_optim(config, *_optim(micro_batch_size=4))
    # verl's KL loss is off: a tracerl KL of 0.01 would not apply; on with that coefficient, it does
    with pytest.raises(UserError, match=r"optim.kl_coef = 0.01 but verl's actor_rollout_ref.actor.kl_loss_coef = 0.0"):
        check_optim(config, *_optim(kl_coef=0.01))
    OmegaConf.update(config, "actor_rollout_ref.actor.use_kl_loss", True)
    OmegaConf.update(config, "actor_rollout_ref.actor.kl_loss_coef", 0.01)
    check_optim(config, *_optim(kl_coef=0.01))


def test_the_tokenizer_comes_from_verls_tokenizer_path(tmp_path) -> None:
    """``actor_rollout_ref.model.tokenizer_path`` wins over the model's folder, as in verl's actor."""
    from transformers import AutoTokenizer

    _, _, policy = shared()
    policy.tokenizer.save_pretrained(tmp_path / "model")
    other = AutoTokenizer.from_pretrained(tmp_path / "model")
    other.add_tokens(["<tracerl_marker>"])
    other.save_pretrained(tmp_path / "tokenizer")
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(tmp_path / "model"),
                                                               "trust_remote_code": False}}})
    plain = verl_tokenizer(config)
    config.actor_rollout_ref.model.tokenizer_path = str(tmp_path / "tokenizer")
    marked = verl_tokenizer(config)
    assert len(marked) == len(plain) + 1 and marked.convert_tokens_to_ids("<tracerl_marker>") == len(plain)


def test_failure_settings() -> None:
    assert failure_settings(None) == (900.0, 3)
    assert failure_settings(OmegaConf.create({"request_timeout_s": 0, "max_failed_steps": 1})) == (None, 1)
    with pytest.raises(UserError, match=r"tracerl.request_timeout_s = -1 must be >= 0"):
        failure_settings(OmegaConf.create({"request_timeout_s": -1}))


def test_readiness_on_the_reference_worker_builds_it_without_a_kl_term() -> None:
    """verl builds its reference worker only for a KL; the trainer asks for one that weighs nothing."""
    from verl.trainer.ppo.utils import need_reference_policy

    from tracerl.integrations.verl.trainer import reference_for_readiness

    config = verl_defaults()
    OmegaConf.update(config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 4)
    assert not reference_for_readiness(config) and not need_reference_policy(config)  # in_process: untouched
    OmegaConf.update(config, "tracerl", {"readiness": "reference_worker"}, force_add=True)
    assert reference_for_readiness(config) and need_reference_policy(config)
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0.0
    assert not reference_for_readiness(config)  # a KL term already builds it: nothing changed
    OmegaConf.update(config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None)
    with pytest.raises(UserError, match=r"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = null"):
        reference_for_readiness(config)
