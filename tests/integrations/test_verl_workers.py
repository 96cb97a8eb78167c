"""TRACE's trees expanded on tree workers (`tracerl.integrations.verl.workers`; run with `make
test-verl`): 2 Ray worker actors, each with the search environment and a rollout engine over
verl's real `LLMServerClient` and router in front of 2 HF server actors (`verl_servers.HFServer`),
independent turn scheduling. The trees equal today's path (the driver's `LocalExecutor`, lockstep
turns, one batch `max_tokens`) and tracerl's own `LocalExecutor` on the HF backend; every request
carries its own row's budget; a request that fails fails its tree only."""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_verl_manager import BUDGET, _batch, _only_tree_failed, _parts, _reference_trees, _same_trees  # noqa: E402
from verl_servers import CONFIG  # noqa: E402
from verl_tree_parts import tree_parts  # noqa: E402

sys.path.insert(0, str(HERE.parent / "allocation"))
from alloc_world import shared  # noqa: E402

WORKERS = 2


def _manager(client, *, workers: int = WORKERS, scheduling: str = "independent"):
    """A manager whose trees are expanded on ``workers`` tree workers (0: in this process, lockstep
    turns when ``scheduling`` says so: today's path)."""
    from omegaconf import OmegaConf

    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    _, _, policy = shared()
    config = OmegaConf.merge(CONFIG, {"actor_rollout_ref": {"rollout": {"agent": {"num_workers": workers}}}})
    parts = _parts()
    parts.engine = dataclasses.replace(parts.engine, vllm_scheduling=scheduling)
    if workers:
        parts.expansion, parts.environment = functools.partial(tree_parts, policy.tokenizer, scheduling), None
    return TraceAgentLoopManager(config, client, parts=parts)


def _run_step(manager, cluster, tasks, global_steps: int = 1):
    _, tq = cluster
    batch, uids = _batch(tasks, global_steps)
    tq.kv_batch_put(keys=uids, partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": global_steps}] * len(uids))
    manager.generate_sequences(batch)
    return uids


@pytest.fixture(scope="module")
def on_workers(cluster, servers):
    """One step on the workers; the servers' request logs of it."""
    ray = cluster[0]
    client, handles = servers
    w, _, _ = shared()
    manager = _manager(client)
    manager.initial_predictor = copy.deepcopy(manager.parts.predictor.state_dict())  # to plan step 1 again
    for h in handles.values():
        ray.get([h.take_requests.remote(), h.take_max_tokens.remote()])
    _run_step(manager, cluster, w.train[:8])
    requests = {name: ray.get(h.take_requests.remote()) for name, h in handles.items()}
    budgets = {name: ray.get(h.take_max_tokens.remote()) for name, h in handles.items()}
    yield manager, requests, budgets
    manager.executor.close()


def test_trees_on_workers_equal_todays_lockstep_path_and_tracerls_own(on_workers, cluster, servers) -> None:
    manager, _, _ = on_workers
    w, _, _ = shared()
    today = _manager(servers[0], workers=0, scheduling="lockstep")
    _run_step(today, cluster, w.train[:8])
    assert manager.last_metrics["leaves"] == BUDGET == sum(len(t.trajectories) for t in manager.last_trees)
    _same_trees(manager.last_trees, today.last_trees)
    _same_trees(manager.last_trees, _reference_trees(manager.last_tasks, global_steps=1).trees)
    # each request asks for its row's budget: the servers generate exactly the trees' sampled tokens;
    # lockstep's rows asked for the batch's largest budget and were cut afterwards (tokens thrown away)
    sampled = sum(len(n.turn.assistant_ids) for t in manager.last_trees for n in t.nodes if n.turn is not None)
    assert manager.last_metrics["generated_tokens"] == sampled <= today.last_metrics["generated_tokens"]
    owners = set(manager.executor.owner.values()) | {0}
    assert manager.policy is None and len(manager.executor.actors) == WORKERS and owners  # no engine here


def test_both_workers_expand_trees_and_each_tree_stays_on_one_server(on_workers) -> None:
    manager, requests, _ = on_workers
    stats = manager.executor.stats
    assert stats["server_requests"] == sum(len(p) for p in requests.values()) > 0
    trees = manager.last_trees
    owners: dict[str, set[str]] = {t.tree_id: set() for t in trees}
    for name, prompts in requests.items():
        for ids in prompts:
            (hit,) = [t.tree_id for t in trees if ids[: len(t.prompt_ids)] == t.prompt_ids]
            owners[hit].add(name)
    assert all(len(names) == 1 for names in owners.values()), owners
    assert manager.last_metrics["failed_trees"] == 0.0


def test_each_request_asks_for_its_own_rows_budget(on_workers) -> None:
    """Independent turns: a request's max_tokens is its row's own remaining budget (the turn's
    24 tokens less what the turn sampled before a stop that did not end it, capped by the 512-token
    total), not the largest of a batch. The turn's start is the longest node prefix the request
    extends."""
    manager, requests, budgets = on_workers
    starts = [t.prefix_ids(n.id) for t in manager.last_trees for n in t.nodes]
    sizes = []
    for name, sent in budgets.items():
        assert len(sent) == len(requests[name])
        for ids, size in zip(requests[name], sent, strict=True):
            start = max((p for p in starts if ids[: len(p)] == p), key=len)
            assert size == min(24, 512 - len(start)) - (len(ids) - len(start)), (len(ids), len(start), size)
            sizes.append(size)
    assert len(set(sizes)) > 1  # rows of one round asked for different budgets


def test_a_failed_request_fails_its_tree_only_on_the_workers(on_workers, cluster, failing) -> None:
    manager, _, _ = on_workers
    w, _, _ = shared()
    first, tasks = manager.last_trees[0].task_id, manager.last_tasks
    victim = next(t for t in tasks if t.id == first)
    failing(victim.question)
    manager.parts.predictor.load_state_dict(manager.initial_predictor)  # the plan of the first step again
    uids = _run_step(manager, cluster, w.train[:8])
    listing = cluster[1].kv_list(partition_id="train")["train"]
    _only_tree_failed(manager, first, listing, uids)
    assert len([k for k in listing if k.split("_")[0] in uids and k not in uids]) == BUDGET


def test_validation_runs_on_the_workers(on_workers, cluster) -> None:
    from verl.utils import tensordict_utils as tu

    manager, _, _ = on_workers
    _, tq = cluster
    w, _, _ = shared()
    batch, uids = _batch(w.train[12:14], global_steps=0)
    tu.assign_non_tensor_data(batch, "validate", True)
    manager.generate_sequences(batch)
    listing = tq.kv_list(partition_id="val")["val"]
    keys = [k for k in listing if k.split("_")[0] in uids and k not in uids]
    assert len(keys) == 2 * len(uids) and all(listing[u]["status"] == "finished" for u in uids)
