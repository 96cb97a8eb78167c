"""Checks the training config runs at load time, so a bad run fails before it creates anything.

Pure value checks (finite floats, budgets that fit a scheme) and cheap checks of the machine
(device available, model folder present, optional packages installed). Each raises
:class:`ConfigError` naming the field, the value and what to do.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import netrc
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from tracerl.config.loading import ConfigError

EMBEDDED_MODELS = ("tiny", "random-tiny")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TRUE = ("1", "true", "yes", "on")


def check_finite(section: str, config: Any) -> None:
    """Reject inf/NaN in every float of ``config`` and its nested sections (tuples included).

    A non-finite learning rate, temperature or clip bound does not fail where it is used; it
    turns the weights into NaN and the run keeps going (the fault probe of issue #14).
    """
    for f in dataclasses.fields(config):
        value, where = getattr(config, f.name), f"{section}.{f.name}" if section else f.name
        if dataclasses.is_dataclass(value):
            check_finite(where, value)
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{where} = {value!r} is not a finite number; give a finite value")


def check_device(device: str, field: str = "model.device") -> None:
    """``model.device`` must name a device this machine has (``cpu``, ``cuda``, ``cuda:N``, ``mps``)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{field} = {device!r} is not a device; allowed values: cpu, cuda, cuda:N, mps") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        count = torch.cuda.device_count()  # reads the driver's count; does not initialise CUDA
        if count == 0:
            raise ConfigError(f"{field} = {device!r} but this machine has no CUDA GPU; available: cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{field} = {device!r} but this machine has {count} CUDA GPU(s); "
                              f"available: cpu, cuda, {', '.join(f'cuda:{i}' for i in range(count))}")
        return
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"{field} = {device!r} but MPS is not available here; available: cpu")
        return
    raise ConfigError(f"{field} = {device!r} is not supported; allowed values: cpu, cuda, cuda:N, mps")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def check_model_source(name_or_path: str, field: str = "model.name_or_path") -> str | None:
    """Check ``model.name_or_path`` of a fresh start; return a note when it will be downloaded.

    Embedded names pass. An existing folder must hold ``config.json`` (valid JSON) and
    readable ``*.safetensors`` headers (a truncated file fails here, not mid-start). Anything
    else is a Hugging Face repo id: accepted with a note when the Hub may be used, an error
    when ``HF_HUB_OFFLINE`` is set or it cannot be a repo id. Not run on resume: a resumed
    run loads its own copy of the initial policy.
    """
    if name_or_path in EMBEDDED_MODELS:
        return None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        _check_model_folder(path, field)
        return None
    field = f"{field} = {name_or_path!r}"
    if path.exists():
        raise ConfigError(f"{field} is a file; give a model folder (with config.json), tiny or random-tiny")
    if looks_local(name_or_path):
        raise ConfigError(f"{field}: no such folder ({path.absolute()}); give an existing model folder "
                          "(check its spelling), tiny or random-tiny")
    if not _HUB_ID.match(name_or_path):
        raise ConfigError(f"{field}: no such folder, and not a Hugging Face repo id (org/name)")
    if _in_hub_cache(name_or_path):
        return None
    if hub_offline():
        raise ConfigError(f"{field}: no such folder, nor in the Hugging Face cache (HF_HUB_OFFLINE is set, so "
                          "nothing is fetched); give a local model folder, tiny or random-tiny")
    return f"{field} is not a local folder; it will be fetched from the Hugging Face Hub"


def looks_local(name_or_path: str) -> bool:
    """Whether a model name that is no existing folder was meant as a local path, not a Hub repo id.

    Local: it starts with ``.``, ``/`` or ``~``, holds a backslash or more than one ``/``, or its
    first path component is a folder here (``testbed/tiny_bpe`` beside a ``testbed/`` folder).
    Anything else of the form ``org/name`` is a Hub id. A local-looking path that does not exist
    fails at config load instead of being tried on the Hub (retries, then a network error).
    """
    if name_or_path.startswith((".", "/", "~")) or "\\" in name_or_path or name_or_path.count("/") > 1:
        return True
    first = name_or_path.split("/", 1)[0]
    return "/" in name_or_path and Path(first).is_dir()


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache already holds the repo's config.json (usable offline)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id after all
        return False


