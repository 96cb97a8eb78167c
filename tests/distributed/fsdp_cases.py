"""Inputs shared by the FSDP tests and the worker processes they launch (tiny Qwen3, built locally)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from tracerl.core.types import Action, Trajectory, Turn
from tracerl.train.update import UpdateSettings, token_logprobs

VOCAB = 40
CASES = {  # name: (tied embeddings, kl_coef, rows that carry signal)
    "tied_nokl": (True, 0.0, None),
    "untied_nokl": (False, 0.0, None),
    "tied_kl": (True, 0.1, None),
    "untied_kl": (False, 0.1, None),
    "one_signal_row": (True, 0.0, (2,)),  # one micro-batch for two ranks: rank 1 holds only padding
}


def tiny_policy(tied: bool, seed: int = 0) -> torch.nn.Module:
    """A 2-layer Qwen3 (so per-layer sharding has layers to shard), float32, eval mode."""
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def trajectories(model: torch.nn.Module, count: int = 6, tree: bool = False) -> list[Trajectory]:
    """``count`` trajectories of 1-3 turns and different lengths, with old log-probs from ``model``
    slightly shifted (ratios differ from 1, so some tokens clip). ``tree``: each odd row is a second
    leaf of the row before it (same prompt and first turn), as the tree-packed update sees them."""
    out: list[Trajectory] = []
    for seed in range(count):
        g = torch.Generator().manual_seed(seed)
        ids = lambda n: torch.randint(1, VOCAB, (n,), generator=g).tolist()  # noqa: E731
        turns = [Turn(ids(3 + i), ids(4), "x", Action(kind="tool", name="search")) for i in range(1 + seed % 3)]
        prompt = ids(5 + seed)
        if tree and seed % 2:
            first = out[-1].turns[0]
            prompt, turns[0] = out[-1].prompt_ids, Turn(list(first.assistant_ids), list(first.observation_ids), "x",
                                                        Action(kind="tool", name="search"))
        traj = Trajectory(task_id=str(seed), group_id="g", prompt_ids=prompt, turns=turns)
        with torch.no_grad():
            tok = torch.tensor([traj.token_ids])
            logprobs = token_logprobs(model, tok, torch.ones_like(tok), 1.0)[0]
        shift = 0.3 * torch.sin(torch.arange(len(logprobs), dtype=torch.float32) + seed)
        for turn, (start, end) in zip(traj.turns, traj.turn_spans, strict=True):
            turn.logprobs = (logprobs + shift)[start:end].tolist()
        out.append(traj)
    return out


def advantages(trajs: list[Trajectory], signal: tuple[int, ...] | None) -> list[torch.Tensor]:
    """Per-token advantages ``i - 2.5`` on sampled tokens; rows outside ``signal`` (when given) are 0."""
    out = []
    for i, traj in enumerate(trajs):
        on = signal is None or i in signal
        out.append(torch.tensor(traj.sampled, dtype=torch.float32) * ((i - 2.5) if on else 0.0))
    return out


def settings(kl_coef: float, micro: int = 2, packing: str = "never") -> UpdateSettings:
    return UpdateSettings(micro_batch_size=micro, temperature=1.0, clip_low=0.2, clip_high=0.28, kl_coef=kl_coef,
                          loss_agg="token-mean", grad_clip=0.5, tree_packing=packing)


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW whose first step is ``lr * g / (|g| + eps)``: an element whose gradient is near ``eps``
    moves by up to ``lr / eps`` times its float noise. ``eps=1e-6`` caps that gain at 1e4. At the
    default 1e-8, one element with a gradient of 1.6e-9 made the packed step differ from the unpacked
    one by 1.9e-5 on an Intel Xeon; at 1e-6 the largest difference there is 7.4e-7."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01,
                             eps=1e-6)
