"""The manager's start-up checks: verl settings that TRACE cannot run under, refused in one line
each (:data:`REFUSED`, :func:`check_verl_config`, :func:`check_sampling`), and the tracerl settings
verl's own config owns (the model path, the tokenizer, the optimiser).

verl 0.9.1's names (``verl/trainer/config/*.yaml``, ``verl/workers/config/*.py``) are read with
``.get`` so a config without a section reads as verl's default. verl is imported only inside
:func:`verl_tokenizer`; the checks read plain OmegaConf mappings, so tests build them in a line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from tracerl.errors import UserError
from tracerl.rollout.engine import EngineConfig


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part, None)
    return default if node is None else node


def _on(value: Any) -> bool:
    return bool(value) and str(value).lower() not in ("false", "0", "none", "null")


# (verl key, is it refused given its value, why) -- each refusal names the key, its value and why.
REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("algorithm.rollout_correction.rollout_rs", _on,
     "verl's rejection sampling zeroes rejected tokens in response_mask, which tracerl's estimators read as the "
     "leaves' turn spans (the first step would stop); leave it null (rollout_is importance weights are fine)"),
    ("actor_rollout_ref.rollout.full_determinism", _on,
     "verl then hands the request id to vLLM unchanged, and TraceAgentLoopManager's request id is the tree id, "
     "shared by a tree's branches in flight together; set it to False (tracerl seeds every row itself)"),
    ("actor_rollout_ref.rollout.n", lambda n: int(n) > 1,
     "the TRACE budget (rollout.budget) is the step's sample count; verl's n would repeat each prompt n times and "
     "multiply its mini-batch by n; set it to 1"),
    ("algorithm.use_kl_in_reward", _on,
     "tracerl's estimators read the verifier's reward (tracerl_reward), so verl's in-reward KL penalty would be "
     "silently ignored; set it to False (actor_rollout_ref.actor.use_kl_loss is the KL that applies)"),
    ("algorithm.filter_groups.enable", _on,
     "DAPO's group filter refills evicted prompts one manager call each, and every call spends a whole TRACE "
     "budget; set it to False (TRACE's planner already spends rollouts where groups are mixed)"),
    ("trainer.v1.sampler.sync_refill_failed_groups", _on,
     "each refill is a manager call that spends a whole TRACE budget; set it to False (a failed tree trains as "
     "zero advantage)"),
    ("distillation.enabled", _on,
     "verl's actor then trains on distillation_ppo_loss over teacher_logprobs that only verl's own agent loop "
     "writes; set it to False (+tracerl.readiness=reference_server serves the frozen reference without it)"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size", lambda v: v is not None,
     "the deprecated global size; tracerl pads its readiness rows to the per-GPU size: set "
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu instead"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", lambda v: v is not None,
     "the deprecated global size; tracerl pads its readiness rows to the per-GPU size: set "
     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu instead"),
)
"""Each verl setting TRACE refuses: its key, when its value is refused, and why."""


def check_refused_settings(config: Any) -> None:
    """Raise :class:`UserError` (one line naming the setting, its value and why) for the first
    setting of :data:`REFUSED` that ``config`` (verl's whole config) sets."""
    missing = object()
    for key, refused, why in REFUSED:
        value = _get(config, key, missing)
        if value is not missing and refused(value):
            raise UserError(f"{key} = {value}: not supported with TraceAgentLoopManager: {why}")


OPTIM_IN_VERL: dict[str, str] = {
    "lr": "actor_rollout_ref.actor.optim.lr",
    "weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "betas": "actor_rollout_ref.actor.optim.betas",
    "warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "schedule": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "grad_clip": "actor_rollout_ref.actor.grad_clip",
    "clip_low": "actor_rollout_ref.actor.clip_ratio_low",
    "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
    "loss_agg": "actor_rollout_ref.actor.loss_agg_mode",
    "kl_coef": "actor_rollout_ref.actor.kl_loss_coef",
}
"""tracerl's ``optim`` field -> the verl actor setting that does its job inside verl."""


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, (tuple, list)):
        return theirs is not None and [float(x) for x in ours] == [float(x) for x in list(theirs)]
    if isinstance(ours, (int, float)) and not isinstance(ours, bool):
        try:
            return float(ours) == float(theirs)
        except (TypeError, ValueError):
            return False
    return str(ours) == str(theirs)


