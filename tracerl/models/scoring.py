"""Frozen reference scoring of the gold answer after each prefix (TRACE credit, spec section 2).

``l_k = (1/|y*|) sum_j log pi_ref(y*_j | S_k + A, y*_<j)`` for every boundary ``S_k`` of a
trajectory. :func:`score_prefixes` computes all ``l_k`` with one prefill of the trajectory up to
its last cut plus one packed forward that holds ``opener + answer`` once per cut, each copy
attending only to its own prefix (a block-diagonal 4D mask over the cached prefix), so the work
is about ``max(cuts) + cuts * (|A| + |y*|)`` tokens instead of ``cuts * L``.
:func:`score_prefixes_naive` (one full forward per cut) is the test oracle.

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
from typing import Any, ContextManager, Literal

import torch

from tracerl.core.protocol import ScoreRequest as NodeScoreRequest
from tracerl.core.protocol import ScoreResult
from tracerl.core.types import Action, RolloutTree, Task, Trajectory
from tracerl.models.batched_scoring import (
    DEFAULT_MAX_BATCH_TOKENS,
    MASKABLE_ATTENTION,
    ScoreRequest,
    ScoreStats,
    score_prefixes_batched,
)
from tracerl.models.lora import adapter_disabled, is_peft_model
from tracerl.models.prefix_cache import forward_with_cache, new_cache, output_cache

Method = Literal["packed", "crop"]
BatchScorer = Callable[..., list[torch.Tensor]]
"""``(model, requests, *, max_batch_tokens, stats) -> list[Tensor]``, the signature of
:func:`score_prefixes_batched`: one float32 CPU tensor [len(request.cut_points)] per
:class:`ScoreRequest`, in order; ``stats`` (a :class:`ScoreStats`) is filled in place."""


def _check_inputs(
    input_ids: torch.Tensor, cut_points: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> None:
    if input_ids.ndim != 1 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(input_ids.shape)}")
    if answer_ids.ndim != 1 or answer_ids.numel() == 0:
        raise ValueError(f"answer_ids must be a non-empty 1-D tensor, got shape {tuple(answer_ids.shape)}")
    if opener_ids is not None and opener_ids.ndim != 1:
        raise ValueError(f"opener_ids must be 1-D, got shape {tuple(opener_ids.shape)}")
    if not cut_points:
        raise ValueError("cut_points must not be empty")
    length = input_ids.numel()
    bad = [c for c in cut_points if not 1 <= int(c) <= length]
    if bad:
        raise ValueError(f"cut_points must lie in [1, {length}] (len(input_ids)); got {bad}")


def _block(answer_ids: torch.Tensor, opener_ids: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """Tokens fed after each cut (opener + answer without its last token) and the opener length."""
    opener = opener_ids if opener_ids is not None else answer_ids.new_zeros(0)
    return torch.cat([opener, answer_ids[:-1]]), opener.numel()


def _mean_logprob(logits: torch.Tensor, answer_ids: torch.Tensor) -> torch.Tensor:
    """Mean log-prob of ``answer_ids`` [A] under next-token ``logits`` [A, V]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, answer_ids[:, None]).squeeze(-1).mean()


