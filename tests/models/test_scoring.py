"""Reference scoring: cached scorers agree with the one-forward-per-cut oracle; readiness wiring."""

from __future__ import annotations

import pytest
import torch
from helpers_tiny import SCORING_VOCAB, bpe_tokenizer, tiny_model, word_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl.agent.formats import get_format
from tracerl.core.types import Action, Task, Trajectory, Turn
from tracerl.models.scoring import ReferenceScorer, answer_token_ids, score_prefixes, score_prefixes_naive

VOCAB = SCORING_VOCAB  # the vocabulary of conftest's sharp_model/exact_model


@st.composite
def scoring_case(draw):
    length = draw(st.integers(1, 60))
    cuts = draw(st.lists(st.integers(1, length), min_size=1, max_size=6))
    ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length))
    answer = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4))
    opener = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=3))
    return ids, cuts, answer, opener


@settings(max_examples=40, deadline=None)
@given(case=scoring_case(), method=st.sampled_from(["packed", "crop"]))
def test_cached_scorer_matches_naive(exact_model, case, method: str) -> None:
    ids, cuts, answer, opener = case
    args = (torch.tensor(ids), cuts, torch.tensor(answer))
    opener_ids = torch.tensor(opener, dtype=torch.long) if opener else None
    expected = score_prefixes_naive(exact_model, *args, opener_ids=opener_ids)
    got = score_prefixes(exact_model, *args, opener_ids=opener_ids, method=method)
    assert got.shape == (len(cuts),)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", ["packed", "crop"])
def test_many_cuts_on_a_long_sequence(sharp_model, method: str) -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (300,), generator=gen)
    cuts = sorted(torch.randint(1, 301, (32,), generator=gen).tolist(), reverse=True)
    answer, opener = torch.tensor([3, 14, 15]), torch.tensor([9, 2])
    expected = score_prefixes_naive(sharp_model, ids, cuts, answer, opener_ids=opener)
    got = score_prefixes(sharp_model, ids, cuts, answer, opener_ids=opener, method=method)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert expected.max() - expected.min() > 1.0  # the cuts really see different contexts


def test_scores_are_mean_answer_logprobs(sharp_model) -> None:
    """Hand check at one cut: mean of log p(a_j | ids[:c] + opener + a_<j)."""
    ids, answer, opener = torch.tensor([4, 8, 15, 16, 23]), torch.tensor([42 % VOCAB, 7]), torch.tensor([1])
    with torch.no_grad():
        logits = sharp_model(input_ids=torch.tensor([[4, 8, 15, 1, 42 % VOCAB, 7]])).logits[0]
    logp = torch.log_softmax(logits, -1)
    expected = (logp[3, 42 % VOCAB] + logp[4, 7]) / 2
    got = score_prefixes(sharp_model, ids, [3], answer, opener_ids=opener)
    assert got.item() == pytest.approx(expected.item(), abs=1e-5)


@pytest.mark.parametrize(
    "cuts,answer,match",
    [
        ([0], [1], "cut_points"),
        ([6], [1], "cut_points"),
        ([], [1], "cut_points"),
        ([2], [], "answer_ids"),
    ],
)
@pytest.mark.parametrize("fn", [score_prefixes, score_prefixes_naive])
def test_bad_inputs_raise(sharp_model, fn, cuts, answer, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fn(sharp_model, torch.arange(5), cuts, torch.tensor(answer, dtype=torch.long))


def test_bad_shapes_and_method_raise(sharp_model) -> None:
    with pytest.raises(ValueError, match="input_ids"):
        score_prefixes(sharp_model, torch.arange(6).view(2, 3), [1], torch.tensor([1]))
    with pytest.raises(ValueError, match="method"):
        score_prefixes(sharp_model, torch.arange(6), [1], torch.tensor([1]), method="fast")  # type: ignore[arg-type]


def test_answer_tokens_bpe_split_at_the_opener() -> None:
    tok, fmt = bpe_tokenizer(), get_format("react")
    opener, answer = answer_token_ids(tok, fmt, "Lumen")
    assert tok.decode(opener) == "Action: answer["
    assert tok.decode(answer) == "Lumen"


def test_answer_tokens_word_level_ignore_spacing() -> None:
    tok, fmt = word_tokenizer(), get_format("react")
    opener, answer = answer_token_ids(tok, fmt, "Ada Stone")
    vocab = tok.get_vocab()
    assert opener == [vocab["Action"], vocab[":"], vocab["answer"], vocab["["]]
    assert answer == [vocab["Ada"], vocab["Stone"]]
    with pytest.raises(ValueError, match="answer"):
        answer_token_ids(tok, fmt, "  ")


def _trajectory(tok) -> tuple[Trajectory, Task]:
    task = Task("t1", "Where was the author of Blue River born?", ("Lumen",))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    search = Action(kind="tool", name="search", arguments={"query": "Blue River"})
    turns = [
        Turn(enc("Action: search[Blue River]\nObservation:"), enc(" Blue River is a novel by Ada Stone.\n"), "", search),
        Turn(enc("Action: open[Ada Stone]\nObservation:"), enc(" Ada Stone was born in Lumen.\n"), "", search),
        Turn(enc("Action: answer[Lumen]") + [tok.eos_token_id], [], "", Action(kind="answer", answer="Lumen")),
    ]
    return Trajectory("t1", "g", enc("Question: " + task.question + "\n"), turns), task


def test_readiness_scores_gold_after_each_boundary() -> None:
    tok, fmt = bpe_tokenizer(), get_format("react")
    model = tiny_model(len(tok), seed=2)
    traj, task = _trajectory(tok)
    scorer = ReferenceScorer(model, tok, fmt)
    got = scorer.readiness(traj, task)
    opener, answer = answer_token_ids(tok, fmt, "Lumen")
    expected = score_prefixes_naive(
        model, torch.tensor(traj.token_ids), traj.boundaries, torch.tensor(answer), opener_ids=torch.tensor(opener)
    )
    assert len(got) == traj.num_transitions + 1 == 3
    assert got == pytest.approx(expected.tolist(), abs=1e-4)
    assert all(v < 0 for v in got)


def test_reference_is_a_frozen_copy() -> None:
    tok, fmt = bpe_tokenizer(), get_format("react")
    model = tiny_model(len(tok), seed=2)
    model.train()
    traj, task = _trajectory(tok)
    scorer = ReferenceScorer(model, tok, fmt)
    before = scorer.readiness(traj, task)
    with torch.no_grad():  # the live policy moves on; the reference must not
        for p in model.parameters():
            p.add_(0.5)
    assert scorer.readiness(traj, task) == before
    assert not scorer.model.training
    assert not any(p.requires_grad for p in scorer.model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="task"):
        scorer.readiness(traj, Task("other", "q", ("a",)))