def check_optim(config: Any, optim: Any, default: Any) -> None:
    """Refuse a tracerl ``optim`` setting (``optim``: the run's ``OptimConfig``, ``default``: its
    preset's) that verl would not apply: inside verl, verl's actor trains. A field left at the
    preset's default follows verl's; one set to verl's own value is fine; any other is refused in
    one line naming both settings (or saying verl has no such setting)."""
    for f in dataclasses.fields(optim):
        ours, base = getattr(optim, f.name), getattr(default, f.name)
        if ours == base:
            continue
        where = OPTIM_IN_VERL.get(f.name)
        if where is None:
            raise UserError(f"tracerl's optim.{f.name} = {ours!r} is not read inside verl (verl's actor trains, "
                            "under actor_rollout_ref.actor); drop it from the tracerl config")
        theirs = _get(config, where)
        if f.name == "kl_coef" and not _on(_get(config, "actor_rollout_ref.actor.use_kl_loss")):
            theirs = 0.0
        if not _same(ours, theirs):
            raise UserError(f"tracerl's optim.{f.name} = {ours!r} but verl's {where} = {theirs!r}: verl's actor "
                            f"trains with its own; set {where} and drop optim.{f.name} from the tracerl config")


def verl_tokenizer(config: Any) -> Any:
    """The tokenizer verl's actor uses: ``actor_rollout_ref.model.tokenizer_path`` (default: the
    model's ``path``) with its ``trust_remote_code``, copied to local as verl does
    (``HFModelConfig.__post_init__``)."""
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local

    model = config.actor_rollout_ref.model
    path = str(model.get("tokenizer_path", None) or model.path)
    tokenizer = hf_tokenizer(copy_to_local(path, use_shm=bool(model.get("use_shm", False))),
                             trust_remote_code=bool(model.get("trust_remote_code", False)))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def reference_model(config: Any, *, dtype: str, device: str, seed: int) -> Any:
    """The frozen reference: verl's ``actor_rollout_ref.model.path`` (copied to local as verl does),
    float32 on ``device`` in eval mode; with ``trust_remote_code`` through transformers' own loader
    (the model's code runs, as it does in verl's actor)."""
    import torch
    from verl.utils.fs import copy_to_local

    model_config = config.actor_rollout_ref.model
    local = copy_to_local(str(model_config.path), use_shm=bool(model_config.get("use_shm", False)))
    if bool(model_config.get("trust_remote_code", False)):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(local, trust_remote_code=True, dtype=torch.float32)
    else:
        from tracerl.testbed.loading import load_model

        model, _ = load_model(local, dtype=dtype, device=device, seed=seed)
    return model.to(device=device, dtype=torch.float32).eval()


def failure_settings(section: Any) -> tuple[float | None, int]:
    """``(request_timeout_s, max_failed_steps)`` from the ``tracerl`` section: a request that
    takes longer than ``+tracerl.request_timeout_s`` (default 900; 0: no limit) fails its tree;
    ``+tracerl.max_failed_steps`` (default 3) consecutive steps in which at least half the trees
    failed stop the run."""
    timeout = float(section.get("request_timeout_s", 900) if section is not None else 900)
    steps = int(section.get("max_failed_steps", 3) if section is not None else 3)
    if timeout < 0 or steps < 1:
        raise UserError(f"tracerl.request_timeout_s = {timeout:g} must be >= 0 (0: no limit) and "
                        f"tracerl.max_failed_steps = {steps} >= 1")
    return (timeout or None), steps


READINESS = ("in_process", "reference_worker", "reference_server")
"""Where the frozen reference scores readiness (``+tracerl.readiness``): an HF copy in this process,
verl's own reference worker (:mod:`.reference`), or frozen-reference servers on GPUs of their own
that the ``tracerl_sync`` trainer starts (:mod:`.readiness`, :mod:`.readiness_servers`)."""
SERVERS = ("vllm", "tracerl_hf")
"""verl rollout servers whose sampling parameters :class:`VerlServerPolicy` speaks (vLLM's names:
``max_tokens``, ``include_stop_str_in_output``, ``seed``, ``logprobs``): vLLM's and tracerl's HF
server (:mod:`.hf_rollout`). SGLang takes other names and passes unknown ones through unchecked,
so it is refused rather than run with ignored stops."""


