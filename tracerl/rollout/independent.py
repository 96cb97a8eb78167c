"""Independent scheduling: one request per live episode, continuous batching across turns.

In lockstep (``RolloutEngine._run``'s own loop) every live episode samples its turn ``t`` in one
batched call, and no episode starts turn ``t + 1`` before the slowest of turn ``t`` has finished
(the longest generation, the slowest tool). With a backend that takes requests one at a time and
is stepped by the caller (:class:`RequestStream`: ``VLLMPolicy`` over vLLM's engine),
:func:`run_independent` instead submits an episode's next turn the moment its observation is
ready and steps the engine continuously, so episodes at different turns share engine steps (the
serving engine's continuous batching) and the batch stays full until the last episodes end.

Tools run on the driver as each request finishes, in a small thread pool (``tool_threads``) so a
slow tool call does not stall the other episodes; the engine is stepped while tools run and
their results are picked up between steps (after each step the calls it started get up to one
step's time to return, so a fast tool's episode rejoins the very next step). Parsing and observation rendering (the tokenizer)
stay on the driver's thread.

Same trajectories as lockstep: a turn's request is the row lockstep would send
(``RolloutEngine._row``: prefix, the episode's own token budget, seed ``derive_seed(episode
seed, turn[, segment])``; a stop the format rejects resubmits the partial turn, as lockstep's
next call would), so what it samples does not depend on when or beside what it
ran (up to the backend's batch invariance, measured in ``tests/vllm_backend``). The tree is
built after the call, in lockstep order (turn round, then request order): node ids, and the
seeds later branches derive from them, are those of the lockstep schedule.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tracerl.models.backend import Generation, SamplingParams
from tracerl.rollout.turns import TurnSteps, _Live, _Outcome

TOOL_THREADS = 4
"""Tool calls in flight at once (0 runs each tool inline on the driver's thread)."""


@runtime_checkable
class RequestStream(Protocol):
    """A backend that takes one generation request at a time and is stepped by its caller."""

    def submit(self, prefix: list[int], params: SamplingParams, seed: int | None, routing_key: str | None = None) -> str:
        """Queue one request (``prefix`` ids, at most ``params.max_new_tokens``); returns its id.
        ``routing_key`` is the request's tree id (sticky routing: a tree's branches share one cache)."""
        ...

    def poll(self) -> list[tuple[str, Generation]]:
        """Run one engine step; returns the requests it finished, as ``(request id, generation)``."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop unfinished requests (after an error, so the engine is left idle)."""
        ...


def streams_requests(backend: Any) -> bool:
    """Whether ``backend`` implements :class:`RequestStream` (``VLLMPolicy`` does, ``HFPolicy`` not)."""
    return isinstance(backend, RequestStream)


@dataclass
class ScheduleStats:
    """What independent scheduling did (summed over calls): requests submitted, engine steps,
    and steps whose in-flight requests were at different turn rounds (continuous batching across
    turns; always 0 in lockstep)."""

    requests: int = 0
    engine_steps: int = 0
    mixed_turn_steps: int = 0


def run_independent(engine: TurnSteps, lives: list[_Live], stats: ScheduleStats | None = None,
                    tool_threads: int = TOOL_THREADS) -> int:
    """Run ``lives`` to their ends through ``engine.backend`` (a :class:`RequestStream`), one
    request per live episode; join their turns to the trees in lockstep order. Returns the tokens
    generated. ``engine`` is the :class:`~tracerl.rollout.engine.RolloutEngine` (its per-turn steps
    and its backend)."""
    run = _Run(engine, lives, stats if stats is not None else ScheduleStats())
    pool = ThreadPoolExecutor(tool_threads, thread_name_prefix="tracerl-tool") if tool_threads > 0 else None
    try:
        run.loop(pool)
    except BaseException:
        engine.backend.abort(list(run.requests))
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    run.commit()
    return run.generated


class _Run:
    """The state of one :func:`run_independent` call."""

    def __init__(self, engine: TurnSteps, lives: list[_Live], stats: ScheduleStats) -> None:
        self.engine, self.lives, self.stats = engine, lives, stats
        self.rounds = [0] * len(lives)
        """Per episode, the requests it has made (its lockstep round)."""
        self.outcomes: list[tuple[int, int, _Outcome]] = []
        """Applied turns as ``(round, episode index, outcome)`` (joined to the trees by :meth:`commit`)."""
        self.requests: dict[str, tuple[int, int]] = {}
        """In flight: request id -> (episode index, token budget)."""
        self.tools: dict[Future[Any], tuple[int, Generation, Any]] = {}
        """Tool calls in flight: future -> (episode index, generation, parsed action)."""
        self.generated = 0

    def submit(self, i: int) -> None:
        prefix, budget, seed = self.engine._row(self.lives[i])
        request = self.engine.backend.submit(prefix, self.engine._params(budget), seed,
                                             routing_key=self.lives[i].tree.tree_id)
        self.requests[request] = (i, budget)
        self.rounds[i] += 1
        self.stats.requests += 1

    def loop(self, pool: ThreadPoolExecutor | None) -> None:
        """Step the engine while requests are in flight; between steps, collect finished tool
        calls and submit those episodes' next turns. Block on tools only when the engine is idle."""
        for i in range(len(self.lives)):
            self.submit(i)
        while self.requests or self.tools:
            if self.requests:
                clock = time.perf_counter()
                started = self._step_engine(pool)
                # Give the calls just started up to one engine step to return: a fast tool (a
                # local search: well under a step) then joins the very next step instead of
                # the one after, and a slow one costs at most a step once.
                wait(started, timeout=time.perf_counter() - clock)
                done = [f for f in self.tools if f.done()]
            else:
                done = list(wait(self.tools, return_when=FIRST_COMPLETED)[0])
            for future in sorted(done, key=lambda f: self.tools[f][0]):  # episode order: reproducible submits
                i, gen, action = self.tools.pop(future)
                self._observe(i, gen, action, future.result())

    def _step_engine(self, pool: ThreadPoolExecutor | None) -> list[Future[Any]]:
        """One engine step; parse what it finished and start those tool calls (returned)."""
        started = []
        rounds = {self.rounds[i] for i, _ in self.requests.values()}
        self.stats.engine_steps += 1
        self.stats.mixed_turn_steps += len(rounds) > 1
        for request, gen in self.engine.backend.poll():
            i, budget = self.requests.pop(request)
            gen = self.engine._fit(gen, budget)
            self.generated += len(gen.token_ids)
            turn = self.engine._join(self.lives[i], gen)
            if turn is None:  # a stop that did not end the turn: sample on from the partial turn
                self.submit(i)
                continue
            gen = turn
            action = self.engine.fmt.parse(gen.text, self.engine.tools)
            episode = self.lives[i].episode
            if pool is None:
                self._observe(i, gen, action, episode.step(action))
            else:
                started.append(pool.submit(episode.step, action))
                self.tools[started[-1]] = (i, gen, action)
        return started

    def _observe(self, i: int, gen: Generation, action: Any, obs: Any) -> None:
        outcome = self.engine._observe(self.lives[i], gen, action, obs)
        self.outcomes.append((self.rounds[i], i, outcome))
        if not outcome.ended:
            self.submit(i)

    def commit(self) -> None:
        """Join every episode's turns to its tree in lockstep order: what round ``r`` finished,
        in request order, before anything of round ``r + 1`` (lockstep's generate call ``r``)."""
        for _, i, outcome in sorted(self.outcomes, key=lambda o: o[:2]):
            self.engine._commit(self.lives[i], outcome)
