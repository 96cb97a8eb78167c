"""The tree-packed update: the layout by hand, the same log-probs, the same gradients on real trees."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.config.schema import ConfigError, resolve_config
from tracerl.core.types import Action, Trajectory, Turn
from tracerl.train.loop import Trainer
from tracerl.train.packing import pack_trees, packed_token_logprobs
from tracerl.train.update import UpdateSettings, policy_update, resolve_tree_packing, token_logprobs, update_settings

TINY = ["model.name_or_path=tiny", "model.tiny_preset=smoke", "data.verifier=answered", "eval.every=0",
        "eval.size=4", "steps=1"]


def test_two_sequences_share_their_prefix_once() -> None:
    # [1 2 3 4] and [1 2 5]: the trie row is 1 2 3 4 5, with 5 a child of 2 (depth 2, not 4).
    packed = pack_trees([[1, 2, 3, 4], [1, 2, 5]], [[False, True, True, True], [False, False, True]], pad_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert packed.end.tolist() == [[5, 5, 4, 4, 5]]  # slot 2 (token 3) owns 3 and 4 only
    # Needed nodes: 2 (from 1), 3 (from 2), 4 (from 3), 5 (from 2); the shared "2" of row 1 is not trained there.
    assert packed.sources.tolist() == [0, 1, 2, 1]
    assert packed.targets.tolist() == [2, 3, 4, 5]
    assert packed.gather.tolist() == [[0, 1, 2, 3], [0, 0, 4, 0]]
    assert packed.tokens == 5


def test_equal_and_prefix_sequences_reuse_slots_and_distinct_prompts_get_rows() -> None:
    packed = pack_trees([[7, 8, 9], [7, 8, 9], [7, 8], [3, 4]], [[True] * 3, [True] * 3, [True] * 2, [True] * 2],
                        pad_id=0)
    assert packed.input_ids.tolist() == [[3, 4, 0], [7, 8, 9]]  # sorted rows, right-padded
    assert packed.end.tolist() == [[2, 2, 3], [3, 3, 3]]  # padding sees only itself
    assert packed.targets.tolist() == [8, 9, 4]
    assert packed.gather.tolist() == [[0, 1, 2], [0, 1, 2], [0, 1, 0], [0, 3, 0]]
    assert packed.tokens == 5


def test_a_row_stops_growing_before_its_attention_outgrows_the_leaves() -> None:
    # [1 2 3 4] + [1 5 6 7] would be a 7-token row: 49 scores > 16 + 16 apart, so each gets its own
    # row; [1 2 3 4] + [1 2 3 5] makes 5 tokens: 25 <= 32, one row.
    apart = pack_trees([[1, 2, 3, 4], [1, 5, 6, 7]], [[True] * 4] * 2, pad_id=0)
    assert apart.input_ids.tolist() == [[1, 2, 3, 4], [1, 5, 6, 7]]
    together = pack_trees([[1, 2, 3, 4], [1, 2, 3, 5]], [[True] * 4] * 2, pad_id=0)
    assert together.input_ids.tolist() == [[1, 2, 3, 4, 5]]


def _model() -> torch.nn.Module:
    config = Qwen3Config(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _tree(seed: int) -> list[Trajectory]:
    """Four leaves: one shared first turn, two second turns, two third turns under each."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, 40, (n,), generator=g).tolist()  # noqa: E731
    turn = lambda: Turn(ids(3), ids(4), "x", Action(kind="tool", name="s"))  # noqa: E731
    prompt, first = ids(5), turn()
    seconds = [turn(), turn()]
    return [Trajectory(str(seed), str(seed), prompt, [first, second, turn()]) for second in seconds for _ in range(2)]


