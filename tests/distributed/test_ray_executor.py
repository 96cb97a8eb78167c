"""RayExecutor on a real local Ray cluster (one per module): the same trees from 1 and 2 workers,
weights reaching every worker, SIGKILLed workers replaced without changing the step, and the
``tracerl train`` smoke run on Ray. Run by ``make test-dist`` (TRACERL_DIST_TESTS=1, Ray installed);
the default suite skips this module before importing Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("TRACERL_DIST_TESTS") != "1":
    pytest.skip("Ray tests run in `make test-dist` (TRACERL_DIST_TESTS=1)", allow_module_level=True)

import ray  # noqa: E402 - after the skip: the default environment has no Ray
import torch  # noqa: E402
from helpers_tiny import bpe_tokenizer, tiny_model  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.allocation.schemes import get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402
from tracerl.core.protocol import to_json, tree_delta  # noqa: E402
from tracerl.errors import UserError  # noqa: E402
from tracerl.rollout.ray_executor import RayExecutor, WorkerLostError, check_placeable  # noqa: E402
from tracerl.config.schema import resolve_config  # noqa: E402
from tracerl.train.data import load_task_data  # noqa: E402
from tracerl.train.executors import worker_spec  # noqa: E402

pytestmark = [pytest.mark.dist]
ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["rollout.executor=ray", "rollout.readiness_on=workers", "rollout.request_timeout_s=120"]


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)  # logical CPUs: 3 actors + the CLI's 2
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    """The trace preset (credit on) at smoke size, its tasks and an initial policy on disk."""
    folder = tmp_path_factory.mktemp("initial")
    tok = bpe_tokenizer()
    tiny_model(len(tok), seed=3).save_pretrained(folder)
    tok.save_pretrained(folder)
    config = resolve_config("trace", smoke="random", overrides=OVERRIDES)
    return config, folder, load_task_data(config.data, config.rollout.engine, config.seed).train


def _executor(run, workers: int) -> RayExecutor:
    config, folder, _ = run
    cfg = resolve_config("trace", smoke="random", overrides=OVERRIDES + [f"rollout.workers={workers}"])
    return RayExecutor(worker_spec(cfg, folder))


@pytest.fixture(scope="module")
def one(run):
    ex = _executor(run, 1)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def two(run):
    ex = _executor(run, 2)
    yield ex
    ex.close()


def _collect(executor, run, scheme: str, seed: int = 11):
    """One step of ``scheme`` with readiness: the trees as JSON without log-probs and readiness,
    and those floats in order (batch shapes move them in the last bits; all else must be equal)."""
    config, _, tasks = run
    predictor = SuccessPredictor(config.predictor) if scheme == "trace" else None
    session = RolloutSession(executor, seed, executor.version)
    result = get_scheme(scheme, config.rollout.schemes, predictor, True).collect(
        session, tasks[: config.rollout.pool_size], config.rollout.budget, torch.Generator().manual_seed(seed))
    session.score(result.trees)
    trees, logprobs = [], []
    for tree in result.trees:
        data = json.loads(to_json(tree_delta(tree)))
        logprobs.append(data.pop("root_readiness"))
        for node in data["nodes"]:
            logprobs += node["turn"].pop("logprobs")
            logprobs.append(node.pop("readiness"))
        for traj in data["trajectories"]:
            logprobs += traj.pop("readiness") or [None]
            for turn in traj["turns"]:
                turn.pop("logprobs")
        trees.append(data)
    session.forget()
    return trees, logprobs, result


def _same(a, b) -> None:
    assert a[0] == b[0]  # tokens, observations, actions, rewards, node ids
    assert [x is None for x in a[1]] == [x is None for x in b[1]]  # the same nodes scored
    assert [x for x in a[1] if x is not None] == pytest.approx([x for x in b[1] if x is not None], abs=1e-5)


@pytest.mark.parametrize("scheme", ["chain", "tree_random", "trace"])
def test_one_and_two_workers_give_the_same_trees_and_spend_the_budget(one, two, run, scheme) -> None:
    a, b = _collect(one, run, scheme), _collect(two, run, scheme)
    _same(a[:2], b[:2])
    budget = run[0].rollout.budget
    assert a[2].cost.rollouts == b[2].cost.rollouts == budget
    assert sum(x is not None for x in a[1]) > len(a[0])  # readiness was scored (credit on)
    metrics = two.take_metrics()
    assert metrics["worker_w0_tokens_per_s"] > 0 and metrics["worker_w1_tokens_per_s"] > 0  # both held trees
    # placed by planned rollouts; trace's later expansions stay on their trees' workers
    assert 1.0 <= metrics["worker_imbalance"] <= (2.0 if scheme == "trace" else 1.25)
    assert not two.owner and two.load == [0.0, 0.0]  # the step's trees forgotten: nothing stays placed
    assert metrics["worker_failures"] == 0 == metrics["requests_retried"]


class KillAfterStart:
    """The executor, SIGKILLing the owner of the first tree right after ``start`` returns."""

    def __init__(self, executor: RayExecutor) -> None:
        self.executor, self.killed = executor, False

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def start(self, requests):
        result = self.executor.start(requests)
        if not self.killed:
            w = self.executor.owner[requests[0].task["id"]]
            os.kill(ray.get(self.executor.actors[w].pid.remote()), signal.SIGKILL)
            self.killed = True
        return result


def test_a_worker_killed_between_start_and_expand_is_replaced_and_the_step_is_unchanged(one, two, run) -> None:
    expected = _collect(one, run, "tree_random", seed=5)
    two.take_metrics()
    got = _collect(KillAfterStart(two), run, "tree_random", seed=5)
    _same(expected[:2], got[:2])
    assert got[2].cost == expected[2].cost
    metrics = two.take_metrics()
    assert metrics["worker_failures"] == 1 and metrics["requests_retried"] >= 1


def test_a_worker_killed_during_an_expand_is_replaced_and_the_step_is_unchanged(one, two, run) -> None:
    expected = _collect(one, run, "tree_random", seed=6)
    two.take_metrics()
    ray.get(two.actors[1].die_in.remote("expand"))  # SIGKILL inside its next expand call
    got = _collect(two, run, "tree_random", seed=6)
    _same(expected[:2], got[:2])
    assert got[2].cost == expected[2].cost
    metrics = two.take_metrics()
    assert metrics["worker_failures"] == 1 and metrics["requests_retried"] >= 1


def test_a_worker_silent_past_the_timeout_is_replaced_and_the_step_is_unchanged(one, two, run) -> None:
    expected = _collect(one, run, "chain", seed=8)
    two.take_metrics()
    ray.get(two.actors[0].hang_in.remote("start"))
    two.timeout = 5.0  # requests only: building the replacement has its own limit
    try:
        got = _collect(two, run, "chain", seed=8)
    finally:
        two.timeout = 120.0
    _same(expected[:2], got[:2])
    metrics = two.take_metrics()
    assert metrics["worker_failures"] == 1 and metrics["requests_retried"] >= 1


def test_after_sync_weights_every_worker_holds_the_trainers_parameters(one, two) -> None:
    tok = bpe_tokenizer()
    trainer = tiny_model(len(tok), seed=9)  # other weights than the initial policy's
    two.sync_weights(trainer, 1)
    expected = trainer.state_dict()
    for actor in two.actors:
        params = ray.get(actor.parameters.remote())
        assert params.keys() == expected.keys()
        for name, value in expected.items():
            assert torch.equal(params[name], value), name
    metrics = two.take_metrics()
    n_bytes = sum(t.numel() * t.element_size() for n, t in expected.items() if n != "lm_head.weight"
                  or not trainer.config.tie_word_embeddings)
    assert metrics["sync_bytes"] == n_bytes and metrics["time_sync_weights"] > 0
    assert two.version == 1


def test_a_bf16_policy_streams_two_bytes_per_parameter_and_workers_hold_them_bitwise(two) -> None:
    """model.dtype = bfloat16 (the executor's sync_dtype): the float32 master weights travel cast,
    bucket by bucket (small buckets here: several parts), and every worker's weights are the
    driver's bf16 weights exactly."""
    from tracerl.models.weights import weight_buckets

    trainer = tiny_model(len(bpe_tokenizer()), seed=13)
    assert len(list(weight_buckets(trainer, 4096, torch.bfloat16))) > 2
    two.take_metrics()
    two.sync_dtype, two.bucket_bytes = torch.bfloat16, 4096
    try:
        two.sync_weights(trainer, two.version + 1)
    finally:
        two.sync_dtype, two.bucket_bytes = torch.float32, 256 * 2**20
    state = trainer.state_dict()
    for actor in two.actors:
        params = ray.get(actor.parameters.remote())
        for name, value in state.items():
            assert torch.equal(params[name], value.to(torch.bfloat16).float()), name
        assert not all(torch.equal(params[n], v) for n, v in state.items())  # bf16 arrived, not the float32 masters
    metrics = two.take_metrics()
    tied = trainer.config.tie_word_embeddings
    parameters = sum(v.numel() for n, v in state.items() if not (tied and n == "lm_head.weight"))
    assert metrics["sync_bytes"] == 2 * parameters
    assert metrics["sync_s_per_gb"] == pytest.approx(metrics["time_sync_weights"] / (2 * parameters / 1e9))


def test_a_worker_killed_while_idle_is_replaced_at_the_weight_sync(one, two, run) -> None:
    """Killed between steps (during the trainer's update): the next sync_weights replaces it with the
    new weights, and the next step's trees are those of one worker holding the same weights."""
    model = tiny_model(len(bpe_tokenizer()), seed=10)
    two.take_metrics()
    os.kill(ray.get(two.actors[1].pid.remote()), signal.SIGKILL)
    two.sync_weights(model, two.version + 1)
    one.sync_weights(model, one.version + 1)
    assert two.take_metrics()["worker_failures"] == 1
    for actor in two.actors:
        params = ray.get(actor.parameters.remote())
        assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    _same(_collect(one, run, "tree_random", seed=12)[:2], _collect(two, run, "tree_random", seed=12)[:2])


class _OnePass:
    """A source that can be read once, as the shards of a driver without a whole copy are
    (distributed/streamed.py: every read is a round of collectives the other ranks join)."""

    stream_once = True

    def __init__(self, model) -> None:
        self.model, self.reads = model, 0

    def buckets(self, bucket_bytes: int, dtype):
        from tracerl.models.weights import weight_buckets

        self.reads += 1
        assert self.reads == 1, "a one-pass source was read twice"
        return weight_buckets(self.model, bucket_bytes, dtype)


def test_a_one_pass_source_is_read_once_and_a_replacement_gets_what_was_sent(two) -> None:
    """A worker that dies after a one-pass sync is replaced, at the next request, with the same
    weights, from the buckets the sync kept in the object store (the source is not read again)."""
    model = tiny_model(len(bpe_tokenizer()), seed=14)
    source = _OnePass(model)
    two.take_metrics()
    restarts = list(two.restarts)  # the later tests count on worker 0's restart budget
    two.sync_weights(source, two.version + 1)
    os.kill(ray.get(two.actors[0].pid.remote()), signal.SIGKILL)
    try:
        two._replace(0, RuntimeError("killed"))
    finally:
        two.restarts[:] = restarts
    assert source.reads == 1 and two.take_metrics()["worker_failures"] == 1
    for actor in two.actors:
        params = ray.get(actor.parameters.remote())
        assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())


