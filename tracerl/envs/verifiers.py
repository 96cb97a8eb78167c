"""Verifiers: terminal rewards in [0, 1] from a final answer and the task's gold aliases.

A verifier is any ``(answer: str, task: Task) -> float``; ``em`` and ``f1`` are the standard
SQuAD/HotpotQA-style ones (spec section 1: exact match by default, F1 optional). ``data.verifier``
names one of :data:`VERIFIERS` or any such function by import path (``my_pkg.rewards:judge``);
``@VERIFIERS.register("name")`` adds one by name.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

from tracerl.core.registry import Registry
from tracerl.core.types import Task

Verifier = Callable[[str, Task], float]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(answer: str, task: Task) -> float:
    """1.0 if the normalised answer equals any normalised alias, else 0.0."""
    pred = normalize_answer(answer)
    return float(any(pred == normalize_answer(alias) for alias in task.answers))


def _f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def token_f1(answer: str, task: Task) -> float:
    """Token-level F1 between the normalised answer and the best alias."""
    return max(_f1(answer, alias) for alias in task.answers)


def answered(answer: str, task: Task) -> float:
    """1.0 for any non-empty final answer: a format reward (format warm-up, sanity runs)."""
    return float(bool(answer.strip()))


VERIFIERS: Registry[Verifier] = Registry("verifier")
"""Verifiers by name; ``get`` also resolves ``package.module:function`` import paths."""
VERIFIERS.add("em", exact_match)
VERIFIERS.add("f1", token_f1)
VERIFIERS.add("answered", answered)


def get_verifier(name: str) -> Verifier:
    """A verifier by name or import path; unknown names fail listing the valid ones."""
    verifier = VERIFIERS.get(name)
    if not callable(verifier):
        raise ValueError(f"verifier {name!r} is a {type(verifier).__name__}, not a function (answer, task) -> float")
    return verifier
