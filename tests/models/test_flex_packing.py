"""``optim.packed_attention = 'flex'``: the tree-packed forward through flex_attention and a BlockMask.

On CPU torch runs FlexAttention forward-only (eager), so these tests compare the flex forward's
log-probs, the IS guard's mismatch and a PPO loss built on them with the dense-mask path; the
gradients need CUDA (benchmarks/gpu/gpu_check_shapes.py compares them there)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.config.schema import ConfigError, resolve_config
from tracerl.core.losses import POLICY_LOSSES
from tracerl.core.types import Action, Trajectory, Turn
from tracerl.train.flex_packing import tree_block_mask
from tracerl.train.packing import pack_trees, packed_token_logprobs
from tracerl.train.update import UpdateSettings, pad_trajectories, token_logprobs, with_trainer_logprobs


def _model() -> torch.nn.Module:
    config = Qwen3Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64)  # grouped heads
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _leaves(seed: int) -> list[Trajectory]:
    """Four leaves: one shared first turn, two second turns, two third turns under each."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, 40, (n,), generator=g).tolist()  # noqa: E731
    turn = lambda: Turn(ids(3), ids(4), "x", Action(kind="tool", name="s"), logprobs=[-3.0] * 3)  # noqa: E731
    prompt, first = ids(5), turn()
    seconds = [turn(), turn()]
    return [Trajectory(str(seed), str(seed), prompt, [first, second, turn()]) for second in seconds for _ in range(2)]


def test_block_mask_holds_the_tree_rule() -> None:
    # Row 1 2 3 4 5 with 5 a child of 2 (end = [5, 5, 4, 4, 5]) and one pad slot (end = 6).
    end = torch.tensor([[5, 5, 4, 4, 5, 6]])
    mask = tree_block_mask(end)
    assert mask.shape == (1, 1, 6, 6)
    allowed = mask.mask_mod(torch.tensor(0), torch.tensor(0), torch.arange(6)[:, None], torch.arange(6)[None, :])
    expected = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(allowed, expected)


def test_flex_log_probs_equal_dense_and_each_leaf_alone() -> None:
    model, leaves = _model(), _leaves(1) + _leaves(2)
    seqs, trained = [t.token_ids for t in leaves], [t.sampled for t in leaves]
    dense_rows = pack_trees(seqs, trained, pad_id=0)
    flex_rows = pack_trees(seqs, trained, pad_id=0, quadratic=False)  # flex drops the quadratic row rule
    assert flex_rows.input_ids.shape[0] < dense_rows.input_ids.shape[0]  # fewer, longer rows
    with torch.no_grad():
        dense = packed_token_logprobs(model, dense_rows, temperature=0.7, chunk=5)
        flex = packed_token_logprobs(model, flex_rows, temperature=0.7, chunk=5, attention="flex")
        flex_same = packed_token_logprobs(model, dense_rows, temperature=0.7, chunk=5, attention="flex")
        for b, leaf in enumerate(leaves):
            ids = torch.tensor([leaf.token_ids])
            alone = token_logprobs(model, ids, torch.ones_like(ids), 0.7)[0]
            mask = torch.tensor(leaf.sampled)
            assert torch.allclose(flex[b, : len(leaf.token_ids)][mask], alone[mask], atol=1e-5)
    assert (flex - dense).abs().max() < 1e-5 and (flex_same - dense).abs().max() < 1e-5
    assert bool((flex[dense == 0] == 0).all())
    assert model.config._attn_implementation != "tracerl_flex"  # switched back after the forward


def test_flex_loss_and_is_guard_equal_dense() -> None:
    model, leaves = _model(), _leaves(3) + _leaves(4)
    results = {}
    for attention in ("dense", "flex"):
        settings = UpdateSettings(8, 1.0, 0.2, 0.28, 0.0, "token-mean", 1.0, tree_packing="always",
                                  packed_attention=attention)
        with torch.no_grad():
            fresh, metrics = with_trainer_logprobs(model, leaves, settings, pad_id=0)
        advantages = [torch.full((len(t.token_ids),), 0.5 - i % 2) for i, t in enumerate(leaves)]
        batch = pad_trajectories(leaves, advantages, 0, "cpu")
        new = pad_trajectories(fresh, advantages, 0, "cpu").old_logprobs  # the trainer's log-probs
        per_token, _ = POLICY_LOSSES.get("ppo")(new, batch.old_logprobs, batch.advantages, batch.loss_mask, 0.2, 0.28)
        results[attention] = (float((per_token * batch.loss_mask).sum() / batch.loss_mask.sum()), metrics)
    (dense_loss, dense_gap), (flex_loss, flex_gap) = results["dense"], results["flex"]
    assert abs(flex_loss - dense_loss) < 1e-5 and flex_loss != 0.0
    assert flex_gap["logprob_mismatch_max"] == pytest.approx(dense_gap["logprob_mismatch_max"], abs=1e-5)


def test_flex_refuses_training_on_cpu_in_one_line(tmp_path) -> None:
    model, leaves = _model(), _leaves(5)
    packed = pack_trees([t.token_ids for t in leaves], [t.sampled for t in leaves], pad_id=0, quadratic=False)
    with pytest.raises(ValueError, match=r"^optim.packed_attention = 'flex' needs CUDA to train \(got 'cpu'\)"):
        packed_token_logprobs(model, packed, temperature=1.0, chunk=5, attention="flex")
    with pytest.raises(ConfigError, match=r"^optim.packed_attention = 'flex' needs model.device = 'cuda'"):
        resolve_config("grpo", overrides=["optim.packed_attention=flex"])


def test_flex_under_bf16_autocast_matches_dense() -> None:
    # As on CUDA with model.dtype = bfloat16: q/k leave the norms in fp32, v is bf16; flex casts all
    # three to the autocast dtype as sdpa does, so both paths agree to bf16 rounding.
    model, leaves = _model(), _leaves(6) + _leaves(7)
    packed = pack_trees([t.token_ids for t in leaves], [t.sampled for t in leaves], pad_id=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        dense = packed_token_logprobs(model, packed, temperature=1.0, chunk=5)
        flex = packed_token_logprobs(model, packed, temperature=1.0, chunk=5, attention="flex")
    trained = dense != 0
    assert bool(trained.any()) and float((flex - dense)[trained].abs().max()) < 0.05


def test_flex_attention_refuses_a_padded_forward() -> None:
    from tracerl.train.flex_packing import flex_scope

    model, ids = _model(), torch.tensor([[0, 5, 6, 7]])
    with torch.no_grad(), flex_scope(model), pytest.raises(ValueError, match="runs only the packed forward"):
        model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1, 1]]))
    assert model.config._attn_implementation != "tracerl_flex"
