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

It is also a :class:`~tracerl.rollout.independent.RequestStream` (``submit`` / ``poll`` /
``abort``), so the rollout engine schedules episodes independently over it
(``rollout.engine.vllm_scheduling = independent``, tracerl's default): an episode's next turn is
sent as soon as its observation is ready, each request with its own ``max_tokens`` (the row's
remaining budget), and ``poll`` returns the requests that have answered. The rows and seeds are
lockstep's, so the trees are the same (``lockstep`` keeps the batched ``generate``).

A request that raises, is aborted, answers malformed log-probs or takes longer than ``timeout_s``
fails its tree only: the tree's id goes into :attr:`VerlServerPolicy.failed` (with the first line
of why), the row gets a one-token stand-in (EOS, log-prob 0, finish ``eos``) so the episode ends
without another request, and every later row of that tree gets the stand-in at once. The manager
then trains the tree's leaves as zero (:mod:`.leaves`). A server on other weights still stops
the step: that is the run's fault, not one request's.

verl syncs the servers' weights itself (its checkpoint manager, after every step), so
``sync_weights`` only records the version the next rows must come from. ``finish_reason`` is
rebuilt from the tokens (verl reports only ``completed``): ``eos`` when the last token is EOS,
``stop`` when the decoded tail holds a stop string (the check :class:`~tracerl.models.backend.HFPolicy`
makes), else ``length``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
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


POLL_S = 0.01
"""Longest a ``poll`` waits for an answer: the engine loop then collects finished tool calls, whose
episodes' next turns would otherwise wait for the next answer."""


class RequestFailed(RuntimeError):
    """One request's answer cannot be used (aborted, malformed): its tree fails, not the step."""


