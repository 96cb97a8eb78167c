"""Rank 0's commands to the other ranks through the rendezvous store, with a heartbeat.

Between commands rank 0 does work of its own that can take long: sampling, scoring, evaluation,
writing a checkpoint. The other ranks must not wait for it inside a collective, whose
``dist.timeout_s`` would then have to exceed rank 0's longest phase (and so could no longer tell a
hung rank from a busy one). Instead they poll the store torchrun's rendezvous made (a TCP
key-value store outside the process group) for the next command, while rank 0 adds 1 to a
heartbeat key every ``beat_s`` seconds from a thread of its own:

- a busy rank 0 keeps beating, so a phase of any length is waited for;
- a rank 0 whose process stops (hung, frozen, its node gone) stops beating, and the other
  ranks stop with one line after ``dist.timeout_s`` without a beat;
- the collectives that follow a command (the sharded update, a DCP save) keep their
  ``dist.timeout_s``: every rank is then inside them, so a rank that hangs there is still caught.

Before rank 0's first beat (it builds the policy, its rollout workers and the reference first)
the other ranks wait without a limit of their own: torchrun ends them if rank 0 exits.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tracerl.errors import UserError

HEARTBEAT = "heartbeat"
POLL_S = 0.05
"""Seconds between two looks at the store while a rank waits for a command."""


class RankLostError(UserError):
    """Rank 0 stopped beating (or its store went away) while this rank waited for a command."""


def rendezvous_store(timeout_s: float) -> tuple[Any, int, int]:
    """The store, rank and world size of torchrun's ``env://`` rendezvous (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): under torchrun a client of its agent's store.
    The process group is then made on the same store (:func:`~tracerl.distributed.fsdp.init_distributed`)."""
    store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    store.set_timeout(timedelta(seconds=timeout_s))
    return store, rank, world


class CommandChannel:
    """Commands ``(kind, arg)`` from rank 0 (``send``) to every other rank (``receive``), in order.

    ``store``: the rendezvous store (its keys here are under ``tracerl/``); ``timeout_s``: how long
    a rank waits without a heartbeat before it stops; ``beat_s``: rank 0's beat period (default: a
    quarter of ``timeout_s``, at most 2 s). ``arg`` must be JSON (a folder path, or None).
    """

    def __init__(self, store: Any, rank: int, timeout_s: float, beat_s: float | None = None) -> None:
        self.store = dist.PrefixStore("tracerl", store)
        self.rank, self.timeout_s = rank, float(timeout_s)
        self.beat_s = min(2.0, self.timeout_s / 4) if beat_s is None else float(beat_s)
        self.sent = self.received = 0
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    # --- rank 0 -------------------------------------------------------------------------------

    def start_heartbeat(self) -> None:
        """Beat from a daemon thread until :meth:`stop_heartbeat` (or the process ends)."""
        if self._beater is not None:
            return
        self.store.add(HEARTBEAT, 1)
        self._beater = threading.Thread(target=self._beat, name="tracerl-heartbeat", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.store.add(HEARTBEAT, 1)
            except Exception:  # noqa: BLE001 - the store is gone (the job is ending): nothing to tell
                return

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=self.beat_s + 1.0)
            self._beater = None

    def send(self, kind: str, arg: Any = None) -> None:
        """Rank 0: the next command for every other rank."""
        self.store.set(f"cmd/{self.sent}", json.dumps([kind, arg]))
        self.sent += 1

    # --- ranks > 0 ----------------------------------------------------------------------------

    def receive(self) -> tuple[str, Any]:
        """The next command; waits while rank 0 beats. Raises :class:`RankLostError` when no beat
        came for ``timeout_s`` seconds (after the first one) or the store cannot be reached."""
        key = f"cmd/{self.received}"
        last, since = 0, time.monotonic()
        while True:
            try:
                if self.store.check([key]):
                    kind, arg = json.loads(self.store.get(key))
                    self.received += 1
                    return str(kind), arg
                beats = self.store.add(HEARTBEAT, 0)
            except (RuntimeError, OSError) as err:  # torch's DistStoreError/DistNetworkError are RuntimeErrors
                raise RankLostError(f"rank {self.rank} lost the rendezvous store while waiting for rank 0's "
                                    f"next command ({type(err).__name__}: {' '.join(str(err).split())[:200]})") from None
            now = time.monotonic()
            if beats != last:
                last, since = beats, now
            elif last > 0 and now - since > self.timeout_s:
                raise RankLostError(f"rank {self.rank}: rank 0 sent no heartbeat for {now - since:.1f} s "
                                    f"(dist.timeout_s = {self.timeout_s:g}): it hung or its process or node is "
                                    "gone; this rank stops")
            time.sleep(POLL_S)
