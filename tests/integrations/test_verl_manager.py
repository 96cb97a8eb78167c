"""The TRACE rollout manager inside verl 0.9.1 (run with `make test-verl`; skipped where verl is
missing): verl's real `LLMServerClient` and router in front of 2 Ray server actors serving
tracerl's HF backend on the tiny model (`verl_servers.HFServer`), TransferQueue on a local Ray
cluster. The manager's trees equal tracerl's own `LocalExecutor` trees on the same seed, every
request of a tree reaches one server, the step spends exactly the budget, and every leaf sits in
TransferQueue with its own reward, read back with TransferQueue's API."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "allocation"))
sys.path.insert(0, str(HERE))
from alloc_world import lucky_verifier, make_engine, shared  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tracerl.agent.formats import get_format  # noqa: E402
from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.allocation.schemes import SchemeConfig, get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402
from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator  # noqa: E402
from tracerl.core.seeds import derive_seed  # noqa: E402
from tracerl.errors import UserError  # noqa: E402
from tracerl.integrations.verl.rows import TREE_FIELDS, object_array, pad_rows, rows_from_trees  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.rollout.executor import LocalExecutor, VersionError  # noqa: E402

BUDGET, SEED, GROUP = 24, 5, 4
from verl_servers import CONFIG  # noqa: E402


def _scheme() -> object:
    return get_scheme("trace", SchemeConfig(group_size=GROUP), predictor=SuccessPredictor(), score=True)


def _parts():
    from tracerl.integrations.verl.manager import TraceParts

    w, env, policy = shared()
    fmt = get_format("react")
    engine = make_engine(policy, env).config
    scheme = _scheme()
    return TraceParts(policy.tokenizer, fmt, env, lucky_verifier, engine, scheme, BUDGET, scheme.predictor,
                      ReferenceScorer(policy.model, policy.tokenizer, fmt), SEED)


def _batch(tasks, global_steps: int):
    """A prompt batch as verl's trainer builds it (``get_tensordict`` of the dataloader's dict)."""
    from verl.utils import tensordict_utils as tu

    uids = [str(uuid.uuid4()) for _ in tasks]
    batch = tu.get_tensordict({
        "raw_prompt": object_array([[{"role": "user", "content": t.question}] for t in tasks]),
        "reward_model": object_array([{"ground_truth": {"target": list(t.answers)}} for t in tasks]),
        "data_source": np.array(["synthwiki"] * len(tasks), dtype=object),
        "uid": np.array(uids, dtype=object),
    })
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch, uids


def _reference_trees(tasks, global_steps: int):
    """tracerl's own LocalExecutor over the plain HFPolicy, the manager's step seed."""
    _, env, policy = shared()
    engine = make_engine(policy, env)
    scorer = ReferenceScorer(policy.model, policy.tokenizer, engine.fmt)
    session = RolloutSession(LocalExecutor(engine, scorer.score_nodes), seed=derive_seed(SEED, "verl_step", global_steps))
    planner = torch.Generator().manual_seed(derive_seed(SEED, "verl_plan", global_steps))
    result = _scheme().collect(session, list(tasks), BUDGET, planner)
    session.score(result.trees)
    return result


@pytest.fixture(scope="module")
def step(cluster, servers):
    """One manager step on a registered prompt batch; what TransferQueue and the servers hold after it."""
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    _, tq = cluster
    client, handles = servers
    w, _, _ = shared()
    tasks = w.train[:8]
    manager = TraceAgentLoopManager(CONFIG, client, parts=_parts())
    batch, uids = _batch(tasks, global_steps=1)  # step 1 samples with the weights of step 0
    tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * len(uids))
    for h in handles.values():
        h.take_requests.remote()
    manager.generate_sequences(batch)
    assert [t.question for t in manager.last_tasks] == [t.question for t in tasks]
    tasks = manager.last_tasks  # as read: ids stable across runs, not verl's uuid4 uids
    requests = {name: cluster[0].get(h.take_requests.remote()) for name, h in handles.items()}
    return manager, tasks, uids, requests, tq.kv_list(partition_id="train")["train"]


def _same_trees(got, want) -> None:
    assert [t.tree_id for t in got] == [t.tree_id for t in want]
    for a, b in zip(got, want, strict=True):
        assert a.prompt_ids == b.prompt_ids
        assert [(n.parent, n.turn.assistant_ids if n.turn else None, n.turn.observation_ids if n.turn else None)
                for n in a.nodes] == [(n.parent, n.turn.assistant_ids if n.turn else None,
                                       n.turn.observation_ids if n.turn else None) for n in b.nodes]
        assert sorted(a.trajectories) == sorted(b.trajectories)
        for leaf, ta in a.trajectories.items():
            tb = b.trajectories[leaf]
            assert (ta.token_ids, ta.reward, ta.node_path, ta.infra_failed) == (tb.token_ids, tb.reward, tb.node_path,
                                                                                tb.infra_failed)
            assert np.allclose(ta.old_logprobs, tb.old_logprobs, atol=1e-5)
            assert ta.readiness is not None and np.allclose(ta.readiness, tb.readiness, atol=1e-5)


def test_manager_trees_equal_tracerls_local_executor(step) -> None:
    manager, tasks, _, _, _ = step
    want = _reference_trees(tasks, global_steps=1)
    assert want.cost.rollouts == BUDGET
    assert sum(len(t.trajectories) for t in manager.last_trees) == BUDGET  # one leaf per rollout
    _same_trees(manager.last_trees, want.trees)
    assert len({t.reward for tree in want.trees for t in tree.trajectories.values()}) == 2  # mixed outcomes


def test_every_request_of_a_tree_reached_one_server(step) -> None:
    manager, _, _, requests, _ = step
    trees = manager.last_trees
    owners: dict[str, set[str]] = {t.tree_id: set() for t in trees}
    for name, prompts in requests.items():
        for ids in prompts:
            hits = [t.tree_id for t in trees if ids[: len(t.prompt_ids)] == t.prompt_ids]
            assert len(hits) == 1, "each request's prefix starts with exactly one tree's prompt"
            owners[hits[0]].add(name)
    assert sum(len(p) for p in requests.values()) == manager.policy.stats["server_requests"]
    assert all(len(names) == 1 for names in owners.values()), owners
    assert {n for names in owners.values() for n in names} == set(requests)  # both servers served trees


def test_leaves_in_transfer_queue_carry_their_own_rewards(step, cluster) -> None:
    manager, tasks, uids, _, listing = step
    _, tq = cluster
    assert all(listing[u]["status"] == "finished" and listing[u]["is_prompt"] for u in uids)
    keys = sorted(k for k in listing if not listing[k].get("is_prompt", False))
    assert len(keys) == BUDGET and all(k.split("_")[0] in uids for k in keys)
    data = tq.kv_batch_get(keys=keys, partition_id="train",
                           select_fields=["rm_scores", "responses", "response_mask", "rollout_log_probs", "uid"]
                           + list(TREE_FIELDS))
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in manager.last_trees for t in tree.trajectories.values()}
    by_tree: dict[str, set[float]] = {}
    for i, key in enumerate(keys):
        traj = leaves[(data["tracerl_tree_id"][i], list(data["tracerl_node_path"][i])[-1])]
        p = len(traj.prompt_ids)
        assert data["responses"][i].tolist() == traj.token_ids[p:]
        assert data["response_mask"][i].tolist() == [int(s) for s in traj.sampled[p:]]
        assert data["rollout_log_probs"][i].tolist() == pytest.approx(traj.old_logprobs[p:])
        assert float(data["rm_scores"][i].sum()) == traj.reward == float(data["tracerl_reward"][i])
        assert data["uid"][i] == key.split("_")[0] == uids[[x.id for x in tasks].index(traj.task_id)]
        by_tree.setdefault(traj.tree_id, set()).add(traj.reward)
    assert any(len(r) == 2 for r in by_tree.values())  # a tree's leaves differ: not the last leaf's reward copied


def _advantage_trainer():
    """A ``tracerl_sync`` trainer whose advantage step reads only its config and TransferQueue."""
    from tracerl.integrations.verl.trainer import TraceSyncTrainer

    trainer = object.__new__(TraceSyncTrainer)
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": "tracerl_trace_credit", "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0},
        "actor_rollout_ref": {"rollout": {"n": 1}},
    })
    return trainer


def test_trainer_advantage_step_on_the_managers_leaves(step, cluster) -> None:
    """tracerl_sync's advantage step on what the manager wrote: exactly tracerl's trace_credit."""
    from transfer_queue.metadata import KVBatchMeta


    manager, _, _, _, listing = step
    _, tq = cluster
    keys = sorted(k for k in listing if not listing[k].get("is_prompt", False))
    trainer = _advantage_trainer()
    trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train"), {})
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "tracerl_tree_id",
                                                                          "tracerl_node_path"])
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in manager.last_trees for t in tree.trajectories.values()}
    order = [leaves[(got["tracerl_tree_id"][i], list(got["tracerl_node_path"][i])[-1])] for i in range(len(keys))]
    trees = {t.tree_id: t for t in manager.last_trees}
    want = get_estimator("trace_credit")(AdvantageBatch(order, trees), AdvantageOptions())
    width = max(len(t.token_ids) - len(t.prompt_ids) for t in order)
    want = pad_rows([a[len(t.prompt_ids):] for t, a in zip(order, want, strict=True)], width)
    adv = got["advantages"]
    adv = adv.to_padded_tensor(0.0) if adv.is_nested else adv
    assert torch.equal(adv, want[:, : adv.shape[1]]) and bool((want != 0).any())
    assert rows_from_trees(manager.last_trees).response_mask.shape[0] == BUDGET


def test_predictor_state_saved_and_loaded(step, tmp_path) -> None:
    manager = step[0]
    predictor = manager.parts.predictor
    assert predictor.updates > 0  # the step's trees trained it
    manager.save_state(tmp_path)
    fresh = SuccessPredictor()
    manager.parts.predictor = fresh
    try:
        manager.load_state(tmp_path)
        assert fresh.updates == predictor.updates
        for a, b in zip(fresh.state_dict()["model"].values(), predictor.state_dict()["model"].values(), strict=True):
            assert torch.equal(a, b)
        with pytest.raises(UserError, match="no tracerl predictor state"):
            manager.load_state(tmp_path / "elsewhere")
    finally:
        manager.parts.predictor = predictor


def test_validation_batch_runs_val_n_chains_per_prompt(step, cluster) -> None:
    """A validation batch (verl marks it ``validate``) after step 0: 2 chains per prompt, in the val
    partition, each its own session: verl's validation keeps the highest index of each
    ``{uid}_{session}`` (``trainer_base._validate``), so both chains of every prompt must survive that rule."""
    from verl.utils import tensordict_utils as tu

    manager = step[0]
    _, tq = cluster
    w, _, _ = shared()
    batch, uids = _batch(w.train[12:14], global_steps=0)
    tu.assign_non_tensor_data(batch, "validate", True)
    manager.generate_sequences(batch)
    listing = tq.kv_list(partition_id="val")["val"]
    keys = sorted(k for k in listing if k.split("_")[0] in uids and k not in uids)
    assert len(keys) == 2 * len(uids) and all(listing[u]["status"] == "finished" for u in uids)
    sessions = {key.rsplit("_", 2)[0] + "_" + key.rsplit("_", 2)[1] for key in keys}  # verl's rule
    assert len(sessions) == 2 * len(uids)
    data = tq.kv_batch_get(keys=keys, partition_id="val", select_fields=["rm_scores", "tracerl_reward"])
    assert [float(r.sum()) for r in data["rm_scores"]] == [float(r) for r in data["tracerl_reward"]]


def test_a_server_on_other_weights_is_refused_in_one_line(step, cluster) -> None:
    """A batch of step 3 needs the weights of step 2; the servers report 0: refused, prompts marked failed."""
    manager, _, _, _, _ = step
    _, tq = cluster
    w, _, _ = shared()
    batch, uids = _batch(w.train[8:12], global_steps=3)
    with pytest.raises(VersionError, match=r"the verl server reports weights step 0; this rollout needs version 2"):
        manager.generate_sequences(batch)
    listing = tq.kv_list(partition_id="train")["train"]
    assert all(listing[u]["status"] == "failure" for u in uids)


def test_reward_model_setting_is_refused(servers) -> None:
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    bad = OmegaConf.merge(CONFIG, {"reward": {"reward_model": {"enable": True}}})
    with pytest.raises(UserError, match=r"reward\.reward_model\.enable=True: verl would score the samples itself"):
        TraceAgentLoopManager(bad, servers[0], parts=_parts())


def test_task_from_row_reads_search_r1_rows() -> None:
    from tracerl.integrations.verl.manager import task_from_row

    row = {"uid": "u1", "raw_prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Who?"}],
           "reward_model": {"style": "rule", "ground_truth": {"target": ["Ann", "Anne"]}}, "extra_info": {}}
    task = task_from_row(row)
    assert (task.id, task.question, task.answers) == ("u1", "Who?", ("Ann", "Anne"))
    assert task_from_row({**row, "extra_info": {"question": "Q"}, "reward_model": {"ground_truth": "B"}}).question == "Q"
    with pytest.raises(UserError, match="prompt u1: reward_model.ground_truth holds no gold answer"):
        task_from_row({**row, "reward_model": {"ground_truth": {"target": []}}})


def test_build_parts_reads_the_tracerl_section(tmp_path) -> None:
    """The manager's tracerl side from ``config.tracerl`` (preset + overrides), as a verl run gives it."""
    from tracerl.integrations.verl.manager import build_parts

    _, _, policy = shared()
    policy.model.save_pretrained(tmp_path / "policy")
    policy.tokenizer.save_pretrained(tmp_path / "policy")
    overrides = ["model.format=react", "rollout.budget=8", "rollout.pool_size=4", "data.train_worlds=1",
                 "model.threads=1"]
    verl = {"actor_rollout_ref": {"model": {"path": str(tmp_path / "policy")}}}
    parts = build_parts(OmegaConf.create({**verl, "tracerl": {"preset": "trace", "overrides": overrides}}))
    assert torch.get_num_threads() == 1  # set explicitly (verl's TaskRunner starts with OMP_NUM_THREADS=1)
    assert (type(parts.scheme).__name__, parts.budget) == ("TraceScheme", 8)
    assert parts.reference is not None and parts.predictor is parts.scheme.predictor
    # trees are expanded on tree workers by default: the environment is theirs, none is built here
    assert parts.environment is None and parts.expansion == "tracerl.integrations.verl.workers:expansion_parts"
    from tracerl.integrations.verl.workers import expansion_parts

    config = OmegaConf.create({**verl, "tracerl": {"preset": "trace", "overrides": overrides}})
    built = expansion_parts(config)  # what each worker builds
    assert "search" in built.environment.tools.names and built.engine == parts.engine
    driver = build_parts(OmegaConf.merge(config, {"tracerl": {"expansion": "driver"}}))
    assert "search" in driver.environment.tools.names and driver.expansion is None
    with pytest.raises(UserError, match=r"tracerl.expansion = 'ray' is not valid; allowed values: workers, driver"):
        build_parts(OmegaConf.merge(config, {"tracerl": {"expansion": "ray"}}))
    with pytest.raises(UserError, match="predictor.features = 'hidden': verl's servers return no hidden states"):
        build_parts(OmegaConf.create({**verl, "tracerl": {"overrides": overrides + ["predictor.features=hidden"]}}))
    with pytest.raises(UserError, match="needs a `tracerl` section"):
        build_parts(OmegaConf.create({}))


