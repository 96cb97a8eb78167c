"""Child processes standing for a trainer, and waits on events with a failure bound (tool tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
BOUND_S = 120.0
"""Failure bound of an event wait (a liveness bound: the events come in well under a second)."""


def wait_for(event, what: str) -> None:
    bound = time.monotonic() + BOUND_S
    while not event():
        if time.monotonic() > bound:
            pytest.fail(f"{what} did not happen within {BOUND_S:g} s")
        time.sleep(0.02)


def stop(proc: subprocess.Popen[str], *pids: int) -> None:
    """Clean up what a test started: the child (killed and reaped) and any worker still running."""
    proc.kill()
    proc.communicate()
    for pid in pids:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def trainer_process(script: str, *args: str, ignore_sigint: bool = False) -> subprocess.Popen[str]:
    """A child Python process standing for the trainer (SIGINT ignored as in a background job)."""
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV, preexec_fn=preexec)


HUNG = """
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the shell handed down
    import helpers_pool_tools, helpers_tools
    from tracerl.envs.tools import Tool, ToolSet

    tools = ToolSet([Tool.from_function(helpers_tools.worker_pid, isolated=True),
                     Tool.from_function(helpers_pool_tools.mark_then_backtrack, isolated=True)])
    print(tools.call("worker_pid", {"query": "q"}), flush=True)
    tools.call("mark_then_backtrack", {"query": sys.argv[1]})  # no timeout: it never returns
"""


