"""Isolated tools: a call that hangs holding the GIL is killed at the timeout, its worker replaced,
no thread leaks, Ctrl-C still stops the caller, and a tool's 10 MB output or message stays bounded."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import helpers_tools
import pytest
from helpers_procs import BOUND_S, HUNG, alive, stop, trainer_process, wait_for

from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.environments import load_tool
from tracerl.envs.isolation import shared_worker
from tracerl.envs.tools import CHARS_PER_TOKEN, MAX_FAILURE_CHARS, Tool, ToolFailure, ToolSet

TASK = Task("t", "Who?", ("Tarsik",))
TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
NAMES = ("echo", "worker_pid", "backtrack", "sleepy", "huge_error", "huge_result", "dies", "quits")


def isolated_tools() -> ToolSet:
    return ToolSet([Tool.from_function(getattr(helpers_tools, n), isolated=True) for n in NAMES])


def step(name: str, timeout_s: float | None = 5.0, tools: ToolSet | None = None, max_obs: int = 256):
    limits = EnvConfig(tool_timeout_s=timeout_s, max_observation_tokens=max_obs)
    env = ToolEnvironment(tools or isolated_tools(), limits)
    return env.start(TASK).step(Action(kind="tool", name=name, arguments={"query": "q"}))


def test_a_gil_holding_regex_is_killed_at_the_timeout_and_the_worker_replaced() -> None:
    """On main the same regex on the timeout thread held the GIL: a 1 s timeout returned after the
    regex finished (16 s for 2^36 paths; this one has 2^40). A liveness bound, not a timing claim."""
    tools = isolated_tools()
    first = int(tools.call("worker_pid", {"query": "q"}, timeout_s=30))
    started = shared_worker().started
    clock = time.monotonic()
    with pytest.raises(ToolFailure, match=r"tool backtrack timed out after 1 s \(its worker process was killed\)"):
        tools.call("backtrack", {"query": "q"}, timeout_s=1.0)
    assert time.monotonic() - clock < 20
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # the hung worker is gone (killed and reaped)
    second = int(tools.call("worker_pid", {"query": "q"}, timeout_s=30))  # a fresh worker serves the next call
    assert second != first and shared_worker().started == started + 1
    assert tools.call("echo", {"query": "hi"}, timeout_s=30) == "got hi"


def test_forty_timed_out_calls_leak_no_thread_and_no_process() -> None:
    """On main each timed-out call left a thread behind (292 after 40 steps)."""
    tools = isolated_tools()
    tools.call("echo", {"query": "warm"}, timeout_s=30)
    threads = threading.active_count()
    for _ in range(40):
        obs = step("sleepy", timeout_s=0.05, tools=tools)
        assert obs.infra_failed and "timed out after 0.05 s" in obs.text
    assert threading.active_count() <= threads
    children = [p for p in Path(f"/proc/{os.getpid()}/task").iterdir()]  # this process's own threads
    assert len(children) <= threads + 4  # torch/OpenMP may hold a few native threads


def test_failures_in_the_worker_fail_only_their_call() -> None:
    tools = isolated_tools()
    died = step("dies", tools=tools)
    assert died.infra_failed and "worker process died (exit code 9)" in died.text
    quit_ = step("quits", tools=tools)
    assert quit_.infra_failed and "called exit(3)" in quit_.text
    assert step("echo", tools=tools).text == "got q"


@pytest.mark.parametrize("isolated", [True, False])
def test_a_10_mb_message_or_result_becomes_a_bounded_observation(isolated: bool) -> None:
    """On main a 10 MB exception message became the observation whole (one step 182 s, 1.9 GB)."""
    tools = ToolSet([Tool.from_function(getattr(helpers_tools, n), isolated=isolated)
                     for n in ("huge_error", "huge_result")])
    tracemalloc.start()
    try:
        for _ in range(5):
            failed = step("huge_error", tools=tools, max_obs=16)
            result = step("huge_result", tools=tools, max_obs=16)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert failed.infra_failed and failed.text.startswith("tool huge_error raised RuntimeError: xxx")
    assert len(failed.text) <= MAX_FAILURE_CHARS + 100 and "9999000 more characters cut" in failed.text
    assert result.text == "y" * (16 * CHARS_PER_TOKEN) and not result.infra_failed
    assert held < 2_000_000  # nothing of the 10 MB strings is kept after the calls


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["foreground", "background-job"])
def test_ctrl_c_stops_a_caller_waiting_on_a_hung_isolated_tool_and_kills_its_worker(tmp_path: Path,
                                                                                   ignore_sigint: bool) -> None:
    """Run as a background job (``make test &``) the child inherits SIGINT ignored and the test used
    to fail, leaving the worker spinning: the child's script restores Python's handler (what the
    test depends on), waits for the tool to be running (a file it writes, not a sleep), and
    whatever happens the child and its worker are stopped."""
    marker = tmp_path / "running"
    proc = trainer_process(HUNG, str(marker), ignore_sigint=ignore_sigint)
    worker = 0
    try:
        worker = int(proc.stdout.readline())
        wait_for(marker.exists, "the tool starting in its worker")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        wait_for(lambda: not alive(worker), "the worker ending")
    finally:
        stop(proc, worker)


def test_plugin_tools_run_isolated_unless_switched_off() -> None:
    assert load_tool("helpers_tools:echo").isolated
    assert not load_tool("helpers_tools:echo", isolate=False).isolated


def test_an_isolated_tool_must_be_importable() -> None:
    def local(query: str) -> str:
        """Defined inside a function: a worker process cannot import it."""
        return query

    with pytest.raises(ValueError, match="tool 'local' runs isolated, so it must be a module-level function"):
        Tool.from_function(local, isolated=True)


def test_a_tool_importable_only_after_the_worker_started_still_runs(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder put on sys.path after the worker started: the worker is restarted with it."""
    isolated_tools().call("echo", {"query": "start the worker"}, timeout_s=30)
    (tmp_path / "late_tools.py").write_text('def shout(text: str) -> str:\n    """Shout."""\n    return text.upper()\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_tools

    tools = ToolSet([Tool.from_function(late_tools.shout, isolated=True)])
    assert tools.call("shout", {"text": "hi"}, timeout_s=30) == "HI"


def test_a_tool_the_worker_cannot_import_fails_only_its_call() -> None:
    import types

    module = types.ModuleType("nowhere_tools")  # importable here, not in a worker process
    exec('def ghost(query: str) -> str:\n    """Not importable elsewhere."""\n    return query\n', module.__dict__)
    sys.modules["nowhere_tools"] = module
    try:
        tools = ToolSet([Tool.from_function(module.ghost, isolated=True)])
        with pytest.raises(ToolFailure, match="tool ghost raised ModuleNotFoundError in the worker process"):
            tools.call("ghost", {"query": "q"}, timeout_s=30)
        assert isolated_tools().call("echo", {"query": "still"}, timeout_s=30) == "got still"
    finally:
        del sys.modules["nowhere_tools"]
