"""The predictor's ``hidden`` input: states recorded by the generation forward, carried on tree
nodes through the executor, and fed to the predictor beside (or instead of) the 13 features."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import random

import pytest
import torch
from alloc_trees import add_chain, answer_turn, tool_turn
from alloc_world import make_engine, shared

from tracerl.allocation.features import NUM_FEATURES, node_state
from tracerl.allocation.predictor import PredictorConfig, SuccessPredictor, weighted_auc
from tracerl.core.types import RolloutTree
from tracerl.models.backend import HFPolicy, SamplingParams
from tracerl.rollout.executor import LocalExecutor
from tracerl.allocation.session import as_session
from tracerl.config.schema import resolve_config
from tracerl.config.loading import ConfigError


def _full_forward_state(policy: HFPolicy, ids: list[int]) -> torch.Tensor:
    """The oracle: one plain forward of the whole prefix, last layer (post-norm) at its last token."""
    with torch.no_grad():
        out = policy.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1]


@pytest.fixture()
def recording():
    w, env, policy = shared()
    fresh = HFPolicy(policy.model, policy.tokenizer)  # own prefix store and flag: the shared one stays as is
    fresh.record_states = True
    return w, env, fresh


def test_generate_records_the_last_token_state_with_or_without_cached_prefixes(recording) -> None:
    w, env, policy = recording
    engine = make_engine(policy, env)
    prompt = engine.prompt_ids(w.train[0])
    other = engine.prompt_ids(w.train[1])[:-3]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    first = policy.generate([prompt, other], params, seeds=[1, 2])
    for prefix, gen in zip([prompt, other], first, strict=True):  # batched, left-padded rows of different lengths
        assert gen.state is not None and len(gen.state) == policy.model.config.hidden_size
        assert torch.allclose(torch.tensor(gen.state), _full_forward_state(policy, prefix), atol=1e-4)
    longer = prompt + first[0].token_ids + prompt[:5]  # extends a stored row: most of it is reused
    reused = policy.stats["reused_prefix_tokens"]
    again = policy.generate([longer], params, seeds=[3])[0]
    assert policy.stats["reused_prefix_tokens"] > reused
    assert torch.allclose(torch.tensor(again.state), _full_forward_state(policy, longer), atol=1e-4)
    policy.record_states = False
    assert policy.generate([prompt], params, seeds=[1])[0].state is None  # off by default: nothing recorded


def test_prefix_states_match_generate_and_keep_their_kv(recording) -> None:
    w, env, policy = recording
    engine = make_engine(policy, env)
    prompts = [engine.prompt_ids(t) for t in w.train[:3]]
    states = policy.prefix_states(prompts + prompts[:1])  # a repeated prompt is computed once
    assert states is not None and states[3] == states[0]
    for ids, state in zip(prompts, states[:3], strict=True):  # the repeat is checked above
        assert torch.allclose(torch.tensor(state), _full_forward_state(policy, ids), atol=1e-4)
    prefill = policy.stats["prefill_tokens"]
    gens = policy.generate(prompts, SamplingParams(max_new_tokens=2), seeds=[0, 1, 2])
    assert policy.stats["prefill_tokens"] - prefill == 3  # only each prompt's last token: the KV was kept
    for gen, state in zip(gens, states[:3], strict=True):
        assert torch.allclose(torch.tensor(gen.state), torch.tensor(state), atol=1e-5)


def test_tree_nodes_carry_the_state_of_their_prefix_through_the_executor(recording) -> None:
    w, env, policy = recording
    engine = make_engine(policy, env)
    session = as_session(LocalExecutor(engine), seed=5)
    trees, _ = session.start(w.train[:2], [3, 3], ["a", "b"])
    copies = {t.tree_id: t for t in trees}  # the driver's copies, rebuilt from deltas
    recorded = 0
    for tree_id, mirror in copies.items():
        held = engine.tree(tree_id)
        for node, mine in zip(held.nodes, mirror.nodes, strict=True):
            assert mine.hidden == node.hidden
            if node.is_leaf:
                assert node.hidden is None  # no turn starts at a leaf
                assert node_state(held, node.id) == held.nodes[node.parent].hidden  # type: ignore[index]
                continue
            assert node.hidden is not None  # every node a turn started from
            expected = _full_forward_state(policy, held.prefix_ids(node.id))
            assert torch.allclose(torch.tensor(node.hidden), expected, atol=1e-4)
            recorded += 1
    assert recorded > 2  # roots and at least one boundary after an observation


def _state_tree(rng: random.Random, step: int, i: int, dim: int = 4) -> RolloutTree:
    """Chains that succeed exactly when their boundary state's first coordinate is positive.

    The handcrafted features are identical across chains (same turns), so only the state tells.
    """
    tree = RolloutTree(f"s{step}-{i}", f"task-{step}-{i}", prompt_ids=[1, 2, 3])
    tree.root.hidden = [0.0] * dim
    for _ in range(4):
        sign = rng.choice([-1.0, 1.0])
        leaf = add_chain(tree, 0, [tool_turn(), answer_turn()], 1.0 if sign > 0 else 0.0)
        tree.nodes[tree.nodes[leaf].parent].hidden = [sign * rng.uniform(0.5, 1.5)] + [rng.gauss(0, 1) for _ in range(dim - 1)]  # type: ignore[index]
    return tree


@pytest.mark.parametrize("features,width", [("hidden", 1 + 4), ("both", NUM_FEATURES + 1 + 4)])
def test_predictor_reads_the_state_and_learns_what_features_cannot_see(features: str, width: int) -> None:
    rng = random.Random(0)
    steps = [[_state_tree(rng, s, i) for i in range(6)] for s in range(8)]
    pred = SuccessPredictor(PredictorConfig(features=features, seed=1))
    assert pred.model is None and pred.predict_nodes([steps[0][0]], [0]) == [0.5]  # cold: prior, width unknown
    assert pred.features([steps[0][0]], [1]).shape == (1, width)
    aucs = [pred.update(trees)["auc"] for trees in steps]
    assert min(aucs[-3:]) > 0.9, aucs  # fresh (unseen) prompts, scored before training on them
    plain = SuccessPredictor(PredictorConfig(seed=1))
    plain_aucs = [plain.update(trees)["auc"] for trees in steps]
    assert max(plain_aucs[-3:]) < 0.7, plain_aucs  # identical histories: the 13 features cannot tell


def test_a_hidden_predictor_without_states_fails_naming_the_option() -> None:
    tree = RolloutTree("t", "q", prompt_ids=[1, 2])
    add_chain(tree, 0, [tool_turn(), answer_turn()], 1.0)
    with pytest.raises(ValueError, match="predictor.features = 'hidden'.*HF backend"):
        SuccessPredictor(PredictorConfig(features="hidden")).update([tree])


def test_hidden_predictor_state_dict_round_trip() -> None:
    rng = random.Random(3)
    steps = [[_state_tree(rng, s, i) for i in range(4)] for s in range(4)]
    cfg = PredictorConfig(features="both", seed=2, batch_size=8)
    a = SuccessPredictor(cfg)
    for trees in steps[:2]:
        a.update(trees)
    b = SuccessPredictor(cfg)
    b.load_state_dict(a.state_dict())
    for trees in steps[2:]:
        assert a.update(trees) == b.update(trees)
    with pytest.raises(ValueError, match="features"):
        SuccessPredictor(PredictorConfig(features="hidden")).load_state_dict(a.state_dict())


def test_root_predictions_use_the_prompt_states() -> None:
    rng = random.Random(4)
    pred = SuccessPredictor(PredictorConfig(features="hidden", seed=1))
    for s in range(6):
        pred.update([_state_tree(rng, s, i) for i in range(6)])
    good, bad = [1.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]
    values = pred.predict_roots(["x", "y"], [[1, 2, 3], [1, 2, 3]], [good, bad])
    assert values[0] > values[1]
    ranked = weighted_auc(values, [1, 0], [0, 1])
    assert ranked == 1.0


def test_config_validates_the_option_and_rejects_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_config("trace_alloc").predictor.features == "handcrafted"
    assert resolve_config("trace_alloc", overrides=["predictor.features=both"]).predictor.features == "both"
    with pytest.raises(ConfigError, match="predictor.features must be one of handcrafted, hidden, both"):
        resolve_config("trace_alloc", overrides=["predictor.features=states"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert resolve_config("trace_alloc", overrides=["model.backend=vllm"]).model.backend == "vllm"
    with pytest.raises(ConfigError, match="predictor.features = 'hidden' needs model.backend = 'hf'"):
        resolve_config("trace_alloc", overrides=["model.backend=vllm", "predictor.features=hidden"])


def test_deltas_serialise_states() -> None:
    from tracerl.core.protocol import NodeRecord, TreeDelta, apply_delta, from_json, pack_floats, to_json

    delta = TreeDelta("t", "q", 1, [NodeRecord(0, dataclasses.asdict(tool_turn()), pack_floats([0.5, -1.0]))], [],
                      [1, 2], root_hidden=pack_floats([0.25, 2.0]))
    text = to_json(delta)
    assert "0.25" not in text  # float32 bytes (base64), not a JSON float list
    back = from_json(TreeDelta, text)
    assert back == delta and len(back.nodes[0].hidden) == 2 * 4
    trees: dict[str, RolloutTree] = {}
    tree = apply_delta(trees, back)
    assert tree.nodes[1].hidden == [0.5, -1.0] and tree.root.hidden == [0.25, 2.0]


def test_a_training_run_records_states_and_trains_the_hidden_predictor(tmp_path) -> None:
    from tracerl.train.loop import Trainer

    overrides = ["data.verifier=answered", "eval.every=0", "eval.size=2", "rollout.budget=8", "rollout.pool_size=2",
                 "rollout.engine.max_turns=3", "steps=2", "predictor.features=both", "log.rollouts=false"]
    trainer = Trainer(resolve_config("trace_alloc_lu", smoke="random", overrides=overrides), tmp_path)
    try:
        records = [trainer.step() for _ in range(2)]
        assert trainer.executor.backend.record_states  # type: ignore[attr-defined]
        pred = trainer.predictor
        assert pred is not None and pred.updates == 2
        assert pred.state_dim == trainer.model.config.hidden_size
        assert pred.in_dim == NUM_FEATURES + 1 + pred.state_dim
        assert all(r["predictor_n_nodes"] > 0 for r in records)
        assert records[1]["scheme_prompt_state_seconds"] >= 0  # stage 1 read the candidates' states
    finally:
        trainer.close()


def test_both_starts_exactly_where_handcrafted_starts() -> None:
    """The state head is zero-initialised and added to the same seeded feature MLP."""
    trees = [_state_tree(random.Random(5), 0, i) for i in range(3)]
    ids = [(t, n.id) for t in trees for n in t.nodes]
    hand, both = SuccessPredictor(PredictorConfig(seed=7)), SuccessPredictor(PredictorConfig(seed=7, features="both"))
    x_hand = hand.features([t for t, _ in ids], [i for _, i in ids])
    x_both = both.features([t for t, _ in ids], [i for _, i in ids])
    assert torch.equal(x_both[:, :NUM_FEATURES], x_hand) and x_both[:, NUM_FEATURES].sum() > 0
    both._build()
    assert hand.model is not None and both.model is not None
    with torch.no_grad():
        assert torch.equal(both.model(x_both), hand.model(x_hand))


def test_the_state_head_is_centred_so_a_common_offset_changes_nothing() -> None:
    """Centred on the replay buffer's mean, the head cannot fit the base rate through the mean
    state: shifting every state by the same vector leaves training and predictions unchanged."""
    def shifted(trees: list[RolloutTree], offset: float) -> list[RolloutTree]:
        out = copy.deepcopy(trees)
        for tree in out:
            for node in tree.nodes:
                if node.hidden is not None:
                    node.hidden = [x + offset for x in node.hidden]
        return out

    rng = random.Random(6)
    steps = [[_state_tree(rng, s, i) for i in range(4)] for s in range(3)]
    probe = [_state_tree(rng, 9, i) for i in range(3)]
    ids = [(t, n.id) for t in probe for n in t.nodes]
    preds = []
    for offset in (0.0, 5.0):
        pred = SuccessPredictor(PredictorConfig(features="hidden", seed=3))
        for trees in steps:
            pred.update(shifted(trees, offset))
        moved = shifted(probe, offset)
        by_id = {t.tree_id: t for t in moved}
        preds.append(pred.predict_nodes([by_id[t.tree_id] for t, _ in ids], [i for _, i in ids]))
        assert pred.model is not None
        assert torch.allclose(pred.model.center, pred._buf_x.mean(0))  # type: ignore[union-attr]  # all state
    assert preds[0] == pytest.approx(preds[1], abs=1e-4)
