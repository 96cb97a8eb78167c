"""Readiness inside verl off the actor's memory (run with `make test-verl`; skipped where verl is
missing): frozen-reference servers answering ``prompt_logprobs`` the way verl's vLLM server does
(`verl_servers.HFServer`, 2 Ray actors on the tiny model) behind verl's real router and
`LLMServerClient`, against tracerl's in-process scorer on TRACE trees of the same model; the
tokens each place forwards; the settings that cannot work, refused in one line."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "allocation"))
sys.path.insert(0, str(HERE))
from alloc_world import make_engine, shared  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.allocation.schemes import SchemeConfig, get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402
from tracerl.core.protocol import ScoreRequest as NodeScoreRequest  # noqa: E402
from tracerl.core.protocol import boundary_nodes  # noqa: E402
from tracerl.errors import UserError  # noqa: E402
from tracerl.integrations.verl.readiness import (  # noqa: E402
    SERVER_KEY,
    InProcessReadiness,
    ServerReference,
)
from tracerl.integrations.verl.readiness_modes import connect_reference, readiness_scorer  # noqa: E402
from tracerl.integrations.verl.reference import VerlReference  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.rollout.executor import LocalExecutor  # noqa: E402

CONFIG = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm"}}})


@pytest.fixture(scope="module")
def servers():
    """verl's real router and ``LLMServerClient`` over 2 stand-in servers holding the reference."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle
    from verl_servers import HFServer

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # one logical GPU: verl's resource pools count GPUs (tracerl.integrations.verl.cpu); the
    # frozen-reference servers' pool takes it
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}})
    _, _, policy = shared()
    weights = ray.put((policy.model, policy.tokenizer))
    handles = {f"ref-{i}": ray.remote(HFServer).remote(*ray.get(weights), f"ref-{i}", None) for i in range(2)}
    yield LLMServerClient(config=CONFIG, load_balancer_handle=get_router_handle(handles)), handles
    ray.shutdown()


@pytest.fixture(scope="module")
def trees():
    """TRACE trees (branching, so nodes share prefixes) of the tiny policy, with their tasks."""
    w, env, policy = shared()
    engine = make_engine(policy, env)
    scorer = ReferenceScorer(policy.model, policy.tokenizer, engine.fmt)
    session = RolloutSession(LocalExecutor(engine, scorer.score_nodes), seed=3)
    scheme = get_scheme("trace", SchemeConfig(group_size=4), predictor=SuccessPredictor(), score=True)
    tasks = w.train[:4]
    result = scheme.collect(session, list(tasks), 12, torch.Generator().manual_seed(3))
    return result.trees, {t.id: t for t in tasks}, engine.fmt


def node_requests(trees, tasks) -> list[NodeScoreRequest]:
    """Every boundary node of every tree, once (what the manager's scoring asks over a step)."""
    out = []
    for tree in trees:
        nodes = sorted({n for t in tree.trajectories.values() for n in boundary_nodes(t)})
        out.append(NodeScoreRequest(tree.tree_id, tree.task_id, tasks[tree.task_id].gold, nodes,
                                    [tree.prefix_ids(n) for n in nodes]))
    return out


