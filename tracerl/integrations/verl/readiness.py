"""Where the frozen reference scores readiness inside verl, and what each place forwards.

Readiness ``l_k`` is the mean log-probability of the gold answer after ``S_k`` and the format's
answer opener, one value per tree node. Three places can score it (``+tracerl.readiness``):

* ``in_process``: tracerl's HF copy in the TaskRunner, :class:`InProcessReadiness` over
  :func:`~tracerl.models.batched_scoring.score_prefixes_batched`: a tree's shared prefixes packed
  as trie rows and forwarded once, the LM head only over the gold tokens;
* ``reference_worker``: verl's reference worker (:class:`~.reference.VerlReference`): one
  full-prefix row per node, verl's engine projects every token of it;
* ``reference_server``: frozen-reference inference servers (:class:`ServerReference`): replicas
  holding the initial weights on GPUs of their own, started by the ``tracerl_sync`` trainer with
  verl's teacher machinery (:mod:`.readiness_servers`) and handed to the manager as verl's
  ``teacher_client``. Each node is one request ``S_k + opener + answer`` with ``max_tokens=1``,
  ``prompt_logprobs=0`` and temperature 1 (the parameters of verl's distillation teacher),
  routed by tree id so a tree's rows reach one replica.

Each is a :data:`~tracerl.models.scoring.BatchScorer` with the same counters
(:class:`ReadinessScorer`): rows scored, ``readiness_tokens_forwarded`` (what the forward
actually ran over), ``readiness_tokens_full_prefix`` (what one full-prefix row per node runs
over: the reference worker's cost) and ``readiness_head_tokens`` (positions projected through
the LM head). With ``check`` (an HF model of the same checkpoint, ``+tracerl.check=true``) every
call is also scored by ``score_prefixes_batched`` and the largest difference kept in ``max_gap``.

vLLM computes prompt log-probs only for tokens it prefills: a request with ``prompt_logprobs``
skips reading vLLM's prefix cache (``KVCacheManager.get_computed_blocks``), so on vLLM a node row
costs its full prefix, off the actor's memory; the forward counter reads the servers'
``num_cached_tokens`` so a server that does reuse its cache is counted as such.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import torch

from tracerl.core.protocol import ScoreRequest as NodeScoreRequest
from tracerl.core.protocol import ScoreResult
from tracerl.errors import UserError
from tracerl.models.batched_scoring import DEFAULT_MAX_BATCH_TOKENS, ScoreStats, score_prefixes_batched
from tracerl.models.scoring import ReferenceScorer
from tracerl.models.scoring_plan import ScoreRequest

Row = tuple[tuple[int, ...], tuple[int, ...]]
"""``(prompt_ids, answer_ids)``: a node's prefix with the opener, and the gold answer's ids."""

SERVER_KEY = "tracerl_reference"
"""The ``teacher_client`` key of the frozen-reference servers the ``tracerl_sync`` trainer starts."""

PROMPT_LOGPROBS: dict[str, Any] = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}
"""Sampling parameters of a readiness request (verl's teacher's, ``_get_teacher_sampling_params``):
one generated token, the log-prob of every prompt token at temperature 1."""


def node_rows(requests: Sequence[ScoreRequest]) -> tuple[list[Row], list[int]]:
    """The distinct ``(prefix + opener, answer)`` rows of ``requests`` and each cut's row index
    (request-major, cut order)."""
    index: dict[Row, int] = {}
    slots = []
    for req in requests:
        for cut in req.cut_points:
            row = (tuple(req.input_ids[:cut]) + tuple(req.opener_ids), tuple(req.answer_ids))
            slots.append(index.setdefault(row, len(index)))
    return list(index), slots


def per_request(requests: Sequence[ScoreRequest], slots: Sequence[int], means: Sequence[float]) -> list[torch.Tensor]:
    """One float32 tensor [len(cut_points)] per request from the rows' means."""
    out, at = [], 0
    for req in requests:
        n = len(req.cut_points)
        out.append(torch.tensor([means[s] for s in slots[at : at + n]], dtype=torch.float32))
        at += n
    return out


