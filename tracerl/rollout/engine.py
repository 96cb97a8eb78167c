"""Batched multi-turn rollouts with tree branching (issue 4 item 2; spec sections 1 and 3).

Every live episode advances one turn per batched ``backend.generate`` call: the assistant
turn is sampled (its tokens are the loss mask's True entries, with sampling-time log-probs),
parsed by the agent format, stepped in the environment, and the rendered observation is
appended as forced tokens. Every prefix is a :class:`~tracerl.core.types.RolloutTree` node;
finished episodes are attached as leaves.

Branching: the engine remembers, per tree it produced, a clone of the environment episode at
every open boundary (the root and each node after an observation). ``expand`` resumes ``n``
continuations from such a node with the stored prefix token ids (never regenerated, so shared
prefix tokens are identical by construction) and a fresh clone of the stored episode. What is
reused at the model level is the backend's business: :class:`~tracerl.models.backend.HFPolicy`
prefills identical prefixes of one call once and repeats their KV-cache rows.

Cost (spec section 1): each new chain and each branch continuation is one rollout; generated
tokens count only tokens sampled in the call (reused prefix tokens are not counted).
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.core.types import RolloutTree, Task, Trajectory, Turn
from tracerl.envs.base import DEFAULT_MAX_OBSERVATION_TOKENS, DEFAULT_MAX_TURNS
from tracerl.models.backend import Generation, PolicyBackend, SamplingParams

Verifier = Callable[[str, Task], float]


@dataclass(frozen=True)
class EngineConfig:
    """Limits and sampling of one rollout engine.

    ``max_turns`` and ``max_observation_tokens`` are THE episode limits: training, evaluation and
    benchmarks build their environments from them with :func:`~tracerl.envs.base.env_config` /
    :func:`~tracerl.envs.search.search_environment`, so every path cuts episodes and
    observations alike.
    """

    max_turns: int = DEFAULT_MAX_TURNS
    """Assistant turns per episode (tool calls, invalid outputs and the answer)."""
    max_turn_tokens: int = 128
    """Tokens one assistant turn may generate."""
    max_total_tokens: int = 2048
    """Prompt + all turns; an episode that reaches it ends without an answer (reward 0)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer must use the same one for its log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_observation_tokens: int = DEFAULT_MAX_OBSERVATION_TOKENS
    """Forced tokens (policy tokenizer) after one assistant turn, markup included; a longer
    observation's text is cut at a word boundary and marked with ' ...'."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_total_tokens", "max_observation_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature >= 0:
            raise ValueError(f"EngineConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"EngineConfig.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class RolloutCost:
    """Sampling cost (spec section 1): continuation rollouts and policy-generated tokens."""

    rollouts: int = 0
    generated_tokens: int = 0

    def __add__(self, other: RolloutCost) -> RolloutCost:
        return RolloutCost(self.rollouts + other.rollouts, self.generated_tokens + other.generated_tokens)


@dataclass
class _TreeState:
    """What expand() needs for a tree: its task and an episode snapshot per open boundary."""

    tree: weakref.ref[RolloutTree]
    task: Task
    episodes: dict[int, Any] = field(default_factory=dict)


@dataclass
class _Live:
    """One running episode: where it sits in its tree and its full token prefix."""

    tree: RolloutTree
    state: _TreeState
    node: int
    episode: Any
    ids: list[int]
    turns: list[Turn]


class RolloutEngine:
    """Runs episodes of ``env`` with ``backend`` in the agent format ``fmt``; rewards from ``verifier``."""

    def __init__(
        self, backend: PolicyBackend, env: Any, fmt: Any, verifier: Verifier, config: EngineConfig
    ) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.env = env
        self.tools = getattr(env, "tools", None)
        self.fmt = fmt
        self.verifier = verifier
        self.config = config
        self._states: dict[int, _TreeState] = {}
        self._ids = itertools.count()

    # --- public API ------------------------------------------------------------------------

    def rollout(
        self,
        tasks: list[Task],
        n: list[int],
        tree_ids: list[str] | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[list[RolloutTree], RolloutCost]:
        """One tree per task holding ``n[i]`` independent chains, all advanced together."""
        if len(n) != len(tasks):
            raise ValueError(f"n has {len(n)} entries for {len(tasks)} tasks")
        if any(k < 0 for k in n):
            raise ValueError(f"n must be >= 0 per task, got {n}")
        if tree_ids is not None and len(tree_ids) != len(tasks):
            raise ValueError(f"tree_ids has {len(tree_ids)} entries for {len(tasks)} tasks")
        trees, lives = [], []
        for i, task in enumerate(tasks):
            tree_id = tree_ids[i] if tree_ids is not None else f"{task.id}#{next(self._ids)}"
            tree, state = self._new_tree(task, tree_id)
            trees.append(tree)
            for _ in range(n[i]):
                lives.append(_Live(tree, state, 0, state.episodes[0].clone(), list(tree.prompt_ids), []))
        generated = self._run(lives, generator)
        return trees, RolloutCost(rollouts=sum(n), generated_tokens=generated)

    def expand(
        self, requests: list[tuple[RolloutTree, int, int]], generator: torch.Generator | None = None
    ) -> RolloutCost:
        """Resume ``k`` continuations from each ``(tree, node_id, k)``; new leaves join the trees."""
        lives = []
        for tree, node_id, k in requests:
            if k < 0:
                raise ValueError(f"continuations must be >= 0, got {k} for node {node_id}")
            state = self._expandable(tree, node_id)
            path = tree.path(node_id)
            turns = [tree.nodes[i].turn for i in path[1:]]
            prefix = tree.prefix_ids(node_id)
            for _ in range(k):
                episode = state.episodes[node_id].clone()
                lives.append(_Live(tree, state, node_id, episode, list(prefix), list(turns)))  # type: ignore[arg-type]
        generated = self._run(lives, generator)
        return RolloutCost(rollouts=len(lives), generated_tokens=generated)

    def prompt_ids(self, task: Task) -> list[int]:
        """Token ids of ``task``'s prompt ``S_0`` as this engine's trees start with them."""
        return self.fmt.prompt_ids(task, self.tools, self.tokenizer)

    def can_expand(self, tree: RolloutTree, node_id: int) -> bool:
        """Whether ``expand`` accepts this node (an open boundary of a tree this engine made)."""
        try:
            self._expandable(tree, node_id)
        except ValueError:
            return False
        return True

    def forget(self, trees: list[RolloutTree]) -> None:
        """Drop the stored episode snapshots of ``trees`` (they are also dropped when a tree is freed)."""
        for tree in trees:
            self._states.pop(id(tree), None)

    # --- tree bookkeeping --------------------------------------------------------------------

    def _new_tree(self, task: Task, tree_id: str) -> tuple[RolloutTree, _TreeState]:
        prompt_ids = self.prompt_ids(task)
        if len(prompt_ids) >= self.config.max_total_tokens:
            raise ValueError(
                f"task {task.id!r}: prompt has {len(prompt_ids)} tokens, max_total_tokens is "
                f"{self.config.max_total_tokens}"
            )
        tree = RolloutTree(tree_id=tree_id, task_id=task.id, prompt_ids=prompt_ids)
        state = _TreeState(tree=weakref.ref(tree), task=task)
        state.episodes[0] = self.env.start(task)
        key = id(tree)
        self._states[key] = state
        weakref.finalize(tree, self._states.pop, key, None)
        return tree, state

    def _expandable(self, tree: RolloutTree, node_id: int) -> _TreeState:
        state = self._states.get(id(tree))
        if state is None or state.tree() is not tree:
            raise ValueError(f"tree {tree.tree_id!r} was not produced by this engine (or was forgotten)")
        if not 0 <= node_id < len(tree.nodes):
            raise ValueError(f"tree {tree.tree_id!r} has no node {node_id}")
        node = tree.nodes[node_id]
        if not node.is_boundary:
            raise ValueError(f"node {node_id} of {tree.tree_id!r} is not a boundary (it ends in an answer)")
        if node.is_leaf or node_id not in state.episodes:
            raise ValueError(
                f"node {node_id} of {tree.tree_id!r} ended its episode (answer, turn/token limit or "
                "infrastructure failure); no turns remain to branch"
            )
        return state

    # --- the turn loop -----------------------------------------------------------------------

    def _run(self, lives: list[_Live], generator: torch.Generator | None) -> int:
        """Advance every live episode a turn per batched call until all end; returns tokens generated."""
        generated = 0
        cfg = self.config
        while lives:
            budgets = [min(cfg.max_turn_tokens, cfg.max_total_tokens - len(lv.ids)) for lv in lives]
            params = SamplingParams(
                max_new_tokens=max(budgets),
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                stop_strings=tuple(self.fmt.stop_strings),
            )
            gens = self.backend.generate([lv.ids for lv in lives], params, generator)
            still = []
            for live, gen, budget in zip(lives, gens, budgets):
                gen = self._fit(gen, budget)
                generated += len(gen.token_ids)
                if self._step(live, gen):
                    still.append(live)
            lives = still
        return generated

    def _fit(self, gen: Generation, budget: int) -> Generation:
        """Cut a generation to this episode's own token budget (the batch shares one cap)."""
        if len(gen.token_ids) <= budget:
            return gen
        ids = gen.token_ids[:budget]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids, gen.logprobs[:budget], text, "length")

    def _step(self, live: _Live, gen: Generation) -> bool:
        """Apply one generated turn; returns whether the episode goes on."""
        action = self.fmt.parse(gen.text, self.tools)
        obs = live.episode.step(action)
        if action.kind == "answer":
            turn = Turn(list(gen.token_ids), [], gen.text, action, logprobs=list(gen.logprobs))
            reward = 0.0 if obs.infra_failed else float(self.verifier(action.answer, live.state.task))
            self._finish(live, turn, reward, action.answer, obs.infra_failed)
            return False
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
            self._finish(live, turn, 0.0, None, obs.infra_failed)
            return False
        live.node = live.tree.add_child(live.node, turn)
        live.turns.append(turn)
        live.ids += turn.assistant_ids + turn.observation_ids
        live.state.episodes[live.node] = live.episode.clone()
        return True

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