def test_a_replaced_worker_0_continues_the_evaluation_counter(two, run) -> None:
    """Worker 0 runs every evaluation; its count of evaluation trees seeds the next ones (exact
    sampled evaluation on resume), so its replacement must continue it, not restart at 0."""
    _, _, tasks = run
    two.evaluate(tasks[:2], 1, 3)
    before = two.eval_state()
    assert before["trees_started"] > 0
    os.kill(ray.get(two.actors[0].pid.remote()), signal.SIGKILL)
    two.clear_prefix_cache()  # the next call finds it dead and replaces it
    assert two.eval_state() == before


def test_when_restarts_are_spent_the_error_names_the_worker_and_its_trees(two, run) -> None:
    config, _, tasks = run
    session = RolloutSession(two, 3, two.version)
    session.start([tasks[0]], [2], ["lost@0"])
    w = two.owner[tasks[0].id]
    two.max_restarts = 0
    os.kill(ray.get(two.actors[w].pid.remote()), signal.SIGKILL)
    with pytest.raises(WorkerLostError) as err:
        session.expand([("lost@0", 0, 1)])
    assert f"rollout worker w{w}" in str(err.value) and "lost@0" in str(err.value) and "\n" not in str(err.value)


def _tool_health_takes_stats() -> bool:
    import inspect

    from tracerl.envs.health import ToolHealth

    return list(inspect.signature(ToolHealth.observe).parameters)[1:] == ["stats"]