@torch.no_grad()
def score_prefixes_naive(
    model: Any,
    input_ids: torch.Tensor,
    cut_points: list[int],
    answer_ids: torch.Tensor,
    *,
    opener_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Oracle: one full forward over ``input_ids[:c] + opener + answer`` per cut. Returns [len(cuts)]."""
    _check_inputs(input_ids, cut_points, answer_ids, opener_ids)
    device = next(model.parameters()).device
    input_ids, answer_ids = input_ids.to(device), answer_ids.to(device)
    opener = opener_ids.to(device) if opener_ids is not None else answer_ids.new_zeros(0)
    scores = []
    for cut in cut_points:
        seq = torch.cat([input_ids[:cut], opener, answer_ids])
        logits = model(input_ids=seq[None]).logits[0]
        first = cut + opener.numel() - 1  # position whose logits predict answer_ids[0]
        scores.append(_mean_logprob(logits[first : first + answer_ids.numel()], answer_ids))
    return torch.stack(scores).cpu()


@torch.no_grad()
def score_prefixes(
    model: Any,
    input_ids: torch.Tensor,
    cut_points: list[int],
    answer_ids: torch.Tensor,
    *,
    opener_ids: torch.Tensor | None = None,
    method: Method | None = None,
) -> torch.Tensor:
    """Mean log-prob of ``answer_ids`` placed after ``input_ids[:c] + opener`` for each cut ``c``.

    Shapes: ``input_ids`` [L], ``answer_ids`` [A], ``opener_ids`` [O] or None; returns float32
    [len(cut_points)] on CPU in the order of ``cut_points``. ``method`` "packed" (default when
    the attention implementation accepts custom 4D masks) does one prefill plus one packed
    forward; "crop" extends one cache cut by cut and crops the scored block off each time.
    """
    _check_inputs(input_ids, cut_points, answer_ids, opener_ids)
    if method is None:
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        method = "packed" if impl in MASKABLE_ATTENTION else "crop"
    if method not in ("packed", "crop"):
        raise ValueError(f"method must be 'packed' or 'crop', got {method!r}")
    device = next(model.parameters()).device
    input_ids, answer_ids = input_ids.to(device), answer_ids.to(device)
    opener_ids = opener_ids.to(device) if opener_ids is not None else None
    cuts = [int(c) for c in cut_points]
    if method == "packed":
        return _score_packed(model, input_ids, cuts, answer_ids, opener_ids).cpu()
    return _score_crop(model, input_ids, cuts, answer_ids, opener_ids).cpu()


def _score_packed(
    model: Any, input_ids: torch.Tensor, cuts: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> torch.Tensor:
    block, n_open = _block(answer_ids, opener_ids)
    width, n_cuts, n_ans = block.numel(), len(cuts), answer_ids.numel()
    prefix_len = max(cuts)
    device = input_ids.device
    # Without an opener the first answer token is predicted by the prefix's own last position.
    keep = torch.tensor(sorted({c - 1 for c in cuts}), device=device)
    cache = new_cache(model)
    out = forward_with_cache(model, input_ids[None, :prefix_len], cache, logits_to_keep=keep)
    prefix_logits = {int(p): out.logits[0, i] for i, p in enumerate(keep.tolist())}
    if width == 0:  # no opener and a one-token answer: the prefill logits are all we need
        return torch.stack([_mean_logprob(prefix_logits[c - 1][None], answer_ids) for c in cuts])
    cuts_t = torch.tensor(cuts, device=device)
    offsets = torch.arange(width, device=device)
    position_ids = (cuts_t[:, None] + offsets[None, :]).reshape(1, -1)
    mask = _packed_mask(cuts_t, width, prefix_len, model.dtype)
    out = forward_with_cache(
        model,
        block.repeat(n_cuts)[None],
        output_cache(out),
        attention_mask=mask,
        position_ids=position_ids,
    )
    logits = out.logits[0].view(n_cuts, width, -1)
    scores = []
    for i, cut in enumerate(cuts):
        if n_open > 0:
            rows = logits[i, n_open - 1 : n_open - 1 + n_ans]
        else:
            rows = torch.cat([prefix_logits[cut - 1][None], logits[i, : n_ans - 1]])
        scores.append(_mean_logprob(rows, answer_ids))
    return torch.stack(scores)


def _packed_mask(cuts: torch.Tensor, width: int, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, cuts*width, prefix_len + cuts*width]: block i sees prefix[:c_i] and itself causally."""
    n = cuts.numel()
    q = n * width
    block_of_q = torch.arange(q, device=cuts.device) // width
    allowed_prefix = torch.arange(prefix_len, device=cuts.device)[None, :] < cuts[block_of_q][:, None]
    kq = torch.arange(q, device=cuts.device)
    same_block = block_of_q[:, None] == block_of_q[None, :]
    allowed_block = same_block & (kq[None, :] <= kq[:, None])
    allowed = torch.cat([allowed_prefix, allowed_block], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=cuts.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _score_crop(
    model: Any, input_ids: torch.Tensor, cuts: list[int], answer_ids: torch.Tensor, opener_ids: torch.Tensor | None
) -> torch.Tensor:
    block, n_open = _block(answer_ids, opener_ids)
    n_ans = answer_ids.numel()
    cache, pos, last_logits = new_cache(model), 0, None
    scores: dict[int, torch.Tensor] = {}
    for i in sorted(range(len(cuts)), key=lambda j: cuts[j]):
        cut = cuts[i]
        if cut > pos:  # extend the shared cache up to this cut
            out = forward_with_cache(model, input_ids[None, pos:cut], cache, logits_to_keep=1)
            cache, last_logits, pos = output_cache(out), out.logits[0, -1], cut
        if block.numel() == 0:
            scores[i] = _mean_logprob(last_logits[None], answer_ids)
            continue
        out = forward_with_cache(model, block[None], cache)
        cache, logits = output_cache(out), out.logits[0]
        rows = logits[n_open - 1 : n_open - 1 + n_ans] if n_open else torch.cat([last_logits[None], logits[: n_ans - 1]])
        scores[i] = _mean_logprob(rows, answer_ids)
        cache.crop(-block.numel())  # drop the scored block, keep the prefix for the next cut
    return torch.stack([scores[i] for i in range(len(cuts))])


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
    :meth:`readiness` and the KL term always run the HF model.
    """

    def __init__(self, model: Any, tokenizer: Any, fmt: Any, method: Method | None = None,
                 dtype: torch.dtype | None = None, batch_scorer: BatchScorer | None = None,
                 answer_prefix: str = "") -> None:
        if is_peft_model(model):
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
