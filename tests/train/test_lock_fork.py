"""A child the run's process forks (a chat-template sandbox, a tool worker) never holds the run lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tracerl.runs.folder import RunLock

HOLDER = textwrap.dedent("""
    import multiprocessing, sys, time
    from pathlib import Path
    from tracerl.runs.folder import RunLock

    lock = RunLock(Path(sys.argv[1]))
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=False)
    child.start()
    Path(sys.argv[2]).write_text(str(child.pid))
    time.sleep(60)
""")


def test_a_killed_run_leaves_no_lock_in_the_child_it_forked(tmp_path: Path) -> None:
    run, pid_file = tmp_path / "run", tmp_path / "child.pid"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), str(pid_file)])
    child = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        holder.send_signal(signal.SIGKILL)  # as a kill mid-step would
        holder.wait()
        os.kill(child, 0)  # the forked child lives on
        lock = RunLock(run)  # ... and holds nothing: the folder can be resumed at once
        assert lock.held
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
