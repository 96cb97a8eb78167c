"""A decode loop with no per-step host sync (``model.decode_engine = 'async'`` and ``'static'``).

:meth:`HFPolicy._decode <tracerl.models.backend.HFPolicy>`'s eager loop copies each step's tokens to
the host and decides which rows stopped before it launches the next forward, so on a GPU the host
waits for the device every step and the device then waits for the host. Here (issue 49, item 2):

- each step's tokens, log-probs and stop pre-filter flags (:mod:`~tracerl.models.stop_filter`) are
  copied into a pinned host buffer with ``non_blocking=True`` and a CUDA event; the next forward is
  launched first, and the copy is read (the event waited on) one step late, while that forward runs.
  On the CPU the step's tensor is read directly (nothing to overlap); the loop is the same;
- a row that finished stays in the batch: the token it drew in the step after its last one is
  dropped, never returned; the batch is compacted (finished rows' KV stored, their slots dropped)
  only once fewer than half of its rows are live, not whenever one finishes;
- sampling is per row and seeded (:func:`~tracerl.models.sampling.sample_next_seeded`) or greedy,
  so a row's draw does not depend on which other rows share its batch: tokens, finish reasons and
  the stored prefixes equal the eager loop's (tests/models/test_decode_engines.py); log-probs and
  stored KV are bitwise equal where both loops run the same batch sizes, else equal up to the
  rounding a CPU matmul gives a row at another batch size (~1e-5: the eager loop shrinks its batch
  at every finish). Rows sharing one unseeded generator interact, so that path stays on the eager loop.

Where the KV lives is a :class:`Slots` object: :class:`DynamicSlots` (transformers' ``DynamicCache``
and a growing padding mask, the eager loop's layout) or
:class:`~tracerl.models.static_decode.StaticSlots` (preallocated slots, CUDA graphs on a GPU).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tracerl.models.generation import FinishReason, Generation, SamplingParams, StopChecker
from tracerl.models.prefix_cache import KVEntry, forward_with_cache, output_cache
from tracerl.models.sampling import sample_next, sample_next_seeded

Rows = list[tuple[list[int], KVEntry | None]]

DECODE_ENGINES = ("auto", "eager", "async", "static")
"""``model.decode_engine``: ``eager`` (host reads every step), ``async`` (this module, on the eager
loop's ``DynamicCache``), ``static`` (:mod:`~tracerl.models.static_decode`: static slots, CUDA graphs
on a GPU), ``auto`` (``static`` on CUDA, ``eager`` elsewhere: on a CPU nothing overlaps)."""


def resolve_engine(name: str, device: torch.device) -> str:
    """The engine ``name`` runs as on ``device`` (``auto`` resolved)."""
    if name not in DECODE_ENGINES:
        raise ValueError(f"model.decode_engine = {name!r} is not valid; allowed values: {', '.join(DECODE_ENGINES)}")
    if name == "auto":  # the fast engines have not run on a GPU yet (benchmarks/gpu/gpu_engine_check.py): opt-in
        return "eager"
    return name


class DecodePolicy(Protocol):
    """What the engines use of :class:`~tracerl.models.backend.HFPolicy` (which drives them)."""

    tokenizer: Any
    eos_token_id: int | None

    @property
    def net(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def _forwards(self) -> AbstractContextManager[Any]: ...

    def _stop_candidates(self, stop_strings: tuple[str, ...], vocab: int, device: torch.device) -> torch.Tensor | None: ...

    def _remember(self, cache: Any, mask: torch.Tensor, finished: list[tuple[int, int]], rows: Rows,
                  tokens: list[list[int]]) -> None: ...


class Slots(Protocol):
    """The KV of a decode batch: one forward per step, compaction, and storing finished rows' KV."""

    capacity: int
    """Rows the forwards run on (>= the live rows; a static engine pads to a bucket)."""
    width0: int
    """KV columns the prefill wrote: step ``s``'s token goes to column ``width0 + s``."""

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row ([capacity] each); the next logits [capacity, V]."""
        ...

    def select(self, slots: list[int]) -> list[int]:
        """Keep these slots (in this order); returns the gather index over the old rows [new capacity]."""
        ...

    def remember(self, finished: list[tuple[int, int]], width: int, rows: Rows, tokens: list[list[int]]) -> None:
        """Store ``(row, slot)``'s KV over the first ``width`` columns (:meth:`HFPolicy._remember`)."""
        ...