@torch.no_grad()
def prompt_logprobs_fields(model: Any, prompt_ids: list[int], sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """What verl's vLLM server puts in ``extra_fields`` for ``prompt_logprobs=0`` (its
    ``extract_prompt_logprobs``), from one HF forward at temperature 1: entry ``i`` of
    ``prompt_logprobs`` / ``prompt_ids`` is ``[log p(prompt[i + 1])]`` / ``[prompt[i + 1]]``, the last
    a dummy; the frozen-reference replicas of tracerl's HF server answer with it."""
    if int(sampling_params["prompt_logprobs"]) != 0:
        raise ValueError(f"prompt_logprobs = {sampling_params['prompt_logprobs']}: tracerl's HF server returns "
                         "the prompt tokens' own log-probs only (0)")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    taken = logp.gather(-1, ids[0, 1:, None])[:, 0].cpu().tolist()
    return {"prompt_logprobs": [[x] for x in taken] + [[0.0]], "prompt_ids": [[t] for t in prompt_ids[1:]] + [[0]],
            "num_cached_tokens": 0}


class ReadinessScorer:
    """A readiness batch scorer with the counters of the module docstring; subclasses score."""

    def __init__(self, check: Any = None) -> None:
        self.check = check
        """An HF model of the reference's checkpoint to compare every call with (or None)."""
        self.reset()

    def reset(self) -> None:
        """Zero the counters and forget failed trees (the manager calls it when a step begins)."""
        self.failed: dict[str, str] = {}
        """Tree id -> the first line of why its readiness request failed (:meth:`take_failed`); only a
        scorer that asks a server per tree fills it."""
        self.rows = 0
        """Distinct node rows scored."""
        self.readiness_tokens_forwarded = 0
        self.readiness_tokens_full_prefix = 0
        self.readiness_head_tokens = 0
        self.max_gap = 0.0
        """Largest ``|readiness - the HF copy's|`` (with ``check``)."""

    def metrics(self) -> dict[str, float]:
        """The counters since :meth:`reset`, named as the manager logs them (``tracerl/`` added there)."""
        out = {"reference_rows": float(self.rows), "readiness_tokens_forwarded": float(self.readiness_tokens_forwarded),
               "readiness_tokens_full_prefix": float(self.readiness_tokens_full_prefix),
               "readiness_head_tokens": float(self.readiness_head_tokens)}
        if self.check is not None:
            out["readiness_max_abs_diff"] = self.max_gap
        return out

    def score(self, model: Any, requests: Sequence[ScoreRequest], rows: list[Row], slots: list[int],
              max_batch_tokens: int, stats: ScoreStats) -> list[torch.Tensor]:
        """Readiness per request (subclasses); ``rows``/``slots``: :func:`node_rows` of ``requests``;
        ``stats``: the caller's :class:`ScoreStats`, filled where the forward is tracerl's."""
        raise NotImplementedError

    def __call__(self, model: Any, requests: Sequence[ScoreRequest], *,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, stats: Any = None) -> list[torch.Tensor]:
        rows, slots = node_rows(requests)
        stats = stats if stats is not None else ScoreStats()
        out = self.score(model, requests, rows, slots, max_batch_tokens, stats) if rows else []
        self.rows += len(rows)
        self.readiness_tokens_full_prefix += sum(len(p) + len(a) for p, a in rows)
        if self.check is not None and rows and not self.failed:  # placeholders are not readiness
            want = score_prefixes_batched(self.check, list(requests))
            gaps = [float((a - b).abs().max()) for a, b in zip(out, want, strict=True) if a.numel()]
            self.max_gap = max([self.max_gap, *gaps])
        return out

    def take_failed(self) -> dict[str, str]:
        """The trees whose readiness failed since the last call (and forget them)."""
        out, self.failed = self.failed, {}
        return out


class InProcessReadiness(ReadinessScorer):
    """``score_prefixes_batched`` on the reference given as ``model``: shared prefixes once, the
    LM head over the gold tokens only. Counts the tokens it forwards (trie rows and blocks,
    without padding) and the gold tokens it projects."""

    def score(self, model: Any, requests: Sequence[ScoreRequest], rows: list[Row], slots: list[int],
              max_batch_tokens: int, stats: ScoreStats) -> list[torch.Tensor]:
        before = stats.prefill_tokens + stats.block_tokens
        out = score_prefixes_batched(model, requests, max_batch_tokens=max_batch_tokens, stats=stats)
        moved, head = stats.prefill_tokens + stats.block_tokens - before, sum(len(a) for _, a in rows)
        if moved == 0:  # attention without custom masks: a cache per request extended cut by cut, a block's
            blocks = sum(len(r.cut_points) * (len(r.opener_ids) + len(r.answer_ids) - 1) for r in requests)
            moved, head = sum(max(r.cut_points) for r in requests) + blocks, blocks  # logits over all of it
        self.readiness_tokens_forwarded += moved
        self.readiness_head_tokens += head
        return out


class _Loop:
    """An asyncio loop on a thread of its own: scoring is synchronous (the rollout session's call)
    and may be called from a thread that already runs a loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tracerl-readiness", daemon=True).start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def answer_logprobs(extra_fields: Mapping[str, Any], prompt: Sequence[int], answer: Sequence[int]) -> list[float]:
    """The answer tokens' log-probs from verl's server answer (``extract_prompt_logprobs``: entry
    ``i`` of ``prompt_logprobs`` is the log-prob of prompt token ``i + 1``, the last entry a
    dummy), checked against the ids the server reports (``prompt_ids``, same layout)."""
    logprobs, ids = extra_fields.get("prompt_logprobs"), extra_fields.get("prompt_ids")
    n, m = len(prompt) + len(answer), len(answer)
    if logprobs is None or len(logprobs) != n:
        raise ValueError(f"prompt_logprobs: the server returned {None if logprobs is None else len(logprobs)} "
                         f"entries for a {n}-token prompt")
    span = slice(n - m - 1, n - 1)
    if ids is not None and [int(x[0]) for x in ids[span]] != [int(t) for t in answer]:
        raise ValueError("prompt_ids: the server's prompt log-probs are not the answer's tokens")
    return [float(x[0]) for x in logprobs[span]]


def _why(err: BaseException) -> str:
    """One line of why a request failed (Ray's ``RayTaskError`` unwrapped to the server's own error)."""
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return "no answer within tracerl.request_timeout_s"
    cause = getattr(err, "cause", None)
    err = cause if isinstance(cause, BaseException) else err
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


class ServerReference(ReadinessScorer):
    """Readiness from frozen-reference servers behind verl's ``LLMServerClient`` (module docstring).

    :meth:`connect` takes verl's ``teacher_client``; ``routes`` (prefix ids -> tree id, filled by
    :class:`RoutedReferenceScorer`) gives each row its routing key, the tree id, as the policy's
    own requests have. A request that raises or takes longer than ``timeout_s`` fails its tree only:
    the tree goes into :attr:`failed` (taken by the manager, which trains its leaves as zero, as for
    a failed generation request) and its rows read 0; a row of no known tree stops the call with
    one line."""

    def __init__(self, check: Any = None, timeout_s: float | None = None) -> None:
        super().__init__(check)
        self.client: Any = None
        self.timeout_s = timeout_s
        self.routes: dict[tuple[int, ...], str] = {}
        self.requests = 0
        self._loop: _Loop | None = None

    def connect(self, teacher_client: Mapping[str, Any] | None) -> None:
        """Use the :data:`SERVER_KEY` client of verl's ``teacher_client`` (the manager's argument)."""
        if not teacher_client or SERVER_KEY not in teacher_client:
            raise UserError("+tracerl.readiness=reference_server scores on frozen-reference servers that the "
                            "tracerl_sync trainer starts (trainer.v1.trainer_mode=tracerl_sync) and verl hands the "
                            f"manager as teacher_client[{SERVER_KEY!r}]; got "
                            f"{sorted(teacher_client) if teacher_client else None}")
        self.client = teacher_client[SERVER_KEY]

    def _key(self, prefix: tuple[int, ...]) -> str:
        # a node whose tree is unknown (scored outside score_nodes) is routed by its own prefix
        return self.routes.get(prefix) or "readiness-" + hashlib.sha1(repr(prefix).encode()).hexdigest()[:16]

    async def _one(self, key: str, prompt: list[int]) -> Any:
        call = self.client.generate(key, prompt_ids=prompt, sampling_params=dict(PROMPT_LOGPROBS))
        return await (asyncio.wait_for(call, self.timeout_s) if self.timeout_s else call)

    async def _all(self, jobs: list[tuple[str, list[int]]]) -> list[Any]:
        return await asyncio.gather(*[self._one(k, p) for k, p in jobs], return_exceptions=True)

    def score(self, model: Any, requests: Sequence[ScoreRequest], rows: list[Row], slots: list[int],
              max_batch_tokens: int, stats: ScoreStats) -> list[torch.Tensor]:
        if self.client is None:
            self.connect(None)
        self._loop = self._loop or _Loop()
        keys: dict[int, str] = {}  # row -> routing key, from the node's prefix (without the opener)
        cuts = [(req, cut) for req in requests for cut in req.cut_points]
        for slot, (req, cut) in zip(slots, cuts, strict=True):
            keys.setdefault(slot, self._key(tuple(req.input_ids[:cut])))
        jobs = [(keys[i], list(p) + list(a)) for i, (p, a) in enumerate(rows)]
        answers = self._loop.run(self._all(jobs))
        means = []
        trees = set(self.routes.values())
        for (key, prompt), (p, a), out in zip(jobs, rows, answers, strict=True):
            if isinstance(out, BaseException):
                if key not in trees:
                    raise RuntimeError(f"readiness request of tree {key!r} to the reference server failed: {_why(out)}")
                self.failed.setdefault(key, f"readiness: {_why(out)}")
                means.append(0.0)  # a placeholder: the manager fails the whole tree
                continue
            extra = getattr(out, "extra_fields", None) or {}
            means.append(sum(answer_logprobs(extra, p, a)) / len(a))
            cached = int(extra.get("num_cached_tokens") or 0)
            self.readiness_tokens_forwarded += len(prompt) - cached
            self.readiness_head_tokens += len(prompt)  # prompt log-probs project every prompt token
        self.requests += len(jobs)
        return per_request(requests, slots, means)


class RoutedReferenceScorer(ReferenceScorer):
    """tracerl's ``ReferenceScorer`` over a :class:`ServerReference` that routes each node's row
    by its tree id (the node requests carry it; the batch scorer's requests do not)."""

    def score_nodes(self, requests: Sequence[NodeScoreRequest], *,
                    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> ScoreResult:
        scorer = self.batch_scorer
        if isinstance(scorer, ServerReference):
            scorer.routes = {tuple(p): req.tree_id for req in requests for p in req.prefixes}
        try:
            return super().score_nodes(requests, max_batch_tokens=max_batch_tokens)
        finally:
            if isinstance(scorer, ServerReference):
                scorer.routes = {}