def by_hand(model, prefix, opener, answer) -> float:
    """``l = mean_j log softmax(logits)[answer_j]`` over one full forward of ``prefix + opener + answer``."""
    ids = torch.tensor([list(prefix) + list(opener) + list(answer)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(prefix) + len(opener)
    return sum(float(logp[start + j - 1, t]) for j, t in enumerate(answer)) / len(answer)


def _server_scorer(client, fmt, check=None):
    _, _, policy = shared()
    reference, server = readiness_scorer("reference_server", None, policy.tokenizer, fmt, check=check)
    connect_reference(server, {SERVER_KEY: client})
    return reference, server


def test_server_readiness_equals_the_in_process_scorer_and_a_hand_forward(servers, trees) -> None:
    import ray

    client, handles = servers
    got_trees, tasks, fmt = trees
    _, _, policy = shared()
    for h in handles.values():
        ray.get(h.take_requests.remote())
    requests = node_requests(got_trees, tasks)
    reference, server = _server_scorer(client, fmt, check=policy.model)
    got = reference.score_nodes(requests)
    want = ReferenceScorer(policy.model, policy.tokenizer, fmt).score_nodes(requests)
    assert got.nodes.keys() == want.nodes.keys()
    for tree_id, nodes in want.nodes.items():
        assert nodes.keys() == got.nodes[tree_id].keys()
        for nid, value in nodes.items():
            assert abs(got.nodes[tree_id][nid] - value) <= 1e-5
    # the same numbers the rollout wrote on the trees' nodes, and one node by hand
    tree = got_trees[0]
    for nid, value in got.nodes[tree.tree_id].items():
        assert abs(tree.nodes[int(nid)].readiness - value) <= 1e-5
    opener, answer = reference._answer_ids(tasks[tree.task_id].gold)
    deepest = max(requests[0].node_ids, key=lambda n: len(tree.prefix_ids(n)))
    hand = by_hand(policy.model, tree.prefix_ids(deepest), opener, answer)
    assert abs(got.nodes[tree.tree_id][str(deepest)] - hand) <= 1e-5
    assert server.max_gap <= 1e-5 and server.requests == sum(len(r.node_ids) for r in requests)
    # every row of a tree reached one server (routed by tree id, as the policy's requests are)
    seen = {name: ray.get(h.take_requests.remote()) for name, h in handles.items()}
    served = {tuple(p): name for name, prompts in seen.items() for p in prompts}
    for req in requests:
        where = {served[tuple(p) + tuple(opener_answer(reference, req))] for p in req.prefixes}
        assert len(where) == 1, (req.tree_id, where)


def opener_answer(reference, req) -> list[int]:
    opener, answer = reference._answer_ids(req.gold)
    return list(opener) + list(answer)


def test_tokens_forwarded_by_each_place_counted_by_hand(servers, trees) -> None:
    """One tree's chain of nodes P0 < P1 < ... : the full-prefix rows forward sum(|P_k| + |A| + |y|);
    tracerl's trie forwards the deepest prefix once plus a block of |A| + |y| - 1 tokens per node and
    projects |y| tokens per node; the server forwards the full rows (prompt log-probs read no cache)."""
    client, _ = servers
    got_trees, tasks, fmt = trees
    _, _, policy = shared()
    leaf = max(got_trees[0].trajectories.values(), key=lambda t: len(boundary_nodes(t)))
    tree = got_trees[0]
    nodes = boundary_nodes(leaf)
    assert len(nodes) >= 2
    chain = [NodeScoreRequest(tree.tree_id, tree.task_id, tasks[tree.task_id].gold, nodes,
                              [tree.prefix_ids(n) for n in nodes])]
    lengths = [len(tree.prefix_ids(n)) for n in nodes]
    local_ref, local = readiness_scorer("in_process", policy.model, policy.tokenizer, fmt)
    opener, answer = local_ref._answer_ids(tasks[tree.task_id].gold)
    a, y = len(opener), len(answer)
    assert a >= 1  # react's opener: the block's lead is the opener
    full = sum(n + a + y for n in lengths)
    local_values = local_ref.score_nodes(chain)
    assert isinstance(local, InProcessReadiness)
    assert (local.rows, local.readiness_tokens_full_prefix) == (len(nodes), full)
    assert local.readiness_tokens_forwarded == max(lengths) + len(nodes) * (a + y - 1) < full
    assert local.readiness_head_tokens == len(nodes) * y
    reference, server = _server_scorer(client, fmt)
    values = reference.score_nodes(chain)
    assert (server.rows, server.readiness_tokens_full_prefix, server.readiness_tokens_forwarded) == (len(nodes), full, full)
    for nid, v in local_values.nodes[tree.tree_id].items():
        assert abs(values.nodes[tree.tree_id][nid] - v) <= 1e-5
    assert server.metrics()["readiness_tokens_forwarded"] == float(full)
    server.reset()
    assert server.metrics()["reference_rows"] == 0.0


def test_reference_worker_rows_are_full_prefix_rows(trees) -> None:
    """verl's reference worker forwards (and projects) each node's row in full; ``compute`` stands in
    for verl's worker with a full forward of the same model."""
    got_trees, tasks, fmt = trees
    _, _, policy = shared()
    reference, worker = readiness_scorer("reference_worker", None, policy.tokenizer, fmt)
    assert isinstance(worker, VerlReference)

    def compute(rows):
        out = []
        for prompt, response in rows:
            ids = torch.tensor([list(prompt) + list(response)])
            with torch.no_grad():
                logp = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), dim=-1)
            out.append(torch.stack([logp[len(prompt) + j - 1, t] for j, t in enumerate(response)]))
        return out

    worker.compute = compute
    requests = node_requests(got_trees[:1], tasks)
    values = reference.score_nodes(requests)
    opener, answer = reference._answer_ids(requests[0].gold)
    full = sum(len(p) + len(opener) + len(answer) for p in requests[0].prefixes)
    assert worker.readiness_tokens_forwarded == worker.readiness_tokens_full_prefix == full
    for nid, v in values.nodes[requests[0].tree_id].items():
        assert abs(got_trees[0].nodes[int(nid)].readiness - v) <= 1e-5


