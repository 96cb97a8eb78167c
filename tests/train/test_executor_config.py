"""The executor fields of the rollout section fail at config load, one line naming the field
(Ray itself is never imported here: the default suite runs without it)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tracerl.config import executor as executor_config
from tracerl.config.schema import ConfigError, resolve_config


@pytest.mark.parametrize(("override", "message"), [
    ("rollout.weight_sync=tcp", "rollout.weight_sync = 'tcp' is not valid; allowed values: object_store, cuda_ipc, nccl"),
    ("rollout.readiness_on=gpu", "rollout.readiness_on = 'gpu' is not valid; allowed values: driver, workers, scoring_workers"),
    ("rollout.workers=0", "rollout.workers must be an integer >= 1, got 0"),
    ("rollout.workers=2", "rollout.workers = 2 needs rollout.executor = 'ray'"),
    ("rollout.max_worker_restarts=-1", "rollout.max_worker_restarts must be an integer >= 0, got -1"),
    ("rollout.request_timeout_s=0", "rollout.request_timeout_s must be > 0 seconds, got 0"),
    ("rollout.worker_resources.cpus=0", "rollout.worker_resources.cpus must be > 0, got 0"),
    ("rollout.worker_resources.gpus=-1", "rollout.worker_resources.gpus must be >= 0, got -1"),
])
def test_a_bad_executor_value_names_the_field(override, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_config("grpo", overrides=[override])


def test_ray_missing_fails_at_config_load_saying_how_to_install(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(executor_config.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"rollout.executor = 'ray' needs Ray, which is not installed: "
                                          r"pip install -e '\.\[ray\]' from a checkout"):
        resolve_config("grpo", overrides=["rollout.executor=ray"])


def test_cuda_weight_sync_is_refused_off_cuda(monkeypatch) -> None:
    monkeypatch.setattr(executor_config.importlib.util, "find_spec", lambda name, *a: object())  # "Ray is installed"
    for mode in ("cuda_ipc", "nccl"):
        with pytest.raises(ConfigError, match=f"rollout.weight_sync = '{mode}' needs model.device = 'cuda'"):
            resolve_config("grpo", overrides=["rollout.executor=ray", f"rollout.weight_sync={mode}"])
    config = resolve_config("grpo", overrides=["rollout.executor=ray", "rollout.workers=2"])
    assert (config.rollout.weight_sync, config.rollout.workers, config.rollout.worker_resources.bundle()) == \
        ("object_store", 2, {"CPU": 1.0})
    assert "ray" not in sys.modules  # checked without importing it
