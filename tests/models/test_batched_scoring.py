"""Batched, tree-aware reference scoring: equal to the per-trajectory scorer, each prefix scored once."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from helpers_tiny import SCORING_VOCAB, bpe_tokenizer, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "allocation"))
from alloc_trees import add_chain  # noqa: E402

from tracerl.agent.formats import get_format  # noqa: E402
from tracerl.core.types import Action, RolloutTree, Task, Turn  # noqa: E402
from tracerl.models import batched_scoring  # noqa: E402
from tracerl.models.batched_scoring import ScoreRequest, ScoreStats, score_prefixes_batched  # noqa: E402
from tracerl.models.scoring import ReferenceScorer, score_prefixes  # noqa: E402

VOCAB = SCORING_VOCAB  # the vocabulary of conftest's sharp_model/exact_model
MARK = 96  # an opener token no trajectory uses: counts scored blocks in the forward inputs


def _expected(model, req: ScoreRequest) -> torch.Tensor:
    """Today's per-trajectory scorer (packed: one prefill plus one packed forward)."""
    opener = torch.tensor(req.opener_ids, dtype=torch.long) if req.opener_ids else None
    return score_prefixes(model, torch.tensor(req.input_ids), list(req.cut_points), torch.tensor(req.answer_ids),
                          opener_ids=opener).to(torch.float64)


@st.composite
def forest(draw):
    """Requests from trees: leaves share a trunk up to a branch point, with 1-3 gold answers of
    1-3 tokens, with or without an opener, cuts anywhere (duplicates and unsorted allowed)."""
    golds = draw(st.lists(st.tuples(st.lists(st.integers(0, 90), min_size=1, max_size=3),
                                    st.sampled_from([(), (91,), (92, 93)])), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(1, 3))):  # trees
        trunk = draw(st.lists(st.integers(0, 90), min_size=1, max_size=25))
        answer, opener = draw(st.sampled_from(golds))
        for _ in range(draw(st.integers(1, 4))):  # leaves
            cut = draw(st.integers(1, len(trunk)))
            ids = trunk[:cut] + draw(st.lists(st.integers(0, 90), min_size=0, max_size=25))
            cuts = draw(st.lists(st.integers(1, len(ids)), min_size=1, max_size=5))
            requests.append(ScoreRequest(tuple(ids), tuple(cuts), tuple(answer), opener))
    return requests


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=forest(), cap=st.sampled_from([8, 64, 16384]), row_cap=st.sampled_from([1, 24, 4096]))
def test_batched_matches_per_trajectory_scorer(exact_model, requests, cap: int, row_cap: int) -> None:
    stats = ScoreStats()
    got = score_prefixes_batched(exact_model, requests, max_batch_tokens=cap, max_row_tokens=row_cap, stats=stats)
    for req, scores in zip(requests, got, strict=True):
        assert scores.shape == (len(req.cut_points),) and scores.device.type == "cpu"
        torch.testing.assert_close(scores.double(), _expected(exact_model, req), atol=1e-5, rtol=0)
    keys = {(r.opener_ids, r.answer_ids, r.input_ids[:c]) for r in requests for c in r.cut_points}
    assert stats.unique_cuts == len(keys) <= stats.cuts == sum(len(r.cut_points) for r in requests)
    assert stats.forwards >= 2 and stats.forwards % 2 == 0  # a prefill and a block forward per batch
    assert stats.forwards <= 2 * stats.rows
    if cap == 16384:  # everything fits one batch per kind (single-sequence rows, trie rows)
        assert stats.forwards in (2, 4)
    seqs = {r.input_ids[: max(r.cut_points)] for r in requests}
    maximal = [s for s in seqs if not any(t != s and t[: len(s)] == s for t in seqs)]
    assert stats.block_tokens == sum(len(k[0] or (0,)) + len(k[1]) - 1 for k in keys)
    if row_cap == 1:  # no packing: one row per maximal sequence
        assert (stats.rows, stats.prefill_tokens) == (len(maximal), sum(map(len, maximal)))
    if row_cap == 4096:  # sequences sharing a first token share a trie row holding each prefix once
        trie = {s[:k] for s in maximal for k in range(1, len(s) + 1)}
        assert (stats.rows, stats.prefill_tokens) == (len({s[0] for s in maximal}), len(trie))