def test_the_model_path_has_one_source(tmp_path) -> None:
    """tracerl's model.name_or_path follows verl's actor path; another checkpoint is refused naming both."""
    from tracerl.integrations.verl.manager import check_model_path

    verl = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(tmp_path / "a")}}})
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert check_model_path(verl, "testbed-default", "testbed-default") == str(tmp_path / "a")
    assert check_model_path(verl, str(tmp_path / "link"), "testbed-default") == str(tmp_path / "a")
    with pytest.raises(UserError, match=r"actor_rollout_ref.model.path = '.*a' but tracerl's model.name_or_path = "
                                        r"'Qwen/Qwen3-4B'"):
        check_model_path(verl, "Qwen/Qwen3-4B", "testbed-default")


@pytest.mark.parametrize("setting, message", [
    ({"temperature": 0.7}, r"actor_rollout_ref.rollout.temperature = 0.7 but tracerl's rollout.engine.temperature = 1"),
    ({"top_p": 0.9}, r"actor_rollout_ref.rollout.top_p = 0.9 but tracerl's rollout.engine.top_p = 1"),
    ({"top_k": 20}, r"actor_rollout_ref.rollout.top_k = 20: tracerl's rollout engine samples without top-k"),
    ({"val_kwargs": {"top_k": 5}}, r"actor_rollout_ref.rollout.val_kwargs.top_k = 5"),
    ({"name": "sglang"}, r"actor_rollout_ref.rollout.name = 'sglang': TraceAgentLoopManager sends vLLM's"),
])
def test_sampling_settings_that_differ_are_refused(servers, setting, message) -> None:
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    bad = OmegaConf.merge(CONFIG, {"actor_rollout_ref": {"rollout": setting}})
    with pytest.raises(UserError, match=message):
        TraceAgentLoopManager(bad, servers[0], parts=_parts())


