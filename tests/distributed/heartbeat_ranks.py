"""Ranks of the heartbeat test, run under torchrun: ``heartbeat_ranks.py OUT TIMEOUT_S``.

Both ranks join as ``tracerl train --nproc 2`` does (rendezvous store, ``run`` command, then the
gloo group on that store). Rank 0 then works alone for 2.5 x TIMEOUT_S (a long rollout), sends
``ping`` and both ranks run a collective; then rank 0 stops its heartbeat (as a frozen process
would) and sleeps, and rank 1 must stop with one line (stderr, exit 3) about TIMEOUT_S later.
Rank 1 writes what it received, and when, to OUT/rank1.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tracerl.distributed.commands import CommandChannel, RankLostError, rendezvous_store
from tracerl.distributed.fsdp import init_distributed


def main(out: Path, timeout_s: float) -> None:
    store, rank, _ = rendezvous_store(timeout_s)
    channel = CommandChannel(store, rank, timeout_s)
    if rank == 0:
        channel.start_heartbeat()
        channel.send("run", str(out))
        init_distributed("gloo", "cpu", timeout_s, store)
        time.sleep(2.5 * timeout_s)  # rank 0's own phase, longer than a collective may wait
        channel.send("ping")
        dist.all_reduce(torch.ones(1))
        channel.stop_heartbeat()  # hung from here on
        time.sleep(30 * timeout_s)
        return
    kind, arg = channel.receive()
    init_distributed("gloo", "cpu", timeout_s, store)
    report = {"seen": [kind], "arg": arg}
    clock = time.monotonic()
    try:
        while True:
            kind, _ = channel.receive()
            report["seen"].append(kind)
            report[f"{kind}_after_s"] = time.monotonic() - clock
            if kind == "ping":
                total = torch.ones(1)
                dist.all_reduce(total)
                report["sum"] = float(total)
                clock = time.monotonic()
    except RankLostError as err:
        print(err, file=sys.stderr)
        report["lost_after_s"] = time.monotonic() - clock
        (out / "rank1.json").write_text(json.dumps(report))
        sys.exit(3)


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