def test_shared_prefixes_are_scored_once(sharp_model) -> None:
    """Four leaves of one tree share the prompt (cut 4) and two share the first boundary (cut 8):
    9 cuts asked, 5 distinct prefixes, and exactly 5 opener blocks reach the model."""
    gen = torch.Generator().manual_seed(3)
    prompt, turn1 = torch.randint(0, 90, (4,), generator=gen).tolist(), [10, 11, 12, 13]
    leaves = [prompt + turn1 + [20, 21, 22], prompt + turn1 + [30, 31], prompt + [40, 41, 42, 43], prompt + [50]]
    cuts = [(4, 8, 11), (4, 8, 10), (4, 8), (4,)]
    requests = [ScoreRequest(tuple(ids), c, (5, 6), (MARK,)) for ids, c in zip(leaves, cuts, strict=True)]
    seen: list[int] = []
    embed = sharp_model.get_input_embeddings()
    hook = embed.register_forward_pre_hook(lambda _, args: seen.extend(args[0].flatten().tolist()))
    try:
        stats = ScoreStats()
        got = score_prefixes_batched(sharp_model, requests, stats=stats)
    finally:
        hook.remove()
    # distinct prefixes: the prompt [:4], prompt + turn1 [:8], leaf 0 [:11], leaf 1 [:10], leaf 2 [:8]
    assert (stats.cuts, stats.unique_cuts) == (9, 5)
    assert seen.count(MARK) == 5
    # one trie row holds every token of the tree once: prompt 4 + turn1 4 + leaf suffixes 3 + 2 + 4
    # (leaf 3 needs only the prompt, a prefix of the others: it adds nothing)
    assert stats.rows == 1 and stats.prefill_tokens == 17
    assert len(seen) == stats.padded_tokens == stats.prefill_tokens + stats.block_tokens  # one row: no padding
    assert stats.block_tokens == 5 * 2  # MARK + the first answer token per distinct prefix
    assert got[0][0] == got[1][0] == got[2][0] == got[3][0]  # one value per distinct prefix
    assert got[0][1] == got[1][1]


def test_prefix_sequences_fold_into_longer_rows(sharp_model) -> None:
    long = tuple(range(1, 21))
    requests = [ScoreRequest(long, (20,), (3,), (MARK,)), ScoreRequest(long[:12], (6, 12), (3,), (MARK,))]
    stats = ScoreStats()
    got = score_prefixes_batched(sharp_model, requests, stats=stats)
    assert stats.rows == 1 and stats.prefill_tokens == 20  # one row, no second prefill of long[:12]
    for req, scores in zip(requests, got, strict=True):
        torch.testing.assert_close(scores.double(), _expected(sharp_model, req), atol=1e-4, rtol=0)


