"""Frozen reference scoring of the gold answer after each prefix (TRACE credit, spec section 2).

``l_k = (1/|y*|) sum_j log pi_ref(y*_j | S_k + A, y*_<j)`` for every boundary ``S_k`` of a
trajectory. One trajectory is scored by :func:`score_prefixes` (one prefill plus one packed
forward; :func:`score_prefixes_naive`, one forward per cut, is the test oracle), both in
:mod:`tracerl.models.prefix_scoring` and re-exported here.

Training scores many trajectories at once with :func:`score_readiness` (``ReferenceScorer.score``):
readiness is a property of a tree node, so every distinct prefix is scored once, in a few batched
forwards (:mod:`tracerl.models.batched_scoring`), and stored on the node for later calls. The
forwards are a :data:`BatchScorer`: :func:`score_prefixes_batched` by default, or vLLM's
``prompt_logprobs`` (:class:`tracerl.models.vllm_scoring.VLLMReference`, ``algo.reference_backend``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ContextManager

import torch

from tracerl.core.protocol import ScoreRequest as NodeScoreRequest
from tracerl.core.protocol import ScoreResult
from tracerl.core.types import Action, RolloutTree, Task, Trajectory
from tracerl.models.batched_scoring import (
    DEFAULT_MAX_BATCH_TOKENS,
    ScoreRequest,
    ScoreStats,
    score_prefixes_batched,
)
from tracerl.models.lora import adapter_disabled, is_peft_model
from tracerl.models.prefix_scoring import Method, score_prefixes, score_prefixes_naive  # noqa: F401 - re-exported

BatchScorer = Callable[..., list[torch.Tensor]]
"""``(model, requests, *, max_batch_tokens, stats) -> list[Tensor]``, the signature of
:func:`score_prefixes_batched`: one float32 CPU tensor [len(request.cut_points)] per
:class:`ScoreRequest`, in order; ``stats`` (a :class:`ScoreStats`) is filled in place."""


EMPTY_THINK = "<think>\n\n</think>\n\n"
"""Qwen3's empty think block (what its no-think mode writes before an answer): the text a thinking
model's reference can be scored after (``algo.score_after_empty_think``), so the gold follows the
markup such a model writes before ``<answer>`` instead of ``<answer>`` straight after the turn opens."""


def answer_token_ids(tokenizer: Any, fmt: Any, answer: str, *, prefix: str = "") -> tuple[list[int], list[int]]:
    """``(opener_ids, answer_ids)`` tokenised exactly as the policy writes an answer action.

    The format renders the answer action (``Action: answer[Paris]``, ``<answer> Paris </answer>``);
    the gold's character span is located inside it after the opener, and the text from the opener
    on (after ``prefix``, e.g. :data:`EMPTY_THINK`) is tokenised in one piece. Tokens overlapping
    the gold's characters are the answer tokens (a token that merges the gold with a separator
    before it, ``' Beijing'`` in a byte-level BPE, or with a closing bracket after it counts as an
    answer token); the tokens before them are the opener (a separator the tokenizer keeps apart
    goes there). So the scored ids are the ids the policy samples when it writes that answer.

    Raises:
        ValueError: an empty gold, or a format whose rendered answer lacks its opener or the gold.
    """
    if not answer.strip():
        raise ValueError("the gold answer must be a non-empty string")
    opener = fmt.answer_opener
    rendered = fmt.render_action(Action(kind="answer", answer=answer))
    start = rendered.find(opener) if opener else 0
    at = rendered.find(answer, start + len(opener)) if start >= 0 else -1
    if at < 0:
        raise ValueError(f"format {getattr(fmt, 'name', fmt)!r}: its rendered answer {rendered!r} does not hold "
                         f"the opener {opener!r} followed by the gold {answer!r}")
    text = prefix + rendered[start:]
    lo = len(prefix) + at - start
    hi = lo + len(answer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    answer_pos = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < hi and e > lo]
    if not answer_pos:
        raise ValueError(f"answer {answer!r} produced no tokens after the opener {opener!r}")
    ids = enc["input_ids"]
    return ids[: answer_pos[0]], ids[answer_pos[0] : answer_pos[-1] + 1]


Items = Iterable[Trajectory | RolloutTree]
"""What :func:`score_readiness` accepts: trees (their leaves' trajectories) and/or trajectories."""


def _boundary_nodes(traj: Trajectory, tree: RolloutTree | None) -> list[int] | None:
    """Tree node ids of the boundaries ``S_0..S_T`` of ``traj``; None outside a tree."""
    if tree is None or len(traj.node_path) != len(traj.turns) + 1:
        return None
    return [traj.node_path[0]] + [traj.node_path[i + 1] for i, t in enumerate(traj.turns) if t.is_transition]


def _unscored(items: Items) -> list[tuple[Trajectory, RolloutTree | None]]:
    """Trajectories without readiness that are not infra failures (each once), with their tree."""
    seen: set[int] = set()
    out: list[tuple[Trajectory, RolloutTree | None]] = []
    for item in items:
        pairs = [(t, item) for t in item.trajectories.values()] if isinstance(item, RolloutTree) else [(item, None)]
        for traj, tree in pairs:
            if id(traj) not in seen and traj.readiness is None and not traj.infra_failed:
                seen.add(id(traj))
                out.append((traj, tree))
    return out


@torch.no_grad()
def score_readiness(
    model: Any,
    items: Items,
    tasks: Mapping[str, Task],
    answer_ids: Callable[[str], tuple[list[int], list[int]]],
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    batch_scorer: BatchScorer | None = None,
) -> ScoreStats:
    """Write ``l_k`` at every boundary of every unscored trajectory in ``items`` (one batched call).

    ``tasks`` maps task ids to tasks (the gold answer ``y*`` is ``task.gold``); ``answer_ids(gold)``
    gives ``(opener_ids, answer_ids)``. Infra-failed and already scored trajectories are skipped.
    For trajectories given through their tree, a boundary node that already holds ``readiness``
    (scored by an earlier call) is reused, and new scores are written onto the nodes; all other
    prefixes go to ``batch_scorer`` in one call (default :func:`score_prefixes_batched`, which
    scores each distinct prefix once). Returns the call's :class:`ScoreStats` (``reused_cuts``:
    cuts answered from nodes).
    """
    requests, plans = [], []
    for traj, tree in _unscored(items):
        if traj.task_id not in tasks:
            raise ValueError(f"no task {traj.task_id!r} in 'tasks' for a trajectory to score")
        opener, answer = answer_ids(tasks[traj.task_id].gold)
        nodes = _boundary_nodes(traj, tree)
        cuts = traj.boundaries
        known = [tree.nodes[n].readiness for n in nodes] if (nodes and tree) else [None] * len(cuts)
        need = [c for c, k in zip(cuts, known, strict=True) if k is None]
        if need:
            requests.append(ScoreRequest(tuple(traj.token_ids[: max(need)]), tuple(need), tuple(answer), tuple(opener)))
        plans.append((traj, tree, nodes, known))
    stats = ScoreStats(trajectories=len(plans))
    scorer = batch_scorer or score_prefixes_batched
    scores = iter(scorer(model, requests, max_batch_tokens=max_batch_tokens, stats=stats))
    for traj, tree, nodes, known in plans:
        fresh = iter(next(scores).tolist()) if None in known else iter(())
        values = [k if k is not None else next(fresh) for k in known]
        stats.reused_cuts += len(known) - known.count(None)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"non-finite readiness scores for task {traj.task_id!r}: {values}")
        traj.readiness = values
        for n, v in zip(nodes, values, strict=True) if nodes else ():  # no node ids: a bare trajectory
            if tree is not None and tree.nodes[n].readiness is None:
                tree.nodes[n].readiness = v
    return stats