def test_a_failed_readiness_request_fails_its_tree_only(servers, trees) -> None:
    """A failed request does not stop the call: its tree is recorded (the manager then trains the
    tree's leaves as zero), its rows read 0, and the next call scores as usual."""
    import ray

    client, handles = servers
    got_trees, tasks, fmt = trees
    reference, server = _server_scorer(client, fmt)
    victim = got_trees[0]
    requests = node_requests(got_trees[:1], tasks)
    for h in handles.values():
        ray.get(h.fail_requests_containing.remote(tasks[victim.task_id].question))
    try:
        failed_call = reference.score_nodes(requests)
    finally:
        for h in handles.values():
            ray.get(h.fail_requests_containing.remote(None))
    failed = server.take_failed()
    assert list(failed) == [victim.tree_id] and server.take_failed() == {}
    assert re.fullmatch(r"readiness: RuntimeError: ref-\d: injected engine failure", failed[victim.tree_id])
    assert set(failed_call.nodes[victim.tree_id].values()) == {0.0}  # placeholders, never trained on
    again = reference.score_nodes(requests)
    assert server.take_failed() == {}
    for nid, v in again.nodes[victim.tree_id].items():
        assert abs(victim.nodes[int(nid)].readiness - v) <= 1e-5


def test_reference_server_without_its_servers_is_refused_in_one_line() -> None:
    for teacher_client in (None, {}, {"teacher_model": object()}):
        with pytest.raises(UserError, match=r"^\+tracerl.readiness=reference_server scores on frozen-reference "
                                            r"servers that the tracerl_sync trainer starts") as err:
            ServerReference().connect(teacher_client)
        assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"tracerl.readiness = 'elsewhere' is not valid"):
        readiness_scorer("elsewhere", None, None, None)


def test_verls_distillation_is_refused_and_server_settings_checked() -> None:
    from tracerl.integrations.verl.readiness_servers import server_settings, wants_servers
    from tracerl.integrations.verl.settings import check_refused_settings

    with pytest.raises(UserError, match=r"^distillation.enabled = True: not supported with TraceAgentLoopManager: "
                                        r"verl's actor then trains on distillation_ppo_loss"):
        check_refused_settings(OmegaConf.create({"distillation": {"enabled": True}}))
    check_refused_settings(OmegaConf.create({"distillation": {"enabled": False}}))
    config = OmegaConf.create({"trainer": {"n_gpus_per_node": 8},
                               "tracerl": {"readiness": "reference_server",
                                           "reference_server": {"num_replicas": 2, "tensor_model_parallel_size": 2}}})
    s = server_settings(config)
    assert wants_servers(config) and (s.n_gpus_per_node, s.nnodes) == (4, 1)
    config.tracerl.reference_server.n_gpus_per_node = 3
    with pytest.raises(UserError, match=r"tracerl.reference_server.n_gpus_per_node = 3: the servers' 4 GPUs"):
        server_settings(config)
    config.tracerl.reference_server = {"num_replicas": 0}
    with pytest.raises(UserError, match=r"num_replicas = 0"):
        server_settings(config)