def test_validation_samples_at_val_kwargs(servers) -> None:
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    config = OmegaConf.merge(CONFIG, {"actor_rollout_ref": {"rollout": {"val_kwargs": {"top_p": 0.5, "temperature": 0.6}}}})
    engine = TraceAgentLoopManager(config, servers[0], parts=_parts()).val_executor.engine.config
    assert (engine.temperature, engine.top_p) == (0.6, 0.5)
    greedy = OmegaConf.merge(config, {"actor_rollout_ref": {"rollout": {"val_kwargs": {"do_sample": False}}}})
    assert TraceAgentLoopManager(greedy, servers[0], parts=_parts()).val_executor.engine.config.temperature == 0.0


def test_validation_without_a_batch_size_is_refused(servers) -> None:
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    config = OmegaConf.merge(CONFIG, {"data": {"val_files": "v.parquet", "val_batch_size": None},
                                      "trainer": {"val_before_train": True}})
    with pytest.raises(UserError, match=r"data.val_batch_size = null: verl would send the whole validation set"):
        TraceAgentLoopManager(config, servers[0], parts=_parts())
    TraceAgentLoopManager(OmegaConf.merge(config, {"data": {"val_batch_size": 4}}), servers[0], parts=_parts())


def test_verls_padding_rows_weigh_nothing(step, cluster) -> None:
    """verl pads the batch with copies of the first leaf (``upsample_batch_to_divisible_size``): 24
    leaves to 32. The padding rows get advantage 0, the real rows exactly tracerl's trace_credit."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size


    manager, _, _, _, listing = step
    _, tq = cluster
    keys = sorted(k for k in listing if not listing[k].get("is_prompt", False))
    padded = upsample_batch_to_divisible_size(KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train"),
                                              16, manager.parts.tokenizer.eos_token_id)
    assert len(padded.keys) == 32
    trainer = _advantage_trainer()
    metrics: dict = {}
    trainer._compute_advantage(padded, metrics)
    assert metrics["tracerl/padding_rows"] == 8
    got = tq.kv_batch_get(keys=padded.keys, partition_id="train", select_fields=["advantages"])["advantages"]
    rows = [got[i] for i in range(len(padded.keys))]
    assert all(float(r.abs().sum()) == 0.0 for r in rows[24:])
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in manager.last_trees for t in tree.trajectories.values()}
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["tracerl_tree_id", "tracerl_node_path"])
    order = [leaves[(data["tracerl_tree_id"][i], list(data["tracerl_node_path"][i])[-1])] for i in range(len(keys))]
    want = get_estimator("trace_credit")(AdvantageBatch(order, {t.tree_id: t for t in manager.last_trees}),
                                         AdvantageOptions())
    for i, (traj, adv) in enumerate(zip(order, want, strict=True)):
        expected = adv[len(traj.prompt_ids):]
        assert torch.equal(rows[i][: expected.numel()], expected), i


def test_the_predictor_is_saved_before_verl_calls_the_checkpoint_latest(step, tmp_path, monkeypatch) -> None:
    """verl's _save_checkpoint writes latest_checkpointed_iteration.txt and calls on_save last; the
    predictor's file must already be in the step folder then, and be copied to default_hdfs_dir."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from tracerl.integrations.verl.manager import PREDICTOR_FILE
    from tracerl.integrations.verl.trainer import TraceSyncTrainer

    seen = []
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint",
                        lambda self: seen.append((tmp_path / "ckpt" / "global_step_3" / PREDICTOR_FILE).is_file()))
    trainer = object.__new__(TraceSyncTrainer)
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ckpt"),
                                                   "default_hdfs_dir": str(tmp_path / "remote")}})
    trainer.global_steps, trainer.agent_loop_manager = 3, step[0]
    trainer._save_checkpoint()
    assert seen == [True]
    assert (tmp_path / "remote" / "global_step_3" / PREDICTOR_FILE).is_file()