class DynamicSlots:
    """The eager loop's layout: a ``DynamicCache`` and a 2D padding mask grown by one column a step."""

    def __init__(self, policy: DecodePolicy, cache: Any, mask: torch.Tensor) -> None:
        self.policy, self.cache, self.mask = policy, cache, mask
        self.capacity, self.width0 = mask.shape

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=-1)
        with self.policy._forwards():
            out = forward_with_cache(self.policy.net, tokens[:, None], self.cache, attention_mask=self.mask,
                                     position_ids=positions[:, None])
        self.cache = output_cache(out)
        return out.logits[:, -1, :]

    def select(self, slots: list[int]) -> list[int]:
        sel = torch.tensor(slots, device=self.mask.device)
        self.cache.batch_select_indices(sel)
        self.mask = self.mask[sel]
        self.capacity = len(slots)
        return slots

    def remember(self, finished: list[tuple[int, int]], width: int, rows: Rows, tokens: list[list[int]]) -> None:
        self.policy._remember(self.cache, self.mask[:, :width], finished, rows, tokens)


@dataclass
class _Step:
    """One step's results on their way to the host."""

    step: int
    host: torch.Tensor
    """[2 or 3, capacity] float32: tokens (exact below 2**24), log-probs, stop pre-filter flags."""
    event: Any
    """The CUDA event recorded after the copy (None on the CPU: the copy was synchronous)."""
    slot_rows: list[int]
    """The original row of each live slot when the step ran (pad slots are not listed)."""


