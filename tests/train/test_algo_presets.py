"""Issue 13's baselines and options end to end: the ``gspo`` and ``tree_grpo`` presets, the
GSPO update on a tiny model, the config fields and their errors."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from statistics import fmean, pstdev

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.config.schema import ConfigError, config_from_yaml, config_to_yaml, resolve_config
from tracerl.train.loop import Trainer
from tracerl.runs.metrics import read_metrics
from tracerl.runs.rollout_log import read_step
from tracerl.train.update import UpdateSettings, policy_update, token_logprobs, update_settings

TINY = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0", "eval.size=4"]


# ----------------------------------------------------------------------------- config


def test_presets_and_their_estimators_and_losses() -> None:
    gspo = resolve_config("gspo")
    assert (gspo.rollout.scheme, gspo.algo.estimator, gspo.algo.policy_loss) == ("chain", "grpo", "gspo")
    assert gspo.optim.loss_agg == "seq-mean-token-mean"
    settings = update_settings(gspo)
    assert (settings.policy_loss, settings.clip_low, settings.clip_high) == ("gspo", 3e-4, 4e-4)
    grpo = update_settings(resolve_config("grpo"))
    assert (grpo.policy_loss, grpo.clip_low, grpo.clip_high) == ("ppo", 0.2, 0.28)
    assert resolve_config("tree_grpo").algo.estimator == "tree_grpo"
    assert resolve_config("trace_alloc").algo.estimator == "tree_anchor"  # the spec's tree-aware advantage
    assert resolve_config("trace").algo.estimator == "trace_credit"
    assert resolve_config("trace_credit").algo.advantage.credit_value == "log_ratio"


@pytest.mark.parametrize(
    ("preset", "override", "match"),
    [
        ("gspo", "optim.loss_agg=token-mean", "optim.loss_agg = 'seq-mean-token-mean'"),
        ("grpo", "algo.policy_loss=gspo", "optim.loss_agg"),
        ("grpo", "algo.policy_loss=cispo", "algo.policy_loss.*gspo, ppo"),
        ("gspo", "algo.gspo_clip_low=1.0", "algo.gspo_clip_low"),
        ("gspo", "algo.gspo_clip_high=-1e-4", "algo.gspo_clip_high"),
        ("trace_credit", "algo.advantage.credit_value=ratio", "credit_value.*log_ratio, raw_diff, remaining_gap"),
    ],
)
def test_config_errors_name_the_field(preset: str, override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_config(preset, overrides=[override])


def test_value_forms_and_gspo_clips_are_config_fields() -> None:
    config = resolve_config("gspo", overrides=["algo.gspo_clip_low=1e-3", "algo.gspo_clip_high=2e-3"])
    assert (update_settings(config).clip_low, update_settings(config).clip_high) == (1e-3, 2e-3)
    config = resolve_config("trace_credit", overrides=["algo.advantage.credit_value=remaining_gap"])
    assert config_from_yaml(config_to_yaml(config)).algo.advantage.credit_value == "remaining_gap"


def test_an_old_run_config_naming_tree_grpo_still_loads() -> None:
    # Before issue 13 trace_alloc's config.yaml said `estimator: tree_grpo` (then the nearest-anchor
    # advantage). It loads, and the name now means Tree-GRPO's estimator.
    text = config_to_yaml(resolve_config("trace_alloc")).replace("estimator: tree_anchor", "estimator: tree_grpo")
    assert config_from_yaml(text).algo.estimator == "tree_grpo"


# ----------------------------------------------------------------------------- the GSPO update


def _model() -> torch.nn.Module:
    config = Qwen3Config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _trajectory(model: torch.nn.Module, seed: int, turns: int) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, 40, (n,), generator=g).tolist()  # noqa: E731
    made = [Turn(ids(3 + i), ids(4), "x", Action(kind="tool", name="search")) for i in range(turns)]
    traj = Trajectory(task_id=str(seed), group_id="g", prompt_ids=ids(5), turns=made)
    tokens = torch.tensor([traj.token_ids])
    logprobs = token_logprobs(model, tokens, torch.ones_like(tokens), 1.0)[0].tolist()
    for turn, (start, end) in zip(traj.turns, traj.turn_spans, strict=True):
        turn.logprobs = logprobs[start:end]  # on-policy: the sampler's log-probs are the model's
    return traj


def _gspo(micro: int) -> UpdateSettings:
    return UpdateSettings(micro_batch_size=micro, temperature=1.0, clip_low=3e-4, clip_high=4e-4, kl_coef=0.0,
                          loss_agg="seq-mean-token-mean", grad_clip=1e9, policy_loss="gspo")


def test_gspo_update_on_policy_loss_is_minus_the_mean_sequence_advantage() -> None:
    model = _model()
    trajs = [_trajectory(model, seed, turns=1 + seed % 3) for seed in range(5)]
    seq_adv = [1.5, -0.5, 0.0, 2.0, -1.0]  # row 2 carries no signal (not run, still a sequence)
    advs = [torch.tensor(t.sampled, dtype=torch.float32) * a for t, a in zip(trajs, seq_adv, strict=True)]
    results = []
    for micro in (5, 1):
        stepped = copy.deepcopy(model)
        optimizer = torch.optim.SGD(stepped.parameters(), lr=0.1)
        metrics = policy_update(stepped, optimizer, trajs, advs, _gspo(micro), pad_id=0)
        # s_i = 1 at the first update: each sequence's loss is -A_i, averaged over all 5 sequences.
        assert metrics["loss"] == pytest.approx(-sum(seq_adv) / 5, abs=1e-6)
        assert metrics["clip_fraction"] == 0.0
        results.append(stepped)
    for a, b in zip(results[0].parameters(), results[1].parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # micro-batching leaves the step unchanged
    # A second update on the same (now stale) rollouts: the sequence ratios left GSPO's tiny clip
    # range, and each clipped sequence counts all its tokens.
    optimizer = torch.optim.SGD(results[0].parameters(), lr=0.1)
    again = policy_update(results[0], optimizer, trajs, advs, _gspo(5), pad_id=0)
    active = [i for i, a in enumerate(seq_adv) if a != 0]
    lengths = [sum(trajs[i].sampled) for i in active]
    shares = {sum(lengths[j] for j in range(len(active)) if (mask >> j) & 1) / sum(lengths)
              for mask in range(1, 2 ** len(active))}
    assert any(again["clip_fraction"] == pytest.approx(s) for s in shares)


# ----------------------------------------------------------------------------- 2-step runs


def test_gspo_preset_trains_two_steps(tmp_path: Path) -> None:
    trainer = Trainer(resolve_config("gspo", smoke="random", overrides=[*TINY, "steps=2"]), tmp_path)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.run()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2] and all(math.isfinite(r["loss"]) for r in records)
    assert trainer.update_settings.policy_loss == "gspo"
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def _grpo(rewards: list[float]) -> list[float]:
    sd = pstdev(rewards)
    return [0.0 if sd < 1e-6 else (r - fmean(rewards)) / sd for r in rewards]


def test_tree_grpo_preset_logs_inter_plus_intra_tree_advantages(tmp_path: Path) -> None:
    trainer = Trainer(resolve_config("tree_grpo", smoke="random", overrides=[*TINY, "steps=2"]), tmp_path)
    trainer.run()
    shared_trees = 0
    for step in (1, 2):
        for tree in read_step(tmp_path, step):  # one RolloutTree per prompt: the prompt's group
            leaves = [t for t in tree["trajectories"] if not t["infra_failed"]]
            inter = _grpo([t["reward"] for t in leaves])
            search_tree = [t["node_path"][1] for t in leaves]  # the root child = Tree-GRPO's tree
            for i, leaf in enumerate(leaves):
                mates = [j for j in range(len(leaves)) if search_tree[j] == search_tree[i]]
                shared_trees += len(mates) > 1
                intra = _grpo([leaves[j]["reward"] for j in mates])[mates.index(i)]
                for value in leaf["turn_advantage"]:
                    assert value == pytest.approx(inter[i] + intra, abs=1e-4)
    assert shared_trees > 0  # some search trees were expanded: the intra-tree term was exercised
