"""Starting ``tracerl train --nproc N``: torchrun launches N copies of the same command line.

Under torchrun (``WORLD_SIZE`` set) rank 0 runs the Trainer as usual (train/run.py) and the
other ranks serve the sharded update (:func:`tracerl.distributed.trainer.serve_rank`). torch.distributed is not imported
here: the one-process path never loads it.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn



def launched_rank() -> int:
    """``RANK`` set by torchrun (0 when this process was not launched by it)."""
    return int(os.environ.get("RANK", "0"))


def launched_world() -> int:
    """``WORLD_SIZE`` set by torchrun (1 when this process was not launched by it)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def relaunch(nproc: int, argv: list[str]) -> int:
    """Run ``tracerl <argv>`` as ``nproc`` processes on this machine through torchrun
    (``torch.distributed.run --standalone``); returns its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "tracerl.cli", *without_nproc(argv)]
    return subprocess.run(cmd, check=False).returncode


def leave_rank(code: int | str | None) -> NoReturn:
    """End a torchrun-launched copy: the ``atexit`` handlers run and the streams are flushed while
    the interpreter is whole, then the process exits without finalising it.

    The process group is destroyed by then (the Trainer's and the serving ranks' ``close``), but
    gloo's C++ threads and objects can outlive it; when interpreter finalisation tears down a
    tensor they still reference, the thread that takes the GIL is killed and the rank aborts
    ("terminate called without an active exception", exit -6) after a run that succeeded.
    """
    if isinstance(code, str):  # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less ``--nproc N`` / ``--nproc=N``: torchrun's parser would read ``--nproc`` as its own
    ``--nproc-per-node``; the launched copies take the count from ``WORLD_SIZE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def check_launch(preset: str | None, config_file: str | None, overrides: list[str], smoke: bool | str,
                 resume: str | None, out: str | None, nproc: int, *, trust_code: bool = False,
                 overwrite: bool = False) -> None:
    """What would fail on every rank, checked once before torchrun starts them (one line, exit 1)."""
    from tracerl.runs.checkpoint import latest_checkpoint
    from tracerl.train.preflight import checked_config
    from tracerl.config.dist import check_dist
    from tracerl.runs.sharded import DCP_FOLDER, CheckpointStateError
    from tracerl.runs.folder import refuse_if_state
    from tracerl.train.run import resumed_config

    if resume:  # --set/--config/PRESET may change only what a resume may change (config/resume_rule.py)
        config, _ = resumed_config(Path(resume), preset=preset, config_file=config_file, overrides=overrides,
                                   trust_code=trust_code)
        config.dist.nproc = nproc
        check_dist(config)
        folder = latest_checkpoint(Path(resume))
        if folder is not None and not (folder / DCP_FOLDER / ".metadata").is_file():
            raise CheckpointStateError(f"{folder} was written by one process (no {DCP_FOLDER}/ with the sharded "
                                       "optimiser); resume it with --nproc 1")
        return
    checked_config(preset or "", config_file=config_file, overrides=overrides, smoke=smoke)
    if not overwrite:  # --overwrite: rank 0 removes the previous run once torchrun has started it
        refuse_if_state(Path(out or "."))
