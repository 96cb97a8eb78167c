"""Ranks > 0 wait for rank 0's commands on the rendezvous store, not in a collective: a rank-0
phase longer than ``dist.timeout_s`` completes, and a rank 0 that stops beating ends the others
with one line about ``dist.timeout_s`` later. One torchrun launch of heartbeat_ranks.py (gloo).
Run with ``make test-dist``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.skipif(os.environ.get("TRACERL_DIST_TESTS") != "1",
                                                   reason="multi-process test: run with `make test-dist`")]
HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TIMEOUT_S = 3.0  # also the gloo rendezvous and collectives' limit: room for a loaded CI machine


def test_rank_0_phases_do_not_count_against_the_timeout_but_a_silent_rank_0_does(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "heartbeat_ranks.py"), str(tmp_path), str(TIMEOUT_S)]
    clock = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - clock
    assert (tmp_path / "rank1.json").is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "rank1.json").read_text())
    # rank 0 worked alone for 2.5 x dist.timeout_s: rank 1 waited it out and the collective after it ran
    assert report["seen"] == ["run", "ping"] and report["arg"] == str(tmp_path) and report["sum"] == 2.0
    assert report["ping_after_s"] > 2.5 * TIMEOUT_S
    # then rank 0 stopped beating: rank 1 stopped after the timeout, long before rank 0's 30 x timeout sleep
    assert TIMEOUT_S <= report["lost_after_s"] < 4 * TIMEOUT_S
    assert done.returncode != 0 and wall < 30 * TIMEOUT_S
    lines = [line for line in done.stderr.splitlines() if "rank 0 sent no heartbeat" in line]
    assert len(lines) == 1 and "(dist.timeout_s = 3)" in lines[0], done.stderr[-3000:]
