"""Independent scheduling: one request per live episode, continuous batching across turns.

In lockstep (``RolloutEngine._run``'s own loop) every live episode samples its turn ``t`` in one
batched call, and no episode starts turn ``t + 1`` before the slowest of turn ``t`` has finished
(the longest generation, the slowest tool). With a backend that takes requests one at a time and
is stepped by the caller (:class:`RequestStream`: ``VLLMPolicy`` over vLLM's engine),
:func:`run_independent` instead submits an episode's next turn the moment its observation is
ready and steps the engine continuously, so episodes at different turns share engine steps (the
serving engine's continuous batching) and the batch stays full until the last episodes end.

Tools run as each request finishes, on the engine's bounded pool (:class:`~tracerl.rollout.tool_calls.ToolRunner`,
``tool_concurrency`` calls in flight) so a slow tool call does not stall the other episodes; the engine is stepped while tools run and
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

A batch backend (``HFPolicy``: one ``generate`` call per batch) runs this schedule through
:class:`BatchStream` (``rollout.engine.hf_scheduling = independent``): each ``poll`` generates every
request submitted since the last one in one batched call, so the episodes whose observations have
arrived generate together while the others' tools are still in flight.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
import dataclasses
import itertools
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tracerl.models.backend import Generation, SamplingParams
from tracerl.rollout.progress import current_progress
from tracerl.rollout.tool_calls import ToolRunner
from tracerl.rollout.turns import TurnSteps, _Live, _Outcome


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
                    stream: RequestStream | None = None) -> int:
    """Run ``lives`` to their ends through ``stream`` (default: ``engine.backend``, a
    :class:`RequestStream`), one request per live episode; join their turns to the trees in
    lockstep order. Returns the tokens generated. ``engine`` is the
    :class:`~tracerl.rollout.engine.RolloutEngine` (its per-turn steps, config and backend)."""
    source: Any = stream if stream is not None else engine.backend
    run = _Run(engine, lives, stats if stats is not None else ScheduleStats(), source)
    runner = ToolRunner(engine.config.tool_concurrency)
    try:
        run.loop(runner)
    except BaseException:
        source.abort(list(run.requests))
        runner.close(failed=True)
        raise
    runner.close()
    run.commit()
    return run.generated


class BatchStream:
    """A :class:`RequestStream` over a batch backend (``generate`` with per-row seeds): ``poll``
    generates every request queued since the last poll in one batched call (sampling parameters of
    the first, the largest budget; the engine cuts each row to its own budget, as lockstep does)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self._queue: list[tuple[str, list[int], SamplingParams, int | None, str | None]] = []
        self._ids = itertools.count()
        self.calls = 0
        """Batched ``generate`` calls made (one per poll with requests)."""

    def submit(self, prefix: list[int], params: SamplingParams, seed: int | None, routing_key: str | None = None) -> str:
        request = str(next(self._ids))
        self._queue.append((request, list(prefix), params, seed, routing_key))
        return request

    def poll(self) -> list[tuple[str, Generation]]:
        queue, self._queue = self._queue, []
        if not queue:
            return []
        params = dataclasses.replace(queue[0][2], max_new_tokens=max(q[2].max_new_tokens for q in queue))
        gens = self.backend.generate([q[1] for q in queue], params, [q[3] for q in queue],
                                     routing_keys=[q[4] for q in queue])
        self.calls += 1
        return [(q[0], gen) for q, gen in zip(queue, gens, strict=True)]

    def abort(self, request_ids: Sequence[str]) -> None:
        drop = set(request_ids)
        self._queue = [q for q in self._queue if q[0] not in drop]


class _Run:
    """The state of one :func:`run_independent` call."""

    def __init__(self, engine: TurnSteps, lives: list[_Live], stats: ScheduleStats, stream: Any) -> None:
        self.engine, self.lives, self.stats, self.stream = engine, lives, stats, stream
        self.states: dict[int, Any] = {}
        """Per episode, the hidden state its current turn started from (joined with the turn's outcome)."""
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
        request = self.stream.submit(prefix, self.engine._params(budget), seed,
                                             routing_key=self.lives[i].tree.tree_id)
        self.requests[request] = (i, budget)
        self.rounds[i] += 1
        self.stats.requests += 1

    def loop(self, runner: ToolRunner) -> None:
        """Step the engine while requests are in flight; between steps, collect finished tool
        calls and submit those episodes' next turns. Block on tools only when the engine is idle."""
        for i in range(len(self.lives)):
            self.submit(i)
        while self.requests or self.tools:
            if self.requests:
                clock = time.perf_counter()
                started = self._step_engine(runner)
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

    def _step_engine(self, runner: ToolRunner) -> list[Future[Any]]:
        """One engine step; parse what it finished and start those tool calls (returned)."""
        started = []
        rounds = {self.rounds[i] for i, _ in self.requests.values()}
        self.stats.engine_steps += 1
        self.stats.mixed_turn_steps += len(rounds) > 1
        for request, gen in self.stream.poll():
            i, budget = self.requests.pop(request)
            if gen.state is not None:
                self.states.setdefault(i, gen.state)  # the turn's first state (lockstep keeps the first)
            gen = self.engine._fit(gen, budget)
            self.generated += len(gen.token_ids)
            current_progress().generated(len(gen.token_ids))
            turn = self.engine._join(self.lives[i], gen)
            if turn is None:  # a stop that did not end the turn: sample on from the partial turn
                self.submit(i)
                continue
            gen = turn
            action = self.engine.fmt.parse(gen.text, self.engine.tools)
            future = runner.submit(self.lives[i].episode, action)
            if runner.concurrency == 0 or action.kind != "tool":  # stepped inline: no tool, or tools run serially
                self._observe(i, gen, action, future.result())
            else:
                started.append(future)
                self.tools[future] = (i, gen, action)
        return started

    def _observe(self, i: int, gen: Generation, action: Any, obs: Any) -> None:
        outcome = self.engine._observe(self.lives[i], gen, action, obs)
        outcome.state = self.states.pop(i, None)
        self.outcomes.append((self.rounds[i], i, outcome))
        if not outcome.ended:
            self.submit(i)

    def commit(self) -> None:
        """Join every episode's turns to its tree in lockstep order: what round ``r`` finished,
        in request order, before anything of round ``r + 1`` (lockstep's generate call ``r``)."""
        for _, i, outcome in sorted(self.outcomes, key=lambda o: o[:2]):
            self.engine._commit(self.lives[i], outcome)
