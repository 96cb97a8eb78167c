"""Which ids the reference scores as the gold: the ids the policy writes for that answer action.

A byte-level BPE (built locally) merges a separator with the next word (``' Lumen'``), so a format
that writes ``<answer> Lumen </answer>`` (``search_r1``) must score ``' Lumen'`` after ``<answer>``,
not ``'Lumen'`` glued to the opener.
"""

from __future__ import annotations

import pytest
from helpers_chat import chat_tokenizer
from helpers_tiny import bpe_tokenizer

from tracerl.agent.formats import get_format
from tracerl.core.types import Action
from tracerl.models.scoring import EMPTY_THINK, answer_token_ids


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


def _policy_ids(tok, fmt, gold: str, prefix: str = "") -> list[int]:
    """Ids of the answer action as the policy writes it, from the opener on."""
    rendered = fmt.render_action(Action(kind="answer", answer=gold))
    return tok.encode(prefix + rendered[rendered.index(fmt.answer_opener):], add_special_tokens=False)


@pytest.mark.parametrize("gold", ["Lumen", "Ada Stone"])
def test_search_r1_scores_the_separator_merged_into_the_gold(tok, gold: str) -> None:
    fmt = get_format("search_r1", tokenizer=tok)
    opener, answer = answer_token_ids(tok, fmt, gold)
    assert tok.decode(opener + answer) == f"<answer> {gold}"  # today's main scored '<answer>Lumen'
    assert tok.decode(answer).strip() == gold
    ids = _policy_ids(tok, fmt, gold)
    assert ids[: len(opener) + len(answer)] == opener + answer  # exactly the ids the policy samples


def test_search_r1_lumen_is_one_spaced_token(tok) -> None:
    """The tokenizer merges the space into the first answer token: it is an answer token."""
    fmt = get_format("search_r1", tokenizer=tok)
    opener, answer = answer_token_ids(tok, fmt, "Lumen")
    assert [tok.decode([i]) for i in answer][0].startswith(" ")
    assert tok.decode(opener) == "<answer>"


@pytest.mark.parametrize("name,text", [("chat", "<answer>Lumen"), ("react", "Action: answer[Lumen")])
def test_formats_without_a_separator(tok, name: str, text: str) -> None:
    fmt = get_format(name, tokenizer=tok)
    opener, answer = answer_token_ids(tok, fmt, "Lumen")
    assert tok.decode(opener + answer) == text
    assert tok.decode(opener) == fmt.answer_opener
    assert _policy_ids(tok, fmt, "Lumen")[: len(opener) + len(answer)] == opener + answer


def test_react_bpe_of_the_react_sentences() -> None:
    tok = bpe_tokenizer()
    fmt = get_format("react")
    opener, answer = answer_token_ids(tok, fmt, "Ada Stone")
    assert tok.decode(opener) == "Action: answer[" and tok.decode(answer) == "Ada Stone"


def test_empty_think_prefix_goes_with_the_opener(tok) -> None:
    fmt = get_format("chat", tokenizer=tok)
    opener, answer = answer_token_ids(tok, fmt, "Lumen", prefix=EMPTY_THINK)
    assert tok.decode(opener) == EMPTY_THINK + "<answer>"
    assert tok.decode(answer) == "Lumen"
    assert _policy_ids(tok, fmt, "Lumen", EMPTY_THINK)[: len(opener) + len(answer)] == opener + answer


class _NoOpener:
    name = "broken"
    answer_opener = "<final>"

    def render_action(self, action: Action, thought: str = "") -> str:
        return f"<answer>{action.answer}</answer>"


def test_a_format_whose_answer_lacks_its_opener_is_an_error(tok) -> None:
    with pytest.raises(ValueError, match="opener '<final>'"):
        answer_token_ids(tok, _NoOpener(), "Lumen")
