"""Concurrent tool calls at the tool layer: a pool of isolated workers (one call each), workers
that die with their trainer, tools that cannot print into the trainer's console or fork it, the
batch form and ``async def`` tools. Waits are on events (files, exits), never on timings."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import helpers_pool_tools
import pytest
from helpers_procs import BOUND_S, HUNG, alive, stop, trainer_process, wait_for

from tracerl.envs.isolation import shared_worker
from tracerl.envs.tools import Tool, ToolFailure, ToolSet

def test_isolated_calls_in_flight_together_each_get_a_worker(tmp_path: Path) -> None:
    """Four calls that each wait for all four: served one at a time by one worker they could never
    meet (each would answer 'alone'); the pool gives each its own process."""
    tools = ToolSet([Tool.from_function(helpers_pool_tools.rendezvous, isolated=True)])
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(tools.call("rendezvous", {"query": f"{tmp_path}|4"}, 90)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "alone" not in out and len(set(out)) == 4
    assert shared_worker().size >= 4


def test_a_worker_dies_with_its_trainer_when_the_trainer_is_sigkilled(tmp_path: Path) -> None:
    """Before: the hung tool's worker outlived a killed trainer, spinning a core for 30 minutes."""
    marker = tmp_path / "running"
    proc = trainer_process(HUNG, str(marker))
    worker = 0
    try:
        worker = int(proc.stdout.readline())
        wait_for(marker.exists, "the tool starting in its worker")
        assert int(marker.read_text()) == worker and alive(worker)
        proc.kill()  # SIGKILL: no atexit, no cleanup of the trainer's own
        proc.wait()
        wait_for(lambda: not alive(worker), "the orphaned worker ending")
    finally:
        stop(proc, worker)


def test_a_tool_printing_5_mb_reaches_neither_stdout_nor_stderr() -> None:
    """Isolated and in-process alike: the trainer prints only its own lines; a failing isolated
    call names the start of what it printed."""
    script = """
        import helpers_pool_tools
        from tracerl.envs.tools import Tool, ToolFailure, ToolSet

        for isolated in (True, False):
            tools = ToolSet([Tool.from_function(helpers_pool_tools.chatty, isolated=isolated)])
            print(tools.call("chatty", {"query": "ok"}, timeout_s=120), flush=True)
            try:
                tools.call("chatty", {"query": "fail"}, timeout_s=120)
            except ToolFailure as exc:
                print(str(exc)[:80], "|", "it printed: spam" in str(exc), flush=True)
    """
    proc = trainer_process(script)
    out, err = proc.communicate(timeout=BOUND_S * 2)
    assert proc.returncode == 0, err
    assert err == ""
    assert out.splitlines() == [
        "quiet answer", "tool chatty raised RuntimeError: after printing (it printed: spam spam spam spam | True",
        "quiet answer", "tool chatty raised RuntimeError: after printing | False"]


def test_a_tool_that_forks_in_process_leaves_a_silent_child_that_ends() -> None:
    """Before: the forked child ran on as a copy of the trainer and died printing 646 lines."""
    script = """
        import helpers_pool_tools
        from tracerl.envs.tools import ToolSet

        tools = ToolSet([helpers_pool_tools.forks])
        print(tools.call("forks", {"query": "a"}), flush=True)
        print(tools.call("forks", {"query": "b"}, timeout_s=60), flush=True)
        print("trainer goes on", flush=True)
    """
    proc = trainer_process(script)
    out, err = proc.communicate(timeout=BOUND_S)
    assert (proc.returncode, err) == (0, "")
    assert out.splitlines() == ["forked a", "forked b", "trainer goes on"]


def _one(query: str) -> str:
    """Look one query up."""
    return f"single {query}"