# The trainer's loop (seam branch) calls ToolHealth.observe(stats), the per-tool health of the
# guards branch; until both are merged, `tracerl train` itself stops at that call, whatever the executor.
@pytest.mark.skipif(not _tool_health_takes_stats(), reason="needs the merged ToolHealth.observe(stats)")
def test_train_smoke_on_two_ray_workers(cluster, tmp_path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1"}
    cmd = [sys.executable, "-c", "import sys; from tracerl.cli import app; sys.argv[0] = 'tracerl'; app()", "train", "trace", "--smoke-random", "--steps", "3", "--out", str(out),
           "--set", "rollout.executor=ray", "--set", "rollout.workers=2", "--set", f"rollout.ray_address={cluster}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(lines) == 3
    for line in lines:  # a step's trees may all hash to one worker: the other then reads 0
        assert line["worker_w0_tokens_per_s"] >= 0 and line["worker_w1_tokens_per_s"] >= 0
        assert line["time_sync_weights"] > 0 and line["sync_bytes"] > 0 and line["worker_failures"] == 0
    assert all(sum(line[f"worker_{w}_tokens_per_s"] for line in lines) > 0 for w in ("w0", "w1"))


def test_unplaceable_workers_are_refused_in_one_line(run) -> None:
    """A GPU per worker on a CPU cluster: refused before any placement group waits (which would end
    in Ray's "Get timed out" after rollout.request_timeout_s)."""
    config, folder, _ = run
    cfg = resolve_config("trace", smoke="random", overrides=OVERRIDES + ["rollout.worker_resources.gpus=1",
                                                                          "rollout.request_timeout_s=30"])
    with pytest.raises(UserError, match=r"rollout.workers = 1 x rollout.worker_resources.gpus = 1 needs 1 GPU, "
                                        r"but the Ray cluster has 0 GPU in all"):
        RayExecutor(worker_spec(cfg, folder))
    with pytest.raises(UserError, match=r"needs 12 CPU, but the Ray cluster has 6 CPU"):
        check_placeable({"CPU": 2.0}, 6, ray.cluster_resources())


def test_the_broadcast_sync_has_a_group_of_its_own_rebuilt_when_a_worker_is_replaced(run) -> None:
    """rollout.weight_sync = nccl, exercised with gloo on the CPU: the driver already holds a default
    process group (as an FSDP driver does), the weights go by broadcast in a group of their own,
    and a worker killed while idle is replaced and a new generation of the group made with it."""
    import torch.distributed as dist
    from dataclasses import replace

    config, folder, _ = run
    spec = worker_spec(resolve_config("trace", smoke="random", overrides=OVERRIDES + ["rollout.workers=2"]), folder)
    spec = replace(spec, config={**spec.config, "rollout": {**spec.config["rollout"], "weight_sync": "nccl"}})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ex = RayExecutor(spec)
    try:
        tok = bpe_tokenizer()
        for version, seed in ((1, 21), (2, 22)):
            model = tiny_model(len(tok), seed=seed)
            ex.sync_weights(model, version)
            for actor in ex.actors:
                params = ray.get(actor.parameters.remote())
                assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
            if version == 1:
                assert ex.generation == 1
                os.kill(ray.get(ex.actors[1].pid.remote()), signal.SIGKILL)
        assert ex.generation == 2 and ex.take_metrics()["worker_failures"] == 1
    finally:
        ex.close()
        dist.destroy_process_group()


def test_a_worker_that_cannot_read_a_path_refuses_in_one_line(run) -> None:
    """A node without the run's files (here: a corpus path no node has): the worker builds nothing,
    the executor stops in one line naming the worker, its node and the path, and frees its bundles."""
    from dataclasses import replace

    config, folder, _ = run
    spec = worker_spec(resolve_config("trace", smoke="random", overrides=OVERRIDES), folder)
    spec = replace(spec, config={**spec.config, "data": {**spec.config["data"], "corpus": "/nowhere/corpus.jsonl"}})
    def live_groups() -> set[str]:
        return {g for g, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}

    before = live_groups()
    with pytest.raises(UserError) as err:
        RayExecutor(spec)
    message = str(err.value)
    assert message.startswith("rollout worker w0 on ") and "\n" not in message
    assert "cannot read data.corpus = /nowhere/corpus.jsonl; every node with rollout workers" in message
    for _ in range(100):  # its placement group is removed (Ray records it asynchronously)
        if live_groups() <= before:
            break
        time.sleep(0.1)
    assert live_groups() <= before


def test_close_leaves_a_cluster_it_joined(run) -> None:
    ex = _executor(run, 1)
    ex.close()
    ex.close()  # idempotent
    assert ray.is_initialized() and ray.cluster_resources().get("CPU", 0) >= 6  # the module's cluster lives on


TWO_TRAINERS = """
import ray
from tracerl.train.run import start_training
for name in ("a", "b"):  # each starts its own local cluster (not the test module's) and releases it
    start_training("trace", {out!r} + "/" + name, overrides=["rollout.executor=ray", "eval.every=0"], steps=1,
                   smoke="random")()
    print("initialized after", name, ray.is_initialized())
"""


def test_two_ray_trainers_in_one_process_start_and_release_their_clusters(cluster, tmp_path) -> None:
    """Trainer.close() closes its executor: the workers, their placement group and the local cluster
    the executor started go, so a second Ray trainer in the same process starts cleanly. With the
    test module's cluster up, a run without rollout.ray_address starts a cluster of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRACERL_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", TWO_TRAINERS.format(out=str(tmp_path))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("initialized after") == 2 and "True" not in proc.stdout
    assert (tmp_path / "b" / "metrics.jsonl").is_file()


def test_tool_stats_of_several_workers_add_up() -> None:
    from tracerl.rollout.ray_executor import _merge_tool_stats

    merged = _merge_tool_stats([{"calls": 2, "failures": 1, "last_failure": "timeout", "per_tool": {"search": [2, 1]}},
                                {"calls": 3, "failures": 0, "last_failure": "", "per_tool": {"search": [1, 0], "open": [2, 0]}}])
    assert merged == {"calls": 5, "failures": 1, "last_failure": "timeout", "per_tool": {"search": [3, 1], "open": [2, 0]}}