def test_packed_log_probs_equal_each_leaf_forwarded_alone() -> None:
    model = _model().eval()
    leaves = _tree(1) + _tree(2)
    packed = pack_trees([t.token_ids for t in leaves], [t.sampled for t in leaves], pad_id=0)
    with torch.no_grad():
        together = packed_token_logprobs(model, packed, temperature=0.7, chunk=5)
        for b, leaf in enumerate(leaves):
            ids = torch.tensor([leaf.token_ids])
            alone = token_logprobs(model, ids, torch.ones_like(ids), 0.7)[0]
            mask = torch.tensor(leaf.sampled)
            assert torch.allclose(together[b, : len(leaf.token_ids)][mask], alone[mask], atol=1e-5)
            assert bool((together[b, : len(leaf.token_ids)][~mask] == 0).all())


def _captured_step(preset: str, tmp_path: Path) -> tuple[Trainer, list[tuple[Trajectory, torch.Tensor]]]:
    """One real step of ``preset`` on the random smoke model; the update's (leaf, advantage) pairs."""
    trainer = Trainer(resolve_config(preset, smoke="random", overrides=TINY), tmp_path)
    seen: list[list[tuple[Trajectory, torch.Tensor]]] = []
    update = trainer._update
    trainer._update = lambda pairs: seen.append(pairs) or update(pairs)  # type: ignore[method-assign]
    trainer.step()
    return trainer, seen[0]


def _gradients(model: torch.nn.Module, pairs: list, packing: str, loss: str, kl: float,
               reference: torch.nn.Module | None) -> list[torch.Tensor]:
    model = copy.deepcopy(model)
    settings = UpdateSettings(micro_batch_size=5, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=kl,
                              loss_agg="seq-mean-token-mean" if loss == "gspo" else "token-mean", grad_clip=1e9,
                              policy_loss=loss, tree_packing=packing)
    policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), [p[0] for p in pairs], [p[1] for p in pairs],
                  settings, pad_id=0, reference=reference if kl else None)
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


@pytest.mark.parametrize("preset", ["trace", "tree_grpo", "trace_credit"])
def test_packed_update_has_the_per_leaf_gradients_on_real_trees(preset: str, tmp_path: Path) -> None:
    trainer, pairs = _captured_step(preset, tmp_path)
    assert any(carries for _, a in pairs for carries in [bool(a.abs().sum() > 0)])
    model = trainer.model.float()
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
        for p in reference.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    shared = len({tuple(t.token_ids[:n]) for t, _ in pairs for n in range(1, len(t.token_ids) + 1)})
    assert shared < sum(len(t.token_ids) for t, _ in pairs)  # the leaves do share tokens
    for loss in ("ppo", "gspo"):
        for kl in (0.0, 0.05):
            apart = _gradients(model, pairs, "never", loss, kl, reference)
            packed = _gradients(model, pairs, "always", loss, kl, reference)
            total = torch.sqrt(sum((a.double() ** 2).sum() for a in apart))
            gap = torch.sqrt(sum(((a - b).double() ** 2).sum() for a, b in zip(apart, packed, strict=True)))
            assert total > 0
            assert gap / total < 1e-5, (preset, loss, kl, float(gap / total))


def test_auto_packs_branching_schemes_and_on_needs_a_tree_mask() -> None:
    assert resolve_tree_packing("auto", "trace") == "auto"
    assert resolve_tree_packing("auto", "tree_random") == "auto"
    assert resolve_tree_packing("auto", "chain") == "never"
    assert resolve_tree_packing("always", "chain") == "always"
    assert update_settings(resolve_config("grpo", smoke="random", overrides=TINY)).tree_packing == "never"
    with pytest.raises(ConfigError, match="optim.tree_packing"):
        resolve_config("trace", smoke="random", overrides=[*TINY, "optim.tree_packing=packed"])
    model = _model()
    model.config._attn_implementation = "flash_attention_2"  # as loaded with flash-attention: no 4D masks
    leaves = _tree(3)
    settings = UpdateSettings(micro_batch_size=4, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                              loss_agg="token-mean", grad_clip=1.0, tree_packing="always")
    advantages = [torch.tensor(t.sampled, dtype=torch.float32) for t in leaves]
    with pytest.raises(ValueError, match="optim.tree_packing = 'always' needs an attention implementation"):
        policy_update(model, torch.optim.SGD(model.parameters(), lr=0.1), leaves, advantages, settings, pad_id=0)