def test_the_trainer_starts_frozen_servers_on_the_initial_checkpoint(servers) -> None:
    """What ``tracerl_sync`` starts (verl's ``TeacherModelManager`` on a pool of its own, the
    ``tracerl_hf`` replica class on the smoke model's folder) answers readiness through verl's
    router and client as the in-process scorer on the same checkpoint does."""
    import verl
    from transformers import AutoTokenizer

    from tracerl.agent.formats import get_format
    from tracerl.integrations.verl.names import ROLLOUT_NAME
    from tracerl.integrations.verl.readiness_servers import ANSWER_ROOM, ReferenceServers, reference_inference, server_settings
    from tracerl.testbed.loading import load_model
    from tracerl.train.smoke import ensure_smoke_model

    folder = ensure_smoke_model(lambda text: None)
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    config.actor_rollout_ref.model.path = str(folder)
    config.actor_rollout_ref.rollout.name = ROLLOUT_NAME
    config.trainer.n_gpus_per_node = 1
    config.tracerl = {"readiness": "reference_server", "reference_server": {"num_replicas": 1}}
    inference = reference_inference(config, server_settings(config))
    assert (inference.load_format, inference.response_length, inference.name) == ("auto", 1, ROLLOUT_NAME)
    assert inference.prompt_length == config.actor_rollout_ref.rollout.prompt_length + \
        config.actor_rollout_ref.rollout.response_length + ANSWER_ROOM
    config.tracerl.reference_server.num_replicas = 2  # the cluster has one logical GPU
    with pytest.raises(UserError, match=r"reference_server: the frozen-reference servers need 2 free GPU and 2 free "
                                        r"CPU in Ray besides the trainer's pools, and Ray has 1 and \d+ left"):
        ReferenceServers(config)
    config.tracerl.reference_server.num_replicas = 1
    started = ReferenceServers(config)
    assert [r.is_teacher_model for r in started.manager.rollout_replicas] == [True]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    fmt = get_format("react", tokenizer=tokenizer)
    texts = ["Question: Where is the tower?\n", "Question: Where is the tower?\nThought: search it\n"]
    prefixes = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    requests = [NodeScoreRequest("tree-a", "task-a", "Paris", [0, 1], prefixes)]
    reference, server = readiness_scorer("reference_server", None, tokenizer, fmt)
    connect_reference(server, started.client())
    got = reference.score_nodes(requests)
    model, _ = load_model(str(folder))
    want = ReferenceScorer(model.eval(), tokenizer, fmt).score_nodes(requests)
    assert sorted(want.nodes["tree-a"]) == sorted(got.nodes["tree-a"]) == ["0", "1"]
    for nid, value in want.nodes["tree-a"].items():
        assert abs(got.nodes["tree-a"][nid] - value) <= 1e-5
    assert server.rows == server.requests == 2


def test_main_ppo_scores_readiness_on_frozen_reference_servers(tmp_path) -> None:
    """One step of `examples/verl/cpu` with ``+tracerl.readiness=reference_server``: the
    ``tracerl_sync`` trainer starts a frozen-reference ``tracerl_hf`` replica on a third logical GPU
    and verl hands its client to the manager as ``teacher_client``; readiness equals tracerl's HF
    copy (``+tracerl.check=true``) and so does every advantage."""
    import subprocess

    from test_verl_main_ppo import EXAMPLE, _run, example_env, steps

    env = example_env(tmp_path / "cache")
    prepared = subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), str(tmp_path / "run")], env=env,
                              capture_output=True, text=True, timeout=600)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    log = _run(tmp_path / "run", env, "tracerl.readiness=reference_server", "ray_kwargs.ray_init.num_gpus=3",
               "ray_kwargs.ray_init.num_cpus=12", "trainer.total_training_steps=1", "trainer.val_before_train=False",
               "trainer.save_freq=-1", "trainer.resume_mode=disable")
    m = steps(log)[1]
    assert m["tracerl/reference_rows"] > 0 and m["tracerl/readiness_max_abs_diff"] <= 1e-5, m
    # the HF server forwards each node's row in full (as vLLM does for prompt log-probs)
    assert m["tracerl/readiness_tokens_forwarded"] == m["tracerl/readiness_tokens_full_prefix"] > 0
    assert m["tracerl/advantage_max_abs_diff"] == 0.0