class VerlServerPolicy:
    """tracerl's policy backend over verl's ``LLMServerClient`` (module docstring).

    Args:
        client: verl's ``LLMServerClient`` (or anything with its async ``generate``).
        tokenizer: the policy's tokenizer (the servers' model's).
        version: the weights step the servers must report (verl's ``global_steps`` of the last
            weight update: ``g - 1`` for a sync trainer's step ``g``).
        timeout_s: seconds a request may take before it fails its tree (None: no limit).
    """

    def __init__(self, client: Any, tokenizer: Any, version: int = 0, timeout_s: float | None = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.version = int(version)
        self.timeout_s = timeout_s
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = int(eos) if eos is not None else None
        self.stats: dict[str, int] = {"generated_tokens": 0, "server_requests": 0, "failed_requests": 0,
                                      "reported_prompt_tokens": 0, "cached_prompt_tokens": 0}
        """Counters; ``cached_prompt_tokens`` sums vLLM's ``num_cached_tokens`` (prefix-cache hits)
        over the requests that report it, whose prompt tokens ``reported_prompt_tokens`` sums."""
        self.failed: dict[str, str] = {}
        """Tree id -> why its first request failed (module docstring); :meth:`take_failed` empties it."""
        self._loop = _Loop()
        self._ids = itertools.count()
        self._flight: dict[str, tuple[tuple[str, list[int], dict[str, Any]], StopChecker, Future[Any]]] = {}
        """Stream requests in flight: request id -> (row, its stop checker, the answer's future)."""
        self._ready: list[tuple[str, Generation]] = []
        """Stream requests answered without a request (their tree has failed)."""
        self._checkers: dict[tuple[str, ...], StopChecker] = {}

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
        sent = [row for row in rows if row[0] not in self.failed]  # a failed tree sends nothing more
        answers = dict(zip((id(row) for row in sent), self._loop.run(self._gather(sent)) if sent else [], strict=True))
        checker = StopChecker(self.tokenizer, params.stop_strings)
        results = [self._answer(row, answers[id(row)], checker) if id(row) in answers else (self._stand_in(), False)
                   for row in rows]
        self.stats["server_requests"] += len(sent)
        self.stats["generated_tokens"] += sum(len(gen.token_ids) for gen, real in results if real)
        return [gen for gen, _ in results]

    # --- RequestStream: one request at a time (independent scheduling) ---------------------------

    def submit(self, prefix: list[int], params: SamplingParams, seed: int | None, routing_key: str | None = None) -> str:
        """Send one request now (``max_tokens`` = ``params.max_new_tokens``, the row's own budget);
        its id. A failed tree's request is answered with the stand-in without reaching a server."""
        if routing_key is None:
            raise ValueError("routing_key: VerlServerPolicy needs the tree id of every request for sticky routing")
        request = str(next(self._ids))
        if routing_key in self.failed:
            self._ready.append((request, self._stand_in()))
            return request
        row = (routing_key, list(prefix), sampling_params(params, seed))
        checker = self._checkers.get(params.stop_strings)
        if checker is None:
            checker = self._checkers[params.stop_strings] = StopChecker(self.tokenizer, params.stop_strings)
        self._flight[request] = (row, checker, asyncio.run_coroutine_threadsafe(self._request(*row), self._loop.loop))
        self.stats["server_requests"] += 1
        return request

    def poll(self) -> list[tuple[str, Generation]]:
        """The requests answered since the last poll (waiting up to :data:`POLL_S` for one), in
        submission order; a failed one answers the stand-in and fails its tree (module docstring)."""
        if not self._ready and self._flight:
            wait([entry[2] for entry in self._flight.values()], timeout=POLL_S, return_when=FIRST_COMPLETED)
        out, self._ready = self._ready, []
        for request in [r for r, entry in self._flight.items() if entry[2].done()]:
            row, checker, future = self._flight.pop(request)
            error = future.exception()
            gen, real = self._answer(row, error if error is not None else future.result(), checker)
            if real:
                self.stats["generated_tokens"] += len(gen.token_ids)
            out.append((request, gen))
        return out

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget ``request_ids`` (their coroutines are cancelled; a server may still finish them)."""
        drop = set(request_ids)
        for request in drop & set(self._flight):
            self._flight.pop(request)[2].cancel()
        self._ready = [(r, gen) for r, gen in self._ready if r not in drop]

    async def _request(self, key: str, ids: list[int], sp: dict[str, Any]) -> Any:
        call = self.client.generate(key, prompt_ids=ids, sampling_params=sp)
        return await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s else call)

    async def _gather(self, rows: list[tuple[str, list[int], dict[str, Any]]]) -> list[Any]:
        return await asyncio.gather(*[self._request(*row) for row in rows], return_exceptions=True)

    def _answer(self, row: tuple[str, list[int], Any], out: Any, checker: StopChecker) -> tuple[Generation, bool]:
        """``(the row's generation, True)``, or ``(the stand-in, False)`` with its tree marked failed."""
        key = row[0]
        if isinstance(out, BaseException) and not isinstance(out, Exception):
            raise out  # cancelled, interrupted: not one request's failure
        try:
            if isinstance(out, Exception):
                raise out
            gen = self._generation(key, out, checker)
            cached = (getattr(out, "extra_fields", None) or {}).get("num_cached_tokens")
            if cached is not None:  # vLLM's prefix-cache hits on this prompt
                self.stats["cached_prompt_tokens"] += int(cached)
                self.stats["reported_prompt_tokens"] += len(row[1])
            return gen, True
        except VersionError:
            raise
        except (asyncio.TimeoutError, TimeoutError):
            self._fail(key, f"no answer within request_timeout_s = {self.timeout_s:g}")
        except Exception as err:  # the client's, the router's or the server's error: this tree's only
            cause = getattr(err, "cause", None)  # Ray's RayTaskError wraps the server's own exception
            err = cause if isinstance(cause, Exception) else err
            self._fail(key, f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}")
        return self._stand_in(), False

    def _fail(self, key: str, why: str) -> None:
        self.failed.setdefault(key, why)
        self.stats["failed_requests"] += 1

    def _stand_in(self) -> Generation:
        """One EOS token (log-prob 0): ends the failed tree's episode; its leaves train as zero."""
        return Generation([self.eos_token_id if self.eos_token_id is not None else 0], [0.0], "", "eos")

    def take_failed(self) -> dict[str, str]:
        """The failed trees since the last call (tree id -> why), forgotten here."""
        out, self.failed = self.failed, {}
        return out

    def _generation(self, key: str, out: Any, checker: StopChecker) -> Generation:
        step = (getattr(out, "extra_fields", None) or {}).get("global_steps")
        if step is None or int(step) != self.version:
            raise VersionError(f"tree {key!r}: the verl server reports weights step {step}; "
                               f"this rollout needs version {self.version}")
        if out.stop_reason == "aborted":
            raise RequestFailed(f"tree {key!r}: the verl server aborted the request (stop_reason 'aborted')")
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None or len(out.log_probs) != len(ids):
            raise RequestFailed(f"tree {key!r}: log_probs: the server returned "
                                f"{None if out.log_probs is None else len(out.log_probs)} for {len(ids)} tokens")
        return Generation(ids, [float(x) for x in out.log_probs],
                          self.tokenizer.decode(ids, skip_special_tokens=True),
                          finish_reason(ids, self.eos_token_id, checker))

    def sync_weights(self, model_or_state: Any, version: int) -> None:
        """verl moves the weights (its checkpoint manager); the next rows must come from ``version``."""
        self.version = int(version)

    def clear_prefix_cache(self) -> None:
        """The servers' prefix caches are verl's (reset on its weight updates): nothing to drop here."""
