"""Batched multi-turn rollouts with tree branching (issue 4 item 2; spec sections 1 and 3).

Every live episode advances one turn per batched ``backend.generate`` call: the assistant
turn is sampled (its tokens are the loss mask's True entries, with sampling-time log-probs),
parsed by the agent format, stepped in the environment, and the rendered observation is
appended as forced tokens. Every prefix is a :class:`~tracerl.core.types.RolloutTree` node;
finished episodes are attached as leaves.

Trees are addressed by ``tree_id`` (unique among the trees an engine holds; starting a tree
with an id it already holds replaces the old one). The engine keeps each tree it produced,
with its task and environment snapshots, until :meth:`RolloutEngine.forget`, so a request
``(tree_id, node_id, k)`` works whoever holds a copy of the tree (see
:mod:`tracerl.rollout.executor`).

Seeds: every episode (a chain, or one continuation of a branch) has its own seed, derived from
the call's seed, its tree id, the node it starts from and its branch index there (the count of
continuations started from that node before it, in request order), and each turn's generate
row is seeded with ``(episode seed, turn index)`` (``(episode seed, turn index, segment)`` for
a turn that samples on after a stop that did not end it, see below). With a backend that
honours per-row seeds (:class:`~tracerl.models.backend.HFPolicy` does) a trajectory therefore
does not depend on the batch it ran in.

Scheduling: with a backend that takes one request at a time
(:class:`~tracerl.rollout.independent.RequestStream`: ``VLLMPolicy``) episodes advance
independently by default (``vllm_scheduling``; :func:`~tracerl.rollout.independent.run_independent`:
a live episode's next turn is submitted the moment its observation is ready, so episodes at different
turns share engine steps); a batch backend (``HFPolicy``) advances the live episodes one turn per
batched ``generate`` call by default (lockstep turns, :meth:`RolloutEngine._run`), or independently
through :class:`~tracerl.rollout.independent.BatchStream` with ``hf_scheduling = independent``.
Tool calls of different episodes run concurrently either way (``tool_concurrency`` in flight, on a
:class:`~tracerl.rollout.tool_calls.ToolRunner`; 0: one at a time, the serial path). An
episode's rows come from :meth:`RolloutEngine._row`, its turns are applied with
:meth:`RolloutEngine._observe` and joined to its tree with :meth:`RolloutEngine._commit` (the
per-turn steps, in :mod:`tracerl.rollout.turns`) in lockstep order (generate round, then request
order), never in the order tools finish, so the trees are the same, node ids included, whatever the
schedule and the tool concurrency.

Branching: the engine remembers, per tree it produced, a clone of the environment episode at
every open boundary (the root and each node after an observation). ``expand`` resumes ``n``
continuations from such a node with the stored prefix token ids (never regenerated, so shared
prefix tokens are identical by construction) and a fresh clone of the stored episode. What is
reused at the model level is the backend's business: :class:`~tracerl.models.backend.HFPolicy`
prefills identical prefixes of one call once and repeats their KV-cache rows.

Ending a turn: the backend stops a row on the format's ``turn_stops`` (plain strings, all vLLM
can match) and the format's ``ends_turn`` decides whether that completes the turn. A react turn
ends at the ``]`` closing its action, but a ``]`` in the thought before it is also a stop; then
the row samples on from its partial turn in the next batched call (a new *segment*), and the
segments join into one turn whose tokens and log-probs are exactly the sampled ones. Sampling
the rest of a turn from the partial turn is the same distribution as sampling it in one go.

Routing: every generate row carries its tree id as a routing key (``routing_keys``), so a backend
in front of several engines can keep a tree's branches on one engine and its prefix cache.

Cost (spec section 1): each new chain and each branch continuation is one rollout; generated
tokens count only tokens sampled in the call (reused prefix tokens are not counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tracerl.core.protocol import RolloutCost
from tracerl.core.types import RolloutTree, Task
from tracerl.envs.base import Observation
from tracerl.envs.verifiers import Verifier
from tracerl.models.backend import PolicyBackend
from tracerl.core.seeds import derive_seed
from tracerl.rollout.engine_config import EngineConfig  # re-exported (its home is engine_config.py)
from tracerl.rollout.independent import BatchStream, ScheduleStats, run_independent, streams_requests
from tracerl.rollout.progress import current_progress
from tracerl.rollout.tool_calls import ToolRunner
from tracerl.rollout.turns import (  # noqa: F401 - _Outcome, _turn_seed re-exported (their home moved to turns.py)
    TurnSteps,
    _keep_state,
    _Live,
    _Outcome,
    _TreeState,
    _turn_seed,
)


class RolloutEngine(TurnSteps):
    """Runs episodes of ``env`` with ``backend`` in the agent format ``fmt``; rewards from ``verifier``.

    The driver: public API, tree bookkeeping and the lockstep turn loop; the per-turn steps
    (row, join, fit, observe, commit) are inherited from :class:`~tracerl.rollout.turns.TurnSteps`."""

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
        self._states: dict[str, _TreeState] = {}
        self.trees_started = 0
        """Trees started without explicit ids (their ids ``task#N`` seed the episodes); a trainer
        checkpoints it so a resumed evaluation at ``temperature > 0`` draws the same episodes."""
        self.schedule = ScheduleStats()
        """Requests and engine steps of independent scheduling (stays zero in lockstep)."""

    # --- public API ------------------------------------------------------------------------

    def rollout(
        self,
        tasks: list[Task],
        n: list[int],
        tree_ids: list[str] | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> tuple[list[RolloutTree], RolloutCost]:
        """One tree per task holding ``n[i]`` independent chains, all advanced together.

        ``seed`` seeds the episodes (see the module docstring); without it one draw from
        ``generator`` (or torch's global generator) is the seed.
        """
        if len(n) != len(tasks):
            raise ValueError(f"n has {len(n)} entries for {len(tasks)} tasks")
        if any(k < 0 for k in n):
            raise ValueError(f"n must be >= 0 per task, got {n}")
        if tree_ids is not None and len(tree_ids) != len(tasks):
            raise ValueError(f"tree_ids has {len(tree_ids)} entries for {len(tasks)} tasks")
        if tree_ids is not None and len(set(tree_ids)) != len(tree_ids):
            raise ValueError(f"tree_ids must be distinct, got {tree_ids}")
        seed = _call_seed(seed, generator)
        trees, lives = [], []
        for i, task in enumerate(tasks):
            if tree_ids is None:
                tree_id, self.trees_started = f"{task.id}#{self.trees_started}", self.trees_started + 1
            else:
                tree_id = tree_ids[i]
            tree, state = self._new_tree(task, tree_id)
            trees.append(tree)
            lives += self._continuations(state, 0, n[i], seed)
        generated = self._run(lives)
        return trees, RolloutCost(rollouts=sum(n), generated_tokens=generated)

    def expand(
        self,
        requests: Sequence[tuple[RolloutTree | str, int, int] | tuple[RolloutTree | str, int, int, int | None]],
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> RolloutCost:
        """Resume ``k`` continuations from each ``(tree or tree_id, node_id, k[, first_branch])``;
        new leaves join the trees. ``first_branch`` (the driver's count) numbers the branches;
        without it the tree's own count does."""
        lives: list[_Live] = []
        seed = _call_seed(seed, generator) if requests else 0
        for tree, node_id, k, *first in requests:
            if k < 0:
                raise ValueError(f"continuations must be >= 0, got {k} for node {node_id}")
            state = self._expandable(tree, node_id)
            lives += self._continuations(state, node_id, k, seed, first[0] if first else None)
        generated = self._run(lives)
        return RolloutCost(rollouts=len(lives), generated_tokens=generated)

    def adopt(self, tree: RolloutTree, task: Task, branches: Mapping[int, int] | None = None) -> None:
        """Hold ``tree`` (produced elsewhere: the driver's copy) as if this engine had produced it,
        so it can be expanded here: the episode at every open boundary is rebuilt by replaying
        the recorded actions and observations into ``env.start(task)`` with the episode's
        ``restore`` (no tool is called), and ``branches`` (node id -> continuations started
        there so far) continues the branch numbering. An environment whose episodes cannot
        restore is refused, naming the episode type."""
        root = self.env.start(task)
        if not callable(getattr(root, "restore", None)):
            raise ValueError(f"trees cannot be adopted with this environment: its {type(root).__name__} episodes "
                             "have no restore(steps) to replay recorded actions without calling tools")
        state = _TreeState(tree=tree, task=task, branches={int(k): int(v) for k, v in (branches or {}).items()})
        state.episodes[0] = root
        for node in tree.nodes[1:]:  # parents come before their children
            if node.is_leaf or node.parent not in state.episodes:
                continue
            turn = node.turn
            assert turn is not None
            episode = state.episodes[node.parent].clone()
            episode.restore([(turn.action, Observation(turn.observation, done=False, error=turn.tool_error))])
            state.episodes[node.id] = episode
        self._states[tree.tree_id] = state

    def prompt_ids(self, task: Task) -> list[int]:
        """Token ids of ``task``'s prompt ``S_0`` as this engine's trees start with them."""
        return self.fmt.prompt_ids(task, self.tools, self.tokenizer)

    def tree(self, tree_id: str) -> RolloutTree:
        """The tree this engine holds under ``tree_id``."""
        state = self._states.get(tree_id)
        if state is None:
            raise ValueError(f"tree {tree_id!r} was not produced by this engine (or was forgotten)")
        return state.tree

    def task(self, tree_id: str) -> Task:
        """The task of the tree held under ``tree_id``."""
        self.tree(tree_id)
        return self._states[tree_id].task

    def can_expand(self, tree: RolloutTree | str, node_id: int) -> bool:
        """Whether ``expand`` accepts this node (an open boundary of a tree this engine holds)."""
        try:
            self._expandable(tree, node_id)
        except ValueError:
            return False
        return True

    def forget(self, trees: list[RolloutTree] | list[str]) -> None:
        """Drop ``trees`` (objects or ids) and their episode snapshots: they can no longer be expanded."""
        for tree in trees:
            self._states.pop(tree if isinstance(tree, str) else tree.tree_id, None)

    # --- tree bookkeeping --------------------------------------------------------------------

    def _new_tree(self, task: Task, tree_id: str) -> tuple[RolloutTree, _TreeState]:
        prompt_ids = self.prompt_ids(task)
        if len(prompt_ids) >= self.config.max_total_tokens:
            raise ValueError(
                f"task {task.id!r}: prompt has {len(prompt_ids)} tokens, max_total_tokens is "
                f"{self.config.max_total_tokens}"
            )
        tree = RolloutTree(tree_id=tree_id, task_id=task.id, prompt_ids=prompt_ids)
        state = _TreeState(tree=tree, task=task)
        state.episodes[0] = self.env.start(task)
        self._states[tree_id] = state
        return tree, state

    def _continuations(self, state: _TreeState, node_id: int, k: int, seed: int,
                       first_branch: int | None = None) -> list[_Live]:
        """``k`` live episodes resuming at ``node_id``, each with its own seed and a fresh env clone."""
        tree = state.tree
        turns = [tree.nodes[i].turn for i in tree.path(node_id)[1:]]
        prefix = tree.prefix_ids(node_id)
        return [
            _Live(tree, state, node_id, state.episodes[node_id].clone(), list(prefix), list(turns),  # type: ignore[arg-type]
                  seed=derive_seed(seed, tree.tree_id, node_id, branch))
            for branch in state.next_branches(node_id, k, first_branch)
        ]

    def _expandable(self, tree: RolloutTree | str, node_id: int) -> _TreeState:
        tree_id = tree if isinstance(tree, str) else tree.tree_id
        state = self._states.get(tree_id)
        if state is None:  # a copy of a held tree (same tree_id) addresses the held tree
            raise ValueError(f"tree {tree_id!r} was not produced by this engine (or was forgotten)")
        held = state.tree
        if not 0 <= node_id < len(held.nodes):
            raise ValueError(f"tree {tree_id!r} has no node {node_id}")
        node = held.nodes[node_id]
        if not node.is_boundary:
            raise ValueError(f"node {node_id} of {tree_id!r} is not a boundary (it ends in an answer)")
        if node.is_leaf or node_id not in state.episodes:
            raise ValueError(
                f"node {node_id} of {tree_id!r} ended its episode (answer, turn/token limit or "
                "infrastructure failure); no turns remain to branch"
            )
        return state

    # --- the turn loop -----------------------------------------------------------------------

    def _run(self, lives: list[_Live]) -> int:
        """Advance every live episode until all end; returns tokens generated.

        Independent requests when the config asks for it (a streaming backend as it is, a batch
        backend through :class:`~tracerl.rollout.independent.BatchStream`), otherwise a turn per
        batched call (lockstep); tool calls run concurrently either way (``tool_concurrency``)."""
        cfg = self.config
        if streams_requests(self.backend) and cfg.vllm_scheduling == "independent":
            return run_independent(self, lives, self.schedule)
        if not streams_requests(self.backend) and cfg.hf_scheduling == "independent" and cfg.tool_concurrency > 0:
            return run_independent(self, lives, self.schedule, BatchStream(self.backend))
        with ToolRunner(cfg.tool_concurrency) as runner:
            generated = 0
            while lives:
                generated, lives = self._lockstep_round(lives, runner, generated)
        return generated

    def _lockstep_round(self, lives: list[_Live], runner: ToolRunner, generated: int) -> tuple[int, list[_Live]]:
        """One batched generate call for every live episode, their tool calls started together and
        applied in request order (the serial path's order, whatever finishes first)."""
        rows = [self._row(lv) for lv in lives]
        params = self._params(max(budget for _, budget, _ in rows))
        gens = self.backend.generate([prefix for prefix, _, _ in rows], params, [seed for _, _, seed in rows],
                                     routing_keys=[lv.tree.tree_id for lv in lives])
        steps: list[tuple[_Live, Any, Any, Any]] = []
        for live, gen, (_, budget, _) in zip(lives, gens, rows, strict=True):
            _keep_state(live, gen)
            gen = self._fit(gen, budget)
            generated += len(gen.token_ids)
            current_progress().generated(len(gen.token_ids))
            turn = self._join(live, gen)
            if turn is None:  # a stop that did not end the turn: it samples on next round
                steps.append((live, None, None, None))
                continue
            action = self.fmt.parse(turn.text, self.tools)
            steps.append((live, turn, action, runner.submit(live.episode, action)))
        still = []
        for live, turn, action, future in steps:
            if turn is None:
                still.append(live)
                continue
            outcome = self._observe(live, turn, action, future.result())
            self._commit(live, outcome)
            if not outcome.ended:
                still.append(live)
        return generated, still


def _call_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """The call's seed: ``seed``, else one draw from ``generator`` (torch's global one when None)."""
    if seed is not None:
        return int(seed)
    return int(torch.randint(0, 2**62, (1,), generator=generator).item())
