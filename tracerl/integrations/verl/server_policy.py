"""``VerlServerPolicy``: a tracerl :class:`~tracerl.models.backend.PolicyBackend` over verl 0.9.1's
``LLMServerClient`` (the client verl hands its agent loop manager; its router sends every request
of one ``request_id`` to the same server).

One ``generate`` row is one ``LLMServerClient.generate(request_id, prompt_ids=..., sampling_params=...)``
call, all rows of a call in flight together:

* ``request_id`` is the row's routing key, the tree id (the rollout engine passes one per row), so
  every turn and branch of a tree reaches the server holding its prefix cache;
* ``sampling_params`` carry the row's ``seed``, the format's stop strings (``stop``) with
  ``include_stop_str_in_output=True`` (tracerl trains on the stop tokens) and ``logprobs=True``;
* the server reports the weights step it serves (``extra_fields["global_steps"]``); a row from
  any other step than :attr:`VerlServerPolicy.version` is refused with one line naming both.

verl syncs the servers' weights itself (its checkpoint manager, after every step), so
``sync_weights`` only records the version the next rows must come from. ``finish_reason`` is
rebuilt from the tokens (verl reports only ``completed``): ``eos`` when the last token is EOS,
``stop`` when the decoded tail holds a stop string (the check :class:`~tracerl.models.backend.HFPolicy`
makes), else ``length``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any

from tracerl.models.backend import FinishReason, Generation, SamplingParams, StopChecker
from tracerl.rollout.executor import VersionError


def sampling_params(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    """verl's (vLLM's) sampling parameters of one row: tracerl's ``params`` and the row's ``seed``."""
    out: dict[str, Any] = {
        "max_tokens": int(params.max_new_tokens),
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "logprobs": True,
        "stop": list(params.stop_strings),
        "include_stop_str_in_output": True,
    }
    if seed is not None:
        out["seed"] = int(seed)
    return out


def finish_reason(token_ids: Sequence[int], eos_token_id: int | None, checker: StopChecker) -> FinishReason:
    """``eos`` / ``stop`` / ``length`` of a server's row (module docstring)."""
    if token_ids and eos_token_id is not None and token_ids[-1] == eos_token_id:
        return "eos"
    return "stop" if checker.hit(list(token_ids)) else "length"


class _Loop:
    """An asyncio loop on a thread of its own: ``generate`` is synchronous (the rollout engine's
    call) and may be called from a thread that already runs a loop (verl's ``auto_await``)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tracerl-verl-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class VerlServerPolicy:
    """tracerl's policy backend over verl's ``LLMServerClient`` (module docstring).

    Args:
        client: verl's ``LLMServerClient`` (or anything with its async ``generate``).
        tokenizer: the policy's tokenizer (the servers' model's).
        version: the weights step the servers must report (verl's ``global_steps`` of the last
            weight update: ``g - 1`` for a sync trainer's step ``g``).
    """

    def __init__(self, client: Any, tokenizer: Any, version: int = 0) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.version = int(version)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = int(eos) if eos is not None else None
        self.stats: dict[str, int] = {"generated_tokens": 0, "server_requests": 0}
        self._loop = _Loop()

    def generate(
        self,
        prefixes: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        *,
        routing_keys: list[str] | None = None,
    ) -> list[Generation]:
        """One server request per row, all in flight at once; ``routing_keys`` (tree ids) are required."""
        if routing_keys is None or len(routing_keys) != len(prefixes):
            raise ValueError(f"routing_keys: VerlServerPolicy needs one tree id per row for sticky routing, "
                             f"got {None if routing_keys is None else len(routing_keys)} for {len(prefixes)} rows")
        if seeds is not None and len(seeds) != len(prefixes):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prefixes)} prefixes")
        rows = [(key, list(p), sampling_params(params, None if seeds is None else seeds[i]))
                for i, (key, p) in enumerate(zip(routing_keys, prefixes, strict=True))]
        outputs = self._loop.run(self._gather(rows)) if rows else []
        checker = StopChecker(self.tokenizer, params.stop_strings)
        gens = [self._generation(key, out, checker) for (key, _, _), out in zip(rows, outputs, strict=True)]
        self.stats["server_requests"] += len(rows)
        self.stats["generated_tokens"] += sum(len(g.token_ids) for g in gens)
        return gens

    async def _gather(self, rows: list[tuple[str, list[int], dict[str, Any]]]) -> list[Any]:
        return await asyncio.gather(*[self.client.generate(key, prompt_ids=ids, sampling_params=sp)
                                      for key, ids, sp in rows])

    def _generation(self, key: str, out: Any, checker: StopChecker) -> Generation:
        step = (getattr(out, "extra_fields", None) or {}).get("global_steps")
        if step is None or int(step) != self.version:
            raise VersionError(f"tree {key!r}: the verl server reports weights step {step}; "
                               f"this rollout needs version {self.version}")
        if out.stop_reason == "aborted":
            raise RuntimeError(f"tree {key!r}: the verl server aborted the request (stop_reason 'aborted')")
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None or len(out.log_probs) != len(ids):
            raise ValueError(f"tree {key!r}: log_probs: the server returned "
                             f"{None if out.log_probs is None else len(out.log_probs)} for {len(ids)} tokens")
        return Generation(ids, [float(x) for x in out.log_probs],
                          self.tokenizer.decode(ids, skip_special_tokens=True),
                          finish_reason(ids, self.eos_token_id, checker))

    def sync_weights(self, model_or_state: Any, version: int) -> None:
        """verl moves the weights (its checkpoint manager); the next rows must come from ``version``."""
        self.version = int(version)

    def clear_prefix_cache(self) -> None:
        """The servers' prefix caches are verl's (reset on its weight updates): nothing to drop here."""
