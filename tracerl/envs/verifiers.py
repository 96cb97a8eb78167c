"""Verifiers: terminal rewards in [0, 1] from a final answer and the task's gold aliases.

A verifier is any ``(answer: str, task: Task) -> float``; ``em`` and ``f1`` are the standard
SQuAD/HotpotQA-style ones (spec section 1: exact match by default, F1 optional). ``data.verifier``
names one of :data:`VERIFIERS` or any such function by import path (``my_pkg.rewards:judge``);
``@VERIFIERS.register("name")`` adds one by name.
"""

from __future__ import annotations

import math
import re
import string
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracerl.core.registry import Registry
from tracerl.envs.plugins import SignedRegistry
from tracerl.core.types import Task
from tracerl.errors import UserError

Verifier = Callable[[str, Task], float]

MAX_FAILED_CALLS = 32
"""Consecutive failed verifier calls (an exception, a reward that is not a finite number) that
stop a run: a verifier whose backend is down would otherwise train on zeros."""
MAX_REWARD = 1e6
"""Largest reward magnitude accepted from a plug-in verifier (rewards are meant to lie in [0, 1];
1e308 passed and turned every mean into an overflow)."""

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


VERIFIERS: Registry[Verifier] = SignedRegistry("verifier", "f(answer, task) -> float", 2)
"""Verifiers by name; ``get`` also resolves ``package.module:function`` import paths."""
VERIFIERS.add("em", exact_match)
VERIFIERS.add("f1", token_f1)
VERIFIERS.add("answered", answered)
BUILT_IN = ("em", "f1", "answered")


def get_verifier(name: str, max_failed_calls: int = MAX_FAILED_CALLS) -> Verifier:
    """A verifier by name or import path, guarded (:class:`GuardedVerifier`); unknown names fail
    listing the valid ones, a function of the wrong shape names what it takes."""
    verifier = VERIFIERS.get(name)
    if not callable(verifier):
        raise ValueError(f"verifier {name!r} is a {type(verifier).__name__}, not a function (answer, task) -> float")
    if name in BUILT_IN:  # never raise, always return a float in [0, 1]
        return verifier
    return GuardedVerifier(verifier, name, max_failed_calls)


class VerifierError(UserError):
    """A verifier failed every call in a row up to its limit; the run stops (checkpoints intact)."""


@dataclass
class GuardedVerifier:
    """A plug-in verifier whose failures are counted like a tool's, not raised from deep in a rollout.

    A call that raises, or returns anything but a finite real number (a string ``"1.0"``, a
    ``nan``, an ``inf``, a ``1e308`` past :data:`MAX_REWARD`), scores 0.0 and is counted; the first
    failure is reported in one line on stderr, and :data:`MAX_FAILED_CALLS` failures in a row
    raise :class:`VerifierError` naming the verifier and its last failure. A reward outside
    [0, 1] that is finite is the verifier's business and passes unchanged.
    """

    fn: Callable[[str, Task], Any]
    name: str
    max_failed_calls: int = MAX_FAILED_CALLS
    calls: int = 0
    failures: int = 0
    streak: int = 0
    last_failure: str = ""

    def __call__(self, answer: str, task: Task) -> float:
        self.calls += 1
        try:
            value = self.fn(answer, task)
        except Exception as exc:  # noqa: BLE001 - a plug-in may raise anything; it is counted, not fatal
            return self._failed(f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._failed(f"returned a {type(value).__name__}, not a number")
        if not math.isfinite(value) or abs(value) > MAX_REWARD:
            return self._failed(f"returned {value:g}, not a finite number of magnitude at most {MAX_REWARD:g}")
        self.streak = 0
        return float(value)

    def _failed(self, why: str) -> float:
        self.failures += 1
        self.streak += 1
        self.last_failure = why
        if self.failures == 1:
            print(f"tracerl: verifier {self.name!r} {why} (scored 0.0; the run stops after "
                  f"{self.max_failed_calls} failures in a row)", file=sys.stderr)
        if self.streak >= self.max_failed_calls:
            raise VerifierError(f"verifier {self.name!r} failed {self.streak} calls in a row (last: {why}); fix the "
                                "verifier or its backend; the last checkpoint is intact")
        return 0.0