def _check_model_folder(path: Path, field: str) -> None:
    where = f"{field} = {str(path)!r}"
    config = path / "config.json"
    if not config.is_file():
        raise ConfigError(f"{where}: the folder has no config.json; give a Hugging Face model folder")
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):  # what loading parses first
        if (path / name).is_file():
            try:
                json.loads((path / name).read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ConfigError(f"{path / name} is not valid JSON ({err}); restore the model folder") from None
    from safetensors import safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):  # reads the header only
                pass
        except Exception as err:  # noqa: BLE001 - SafetensorError is not importable by name
            raise ConfigError(f"{weights} is corrupt or truncated ({err}); restore the model folder") from None


def check_extra(field: str, enabled: bool, module: str, extra: str) -> None:
    """An optional logger that is switched on must be installed (found without importing it)."""
    if enabled and importlib.util.find_spec(module) is None:
        raise ConfigError(f"{field} = true needs the {module} package: pip install -e '.[{extra}]' "
                          f"(or set {field}=false)")


WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")
"""``WANDB_MODE`` values under which W&B needs no key (it logs locally or not at all)."""
WANDB_HOST = "https://api.wandb.ai"
"""W&B's default server (``WANDB_BASE_URL`` replaces it): the host ``wandb login`` writes to ~/.netrc."""


def wandb_login_problem(environ: Mapping[str, str], home: Path) -> str | None:
    """Why W&B could not log in from here (one line naming both ways on), or None when it can:
    ``WANDB_MODE`` offline/disabled, ``WANDB_API_KEY`` set, or a ``~/.netrc`` (``$NETRC``) entry
    for the W&B host, which is what ``wandb login`` writes. Reads files only; imports nothing."""
    if environ.get("WANDB_MODE", "").strip().lower() in WANDB_LOCAL_MODES:
        return None
    if environ.get("WANDB_API_KEY", "").strip() or environ.get("WANDB_IDENTITY_TOKEN_FILE", "").strip():
        return None
    host = urlparse(environ.get("WANDB_BASE_URL", "").strip() or WANDB_HOST).hostname or ""
    try:
        entry = netrc.netrc(str(Path(environ.get("NETRC", "").strip() or home / ".netrc"))).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    if entry is not None and entry[2]:
        return None
    return ("log.wandb = true but no W&B API key is set (WANDB_API_KEY, or ~/.netrc from `wandb login`): run "
            "`wandb login`, or set WANDB_MODE=offline to log locally (`wandb sync` later), or log.wandb=false")


def check_wandb(config: Any) -> None:
    """``log.wandb = true``: W&B must be able to log in (checked before the run folder is touched;
    without the package installed the config already failed in :func:`check_extra`)."""
    if not config.log.wandb or importlib.util.find_spec("wandb") is None:
        return
    problem = wandb_login_problem(os.environ, Path.home())
    if problem is not None:
        raise ConfigError(problem)


def check_budget(scheme: str, budget: int, pool_size: int, schemes: Any) -> None:
    """``rollout.budget`` must be spendable by the scheme (what ``allocation/schemes.py`` requires).

    chain (and dapo) spend the budget in whole groups of ``group_size`` on distinct pool
    prompts; tree_random in prompts of ``tree_cost_per_prompt`` planned rollouts; trace gives a
    selected prompt at least ``min_per_prompt``.
    """
    n = schemes.group_size
    if scheme in ("chain", "dapo"):
        if budget % n:
            raise ConfigError(f"rollout.budget = {budget} is not a multiple of rollout.schemes.group_size = {n} "
                              f"({scheme} spends it in whole groups); use e.g. rollout.budget={max(n, budget // n * n)}")
        if (scheme == "chain" or schemes.dapo_target_groups is None) and budget // n > pool_size:
            raise ConfigError(f"rollout.budget = {budget} needs {budget // n} prompts of group_size {n}, but "
                              f"rollout.pool_size = {pool_size}; raise rollout.pool_size or lower rollout.budget")
    elif scheme == "tree_random":
        per = schemes.tree_cost_per_prompt
        if budget < per or budget // per > pool_size:
            raise ConfigError(
                f"rollout.budget = {budget} does not fit tree_random: a prompt costs {per} rollouts "
                "(tree_initial + tree_rounds * tree_expand_nodes * tree_continuations), so the budget needs "
                f"{per} <= budget < {per * (pool_size + 1)} (rollout.pool_size = {pool_size})")
    elif scheme == "trace" and budget < schemes.min_per_prompt:
        raise ConfigError(
            f"rollout.budget = {budget} is below the {schemes.min_per_prompt} rollouts trace gives a selected prompt "
            "at least (rollout.schemes.trace_min_per_prompt, or rollout.schemes.group_size when unset)")
