"""Policy backends: batched sampling with per-token sampling-time log-probs.

The rollout engine only talks to :class:`PolicyBackend` (a tokenizer, ``generate`` with
per-row seeds, ``sync_weights``); :func:`tracerl.models.factory.make_backend` picks the
implementation from ``model.backend`` (``hf``: :class:`HFPolicy`; ``vllm``: ``VLLMPolicy``). :class:`HFPolicy` wraps
any Hugging Face causal LM with a hand-written sampling loop (KV cache, left padding, explicit
position ids, per-row stop strings), which is about twice as fast as ``model.generate`` on tiny
models and lets us record exactly the log-probs the trainer will recompute. Its prefill (suffix
buckets over reused KV, hidden-state recording) lives in :mod:`tracerl.models.prefill`.

Conventions (shared with pretraining and the trainer):

- ``Generation.token_ids`` include the stop-string tokens and the EOS token when the row
  ended on them: both are policy decisions and are trained on.
- ``Generation.text`` is the decoded ``token_ids`` without special tokens (EOS dropped).
- ``logprobs[i] = log softmax(logits / temperature)[token_ids[i]]`` over the full vocabulary
  (top-p only restricts which token is drawn, not the recorded distribution). With
  ``temperature == 0`` decoding is greedy and the recorded log-probs are at temperature 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from tracerl.models.decode_async import DynamicSlots, lagged_decode, resolve_engine
from tracerl.models.generation import FinishReason, Generation, SamplingParams, StopChecker  # noqa: F401 - re-exported
from tracerl.models.heads import split_head
from tracerl.models.precision import low_precision_copy, no_autocast, refresh_copy
from tracerl.models.sampling import same_device, sample_next, sample_next_seeded  # noqa: F401 - re-exported
from tracerl.models.prefill import prefill
from tracerl.models.stop_filter import stop_candidates
from tracerl.models.prefix_cache import KVEntry, PrefixKVStore, forward_with_cache, output_cache, plain_dynamic, slot_layers
from tracerl.models.weights import load_buckets

@runtime_checkable
class PolicyBackend(Protocol):
    """What the rollout engine needs from a policy: a tokenizer, batched sampling, weight sync.

    Lifecycle: the trainer calls ``sync_weights(model, version)`` after every optimiser step
    (and after loading weights); a backend never polls the trainer's model for changes. A
    backend that caches KV across calls must drop it there, so no continuation reuses KV
    computed under old weights.

    ``seeds[i]`` seeds row ``i``: the same prefix, params and seed give the same tokens alone or
    batched with other rows (up to float ties), so a trajectory does not depend on its batch.
    ``seeds=None``: unseeded sampling.
    """

    tokenizer: Any
    stats: dict[str, int]

    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        *,
        routing_keys: list[str] | None = None,
    ) -> list[Generation]:
        """``routing_keys[i]``: row ``i``'s tree id (sticky routing: a backend in front of several
        engines keeps a tree on one, so its branches share that engine's prefix cache)."""
        ...

    def sync_weights(self, model_or_state: Any, version: int) -> None: ...

    def clear_prefix_cache(self) -> None:
        """Drop every stored prefix KV (``sync_weights`` does it; so does the trainer after evaluating)."""
        ...


