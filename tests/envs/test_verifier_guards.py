"""A plug-in verifier runs under a tool's protections (issue 50 items 7, 8, 15): a timeout,
``SystemExit`` and other ``BaseException``s caught and counted, rewards that are not finite
numbers of bounded size scored 0 and counted; an environment factory or a tool that raises
anything ends in one line or an infrastructure failure of that call."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from tracerl.core.registry import RegistryError
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.environments import ENVIRONMENTS, EnvSettings, build_environment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import GuardedVerifier, VerifierError

TASK = Task("t", "Who?", ("Tarsik",))


class _Escape(BaseException):
    """Not an ``Exception``: a plug-in's own control-flow signal."""


class _HostileFloat(float):
    def __abs__(self) -> float:
        raise RuntimeError("abs is hostile")

    def __gt__(self, other: object) -> bool:
        raise RuntimeError("comparison is hostile")


def test_a_verifier_that_never_returns_times_out_scored_zero_and_counted(capsys: pytest.CaptureFixture[str]) -> None:
    release = threading.Event()

    def judge(answer: str, task: Task) -> float:
        release.wait()  # hangs until the test lets it go
        return 1.0

    guarded = GuardedVerifier(judge, "judge", max_failed_calls=2, timeout_s=0.05)
    try:
        assert guarded("Tarsik", TASK) == 0.0
        assert (guarded.calls, guarded.failures, guarded.last_failure) == (1, 1, "timed out after 0.05 s")
        assert capsys.readouterr().err == ("tracerl: verifier 'judge' timed out after 0.05 s (scored 0.0; the run "
                                           "stops after 2 failures in a row)\n")
        with pytest.raises(VerifierError, match=r"verifier 'judge' failed 2 calls in a row \(last: timed out"):
            guarded("Tarsik", TASK)
    finally:
        release.set()


@pytest.mark.parametrize(("behaviour", "why"), [
    (lambda: sys.exit(0), "called exit(0)"),
    (lambda: sys.exit("bye"), "called exit('bye')"),
    (lambda: (_ for _ in ()).throw(_Escape("out")), "raised _Escape: out"),
])
def test_system_exit_and_base_exceptions_are_counted_not_raised(behaviour: Any, why: str) -> None:
    guarded = GuardedVerifier(lambda answer, task: behaviour(), "judge", timeout_s=5.0)
    assert guarded("a", TASK) == 0.0
    assert (guarded.failures, guarded.streak, guarded.last_failure) == (1, 1, why)


def test_keyboard_interrupt_in_a_verifier_propagates() -> None:
    def judge(answer: str, task: Task) -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        GuardedVerifier(judge, "judge", timeout_s=5.0)("a", TASK)


@pytest.mark.parametrize(("value", "why"), [
    (10**400, "returned an int too large for a float"),
    (_HostileFloat(2e6), "returned 2e+06, not a finite number of magnitude at most 1e+06"),
    (float("-inf"), "returned -inf, not a finite number of magnitude at most 1e+06"),
])
def test_rewards_past_a_float_or_the_bound_score_zero(value: Any, why: str) -> None:
    guarded = GuardedVerifier(lambda answer, task: value, "judge", timeout_s=None)
    assert guarded("a", TASK) == 0.0
    assert guarded.last_failure == why


def test_a_hostile_float_subclass_in_range_comes_back_as_a_plain_float() -> None:
    reward = GuardedVerifier(lambda answer, task: _HostileFloat(0.5), "judge", timeout_s=5.0)("a", TASK)
    assert reward == 0.5 and type(reward) is float


def test_a_verifier_sys_exit_through_the_rollout_engine_scores_zero_and_the_rollout_ends() -> None:
    """Through the real engine: every answer's verifier calls sys.exit(0); the rollouts finish with
    reward 0 and the failures are counted (it used to end the trainer with exit 0)."""
    import torch
    from helpers_tiny import ScriptedPolicy, bpe_tokenizer

    from tracerl.agent.formats import get_format
    from tracerl.rollout.engine import EngineConfig, RolloutEngine

    def judge(answer: str, task: Task) -> float:
        sys.exit(0)

    tok = bpe_tokenizer()
    env = ToolEnvironment(ToolSet([]), EnvConfig(max_turns=2))
    guarded = GuardedVerifier(judge, "judge", max_failed_calls=10, timeout_s=5.0)
    policy = ScriptedPolicy(tok, lambda prefix: "Action: answer[Tarsik]")
    engine = RolloutEngine(policy, env, get_format("react"), guarded,
                           EngineConfig(max_turns=2, max_turn_tokens=32, max_total_tokens=200))
    trees, _ = engine.rollout([TASK], [3], generator=torch.Generator().manual_seed(0))
    rewards = [t.reward for tree in trees for t in tree.trajectories.values()]
    assert rewards == [0.0, 0.0, 0.0]
    assert (guarded.calls, guarded.failures) == (3, 3)


def test_an_environment_factory_that_raises_is_one_line_naming_data_environment() -> None:
    def broken(documents: Any, settings: EnvSettings) -> ToolEnvironment:
        raise RuntimeError("index\nserver\ndown")

    def quits(documents: Any, settings: EnvSettings) -> ToolEnvironment:
        sys.exit(2)

    ENVIRONMENTS.add("test_broken_factory", broken)
    ENVIRONMENTS.add("test_quitting_factory", quits)
    with pytest.raises(RegistryError) as err:
        build_environment("test_broken_factory", [], EnvSettings())
    assert str(err.value) == ("data.environment 'test_broken_factory' raised RuntimeError while building the "
                              "environment: index server down")
    with pytest.raises(RegistryError, match=r"^data.environment 'test_quitting_factory' raised SystemExit"):
        build_environment("test_quitting_factory", [], EnvSettings())


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_a_tool_raising_a_base_exception_subclass_is_an_infra_failure(timeout_s: float | None) -> None:
    def escape(query: str) -> str:
        """Raise a BaseException subclass."""
        raise _Escape("left the loop")

    env = ToolEnvironment(ToolSet([escape]), EnvConfig(max_turns=3, tool_timeout_s=timeout_s))
    episode = env.start(TASK)
    obs = episode.step(Action("tool", name="escape", arguments={"query": "x"}))
    assert (obs.done, obs.error, obs.infra_failed) == (True, True, True)
    assert obs.text == "tool escape raised _Escape: left the loop"
    stats = env.take_tool_stats()
    assert (stats.calls, stats.failures) == (1, 1)