def test_full_logit_head_and_fallback_give_the_same_values(sharp_model, monkeypatch) -> None:
    requests = [ScoreRequest(tuple(range(30)), (3, 17, 30), (4, 5), ()),
                ScoreRequest(tuple(range(5, 25)), (20,), (8,), (9,))]
    assert batched_scoring._split_head(sharp_model) is not None  # decoder + chunked LM head by default
    base = score_prefixes_batched(sharp_model, requests)
    monkeypatch.setattr(sharp_model.config, "logit_scale", 2.0, raising=False)  # no split head: full logits
    assert batched_scoring._split_head(sharp_model) is None
    for a, b in zip(base, score_prefixes_batched(sharp_model, requests), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    monkeypatch.setattr(batched_scoring, "MASKABLE_ATTENTION", ("eager",))  # as if sdpa ignored 4D masks
    stats = ScoreStats()
    for a, b in zip(base, score_prefixes_batched(sharp_model, requests, stats=stats), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert stats.forwards == 0 and stats.rows == len(requests)  # per-request path


@pytest.mark.parametrize(
    "request_,match",
    [
        (ScoreRequest((1, 2), (3,), (1,)), "cut_points"),
        (ScoreRequest((1, 2), (), (1,)), "cut_points"),
        (ScoreRequest((1, 2), (1,), ()), "answer_ids"),
    ],
)
def test_bad_requests_raise(sharp_model, request_: ScoreRequest, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        score_prefixes_batched(sharp_model, [request_])
    with pytest.raises(ValueError, match="max_batch_tokens"):
        score_prefixes_batched(sharp_model, [], max_batch_tokens=0)
    assert score_prefixes_batched(sharp_model, []) == []


# --- trees through ReferenceScorer.score -----------------------------------------------------------


def _turn(tok, text: str, observation: str = "", answer: str = "") -> Turn:
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if answer:
        return Turn(enc(text) + [tok.eos_token_id], [], text, Action(kind="answer", answer=answer))
    return Turn(enc(text), enc(observation), text, Action(kind="tool", name="search", arguments={"query": "x"}))


def _tree(tok, tree_id: str, task: Task) -> RolloutTree:
    """root -> search -> {answer, open -> answer}; root -> answer; root -> search (infra failure)."""
    tree = RolloutTree(tree_id, task.id, tok.encode("Question: " + task.question + "\n", add_special_tokens=False))
    search = _turn(tok, "Action: search[Blue River]\nObservation:", " Blue River is a novel by Ada Stone.\n")
    node1 = tree.add_child(0, search)
    add_chain(tree, node1, [_turn(tok, "Action: answer[Ada]", answer="Ada")], 0.0)
    add_chain(tree, node1, [_turn(tok, "Action: open[Ada Stone]\nObservation:", " Ada Stone was born in Lumen.\n"),
                            _turn(tok, "Action: answer[Lumen]", answer="Lumen")], 1.0)
    add_chain(tree, 0, [_turn(tok, "Action: answer[Varo]", answer="Varo")], 0.0)
    add_chain(tree, 0, [_turn(tok, "Action: search[x]\nObservation:", " Error.\n")], 0.0, infra_failed=True)
    return tree


def test_reference_score_fills_trees_like_readiness() -> None:
    tok, fmt = bpe_tokenizer(), get_format("react")
    scorer = ReferenceScorer(tiny_model(len(tok), seed=2), tok, fmt)
    tasks = {t.id: t for t in (Task("t1", "Where was the author of Blue River born?", ("Lumen",)),
                               Task("t2", "Who founded Varo?", ("Orla Fenn",)))}
    trees = [_tree(tok, "a", tasks["t1"]), _tree(tok, "b", tasks["t2"])]
    stats = scorer.score(trees, tasks)
    # per tree: leaves need 2 + 3 + 1 cuts over 3 distinct prefixes (root, search, open)
    assert (stats.requests, stats.cuts, stats.unique_cuts, stats.reused_cuts) == (6, 12, 6, 0)
    for tree in trees:
        for traj in tree.trajectories.values():
            if traj.infra_failed:
                assert traj.readiness is None
                continue
            expected = scorer.readiness(traj, tasks[tree.task_id])
            assert traj.readiness == pytest.approx(expected, abs=1e-4)
            assert all(math.isfinite(v) for v in traj.readiness)
    assert trees[0].root.readiness == trees[0].trajectories[2].readiness[0]
    assert trees[0].root.readiness != trees[1].root.readiness  # different gold answers
    # a new leaf below scored nodes is answered from the nodes: no forward at all
    leaf = add_chain(trees[0], 1, [_turn(tok, "Action: answer[Ada Stone]", answer="Ada Stone")], 0.0)
    again = scorer.score(trees, tasks)
    assert (again.requests, again.reused_cuts, again.forwards) == (0, 2, 0)
    assert trees[0].trajectories[leaf].readiness == trees[0].trajectories[2].readiness
    with pytest.raises(ValueError, match="t1"):
        scorer.score([_tree(tok, "c", tasks["t1"])], {"t2": tasks["t2"]})
    # plain trajectories (no tree): same values, shared prefixes still scored once within the call
    loose = _tree(tok, "d", tasks["t1"]).trajectories
    plain = scorer.score(list(loose.values()), tasks)
    assert (plain.trajectories, plain.cuts, plain.unique_cuts) == (3, 6, 3)
    for leaf, traj in loose.items():
        expected = trees[0].trajectories[leaf].readiness
        assert traj.readiness == expected if expected is None else traj.readiness == pytest.approx(expected, abs=1e-5)


def test_eager_attention_takes_the_same_masks(exact_model) -> None:
    """The trie and block masks are additive 4D masks: eager attention must read them as sdpa does."""
    import copy

    eager = copy.deepcopy(exact_model)
    eager.config._attn_implementation = "eager"
    trunk = tuple(range(1, 13))
    requests = [ScoreRequest(trunk + (20, 21, 22), (4, 12, 15), (5, 6), (MARK,)),
                ScoreRequest(trunk[:8] + (30, 31), (8, 10), (5,), ()),
                ScoreRequest((40, 41, 42), (1, 3), (7, 8, 9), (MARK,))]
    stats = ScoreStats()
    for req, scores in zip(requests, score_prefixes_batched(eager, requests, stats=stats), strict=True):
        torch.testing.assert_close(scores.double(), _expected(exact_model, req), atol=1e-5, rtol=0)
    assert stats.rows == 2  # the two trunk sequences share a trie row; the third is alone


def test_reference_score_takes_a_batch_scorer() -> None:
    """``batch_scorer`` replaces the HF forwards; node reuse, write-back and the finiteness check stay."""
    tok, fmt = bpe_tokenizer(), get_format("react")
    task = Task("t1", "Where was the author of Blue River born?", ("Lumen",))
    calls: list[list[ScoreRequest]] = []

    def by_cut(model, requests, *, max_batch_tokens, stats):  # l = -cut: readable, and tells cuts apart
        calls.append(list(requests))
        stats.requests += len(requests)
        return [torch.tensor([-float(c) for c in r.cut_points]) for r in requests]

    scorer = ReferenceScorer(tiny_model(len(tok), seed=2), tok, fmt, batch_scorer=by_cut)
    tree = _tree(tok, "a", task)
    stats = scorer.score([tree], {"t1": task})
    assert len(calls) == 1 and stats.requests == 3  # one call for the three scored leaves
    for traj in tree.trajectories.values():
        if not traj.infra_failed:
            assert traj.readiness == [-float(c) for c in traj.boundaries]
    assert tree.root.readiness == -float(tree.trajectories[2].boundaries[0])
    add_chain(tree, 1, [_turn(tok, "Action: answer[Ada Stone]", answer="Ada Stone")], 0.0)
    assert scorer.score([tree], {"t1": task}).reused_cuts == 2 and len(calls[-1]) == 0  # answered from nodes
    scorer.batch_scorer = lambda model, requests, **_: [torch.full((len(r.cut_points),), float("nan")) for r in requests]
    with pytest.raises(ValueError, match="non-finite readiness"):
        scorer.score([_tree(tok, "b", task)], {"t1": task})