class HFPolicy:
    """A Hugging Face causal LM as a :class:`PolicyBackend`.

    Prefix reuse, two levels:

    - within one call, identical prefixes are prefilled once and their KV-cache rows repeated,
      so ``n`` continuations of one stored boundary (or ``n`` chains of one prompt) cost one
      prefill;
    - across calls, a :class:`~tracerl.models.prefix_cache.PrefixKVStore` keeps every finished
      row's KV (up to ``prefix_cache_bytes``), so the next turn of an episode, or a branch
      from a boundary of an earlier chain, prefills only the tokens after the longest stored
      prefix (typically the observation). It is cleared by :meth:`sync_weights`, which the
      trainer calls after every update (the policy shares its model with the trainer).

    ``stats`` counts ``prefill_tokens`` (computed), ``reused_prefix_tokens`` (skipped thanks to
    either level) and ``generated_tokens``.
    """

    def __init__(self, model: Any, tokenizer: Any, prefix_cache_bytes: int = 256 * 2**20,
                 generation_dtype: torch.dtype | None = None, decode_engine: str = "eager") -> None:
        self.model = model
        self.copy: Any = low_precision_copy(model, generation_dtype) if generation_dtype is not None else None
        """``model.generation_dtype = 'bfloat16'``: the frozen bf16 copy every forward of this policy runs
        on, without autocast, refreshed from ``model`` at :meth:`sync_weights`; None: ``model`` itself."""
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = int(eos) if eos is not None else None
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id: int = int(pad) if pad is not None else (self.eos_token_id or 0)
        self.store: PrefixKVStore | None = PrefixKVStore(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.version = 0
        """Weights version of the last :meth:`sync_weights` (the trainer's optimiser step)."""
        self.stats: dict[str, int] = {"prefill_tokens": 0, "reused_prefix_tokens": 0, "generated_tokens": 0}
        self._stop_tables: dict[tuple[Any, ...], torch.Tensor | None] = {}
        self.record_states = False
        """Return each prefix's last-token hidden state in ``Generation.state`` (the success
        predictor's ``hidden`` input); read off the prefill forward that runs anyway."""
        self.decode_engine = decode_engine
        """``model.decode_engine``: ``eager`` (:meth:`_decode`), ``async`` or ``static``
        (:mod:`~tracerl.models.decode_async`, :mod:`~tracerl.models.static_decode`), ``auto``
        (``eager`` until the fast engines are validated on a GPU); :func:`~tracerl.models.factory.decode_engine` refuses
        ``static`` in one line for a model it cannot run on."""
        self.static_pool: Any = None
        """The static engine's :class:`~tracerl.models.static_decode.SlotPool` (made at its first call)."""

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device = "cpu",
        prefix_cache_bytes: int = 256 * 2**20,
    ) -> HFPolicy:
        """Load a model and tokenizer from a local folder or hub name (``HF_HUB_OFFLINE`` applies)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from tracerl.models.size_guard import check_model_folder

        check_model_folder(path_or_name)  # a local folder's sizes, refused before anything is allocated
        tokenizer = AutoTokenizer.from_pretrained(path_or_name)
        model = AutoModelForCausalLM.from_pretrained(path_or_name, dtype=dtype).to(device)
        model.eval()
        return cls(model, tokenizer, prefix_cache_bytes)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def net(self) -> Any:
        """The module the forwards run on: the bf16 copy when there is one, else the shared model."""
        return self.copy if self.copy is not None else self.model

    def _forwards(self) -> Any:
        """The bf16 copy runs with autocast off (the caller's ``compute_context`` would re-cast it)."""
        return no_autocast(self.device) if self.copy is not None else contextlib.nullcontext()

    def clear_prefix_cache(self) -> None:
        """Drop all stored KV (:meth:`sync_weights` does it)."""
        if self.store is not None:
            self.store.clear()

    def sync_weights(self, model_or_state: Any, version: int) -> None:
        """New weights: ``model_or_state`` is the trainer's model (shared with this policy: nothing
        to copy), a state dict loaded into it, or an iterable of ``(name, tensor)`` buckets
        (:func:`~tracerl.models.weights.weight_buckets`) copied in one bucket at a time. Clears the
        prefix KV store (computed under the old weights) and records ``version``."""
        if hasattr(model_or_state, "state_dict") or isinstance(model_or_state, Mapping):
            if model_or_state is not self.model:
                state = model_or_state.state_dict() if hasattr(model_or_state, "state_dict") else model_or_state
                self.model.load_state_dict(state)
        else:
            load_buckets(self.model, model_or_state)
        if self.copy is not None:
            refresh_copy(self.copy, self.model)
        self.clear_prefix_cache()
        self.version = int(version)

    def _stop_candidates(self, stop_strings: tuple[str, ...], vocab: int, device: torch.device) -> torch.Tensor | None:
        """:func:`~tracerl.models.stop_filter.stop_candidates`, built once per stop strings and vocabulary."""
        key = (stop_strings, vocab, str(device))
        if key not in self._stop_tables:
            self._stop_tables[key] = stop_candidates(self.tokenizer, stop_strings, vocab, device)
        return self._stop_tables[key]

    def device_generator(self, generator: torch.Generator | None) -> torch.Generator | None:
        """A generator on the model's device: ``generator`` itself when it lives there, else a new
        one seeded by one draw from it (once per ``generate`` call, never a copy per token).

        The draw advances ``generator``, so a run seeded (and checkpointed) through a CPU generator
        stays reproducible; passing ``torch.Generator(device=model_device)`` skips the draw.
        """
        if generator is None or same_device(generator.device, self.device):
            return generator
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        *,
        generator: torch.Generator | None = None,
        routing_keys: list[str] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prefix (rows stop on a stop string, EOS or the length cap).

        ``routing_keys`` (the rows' tree ids) are accepted and unused: one model, one prefix store.

        ``seeds`` (one per prefix): row ``i`` draws with its own counter-based noise
        (:func:`~tracerl.models.sampling.sample_next_seeded`), independent of the other rows.
        Otherwise the batch shares ``generator`` (``torch.multinomial``; rows interact).
        """
        if not prefixes:
            return []
        if any(len(p) == 0 for p in prefixes):
            raise ValueError("every prefix must hold at least one token")
        if seeds is not None and len(seeds) != len(prefixes):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prefixes)} prefixes")
        if seeds is not None and generator is not None:
            raise ValueError("pass seeds or a generator, not both")
        generator = self.device_generator(generator)
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique.setdefault(tuple(p), len(unique)) for p in prefixes]
        seqs = [list(p) for p in unique]
        hits = [self.store.lookup(p) if self.store is not None else (None, 0) for p in seqs]
        computed = sum(len(p) - k for p, (_, k) in zip(seqs, hits, strict=True))
        self.stats["prefill_tokens"] += computed
        self.stats["reused_prefix_tokens"] += sum(len(p) for p in prefixes) - computed
        was_training = self.net.training
        self.net.eval()  # sampling must not see dropout even when the trainer left train mode on
        try:
            logits, cache, mask, states = self._prefill(seqs, hits)
            index = torch.tensor(row_to_unique, device=logits.device)
            if len(unique) < len(prefixes):
                cache.batch_select_indices(index)  # repeat the shared prefix rows
            rows = [(seqs[u], hits[u][0]) for u in row_to_unique]
            row_seeds = torch.tensor(seeds, dtype=torch.int64, device=logits.device) if seeds is not None else None
            gens = self._decode_with_engine(logits[index], cache, mask[index], rows, params, generator, row_seeds)
        finally:
            self.net.train(was_training)
        if states is not None:
            for gen, u in zip(gens, row_to_unique, strict=True):
                gen.state = states[u]
        self.stats["generated_tokens"] += sum(len(g.token_ids) for g in gens)
        return gens

    @torch.no_grad()
    def prefix_states(self, prefixes: list[list[int]]) -> list[list[float]] | None:
        """Last-token hidden states [H] of ``prefixes`` (None when the model has no separable decoder).

        One prefill forward; its KV goes to the prefix store, so a later ``generate`` from the same
        prefix (stage 1 after the planner valued its candidate prompts) reuses it and recomputes
        only the last token.
        """
        if not prefixes or split_head(self.net) is None:
            return None
        unique = list(dict.fromkeys(tuple(p) for p in prefixes))
        seqs = [list(p) for p in unique]
        hits = [self.store.lookup(p) if self.store is not None else (None, 0) for p in seqs]
        self.stats["prefill_tokens"] += sum(len(p) - k for p, (_, k) in zip(seqs, hits, strict=True))
        was_training, recording = self.net.training, self.record_states
        self.net.eval()
        self.record_states = True
        try:
            _, cache, mask, states = self._prefill(seqs, hits)
            self._remember(cache, mask, [(u, u) for u in range(len(seqs))],
                           [(seqs[u], hits[u][0]) for u in range(len(seqs))], [[] for _ in seqs])
        finally:
            self.net.train(was_training)
            self.record_states = recording
        assert states is not None
        where = {p: u for u, p in enumerate(unique)}
        return [states[where[tuple(p)]] for p in prefixes]

    # --- prefill ---------------------------------------------------------------------------

    def _prefill(
        self, seqs: list[list[int]], hits: list[tuple[KVEntry | None, int]]
    ) -> tuple[torch.Tensor, Any, torch.Tensor, list[list[float]] | None]:
        """:func:`~tracerl.models.prefill.prefill` with this policy's model, pad id and ``record_states``."""
        with self._forwards():
            return prefill(self.net, seqs, hits, self.pad_token_id, self.record_states)

    # --- decode ----------------------------------------------------------------------------

    def _decode_with_engine(self, logits: torch.Tensor, cache: Any, mask: torch.Tensor,
                            rows: list[tuple[list[int], KVEntry | None]], params: SamplingParams,
                            generator: torch.Generator | None, seeds: torch.Tensor | None) -> list[Generation]:
        """:attr:`decode_engine`'s loop. Rows sharing one unseeded generator draw in batch order, so
        they stay on the eager loop whatever the engine (the others keep finished rows in the batch)."""
        engine = resolve_engine(self.decode_engine, self.device)
        if engine == "eager" or (seeds is None and params.temperature > 0):
            return self._decode(logits, cache, mask, rows, params, generator, seeds)
        if engine == "static":
            from tracerl.models.static_decode import SlotPool, StaticSlots  # transformers' StaticCache, on demand

            self.static_pool = self.static_pool or SlotPool(compiled=self.device.type == "cuda")
            try:
                slots = StaticSlots(self, self.static_pool, cache, mask, params.max_new_tokens)
                return lagged_decode(self, logits, slots, rows, params, seeds)
            finally:
                self.static_pool.prune()  # slots this call did not use: memory back, not kept for later
        return lagged_decode(self, logits, DynamicSlots(self, cache, mask), rows, params, seeds)

    def _decode(
        self,
        logits: torch.Tensor,
        cache: Any,
        mask: torch.Tensor,
        rows: list[tuple[list[int], KVEntry | None]],
        params: SamplingParams,
        generator: torch.Generator | None,
        seeds: torch.Tensor | None = None,
    ) -> list[Generation]:
        batch = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[FinishReason] = ["length"] * batch
        live = list(range(batch))  # original row index of each cache row
        positions = torch.tensor([len(seq) for seq, _ in rows], device=logits.device)
        checker = StopChecker(self.tokenizer, params.stop_strings)
        candidates = self._stop_candidates(params.stop_strings, logits.shape[-1], logits.device)
        for step in range(params.max_new_tokens):
            if seeds is None:
                next_tok, next_lp = sample_next(logits, params.temperature, params.top_p, generator)
            else:  # the position is the token's index within its row's generation
                next_tok, next_lp = sample_next_seeded(
                    logits, params.temperature, params.top_p, seeds, torch.full_like(seeds, step))
            # One device-to-host copy per step (float32 holds token ids below 2**24 exactly), with
            # each row's stop pre-filter flag: only flagged rows decode their tail (stop_filter.py).
            parts = [next_tok.float(), next_lp.float()]
            if candidates is not None:
                parts.append(candidates[next_tok].float())
            both = torch.stack(parts).tolist()
            next_list, lp_list = [int(t) for t in both[0]], both[1]
            may_stop = both[2] if candidates is not None else [1.0] * len(live)
            keep: list[int] = []
            for slot, row in enumerate(live):
                tokens[row].append(next_list[slot])
                logprobs[row].append(lp_list[slot])
                if next_list[slot] == self.eos_token_id:
                    reasons[row] = "eos"
                elif may_stop[slot] and checker.hit(tokens[row]):
                    reasons[row] = "stop"
                else:
                    keep.append(slot)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows so they cost nothing further
                kept = set(keep)
                done = [slot for slot in range(len(live)) if slot not in kept]
                self._remember(cache, mask, [(live[s], s) for s in done], rows, tokens)
                sel = torch.tensor(keep, device=logits.device)
                cache.batch_select_indices(sel)
                mask, positions, next_tok = mask[sel], positions[sel], next_tok[sel]
                seeds = seeds[sel] if seeds is not None else None
                live = [live[s] for s in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            with self._forwards():
                out = forward_with_cache(self.net, next_tok[:, None], cache, attention_mask=mask,
                                         position_ids=positions[:, None])
            cache, logits, positions = output_cache(out), out.logits[:, -1, :], positions + 1
        self._remember(cache, mask, [(row, slot) for slot, row in enumerate(live)], rows, tokens)
        return [
            Generation(
                token_ids=tokens[row],
                logprobs=logprobs[row],
                text=self.tokenizer.decode(tokens[row], skip_special_tokens=True),
                finish_reason=reasons[row],
            )
            for row in range(batch)
        ]

    def _remember(
        self,
        cache: Any,
        mask: torch.Tensor,
        finished: list[tuple[int, int]],
        rows: list[tuple[list[int], KVEntry | None]],
        tokens: list[list[int]],
    ) -> None:
        """Copy finished rows' KV (prefix + generated tokens but the last) into the store."""
        if self.store is None or not finished or not (plain_dynamic(cache) or slot_layers(cache)):
            return
        host = mask[[slot for _, slot in finished]].cpu()  # one device-to-host copy, not a nonzero() per row
        for (row, slot), row_mask in zip(finished, host, strict=True):
            seq, extends = rows[row]
            key = tuple(seq + tokens[row][:-1])
            cols = row_mask.nonzero().squeeze(-1)
            if cols.numel() != len(key):  # layout mismatch: never store something unverifiable
                continue
            cols = cols.to(mask.device)
            layers = [(lay.keys[slot][:, cols], lay.values[slot][:, cols]) for lay in cache.layers]
            self.store.add(key, layers, register=(len(seq),), extends=extends)
