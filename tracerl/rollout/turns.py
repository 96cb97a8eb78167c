"""One turn of one episode: the state a running episode carries and the per-turn steps.

:class:`~tracerl.rollout.engine.RolloutEngine` drives the turn loop (lockstep here,
independent scheduling in :mod:`tracerl.rollout.independent`); what happens to one episode in
one turn lives here, shared by both schedules:

- :class:`_Live` (a running episode), :class:`_TreeState` (what ``expand`` needs of a tree) and
  :class:`_Outcome` (an applied turn before it joins its tree);
- :class:`TurnSteps`, the engine's per-turn methods: the generate row and its seed
  (:func:`_turn_seed`), the turn's token room, fitting a generation to the episode's own budget,
  joining the segments of a turn a stop did not end, applying the turn (observation fitting to
  ``max_observation_tokens`` and the room under ``max_total_tokens``) and joining it to the tree
  (the environment's step, the tool call, runs between the two, on the engine's tool runner:
  :mod:`tracerl.rollout.tool_calls`);
- :func:`_keep_state`: the policy's hidden state kept at the node a turn started from.

See :mod:`tracerl.rollout.engine` for seeds and segments, and
:class:`~tracerl.rollout.engine_config.EngineConfig` for the limits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracerl.core.types import RolloutTree, Task, Trajectory, Turn
from tracerl.envs.verifiers import Verifier
from tracerl.models.backend import Generation, PolicyBackend, SamplingParams
from tracerl.core.seeds import derive_seed
from tracerl.rollout.engine_config import EngineConfig
from tracerl.rollout.progress import current_progress


@dataclass
class _TreeState:
    """What expand() needs for a tree: the tree, its task, an episode snapshot per open boundary
    and, per node, how many continuations were started from it (the next branch index)."""

    tree: RolloutTree
    task: Task
    episodes: dict[int, Any] = field(default_factory=dict)
    branches: dict[int, int] = field(default_factory=dict)

    def next_branches(self, node_id: int, k: int, first: int | None = None) -> range:
        """Branch indices of ``k`` new continuations of ``node_id``: from ``first`` (the driver's
        count, so any executor numbers them alike) or, when None, from this tree's own count."""
        start = self.branches.get(node_id, 0) if first is None else int(first)
        self.branches[node_id] = max(self.branches.get(node_id, 0), start + k)
        return range(start, start + k)


@dataclass
class _Live:
    """One running episode: where it sits in its tree and its full token prefix."""

    tree: RolloutTree
    state: _TreeState
    node: int
    episode: Any
    ids: list[int]
    turns: list[Turn]
    seed: int = 0
    """The episode's seed; its turn ``t`` samples with ``derive_seed(seed, t)``."""
    partial: Generation | None = None
    """The current turn so far, when a stop string did not end it (``fmt.ends_turn`` said no)."""
    segments: int = 0
    """How many such partial pieces the current turn has (its next piece's seed tells them apart)."""


@dataclass
class _Outcome:
    """One applied turn, before it joins the tree (:meth:`TurnSteps._commit`)."""

    turn: Turn
    ended: bool
    reward: float = 0.0
    answer: str | None = None
    infra: bool = False
    snapshot: Any = None
    """The episode cloned at the new boundary (when the episode goes on)."""
    state: Any = None
    """The policy's hidden state at the node the turn started from (independent scheduling keeps
    it here until the turn joins the tree, where :func:`_keep_state` would have put it)."""