def test_calls_arriving_together_are_sent_as_one_batch_and_each_gets_its_own_text() -> None:
    """max_batch 4 and a window far longer than the test: the batch goes when the fourth call joins."""
    sent: list[list[str]] = []

    def many(queries: list[str]) -> list[str]:
        sent.append(list(queries))
        return [f"batch {q}" for q in queries]

    tools = ToolSet([Tool.from_function(_one, batch=many, batch_window_s=600, max_batch=4)])
    out: dict[str, str] = {}
    threads = [threading.Thread(target=lambda q=q: out.__setitem__(q, tools.call("_one", {"query": q}, 60)))
               for q in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {q: f"batch {q}" for q in "abcd"}
    assert len(sent) == 1 and sorted(sent[0]) == list("abcd")


def test_a_batch_form_answering_wrongly_fails_every_call_of_the_batch() -> None:
    tools = ToolSet([Tool.from_function(_one, batch=lambda queries: ["only one"], batch_window_s=600, max_batch=2)])
    errors: list[str] = []

    def call(q: str) -> None:
        try:
            tools.call("_one", {"query": q}, 60)
        except ToolFailure as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=call, args=(q,)) for q in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["tool _one's batch form returned 1 items for 2 calls, expected a list of 2 str"] * 2


def test_a_lone_call_goes_alone_after_the_window() -> None:
    tools = ToolSet([Tool.from_function(_one, batch=lambda qs: [q.upper() for q in qs], batch_window_s=0.0)])
    assert tools.call("_one", {"query": "x"}, None) == "X"


async def slow_echo(query: str) -> str:
    """Echo after awaiting a gate the test opens."""
    import asyncio

    if query == "hang":
        await asyncio.Event().wait()
    return f"awaited {query}"


def test_async_tools_are_awaited_and_time_out_as_failures() -> None:
    tools = ToolSet([slow_echo])
    assert tools.call("slow_echo", {"query": "x"}, 30) == "awaited x"
    assert tools.call("slow_echo", {"query": "y"}, None) == "awaited y"
    with pytest.raises(ToolFailure, match=r"tool slow_echo timed out after 0\.05 s"):
        tools.call("slow_echo", {"query": "hang"}, 0.05)


ROLLOUT = """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the shell handed down
    import helpers_pool_tools
    from helpers_tiny import ScriptedPolicy, bpe_tokenizer
    from tracerl.agent.formats import get_format
    from tracerl.core.types import Task
    from tracerl.envs.base import EnvConfig, ToolEnvironment
    from tracerl.envs.tools import Tool, ToolSet
    from tracerl.envs.verifiers import exact_match
    from tracerl.rollout.engine import EngineConfig, RolloutEngine

    folder = sys.argv[1]
    def respond(prefix):
        question = prefix.split("Question: ", 1)[1].split("?", 1)[0]
        return f"Action: search[{folder}/{question}]\\nObservation:"
    tool = Tool.from_function(helpers_pool_tools.mark_then_backtrack, name="search", isolated=True)
    env = ToolEnvironment(ToolSet([tool]), EnvConfig(max_turns=2))
    engine = RolloutEngine(ScriptedPolicy(bpe_tokenizer(), respond), env, get_format("react"), exact_match,
                           EngineConfig(max_turns=2, max_turn_tokens=200, tool_concurrency=4))
    engine.rollout([Task("a", "a?", ("x",)), Task("b", "b?", ("x",))], [1, 1], seed=0)
"""


def test_ctrl_c_during_concurrent_rollouts_kills_every_busy_worker(tmp_path: Path) -> None:
    """Two episodes' isolated calls hang at once on pool threads; Ctrl-C reaches the driver, which
    kills both busy workers (their calls would otherwise run on after the trainer stopped)."""
    proc = trainer_process(ROLLOUT, str(tmp_path), ignore_sigint=True)
    workers: list[int] = []
    try:
        wait_for(lambda: all((tmp_path / q).exists() and (tmp_path / q).read_text() for q in "ab"),
                 "both calls starting in their workers")
        workers = [int((tmp_path / q).read_text()) for q in "ab"]
        assert len(set(workers)) == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND_S)
        assert proc.returncode != 0 and "KeyboardInterrupt" in err
        for pid in workers:
            wait_for(lambda pid=pid: not alive(pid), f"worker {pid} ending")
    finally:
        stop(proc, *workers)


def test_an_isolated_async_tool_is_awaited_in_its_worker() -> None:
    tools = ToolSet([Tool.from_function(helpers_pool_tools.async_echo, isolated=True)])
    assert tools.call("async_echo", {"query": "q"}, 60) == "async q"
