"""Verifiers: normalisation, exact match over aliases, token F1 by hand."""

from __future__ import annotations

import pytest

from tracerl.core.types import Task
from tracerl.envs.verifiers import exact_match, get_verifier, normalize_answer, token_f1


def task(*answers: str) -> Task:
    return Task("t", "q", answers)


def test_normalize() -> None:
    assert normalize_answer("  The  Eiffel-Tower, an icon!") == "eiffeltower icon"
    assert normalize_answer("A") == ""
    assert normalize_answer("Anthem") == "anthem"  # articles only as whole words


@pytest.mark.parametrize(
    ("answer", "answers", "expected"),
    [("the Kalvoran.", ("Kalvoran",), 1.0), ("kalvoren", ("Kalvoran",), 0.0),
     ("USA", ("United States", "usa"), 1.0), ("", ("x",), 0.0)],
)
def test_exact_match(answer, answers, expected) -> None:
    assert exact_match(answer, task(*answers)) == expected


def test_token_f1_by_hand() -> None:
    # pred tokens {new, york, city}, gold {new, york}: P = 2/3, R = 1, F1 = 2*(2/3)/(5/3) = 0.8
    assert token_f1("New York City", task("New York")) == pytest.approx(0.8)
    # best alias wins: "york" vs "New York" gives P=1, R=1/2 -> 2/3; vs "York" gives 1
    assert token_f1("York", task("New York", "York")) == 1.0
    assert token_f1("York", task("New York")) == pytest.approx(2 / 3)
    assert token_f1("Paris", task("London")) == 0.0
    assert token_f1("the", task("a")) == 1.0  # both normalise to nothing


def test_registry() -> None:
    assert get_verifier("em") is exact_match and get_verifier("f1") is token_f1
    with pytest.raises(ValueError, match="valid: answered, em, f1"):
        get_verifier("bleu")


def test_answered_is_a_format_reward() -> None:
    assert get_verifier("answered")("Anything", task("Paris")) == 1.0
    assert get_verifier("answered")("   ", task("Paris")) == 0.0