def test_task_ids_are_the_same_in_every_run() -> None:
    """verl's uids are fresh uuid4s; tracerl's sampling seeds derive from task ids, so ids come from the data."""
    from tracerl.integrations.verl.manager import stable_ids

    rows = [{"uid": "u1", "data_source": "nq", "extra_info": {"index": 7}},
            {"uid": "u2", "data_source": "nq", "extra_info": {"index": 7}},
            {"uid": "u3", "raw_prompt": [{"role": "user", "content": "Who?"}]}]
    ids = stable_ids(rows)
    assert ids[:2] == ["nq-7", "nq-7.1"] and len(ids[2]) == 16
    assert stable_ids([{**r, "uid": "other"} for r in rows]) == ids


def test_readiness_on_a_reference_worker_verl_does_not_build_is_refused(monkeypatch) -> None:
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from tracerl.integrations.verl.reference import VerlReference

    trainer = _advantage_trainer()
    trainer.use_reference_policy, trainer.ref_in_actor = False, False
    manager = type("M", (), {"verl_reference": VerlReference()})()
    with pytest.raises(UserError, match=r"reference_worker scores on verl's reference worker, which this run does "
                                        r"not build: set actor_rollout_ref.actor.use_kl_loss=True"):
        trainer.fit(manager)
    trainer.use_reference_policy = True
    monkeypatch.setattr(PPOTrainerSync, "fit", lambda self, m: "fitted")
    assert trainer.fit(manager) == "fitted" and manager.verl_reference.compute == trainer.reference_logprobs


