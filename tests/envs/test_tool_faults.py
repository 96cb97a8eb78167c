"""Tool runtime faults: timeouts that let the process exit, SystemExit/KeyboardInterrupt in a
tool, per-environment call counters and the run-stopping tool health check."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.health import ToolHealth, ToolHealthError, ToolStats, failed_streak
from tracerl.envs.tools import ToolFailure, ToolSet, call_with_timeout
from tracerl.errors import UserError

TASK = Task("t", "Who?", ("Tarsik",))
REPO = Path(__file__).resolve().parents[2]


def echo(query: str) -> str:
    """Repeat the query."""
    return f"got {query}"


def crash(query: str) -> str:
    """Fail like a broken backend."""
    raise ConnectionError("backend down")


def quits(query: str) -> str:
    """A script turned into a tool that calls sys.exit."""
    sys.exit(3)


def interrupted(query: str) -> str:
    """The user pressed Ctrl-C while the tool ran."""
    raise KeyboardInterrupt


def env(**config: object) -> ToolEnvironment:
    return ToolEnvironment(ToolSet([echo, crash, quits, interrupted]), EnvConfig(**config))  # type: ignore[arg-type]


def call(name: str) -> Action:
    return Action(kind="tool", name=name, arguments={"query": "q"})


def test_a_hung_tool_with_a_timeout_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """The tool sleeps 60 s, the timeout is 0.5 s: the call fails and the interpreter exits at once.

    (With a ThreadPoolExecutor worker the interpreter waited for the sleeping tool at exit.)
    """
    script = textwrap.dedent("""
        import time
        from tracerl.core.types import Action, Task
        from tracerl.envs.base import EnvConfig, ToolEnvironment
        from tracerl.envs.tools import ToolSet

        def hang(query: str) -> str:
            '''Never answers.'''
            time.sleep(60)
            return "late"

        env = ToolEnvironment(ToolSet([hang]), EnvConfig(tool_timeout_s=0.5))
        obs = env.start(Task("t", "Q?", ("A",))).step(Action(kind="tool", name="hang", arguments={"query": "q"}))
        print("infra_failed" if obs.infra_failed else "no failure", obs.text)
    """)
    # A liveness bound, not a timing measurement: before the fix this process lived 60 s.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("infra_failed") and "timed out after 0.5 s" in done.stdout


def test_system_exit_in_a_tool_is_an_infra_failure_of_that_call() -> None:
    for config in ({}, {"tool_timeout_s": 5.0}):  # inline and on the timeout thread
        episode = env(**config).start(TASK)
        obs = episode.step(call("quits"))
        assert obs.infra_failed and obs.done and "exit(3)" in obs.text
        assert episode.infra_failed


def test_keyboard_interrupt_in_a_tool_propagates() -> None:
    for config in ({}, {"tool_timeout_s": 5.0}):
        with pytest.raises(KeyboardInterrupt):
            env(**config).start(TASK).step(call("interrupted"))


def test_call_with_timeout_returns_and_reraises_in_the_caller() -> None:
    assert call_with_timeout(lambda: "ok", 5.0) == "ok"
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: str(1 / 0), 5.0)
    gate = threading.Event()
    with pytest.raises(ToolFailure, match="timed out after 0.05 s"):
        call_with_timeout(lambda: str(gate.wait(5)), 0.05, what="slow call")
    gate.set()


def test_stats_count_calls_that_reach_a_tool_and_their_failures() -> None:
    environment = env()
    episode = environment.start(TASK)
    episode.step(call("echo"))
    branch = episode.clone()  # a branch counts into the same environment
    branch.step(call("echo"))
    episode.step(Action(kind="tool", name="nope", arguments={"query": "q"}))  # the policy's mistake: no call
    episode.step(call("crash"))
    stats = environment.stats.take()
    assert stats.per_tool == {"echo": [2, 0], "crash": [1, 1]}
    assert (stats.calls, stats.failures) == (3, 1)
    assert "ConnectionError" in stats.last_failure["crash"] and "echo" not in stats.last_failure
    assert (environment.stats.calls, environment.stats.failures) == (0, 0)  # take() resets


def test_failed_streak_by_hand() -> None:
    streak = 0
    steps = [(4, 4), (3, 3), (0, 0), (5, 5), (2, 1), (1, 1)]  # (calls, failures) per step
    seen = []
    for calls, failures in steps:
        streak = failed_streak(streak, calls, failures)
        seen.append(streak)
    assert seen == [1, 2, 2, 3, 0, 1]  # a step without calls leaves the streak; one success resets it
    with pytest.raises(ValueError):
        failed_streak(0, 2, 3)


def stats(**per_tool: tuple[int, int]) -> ToolStats:
    """A step's counts, ``name=(calls, failures)``; each failing tool's last message is "<name> down"."""
    return ToolStats({n: list(c) for n, c in per_tool.items()}, {n: f"{n} down" for n, c in per_tool.items() if c[1]})


def test_tool_health_stops_after_the_configured_all_failed_steps() -> None:
    health = ToolHealth(max_failed_steps=3)
    health.observe(stats(search=(4, 4)))
    health.observe(stats(search=(4, 3)))  # one call worked: the tool is alive
    health.observe(stats(search=(2, 2)))
    health.observe(stats())
    health.observe(stats(search=(5, 5)))
    with pytest.raises(ToolHealthError, match="data.max_failed_tool_steps = 3") as info:
        health.observe(ToolStats({"search": [1, 1]}, {"search": "tool search raised ConnectionError: backend down"}))
    assert isinstance(info.value, UserError) and "backend down" in str(info.value)
    with pytest.raises(ValueError):
        ToolHealth(0)


def test_a_dead_tool_stops_the_run_while_another_tool_works() -> None:
    """On main the streak counted steps where *every* call failed: a dead search beside a working
    open never stopped the run. Streaks by hand: search 1, 2, (not called) 2, 3 -> stop."""
    health = ToolHealth(max_failed_steps=3)
    health.observe(stats(search=(3, 3), open=(5, 0)))
    health.observe(stats(search=(2, 2), open=(4, 0)))
    health.observe(stats(open=(6, 0)))  # search not called: its streak stays at 2
    assert health.streaks == {"search": 2, "open": 0}
    with pytest.raises(ToolHealthError, match=r"tool 'search' failed every call in 3 consecutive steps \(1 of 1 "
                                              r"in the last; last failure: search down\)"):
        health.observe(stats(search=(1, 1), open=(2, 1)))  # open failed once too, but it also worked


def test_tool_health_state_round_trips() -> None:
    health = ToolHealth(max_failed_steps=2)
    health.observe(stats(search=(1, 1), open=(1, 0)))
    resumed = ToolHealth(max_failed_steps=2)
    resumed.load_state_dict(health.state_dict())
    with pytest.raises(ToolHealthError, match="tool 'search'"):
        resumed.observe(stats(search=(2, 2)))


def test_stats_add_up_per_tool_and_round_trip() -> None:
    total = ToolStats({"search": [2, 1], "open": [1, 0]}, {"search": "a"}) + ToolStats({"search": [3, 0]}, {})
    assert total.per_tool == {"search": [5, 1], "open": [1, 0]}
    assert (total.calls, total.failures, total.last_failure) == (6, 1, {"search": "a"})
    assert ToolStats(**dataclasses.asdict(total)) == total
    assert json.loads(json.dumps(dataclasses.asdict(total))) == dataclasses.asdict(total)


def test_engine_rollouts_feed_tool_health_until_a_dead_backend_stops_the_run() -> None:
    """Through the real rollout engine: each step's stats count the searches; a dead search
    backend (every call failing) stops the run after ``max_failed_steps`` steps, a live one never."""
    import torch
    from helpers_tiny import ScriptedPolicy, bpe_tokenizer

    from tracerl.agent.formats import get_format
    from tracerl.envs.verifiers import exact_match
    from tracerl.rollout.engine import EngineConfig, RolloutEngine
    from tracerl.train.data import RoutedEnvironment

    backend_up = {"value": True}

    def search(query: str) -> str:
        """Search the corpus."""
        if not backend_up["value"]:
            raise ConnectionError("search backend went away")
        return "Ada: Ada is a writer."

    tok = bpe_tokenizer()
    routed = RoutedEnvironment()
    tasks = [Task(f"t{i}", "Who is Ada?", ("writer",)) for i in range(2)]
    routed.register(tasks, ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=3, tool_timeout_s=5.0)))
    policy = ScriptedPolicy(tok, lambda prefix: "Action: search[Ada]\nObservation:")
    engine = RolloutEngine(policy, routed, get_format("react"), exact_match,
                           EngineConfig(max_turns=3, max_turn_tokens=96, max_total_tokens=400))
    health = ToolHealth(max_failed_steps=2)

    def step() -> ToolStats:
        engine.rollout(tasks, [2, 2], generator=torch.Generator().manual_seed(0))
        stats = routed.take_tool_stats()
        health.observe(stats)
        return stats

    healthy = step()
    assert healthy.calls == 4 * 3 and healthy.failures == 0  # 4 rollouts x 3 searching turns
    backend_up["value"] = False
    dead = step()
    assert dead.calls == dead.failures == 4  # each rollout ends at its first failed call
    with pytest.raises(ToolHealthError, match="tool 'search' failed every call in 2 consecutive steps .*search backend went away"):
        step()
