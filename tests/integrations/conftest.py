"""Fixtures of the verl tests that talk to servers (`test_verl_manager.py`, `test_verl_workers.py`):
a local Ray cluster with TransferQueue, verl's real router and `LLMServerClient` over 2 HF server
actors (`verl_servers.HFServer`), and a switch that makes the servers fail requests. Module scope:
each module that asks gets its own cluster. verl is imported only inside the fixtures (the default
suite collects this folder without it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster (8 logical CPUs: TransferQueue hangs with 2) and TransferQueue."""
    import ray
    import transfer_queue as tq

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}})
    tq.init()
    yield ray, tq
    tq.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def servers(cluster):
    """verl's real router (``get_router_handle``) and ``LLMServerClient`` over 2 HF server actors."""
    sys.path.insert(0, str(HERE.parent / "allocation"))
    sys.path.insert(0, str(HERE))
    from alloc_world import shared
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle
    from verl_servers import CONFIG, HFServer

    ray, _ = cluster
    _, _, policy = shared()
    actor = ray.remote(HFServer)
    weights = ray.put((policy.model, policy.tokenizer))
    handles = {f"server-{i}": actor.remote(*ray.get(weights), f"server-{i}", 0) for i in range(2)}
    client = LLMServerClient(config=CONFIG, load_balancer_handle=get_router_handle(handles))
    return client, handles


@pytest.fixture()
def failing(servers, cluster):
    """Make both servers raise on the requests whose prompt holds a text; healthy again after the test."""
    ray, handles = cluster[0], servers[1]

    def fail(text):
        ray.get([h.fail_requests_containing.remote(text) for h in handles.values()])

    yield fail
    fail(None)
