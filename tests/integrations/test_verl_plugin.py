"""TRACE inside verl 0.9.1 (run with `make test-verl`; skipped where verl is missing): the plug-in
loads on `import verl`, a broken one fails the start-up check loudly, and verl's own
`compute_advantage` gives exactly tracerl's advantages on trees from a real tiny-model run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_world import make_engine, shared  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from tracerl.allocation.predictor import SuccessPredictor  # noqa: E402
from tracerl.allocation.schemes import SchemeConfig, get_scheme  # noqa: E402
from tracerl.allocation.session import RolloutSession  # noqa: E402
from tracerl.core.advantages import AdvantageBatch, AdvantageOptions, get_estimator  # noqa: E402
from tracerl.errors import UserError  # noqa: E402
from tracerl.integrations.verl.estimators import tree_fields  # noqa: E402
from tracerl.integrations.verl.rows import pad_rows, rows_from_trees  # noqa: E402
from tracerl.models.scoring import ReferenceScorer  # noqa: E402
from tracerl.rollout.executor import LocalExecutor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_import_verl_loads_the_plugin() -> None:
    out = _python(
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from tracerl.integrations.verl.check import check_registrations\n"
        "check_registrations()\n"
        "print(get_adv_estimator_fn('tracerl_trace_credit').__name__, get_adv_estimator_fn('tracerl_tree_anchor').__name__,"
        " get_trainer_cls('tracerl_sync').__name__)"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["tracerl_trace_credit", "tracerl_tree_anchor", "TraceSyncTrainer"]


HEAVY = ("verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.core_algos", "verl.workers.rollout.replica",
         "transfer_queue", "vllm", "tracerl.integrations.verl.hf_rollout", "tracerl.integrations.verl.trainer",
         "tracerl.integrations.verl.estimators", "tracerl.models", "torch", "ray")
"""What verl's plug-in entry point must not import: it loads in every verl process, vLLM's included."""


def test_the_entry_point_imports_nothing_heavy_until_used() -> None:
    """verl (plug-ins off) loaded first, then tracerl's entry point as verl loads it: it adds tracerl's
    names and wrapt's import hooks, nothing of the list above; the names resolve once verl imports
    its registries."""
    out = _python(
        "import os, sys\n"
        "os.environ['VERL_USE_EXTERNAL_PLUGINS'] = 'none'\n"
        "import verl\n"
        "before = set(sys.modules)\n"
        "from importlib.metadata import entry_points\n"
        "[ep] = [e for e in entry_points(group='verl.plugins') if e.name == 'tracerl']\n"
        "ep.load()\n"
        "added = sorted(set(sys.modules) - before)\n"
        f"print([m for m in added if m.startswith({HEAVY!r})])\n"
        "print([m for m in added if not m.startswith(('wrapt', 'tracerl'))])\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "print(RolloutReplicaRegistry.get('tracerl_hf').__name__, get_trainer_cls('tracerl_sync').__name__)\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "[]", "HFReplica TraceSyncTrainer"]


def test_a_broken_plugin_fails_the_check_in_one_line() -> None:
    """verl swallows the plug-in's import error; the check names what is missing, why and how to install."""
    out = _python(
        "import sys\n"
        "sys.modules['tracerl.integrations.verl.estimators'] = None  # its import now fails\n"
        "import verl  # silent: verl logs plug-in errors at DEBUG\n"
        "from tracerl.errors import UserError\n"
        "from tracerl.integrations.verl.check import check_registrations\n"
        "try:\n    check_registrations()\nexcept UserError as err:\n    print(err)\n    sys.exit(1)\n"
    )
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("verl has not registered tracerl's tracerl_trace_credit, tracerl_tree_anchor, tracerl_sync")
    assert "its import fails: ModuleNotFoundError" in lines[0] and "pip install -e '.[verl]'" in lines[0]


@pytest.fixture(scope="module")
def trees():
    """TRACE trees of a real tiny-model run, every valid leaf scored by the real reference."""
    w, env, policy = shared()
    engine = make_engine(policy, env)
    scorer = ReferenceScorer(engine.backend.model, engine.tokenizer, engine.fmt)
    session = RolloutSession(LocalExecutor(engine, scorer.score_nodes), seed=5)
    scheme = get_scheme("trace", SchemeConfig(group_size=4), predictor=SuccessPredictor(), score=True)
    result = scheme.collect(session, w.train, 24)
    session.score(result.trees)
    leaves = [t for tree in result.trees for t in tree.trajectories.values()]
    assert any(tree.branch_anchors() for tree in result.trees)  # real branching below the root
    assert all(t.readiness is not None for t in leaves if not t.infra_failed)
    assert len({t.reward for t in leaves}) == 2  # mixed outcomes
    return result.trees


