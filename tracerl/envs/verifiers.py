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
from tracerl.envs.tool_errors import ToolFailure, bounded_message
from tracerl.envs.tools import call_with_timeout
from tracerl.errors import UserError

Verifier = Callable[[str, Task], float]

MAX_FAILED_CALLS = 32
"""Consecutive failed verifier calls (an exception, a reward that is not a finite number) that
stop a run: a verifier whose backend is down would otherwise train on zeros."""
MAX_REWARD = 1e6
"""Largest reward magnitude accepted from a plug-in verifier (rewards are meant to lie in [0, 1];
1e308 passed and turned every mean into an overflow)."""
VERIFIER_TIMEOUT_S = 60.0
"""Seconds a plug-in verifier call may run before it is abandoned, scored 0.0 and counted (a judge
that hangs would otherwise hang the run). The abandoned call runs on a daemon thread until it returns."""

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


def get_verifier(name: str, max_failed_calls: int = MAX_FAILED_CALLS,
                 timeout_s: float | None = VERIFIER_TIMEOUT_S) -> Verifier:
    """A verifier by name or import path, guarded (:class:`GuardedVerifier`, each call limited to
    ``timeout_s`` seconds); unknown names fail listing the valid ones, a function of the wrong
    shape names what it takes."""
    verifier = VERIFIERS.get(name)
    if not callable(verifier):
        raise ValueError(f"verifier {name!r} is a {type(verifier).__name__}, not a function (answer, task) -> float")
    if name in BUILT_IN:  # never raise, always return a float in [0, 1]
        return verifier
    return GuardedVerifier(verifier, name, max_failed_calls, timeout_s)


class VerifierError(UserError):
    """A verifier failed every call in a row up to its limit; the run stops (train/run.py's
    :func:`~tracerl.train.run.truthful_stop` adds which checkpoint a resume continues from)."""


@dataclass
class GuardedVerifier:
    """A plug-in verifier under the protections a tool has, its failures counted, not raised.

    Each call runs on a timeout thread (:func:`~tracerl.envs.tools.call_with_timeout`): past
    ``timeout_s`` seconds (:data:`VERIFIER_TIMEOUT_S`) it is abandoned. A call that times out,
    raises (``SystemExit`` and any other ``BaseException`` included; only the user's
    ``KeyboardInterrupt`` propagates), or returns anything but a finite real number (a string
    ``"1.0"``, a ``nan``, an ``inf``, ``10**400``, a ``1e308`` past :data:`MAX_REWARD`, a float
    subclass whose methods raise) scores 0.0 and is counted; the first failure is reported in one
    line on stderr, and :data:`MAX_FAILED_CALLS` failures in a row raise :class:`VerifierError`
    naming the verifier and its last failure. A reward outside [0, 1] that is finite is the
    verifier's business and passes unchanged.

    A verifier runs in the trainer's process (on a thread): it is trusted code. ``os._exit`` or a
    native crash inside it ends the run, and a call past its timeout keeps running on its abandoned
    daemon thread until it returns. Cost: a call on the timeout thread takes ~0.2 ms, against ~0.01 ms
    without (``em`` on a busy 2-core machine), so the built-in verifiers are not wrapped.
    """

    fn: Callable[[str, Task], Any]
    name: str
    max_failed_calls: int = MAX_FAILED_CALLS
    timeout_s: float | None = VERIFIER_TIMEOUT_S
    calls: int = 0
    failures: int = 0
    streak: int = 0
    last_failure: str = ""

    def __call__(self, answer: str, task: Task) -> float:
        self.calls += 1
        try:
            if self.timeout_s is None:
                value = _score(self.fn, answer, task)
            else:  # call_with_timeout is typed for tools' text; it hands back whatever the call returns
                run: Callable[..., Any] = call_with_timeout
                value = run(lambda: _score(self.fn, answer, task), self.timeout_s, what=f"verifier {self.name!r}")
        except KeyboardInterrupt:  # the user's Ctrl-C
            raise
        except ToolFailure as exc:  # the timeout
            return self._failed(f"{exc}".removeprefix(f"verifier {self.name!r} "))
        except BaseException as exc:  # noqa: BLE001 - a plug-in may raise anything, sys.exit included; counted
            return self._failed(_describe(exc))
        if isinstance(value, str):  # a reward that is not a finite number of bounded size
            return self._failed(value)
        self.streak = 0
        return value

    def _failed(self, why: str) -> float:
        self.failures += 1
        self.streak += 1
        self.last_failure = why
        if self.failures == 1:
            print(f"tracerl: verifier {self.name!r} {why} (scored 0.0; the run stops after "
                  f"{self.max_failed_calls} failures in a row)", file=sys.stderr)
        if self.streak >= self.max_failed_calls:
            raise VerifierError(f"verifier {self.name!r} failed {self.streak} calls in a row (last: {why}); fix the "
                                "verifier or its backend")  # the trainer adds where a resume continues from
        return 0.0


def _score(fn: Callable[[str, Task], Any], answer: str, task: Task) -> float | str:
    """``fn(answer, task)`` as a plain float, or why it is not a reward (a string).

    The value is read with C-level float operations only (``float``, ``math.isfinite``,
    ``math.fabs``, ``math.copysign``): a float subclass's own ``__abs__`` or comparisons never run,
    and ``10**400`` (which overflows a float) is a failure, not an ``OverflowError``.
    """
    value = fn(answer, task)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"returned a {type(value).__name__}, not a number"
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return f"returned an {type(value).__name__} too large for a float"
    if not math.isfinite(number) or math.fabs(number) > MAX_REWARD:
        return f"returned {math.copysign(math.fabs(number), number):g}, not a finite number of magnitude at most {MAX_REWARD:g}"
    return math.copysign(math.fabs(number), number)  # a plain float whatever subclass came back


def _describe(exc: BaseException) -> str:
    """One bounded line for what a verifier raised (its message may itself fail to print)."""
    if isinstance(exc, SystemExit):
        return f"called exit({bounded_message(_safe_repr(exc.code), 200)})"
    try:
        text = " ".join(str(exc).split())
    except Exception:  # noqa: BLE001 - a hostile __str__
        text = "<message cannot be printed>"
    return f"raised {type(exc).__name__}: {bounded_message(text, 200)}"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__
        return f"<{type(value).__name__}>"