class _HostCopier:
    """Two pinned buffers on CUDA, alternated: step ``s`` is copied while step ``s - 1`` is read."""

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.cuda = device.type == "cuda"
        # Flat, so a step's [parts, rows] view stays contiguous after compaction (a strided pinned view
        # would make the copy go through a temporary).
        self.buffers = [torch.empty(3 * capacity, dtype=torch.float32, pin_memory=True) for _ in range(2)] \
            if self.cuda else []

    def start(self, step: int, parts: list[torch.Tensor], slot_rows: list[int]) -> _Step:
        stage = torch.stack([p.float() for p in parts])
        if not self.cuda:
            return _Step(step, stage, None, slot_rows)
        host = self.buffers[step % 2][: stage.numel()].view(stage.shape)
        host.copy_(stage, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _Step(step, host, event, slot_rows)


def lagged_decode(policy: DecodePolicy, logits: torch.Tensor, slots: Slots, rows: Rows, params: SamplingParams,
                  seeds: torch.Tensor | None) -> list[Generation]:
    """Sample up to ``params.max_new_tokens`` per row with stops read one step late (module docstring).

    ``logits`` [B, V] are the prefill's last logits of the ``B`` rows; ``seeds`` [B] int64 or None
    (then ``params.temperature`` must be 0: greedy).
    """
    batch = logits.shape[0]
    state = _RowState(policy, rows, params, batch)
    positions = torch.tensor([len(seq) for seq, _ in rows], device=logits.device)
    logits, positions = _pad(logits, slots.capacity), _pad(positions, slots.capacity)
    seeds = _pad(seeds, slots.capacity) if seeds is not None else None
    checker = StopChecker(policy.tokenizer, params.stop_strings)
    candidates = policy._stop_candidates(params.stop_strings, logits.shape[-1], logits.device)
    copier = _HostCopier(logits.device, slots.capacity)
    width0 = slots.width0
    slot_rows, pending = list(range(batch)), None
    for step in range(params.max_new_tokens):
        if seeds is None:
            tok, lp = sample_next(logits, 0.0, 1.0, None)
        else:  # the position is the token's index within its row's generation
            tok, lp = sample_next_seeded(logits, params.temperature, params.top_p, seeds, torch.full_like(seeds, step))
        current = copier.start(step, [tok, lp] + ([candidates[tok]] if candidates is not None else []), slot_rows)
        if step < params.max_new_tokens - 1:  # launched before the previous step is read: it overlaps
            logits, positions = slots.forward(tok, positions), positions + 1
        if pending is not None:
            state.consume(pending, checker)
            if state.live == 0:
                break  # every row ended before this step: its tokens are dropped
            if 2 * state.live < len(slot_rows) and step < params.max_new_tokens - 1:
                keep = [s for s, row in enumerate(slot_rows) if row not in state.ended]
                state.remember(slots, width0, {row: s for s, row in enumerate(slot_rows)})
                index = torch.tensor(slots.select(keep), device=logits.device)
                logits, positions = logits[index], positions[index]
                seeds = seeds[index] if seeds is not None else None
                slot_rows = [slot_rows[s] for s in keep]
        pending = current
    else:
        assert pending is not None
        state.consume(pending, checker)
    state.remember(slots, width0, {row: s for s, row in enumerate(slot_rows)})
    return [Generation(token_ids=state.tokens[r], logprobs=state.logprobs[r], finish_reason=state.reasons[r],
                       text=policy.tokenizer.decode(state.tokens[r], skip_special_tokens=True)) for r in range(batch)]


class _RowState:
    """The host side of :func:`lagged_decode`: each row's tokens, how and at which step it ended."""

    def __init__(self, policy: DecodePolicy, rows: Rows, params: SamplingParams, batch: int) -> None:
        self.policy, self.rows, self.params = policy, rows, params
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.reasons: list[FinishReason] = ["length"] * batch
        self.ended: dict[int, int] = {}
        """row -> the step that drew its last token."""
        self.remembered: set[int] = set()
        self.live = batch

    def consume(self, pending: _Step, checker: Any) -> None:
        """Read a step's copy (waiting on its event) and end the rows that stopped on it."""
        if pending.event is not None:
            pending.event.synchronize()
        values = pending.host.tolist()
        eos, last = self.policy.eos_token_id, pending.step == self.params.max_new_tokens - 1
        for slot, row in enumerate(pending.slot_rows):
            if row in self.ended:
                continue  # a token drawn after the row's last one: dropped
            token = int(values[0][slot])
            self.tokens[row].append(token)
            self.logprobs[row].append(values[1][slot])
            if token == eos:
                self.reasons[row] = "eos"
            elif (len(values) < 3 or values[2][slot]) and checker.hit(self.tokens[row]):
                self.reasons[row] = "stop"
            elif not last:
                continue
            self.ended[row] = pending.step
            self.live -= 1

    def remember(self, slots: Slots, width0: int, slot_of: dict[int, int]) -> None:
        """Store every ended row's KV not stored yet, in the eager loop's order (by the step the row
        ended on, then by row), so LRU eviction in the store matches it too."""
        todo = sorted((step, row) for row, step in self.ended.items() if row not in self.remembered)
        for step in sorted({s for s, _ in todo}):
            group = [(row, slot_of[row]) for s, row in todo if s == step]
            slots.remember(group, width0 + step, self.rows, self.tokens)
        self.remembered |= {row for _, row in todo}


def _pad(t: torch.Tensor, capacity: int) -> torch.Tensor:
    """``t`` [B, ...] padded to ``capacity`` rows by repeating its last row (pad rows' outputs are ignored)."""
    if t.shape[0] >= capacity:
        return t
    return torch.cat([t, t[-1:].expand(capacity - t.shape[0], *t.shape[1:])])
