"""Token sampling for the policy backends: a shared generator, or one seed per request row.

Two ways to draw one token per row of ``logits [B, V]``:

- :func:`sample_next` draws with ``torch.multinomial`` from one (optional) ``torch.Generator``
  shared by the batch: a row's draw depends on which rows came before it in the batch.
- :func:`sample_next_seeded` gives every row its own stream: inverse-CDF sampling with one
  counter-based uniform per row, ``u = hash(seed_row, position)``; the token is the first
  whose cumulative probability (float64, over the nucleus when ``top_p < 1``) exceeds
  ``u * total``. A row's token depends only on its own seed, its position in the generation
  and its logits, never on the batch it ran in (the per-request-seed contract of
  :class:`~tracerl.models.backend.PolicyBackend`), and it is an exact draw from the same
  distribution ``sample_next`` draws from.

Cost of the seeded path: the hash runs over ``B`` numbers only; per decode step it adds a
float64 cumulative sum and a binary search over ``[B, V]``, about what ``torch.multinomial``
does itself, and no host-side loop over rows or per-row generators. (A first design, Gumbel-max
with per-token hashed noise, cost ~10 integer passes over ``[B, V]``: 2.5x multinomial on a
CPU at V = 152k.) The hash is a 32-bit integer mix computed in int64 with every product below
2**63, so it is identical on every device.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # the multiplier of a well-known 32-bit avalanche hash (< 2**31: no int64 overflow)


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two devices are the same (``cuda`` without an index matches any ``cuda:N``)."""
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _avalanche(x: torch.Tensor) -> torch.Tensor:
    """32-bit avalanche mix of an int64 tensor holding values in [0, 2**32)."""
    x = ((x >> 16) ^ x) * _MIX & _M32
    x = ((x >> 16) ^ x) * _MIX & _M32
    return (x >> 16) ^ x


def row_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row, [B] float64: a function of (seed_b, position_b) only.

    ``seeds`` [B] int64 (any 64-bit value), ``positions`` [B] int64 (index of the token being
    drawn within its request's generation). 53 random bits (two 32-bit hashes).
    """
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    a = _avalanche(lo ^ _avalanche(hi ^ _avalanche(positions & _M32)))
    b = _avalanche(a ^ 0x9E3779B9)
    bits = (a >> 5) * (1 << 26) + (b >> 6)  # 27 + 26 = 53 bits
    return (bits.double() + 0.5) / float(1 << 53)


def _tempered(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp [B, V] of the full tempered distribution, keep mask [B, V] of the nucleus)``."""
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return logp, torch.ones_like(logp, dtype=torch.bool)
    probs = logp.exp()
    sorted_p, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass before it is below top_p (the first token is always kept).
    keep_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p
    return logp, torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]`` float. The log-prob is of the full tempered distribution.
    ``generator`` must live on ``logits``' device: drawing on another device would copy the
    probabilities there and back for every token.
    """
    if generator is not None and not same_device(generator.device, logits.device):
        raise ValueError(
            f"the generator is on {generator.device} but the logits on {logits.device}; "
            "create it on the model's device (torch.Generator(device=...))")
    logits = logits.float()
    if temperature == 0.0:
        return _greedy(logits)
    logp, keep = _tempered(logits, temperature, top_p)
    tokens = torch.multinomial(logp.exp() * keep, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def sample_next_seeded(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`sample_next`, but row ``b`` draws with its own ``(seeds[b], positions[b])`` noise."""
    logits = logits.float()
    if temperature == 0.0:
        return _greedy(logits)
    logp, keep = _tempered(logits, temperature, top_p)
    cdf = (logp.exp() * keep).double().cumsum(dim=-1)  # float64: tail tokens keep their mass
    target = row_uniforms(seeds, positions) * cdf[:, -1]
    # First index whose cumulative mass exceeds the target: never a zero-probability token.
    tokens = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding; the recorded log-prob is at temperature 1."""
    logp = torch.log_softmax(logits, dim=-1)
    tokens = logits.argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
