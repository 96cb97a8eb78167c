"""Policy backends: batched sampling with per-token sampling-time log-probs.

The rollout engine only talks to :class:`PolicyBackend` (a tokenizer plus ``generate``), so a
vLLM or SGLang backend can be added later without touching the engine. :class:`HFPolicy` wraps
any Hugging Face causal LM with a hand-written sampling loop (KV cache, left padding, explicit
position ids, per-row stop strings), which is about twice as fast as ``model.generate`` on tiny
models and lets us record exactly the log-probs the trainer will recompute.

Conventions (shared with pretraining and the trainer):

- ``Generation.token_ids`` include the stop-string tokens and the EOS token when the row
  ended on them: both are policy decisions and are trained on.
- ``Generation.text`` is the decoded ``token_ids`` without special tokens (EOS dropped).
- ``logprobs[i] = log softmax(logits / temperature)[token_ids[i]]`` over the full vocabulary
  (top-p only restricts which token is drawn, not the recorded distribution). With
  ``temperature == 0`` decoding is greedy and the recorded log-probs are at temperature 1.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How one ``generate`` call samples."""

    max_new_tokens: int
    """Hard cap on generated tokens per row (ends the row with finish_reason "length")."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    stop_strings: tuple[str, ...] = ()
    """A row stops once its decoded generated text contains any of these (tokens kept)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must not contain empty strings")


@dataclass
class Generation:
    """One sampled continuation of one prefix."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason


@runtime_checkable
class PolicyBackend(Protocol):
    """What the rollout engine needs from a policy: a tokenizer and batched sampling."""

    tokenizer: Any

    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]: ...


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Prompt token ids: the BOS token (when the tokenizer has one) then the text, no EOS.

    Continuations (observations, answers) are encoded with ``add_special_tokens=False``;
    pretraining builds its episodes the same way so the policy sees familiar prefixes.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([int(bos)] if bos is not None else []) + list(ids)


def forward_with_cache(model: Any, input_ids: torch.Tensor, cache: Any, **kwargs: Any) -> Any:
    """Call ``model`` with a KV cache under the keyword the installed transformers expects.

    transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns until 5.40).
    """
    key = _cache_kwarg(model)
    out = model(input_ids=input_ids, use_cache=True, **{key: cache}, **kwargs)
    return out


def output_cache(out: Any) -> Any:
    """The updated cache of a model output, under either attribute name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _cache_kwarg(model: Any) -> str:
    key = getattr(model, "_tracerl_cache_kwarg", None)
    if key is None:
        params = inspect.signature(model.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        try:
            model._tracerl_cache_kwarg = key
        except AttributeError:  # pragma: no cover - exotic wrappers without attribute assignment
            pass
    return key


def new_cache(model: Any) -> Any:
    """An empty dynamic KV cache for ``model`` (croppable and batch-indexable)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]`` float. The log-prob is of the full tempered distribution.
    """
    logits = logits.float()
    if temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep a token if the mass before it is below top_p (the first token is always kept).
        keep_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
    if generator is not None and generator.device != probs.device:
        tokens = torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(-1)
        tokens = tokens.to(probs.device)
    else:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class _StopChecker:
    """Per-row stop-string detection on a short decoded tail (avoids O(n^2) decoding)."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        # A stop string can span at most len(s) tokens when each token decodes to >= 1 char;
        # a few extra tokens cover byte-level pieces that decode to partial characters.
        self.window = max((len(s) for s in stop_strings), default=0) + 4

    def hit(self, generated: list[int]) -> bool:
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(generated[-self.window :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)


class HFPolicy:
    """A Hugging Face causal LM as a :class:`PolicyBackend`.

    Prefix reuse: identical prefixes within one ``generate`` call are prefilled once and their
    KV-cache rows repeated, so ``n`` continuations of one stored boundary (or ``n`` chains of
    one prompt) cost one prefill.
    """

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = int(eos) if eos is not None else None
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id: int = int(pad) if pad is not None else (self.eos_token_id or 0)

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str,
        dtype: torch.dtype | str = "auto",
        device: str | torch.device = "cpu",
    ) -> HFPolicy:
        """Load a model and tokenizer from a local folder or hub name (``HF_HUB_OFFLINE`` applies)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path_or_name)
        model = AutoModelForCausalLM.from_pretrained(path_or_name, dtype=dtype).to(device)
        model.eval()
        return cls(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prefix (rows stop on a stop string, EOS or the length cap)."""
        if not prefixes:
            return []
        if any(len(p) == 0 for p in prefixes):
            raise ValueError("every prefix must hold at least one token")
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique.setdefault(tuple(p), len(unique)) for p in prefixes]
        logits, cache, mask, positions = self._prefill([list(p) for p in unique])
        index = torch.tensor(row_to_unique, device=logits.device)
        if len(unique) < len(prefixes):
            cache.batch_select_indices(index)  # repeat the shared prefix rows
        return self._decode(logits[index], cache, mask[index], positions[index], params, generator)

    def _prefill(
        self, prefixes: list[list[int]]
    ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Left-padded prefill; returns last logits [U, V], cache, mask [U, Lmax], next positions [U]."""
        device = self.device
        width = max(len(p) for p in prefixes)
        ids = torch.full((len(prefixes), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        for row, p in enumerate(prefixes):
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        # Explicit positions so a left-padded row sees the same positions as an unpadded one.
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = new_cache(self.model)
        out = forward_with_cache(
            self.model, ids, cache, attention_mask=mask, position_ids=position_ids, logits_to_keep=1
        )
        return out.logits[:, -1, :], output_cache(out), mask, mask.sum(-1)

    def _decode(
        self,
        logits: torch.Tensor,
        cache: Any,
        mask: torch.Tensor,
        positions: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        batch = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[FinishReason] = ["length"] * batch
        live = list(range(batch))  # original row index of each cache row
        checker = _StopChecker(self.tokenizer, params.stop_strings)
        for step in range(params.max_new_tokens):
            next_tok, next_lp = sample_next(logits, params.temperature, params.top_p, generator)
            next_list, lp_list = next_tok.tolist(), next_lp.tolist()
            keep: list[int] = []
            for slot, row in enumerate(live):
                tokens[row].append(next_list[slot])
                logprobs[row].append(lp_list[slot])
                if next_list[slot] == self.eos_token_id:
                    reasons[row] = "eos"
                elif checker.hit(tokens[row]):
                    reasons[row] = "stop"
                else:
                    keep.append(slot)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows so they cost nothing further
                sel = torch.tensor(keep, device=logits.device)
                cache.batch_select_indices(sel)
                mask, positions, next_tok = mask[sel], positions[sel], next_tok[sel]
                live = [live[s] for s in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
            out = forward_with_cache(
                self.model,
                next_tok[:, None],
                cache,
                attention_mask=mask,
                position_ids=positions[:, None],
            )
            cache, logits, positions = output_cache(out), out.logits[:, -1, :], positions + 1
        return [
            Generation(
                token_ids=tokens[row],
                logprobs=logprobs[row],
                text=self.tokenizer.decode(tokens[row], skip_special_tokens=True),
                finish_reason=reasons[row],
            )
            for row in range(batch)
        ]