def _expected(trees, name: str, options: AdvantageOptions, width: int) -> torch.Tensor:
    rows = rows_from_trees(trees)
    batch = AdvantageBatch(rows.trajectories, {tree.tree_id: tree for tree in trees})
    advantages = get_estimator(name)(batch, options)
    return pad_rows([a[len(t.prompt_ids):] for t, a in zip(rows.trajectories, advantages, strict=True)], width)


def _data(trees) -> DataProto:
    rows = rows_from_trees(trees)
    tensors = {"prompts": rows.prompts, "responses": rows.responses, "response_mask": rows.response_mask,
               "token_level_rewards": rows.token_level_rewards}
    return DataProto.from_dict(tensors=tensors, non_tensors=dict(rows.non_tensor))


CONFIG = OmegaConf.create({"adv_estimator": "x", "tracerl": {"w_turn": 0.5, "horizon": 2}})
OPTIONS = AdvantageOptions(w_turn=0.5, horizon=2)


@pytest.mark.parametrize("name", ["trace_credit", "tree_anchor"])
def test_verl_compute_advantage_equals_tracerl(trees, name: str) -> None:
    """verl's own compute_advantage, the tree fields handed over as the trainer does."""
    data = _data(trees)
    with tree_fields(data.non_tensor_batch):
        out = compute_advantage(data, adv_estimator=f"tracerl_{name}", config=CONFIG)
    want = _expected(trees, name, OPTIONS, data.batch["responses"].shape[1])
    assert torch.equal(out.batch["advantages"], want)
    assert torch.equal(out.batch["returns"], want)
    assert bool((want != 0).any())


def test_trace_credit_differs_from_tree_anchor(trees) -> None:
    """The turn credit is really in: readiness moves the advantages off the outcome part."""
    width = _data(trees).batch["responses"].shape[1]
    assert not torch.equal(_expected(trees, "trace_credit", OPTIONS, width), _expected(trees, "tree_anchor", OPTIONS, width))


@pytest.mark.parametrize("name", ["trace_credit", "tree_anchor"])
def test_estimator_given_non_tensor_batch_alone(trees, name: str) -> None:
    """Where verl passes non_tensor_batch to every estimator (verl PR #7473), no context is needed."""
    data = _data(trees)
    fn = get_adv_estimator_fn(f"tracerl_{name}")
    adv, _ = fn(token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
                config=CONFIG, index=data.non_tensor_batch["uid"], non_tensor_batch=data.non_tensor_batch)
    assert torch.equal(adv, _expected(trees, name, OPTIONS, data.batch["responses"].shape[1]))


def test_without_tree_fields_the_estimator_says_how_to_run(trees) -> None:
    with pytest.raises(UserError, match="needs tracerl's tree fields: run verl with trainer.v1.trainer_mode=tracerl_sync"):
        compute_advantage(_data(trees), adv_estimator="tracerl_trace_credit", config=CONFIG)


def test_unknown_option_names_its_field(trees) -> None:
    data = _data(trees)
    bad = OmegaConf.create({"tracerl": {"w_trun": 0.5}})
    with tree_fields(data.non_tensor_batch), pytest.raises(UserError, match=r"algorithm\.tracerl\.w_trun: unknown option"):
        compute_advantage(data, adv_estimator="tracerl_tree_anchor", config=bad)


@pytest.fixture(scope="module")
def transfer_queue():
    """A local Ray cluster and TransferQueue (TQ hangs with 2 logical CPUs, works with 8)."""
    import os

    import ray
    import transfer_queue as tq

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=8, include_dashboard=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def test_trainer_advantage_step_on_a_transfer_queue_batch(trees, transfer_queue) -> None:
    """tracerl_sync's own _compute_advantage: leaves in TransferQueue as verl's agent loop stores
    them (unpadded per-row tensors, the tree fields beside), advantages written back to it."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from tracerl.integrations.verl.rows import TREE_FIELDS
    from tracerl.integrations.verl.trainer import TraceSyncTrainer

    tq = transfer_queue
    rows = rows_from_trees(trees)
    keys, leaves = [], []
    for i, t in enumerate(rows.trajectories):
        n = len(t.token_ids) - len(t.prompt_ids)
        leaf = {"uid": rows.non_tensor["uid"][i], "response_mask": rows.response_mask[i, :n],
                "rm_scores": rows.token_level_rewards[i, :n]}
        leaf.update({name: rows.non_tensor[name][i] for name in TREE_FIELDS})
        leaves.append(leaf)
        keys.append(f"{rows.non_tensor['uid'][i]}_0_{i}")
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(leaves), tags=[{}] * len(keys))
    trainer = object.__new__(TraceSyncTrainer)  # the advantage step reads only the config and TQ
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": "tracerl_trace_credit", "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0,
                      "tracerl": {"w_turn": 0.5, "horizon": 2}},
        "actor_rollout_ref": {"rollout": {"n": 1}},
    })
    trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), {})
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
    got = got.to_padded_tensor(0.0) if got.is_nested else got  # equal-length rows are stored stacked
    assert torch.equal(got, _expected(trees, "trace_credit", OPTIONS, got.shape[1]))