def test_a_failed_request_fails_its_tree_only(step, servers, cluster, failing) -> None:
    """A server error on one tree's requests (verl's own agent loop fails only that prompt's group):
    the step goes on; that tree's leaves are in TransferQueue with an all-zero mask, reward 0 and
    advantage 0, outside every group statistic; the others get exactly tracerl's trace_credit;
    ``tracerl/failed_trees`` counts it."""
    from transfer_queue.metadata import KVBatchMeta

    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    _, tq = cluster
    w, _, _ = shared()
    first, tasks = step[0].last_trees[0].task_id, step[1]  # the same batch plans the same first trees
    victim = next(i for i, t in enumerate(tasks) if t.id == first)
    manager = TraceAgentLoopManager(CONFIG, servers[0], parts=_parts())
    failing(tasks[victim].question)
    batch, uids = _batch(w.train[:8], global_steps=1)
    tq.kv_batch_put(keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * 8)
    manager.generate_sequences(batch)
    listing = tq.kv_list(partition_id="train")["train"]
    bad, others = _only_tree_failed(manager, first, listing, uids)
    keys = sorted(k for k in listing if k.split("_")[0] in uids and k not in uids)
    assert len(keys) == BUDGET
    _advantage_trainer()._compute_advantage(KVBatchMeta(keys=keys, tags=[listing[k] for k in keys],
                                                        partition_id="train"), {})
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "response_mask", "rm_scores",
                                                                          "tracerl_tree_id", "tracerl_node_path"])
    dead = [i for i, k in enumerate(keys) if k.split("_")[0] == uids[victim]]
    assert len(dead) == len(bad.trajectories)
    for i in dead:
        assert str(data["tracerl_tree_id"][i]).startswith(f"failed:{bad.tree_id}:")
        assert float(data["response_mask"][i].abs().sum() + data["advantages"][i].abs().sum()
                     + data["rm_scores"][i].abs().sum()) == 0.0
    leaves = {(t.tree_id, t.node_path[-1]): t for tree in others for t in tree.trajectories.values()}
    real = [i for i in range(len(keys)) if i not in dead]
    order = [leaves[(data["tracerl_tree_id"][i], list(data["tracerl_node_path"][i])[-1])] for i in real]
    want = get_estimator("trace_credit")(AdvantageBatch(order, {t.tree_id: t for t in others}), AdvantageOptions())
    for i, traj, adv in zip(real, order, want, strict=True):
        expected = adv[len(traj.prompt_ids):]
        assert torch.equal(data["advantages"][i][: expected.numel()], expected), i
    assert any(bool((a != 0).any()) for a in want)