def check_verl_config(config: Any) -> None:
    """Refuse verl settings under which the verifier's rewards would not be the ones trained on,
    the servers would not read tracerl's sampling parameters, or validation would run the whole
    validation set in one call, or a setting of :data:`REFUSED` is on (one line each, naming the setting)."""
    check_refused_settings(config)
    reward_model = config.get("reward", {}).get("reward_model", {})
    if reward_model.get("enable", False):
        raise UserError("reward.reward_model.enable=True: verl would score the samples itself and overwrite "
                        "tracerl's verifier rewards (rm_scores); set it to False with TraceAgentLoopManager")
    name = config.actor_rollout_ref.rollout.get("name", None)
    if name not in SERVERS:
        raise UserError(f"actor_rollout_ref.rollout.name = {name!r}: TraceAgentLoopManager sends vLLM's sampling "
                        f"parameters (stop strings, include_stop_str_in_output, seed), which {name!r} does not "
                        f"read; use one of: {', '.join(SERVERS)}")
    data, trainer = config.get("data", {}), config.get("trainer", {})
    validates = bool(trainer.get("val_before_train", False)) or int(trainer.get("test_freq", -1) or -1) > 0
    if validates and data.get("val_batch_size", None) is None and "val_files" in data:
        raise UserError("data.val_batch_size = null: verl would send the whole validation set through one "
                        "TraceAgentLoopManager call (every episode in flight at once); set data.val_batch_size "
                        "(e.g. 64)")


def check_sampling(config: Any, engine: EngineConfig) -> EngineConfig:
    """Check that verl's rollout sampling settings are tracerl's and return the validation engine.

    verl computes the old and new log-probs at ``actor_rollout_ref.rollout.temperature``; the
    manager samples at tracerl's ``rollout.engine.temperature`` (and ``top_p``). A mismatch would
    silently give wrong importance ratios, so it is refused naming both settings. tracerl samples
    without top-k. Validation samples at ``val_kwargs`` (``do_sample=False``: greedy)."""
    rollout = config.actor_rollout_ref.rollout
    for key in ("temperature", "top_p"):
        theirs, ours = float(rollout.get(key, getattr(EngineConfig(), key))), float(getattr(engine, key))
        if theirs != ours:
            raise UserError(f"actor_rollout_ref.rollout.{key} = {theirs:g} but tracerl's rollout.engine.{key} = "
                            f"{ours:g}: verl computes the log-probs the update uses at its setting and the "
                            "manager samples at tracerl's; set both to the same value")
    val = rollout.get("val_kwargs", {}) or {}
    for where, top_k in (("actor_rollout_ref.rollout.top_k", rollout.get("top_k", -1)),
                         ("actor_rollout_ref.rollout.val_kwargs.top_k", val.get("top_k", -1))):
        if top_k not in (None, -1, 0):
            raise UserError(f"{where} = {top_k}: tracerl's rollout engine samples without top-k; set it to -1")
    greedy = not bool(val.get("do_sample", True))
    return dataclasses.replace(engine, temperature=0.0 if greedy else float(val.get("temperature", engine.temperature)),
                               top_p=float(val.get("top_p", engine.top_p)))


def check_model_path(config: Any, tracerl_path: str, preset_default: str) -> str:
    """The one checkpoint the manager loads its tokenizer and frozen reference from: verl's
    ``actor_rollout_ref.model.path`` (what the launch script's ``MODEL`` sets). A tracerl
    ``model.name_or_path`` left at its preset's default follows it; one set to another
    checkpoint is refused naming both (the reference must be the actor's initial policy)."""
    verl_path = str(config.actor_rollout_ref.model.path)
    if tracerl_path in (preset_default, verl_path):
        return verl_path
    same = os.path.exists(tracerl_path) and os.path.exists(verl_path) and os.path.samefile(tracerl_path, verl_path)
    if not same:
        raise UserError(f"actor_rollout_ref.model.path = {verl_path!r} but tracerl's model.name_or_path = "
                        f"{tracerl_path!r}: the manager's tokenizer and frozen reference must be the actor's "
                        "initial checkpoint; drop model.name_or_path from the tracerl config (it follows verl's)")
    return verl_path


def tracerl_config(config: Any) -> Any:
    """tracerl's run config from verl's ``config.tracerl`` (``preset``, ``config_file``, ``overrides``)."""
    from tracerl.config.schema import resolve_config

    section = config.get("tracerl", None)
    if section is None:
        raise UserError("TraceAgentLoopManager needs a `tracerl` section: +tracerl.config_file=PATH (a tracerl YAML)")
    return resolve_config(str(section.get("preset", "trace")), config_file=section.get("config_file", None),
                          overrides=[str(o) for o in section.get("overrides", [])])