class ReferenceScorer:
    """The frozen initial policy that scores readiness ``l_k`` (spec section 2 step 1).

    A plain model is deep-copied at construction (optionally cast to ``dtype``: frozen weights
    need no float32 master copy, so a bf16 reference costs 2 bytes per parameter), put in eval
    mode with gradients off, and never updated. A peft (LoRA) model is *not* copied: the
    reference is the same model with its adapter disabled, entered through :meth:`frozen`
    around every reference forward.

    ``batch_scorer`` replaces :func:`score_prefixes_batched` in :meth:`score` (it is handed
    ``self.model``, which it may ignore: a vLLM engine holding the same frozen weights);
    :meth:`readiness` and the KL term always run the HF model. ``model`` may be None when
    ``batch_scorer`` holds the weights elsewhere (verl's reference worker): then only the batched
    paths (:meth:`score`, :meth:`score_nodes`) work.
    """

    def __init__(self, model: Any, tokenizer: Any, fmt: Any, method: Method | None = None,
                 dtype: torch.dtype | None = None, batch_scorer: BatchScorer | None = None,
                 answer_prefix: str = "") -> None:
        if model is None:
            if batch_scorer is None:
                raise ValueError("ReferenceScorer: model=None needs a batch_scorer that holds the weights")
            self.model = None
        elif is_peft_model(model):
            self.model = model  # shared with the policy; frozen() switches the adapter off
        else:
            self.model = copy.deepcopy(model)
            if dtype is not None:
                self.model.to(dtype=dtype)
            self.model.eval()
            self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.method = method
        self.batch_scorer = batch_scorer
        self.answer_prefix = answer_prefix
        """Text scored before the opener (``EMPTY_THINK`` with ``algo.score_after_empty_think``)."""
        self._answer_cache: dict[str, tuple[list[int], list[int]]] = {}

    def _answer_ids(self, gold: str) -> tuple[list[int], list[int]]:
        if gold not in self._answer_cache:
            self._answer_cache[gold] = answer_token_ids(self.tokenizer, self.fmt, gold,
                                                          prefix=self.answer_prefix)
        return self._answer_cache[gold]

    def score(self, items: Items, tasks: Mapping[str, Task], *,
              max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> ScoreStats:
        """Batched readiness of every unscored trajectory in ``items``: see :func:`score_readiness`.

        This is the callable the trace scheme and the trainer share, so no trajectory is scored
        twice; ``readiness`` below stays the one-trajectory path (and the reference for tests).
        """
        with self.frozen():
            return score_readiness(self.model, items, tasks, self._answer_ids, max_batch_tokens=max_batch_tokens,
                                   batch_scorer=self.batch_scorer)

    @torch.no_grad()
    def score_nodes(self, requests: Sequence[NodeScoreRequest], *,
                    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> ScoreResult:
        """Readiness of self-contained node requests (prefix ids and gold answer; no tree needed):
        every prefix in one batched call (``batch_scorer``), deduplicated and trie-packed there.
        Returns ``ScoreResult.nodes[tree_id][str(node_id)]``; equal to :meth:`score` on the trees."""
        jobs, keys = [], []
        for req in requests:
            opener, answer = self._answer_ids(req.gold)
            for nid, prefix in zip(req.node_ids, req.prefixes, strict=True):
                jobs.append(ScoreRequest(tuple(prefix), (len(prefix),), tuple(answer), tuple(opener)))
                keys.append((req.tree_id, nid))
        result = ScoreResult()
        if not jobs:
            return result
        with self.frozen():
            scorer = self.batch_scorer or score_prefixes_batched
            scores = scorer(self.model, jobs, max_batch_tokens=max_batch_tokens, stats=ScoreStats())
        for (tree_id, nid), value in zip(keys, scores, strict=True):
            l_k = float(value[0])
            if not math.isfinite(l_k):
                raise ValueError(f"non-finite readiness score for node {nid} of tree {tree_id!r}: {l_k}")
            result.nodes.setdefault(tree_id, {})[str(nid)] = l_k
        return result

    @torch.no_grad()
    def readiness(self, trajectory: Trajectory, task: Task) -> list[float]:
        """``l_k`` at each boundary ``S_0..S_T`` of ``trajectory`` for the gold answer of ``task``."""
        if trajectory.task_id != task.id:
            raise ValueError(f"trajectory is for task {trajectory.task_id!r}, not {task.id!r}")
        with self.frozen():
            opener, answer = self._answer_ids(task.gold)
            cuts = trajectory.boundaries
            ids = torch.tensor(trajectory.token_ids[: cuts[-1]], dtype=torch.long)
            scores = score_prefixes(
                self.model,
                ids,
                cuts,
                torch.tensor(answer, dtype=torch.long),
                opener_ids=torch.tensor(opener, dtype=torch.long),
                method=self.method,
            )
        values = scores.tolist()
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"non-finite readiness scores for task {task.id!r}: {values}")
        return values

    def frozen(self) -> ContextManager[Any]:
        """Enter around every reference forward: disables the LoRA adapter of a shared peft
        model (the base model is the reference), a null context for a deep-copied reference."""
        return adapter_disabled(self.model)