def test_steps_with_most_trees_failed_stop_the_run_in_one_line(servers, cluster, failing) -> None:
    """Every request fails: the first such step trains nothing and goes on; the second in a row
    (``+tracerl.max_failed_steps=2``) stops with one line, its prompts marked failed."""
    from tracerl.integrations.verl.manager import TraceAgentLoopManager

    _, tq = cluster
    w, _, _ = shared()
    config = OmegaConf.merge(CONFIG, {"tracerl": {"max_failed_steps": 2}})
    manager = TraceAgentLoopManager(config, servers[0], parts=_parts())
    failing("")
    batch, uids = _batch(w.train[24:28], global_steps=1)
    manager.generate_sequences(batch)
    trees = len(manager.last_trees)
    assert manager.last_metrics["failed_trees"] == trees > 0 and manager.failed_steps == 1
    assert all(t.infra_failed for tree in manager.last_trees for t in tree.trajectories.values())
    batch, uids = _batch(w.train[28:32], global_steps=2)
    with pytest.raises(UserError, match=r"^step 2: (\d+) of \1 trees failed \(tree '.+': RuntimeError: server-\d: "
                                        r"injected engine failure\); 2 steps in a row with at least half failed "
                                        r"\(tracerl.max_failed_steps = 2\): check verl's rollout servers$"):
        manager.generate_sequences(batch)
    listing = tq.kv_list(partition_id="train")["train"]
    assert all(listing[u]["status"] == "failure" for u in uids)