class TurnSteps:
    """The per-turn steps of :class:`~tracerl.rollout.engine.RolloutEngine` (its base class).

    Uses the engine's ``config``, ``tokenizer``, ``fmt``, ``tools`` and ``verifier``; the lockstep
    loop (``RolloutEngine._run``) and :func:`~tracerl.rollout.independent.run_independent` call
    these same methods, so both schedules build the same turns (the latter also drives the
    engine's ``backend``, declared here so it can take any ``TurnSteps``).
    """

    backend: PolicyBackend
    config: EngineConfig
    tokenizer: Any
    fmt: Any
    tools: Any
    verifier: Verifier

    def _row(self, live: _Live) -> tuple[list[int], int, int]:
        """``live``'s next generate row: ``(prefix ids, token budget, seed)`` (both schedules).

        A turn that samples on after a stop that did not end it continues from its partial turn,
        seeded ``(episode seed, turn, segment)``."""
        prefix = live.ids + (live.partial.token_ids if live.partial else [])
        return prefix, self._turn_room(live), _turn_seed(live)

    def _params(self, max_new_tokens: int) -> SamplingParams:
        cfg = self.config
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            stop_strings=tuple(self.fmt.turn_stops(self.tools)),
        )

    def _turn_room(self, live: _Live) -> int:
        """Tokens the episode's current turn may still sample (turn cap and total cap)."""
        cfg = self.config
        done = len(live.partial.token_ids) if live.partial else 0
        return min(cfg.max_turn_tokens, cfg.max_total_tokens - len(live.ids)) - done

    def _join(self, live: _Live, gen: Generation) -> Generation | None:
        """The whole turn once ``gen`` ends it, else None (kept as ``live.partial`` to sample on).

        A stop ends the turn when the format says the text completes it, or when no room is left.
        Joined pieces keep every sampled token and log-prob; the text is decoded from the ids as
        a backend does (special tokens dropped).
        """
        part = live.partial
        if part is not None:
            ids = part.token_ids + gen.token_ids
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            gen = Generation(ids, part.logprobs + gen.logprobs, text, gen.finish_reason)
        live.partial = None
        if gen.finish_reason == "stop" and self._turn_room(live) > len(gen.token_ids):
            if not self.fmt.ends_turn(self.tokenizer.decode(gen.token_ids, skip_special_tokens=False)):
                live.partial, live.segments = gen, live.segments + 1
                return None
        live.segments = 0
        return gen

    def _fit(self, gen: Generation, budget: int) -> Generation:
        """Cut a generation to this episode's own token budget (the batch shares one cap)."""
        if len(gen.token_ids) <= budget:
            return gen
        ids = gen.token_ids[:budget]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids, gen.logprobs[:budget], text, "length")

    def _observe(self, live: _Live, gen: Generation, action: Any, obs: Any) -> _Outcome:
        """The turn ``gen`` made (``action``, answered by ``obs``), applied to ``live``'s own
        record (turns, ids) but not yet to its tree, which :meth:`_commit` does."""
        if action.kind == "answer":
            turn = Turn(list(gen.token_ids), [], gen.text, action, logprobs=list(gen.logprobs))
            reward = 0.0 if obs.infra_failed else float(self.verifier(action.answer, live.state.task))
            return _Outcome(turn, True, reward, action.answer, obs.infra_failed)
        room = self.config.max_total_tokens - len(live.ids) - len(gen.token_ids)
        obs_ids = self._observation_ids(obs, gen.token_ids, min(self.config.max_observation_tokens, room))
        turn = Turn(
            list(gen.token_ids), obs_ids, gen.text, action,
            observation=obs.text, tool_error=obs.error, logprobs=list(gen.logprobs),
        )
        ended = (
            obs.done
            or obs.infra_failed
            or len(live.turns) + 1 >= self.config.max_turns
            or len(live.ids) + len(gen.token_ids) + len(obs_ids) >= self.config.max_total_tokens
        )
        if ended:
            return _Outcome(turn, True, 0.0, None, obs.infra_failed)
        live.turns.append(turn)
        live.ids += turn.assistant_ids + turn.observation_ids
        return _Outcome(turn, False, snapshot=live.episode.clone())

    def _commit(self, live: _Live, outcome: _Outcome) -> None:
        """Join ``outcome``'s turn to the tree (a new boundary, or a leaf when the episode ended)."""
        node = live.tree.nodes[live.node]
        if outcome.state is not None and node.hidden is None:
            node.hidden = outcome.state
        if outcome.ended:
            self._finish(live, outcome.turn, outcome.reward, outcome.answer, outcome.infra)
            return
        live.node = live.tree.add_child(live.node, outcome.turn)
        live.state.episodes[live.node] = outcome.snapshot

    def _finish(self, live: _Live, turn: Turn, reward: float, answer: str | None, infra: bool) -> None:
        leaf = live.tree.add_child(live.node, turn)
        trajectory = Trajectory(
            task_id=live.state.task.id,
            group_id=live.tree.tree_id,
            prompt_ids=list(live.tree.prompt_ids),
            turns=live.turns + [turn],
            answer=answer,
            reward=reward,
            infra_failed=infra,
        )
        live.tree.add_leaf(leaf, trajectory)
        current_progress().rollout_finished()

    def _observation_ids(self, obs: Any, sampled: list[int], limit: int) -> list[int]:
        """Forced tokens after a turn that sampled ``sampled``, cut by words to ``limit`` tokens.

        ``limit`` is ``max_observation_tokens`` or the room left under ``max_total_tokens``,
        so a trajectory never exceeds ``max_total_tokens``. The format decides the tokens (a
        chat template may also force the end of the assistant turn the policy did not write).
        """
        if limit <= 0:
            return []
        ids = self.fmt.observation_ids(obs, sampled, self.tokenizer)
        if len(ids) <= limit:
            return ids
        words = obs.text.split()
        lo, hi, best = 0, len(words) - 1, None
        while lo <= hi:  # the longest word prefix whose rendering fits
            mid = (lo + hi) // 2
            cut = dataclasses.replace(obs, text=" ".join(words[:mid] + ["..."]))
            cand = self.fmt.observation_ids(cut, sampled, self.tokenizer)
            if len(cand) <= limit:
                best, lo = cand, mid + 1
            else:
                hi = mid - 1
        return best if best is not None else ids[:limit]


def _turn_seed(live: _Live) -> int:
    """Seed of the episode's next generate row: ``(seed, turn)``, plus the segment when the turn
    samples on after a stop that did not end it (a fresh stream for the rest of the turn)."""
    if live.segments:
        return derive_seed(live.seed, len(live.turns), live.segments)
    return derive_seed(live.seed, len(live.turns))


def _keep_state(live: _Live, gen: Generation) -> None:
    """Store the policy's hidden state at the node the turn started from (the success predictor's
    ``hidden`` input), when the backend recorded one; a node keeps the first state it got."""
    node = live.tree.nodes[live.node]
    if gen.state is not None and node.hidden is None:
        node.hidden = gen.state