class _Silent:
    """A server client that never answers (a hung engine), counting the requests it got."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        import asyncio

        self.calls += 1
        await asyncio.Event().wait()


def test_a_request_past_its_timeout_fails_its_tree_and_sends_no_more() -> None:
    from tracerl.integrations.verl.server_policy import VerlServerPolicy
    from tracerl.models.backend import SamplingParams

    _, _, policy = shared()
    client = _Silent()
    backend = VerlServerPolicy(client, policy.tokenizer, timeout_s=0.05)
    params = SamplingParams(max_new_tokens=4)
    gens = backend.generate([[1, 2], [1, 3]], params, routing_keys=["tree-a", "tree-a"])
    eos = policy.tokenizer.eos_token_id
    assert [(g.token_ids, g.logprobs, g.finish_reason) for g in gens] == [([eos], [0.0], "eos")] * 2
    assert backend.generate([[1, 2, 5]], params, routing_keys=["tree-a"])[0].token_ids == [eos]
    assert client.calls == 2  # the failed tree's later row is not sent
    assert backend.stats["failed_requests"] == 2 and backend.stats["generated_tokens"] == 0
    assert backend.take_failed() == {"tree-a": "no answer within request_timeout_s = 0.05"}
    assert backend.failed == {}


def test_a_kl_that_weighs_nothing_runs_no_reference_forward(step, cluster) -> None:
    """use_kl_loss with kl_loss_coef=0 (what readiness on verl's reference worker sets): the
    trainer's reference step copies old_log_probs (the trainer here has no worker to call)."""
    from transfer_queue.metadata import KVBatchMeta

    from tracerl.integrations.verl.trainer import TraceSyncTrainer

    _, tq = cluster
    listing = step[4]
    keys = sorted(k for k in listing if not listing[k].get("is_prompt", False))
    old = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rollout_log_probs"])
    old["old_log_probs"] = old.pop("rollout_log_probs")
    tq.kv_batch_put(keys=keys, partition_id="train", fields=old)
    trainer = object.__new__(TraceSyncTrainer)
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.0}},
                                       "algorithm": {"use_kl_in_reward": False}})
    trainer._compute_ref_log_prob(KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train"), {})
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["ref_log_prob", "old_log_probs"])
    assert all(torch.equal(got["ref_log_prob"][i], got["old_log_probs"][i]) for i in range(len(keys)))


class _Cached:
    """A server client answering one token and vLLM's ``num_cached_tokens`` (prompt length - 1)."""

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=[7], log_probs=[-0.5], stop_reason="completed",
                           extra_fields={"global_steps": 0, "num_cached_tokens": len(prompt_ids) - 1})


def test_vllms_prefix_cache_hits_are_counted() -> None:
    from tracerl.integrations.verl.server_policy import VerlServerPolicy
    from tracerl.models.backend import SamplingParams

    _, _, policy = shared()
    backend = VerlServerPolicy(_Cached(), policy.tokenizer)
    backend.generate([[1, 2, 3], [1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=1), routing_keys=["t", "t"])
    assert (backend.stats["cached_prompt_tokens"], backend.stats["reported_prompt_tokens"]) == (2 + 4, 3 + 5)
    assert backend.stats["generated_tokens"] == 2 and backend.failed == {}


def _only_tree_failed(manager, first, listing, uids):
    """The step failed exactly the tree of task ``first`` (its leaves zero, the others untouched)
    and marked every prompt of the batch finished in TransferQueue (``listing``); that tree and
    the others."""
    (bad,) = [t for t in manager.last_trees if t.task_id == first]
    others = [t for t in manager.last_trees if t is not bad]
    assert manager.last_metrics["failed_trees"] == 1.0 and list(manager.last_failed) == [bad.tree_id]
    assert manager.last_failed[bad.tree_id] in {f"RuntimeError: server-{i}: injected engine failure" for i in (0, 1)}
    assert all(t.infra_failed and t.reward == 0.0 for t in bad.trajectories.values())
    assert others and not any(t.infra_failed for tree in others for t in tree.trajectories.values())
    assert all(listing[u]["status"] == "finished" for u in uids)
    return bad, others
