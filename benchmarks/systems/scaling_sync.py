"""The two rollout-worker halves of benchmarks/systems/scaling.py: weight sync and placement.

- :func:`weight_sync`: a Qwen3 of ~30M parameters held by this driver (float32 master weights)
  is synced to 2 Ray rollout workers on a local cluster (``rollout.executor = ray``,
  ``object_store``), as a float32 policy and as a bf16 policy (``model.dtype``): bytes sent per
  parameter, seconds, seconds per GB and the driver's peak memory above its level before the sync
  (sampled every 5 ms from /proc/self/status: ``RssAnon``, its own heap, and ``RssShmem``, the
  object store's pages it wrote), with 16 MiB buckets streamed (two in flight at most), and for
  contrast the bf16 policy as one whole-model bucket (what a sync that is not streamed holds).
- :func:`placement`: the busiest worker's planned rollouts over the mean, 8 workers, for 16 and 64
  prompts of equal work (GRPO) or 1-16 rollouts each (allocation), task-id hash against the
  least-loaded placement the executor uses; 50 draws each.

Needs Ray (``.venv-dist``) for the sync half; the placement half is pure.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


KEYS = ("RssAnon", "RssShmem")


def _rss() -> dict[str, int]:
    """This process's resident heap and shared-memory bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in KEYS:
                out[key] = int(value.split()[0]) * 1024
    return out


class PeakRss:
    """This process's peak ``RssAnon`` and ``RssShmem`` while the block runs (a sampling thread)."""

    def __enter__(self) -> PeakRss:
        self.base = _rss()
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._take()

    def _take(self) -> None:
        now = _rss()
        self.peak = {k: max(self.peak[k], now[k]) for k in KEYS}

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._take()

    def above(self) -> dict[str, int]:
        return {k: self.peak[k] - self.base[k] for k in KEYS}


def weight_sync(syncs: int = 3) -> dict[str, Any]:
    import ray
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers_tiny import bpe_tokenizer

    from tracerl.config.schema import resolve_config
    from tracerl.rollout.ray_executor import RayExecutor
    from tracerl.train.executors import worker_spec

    tok = bpe_tokenizer()
    config = Qwen3Config(vocab_size=len(tok), hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=64, intermediate_size=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    parameters = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {"parameters": parameters, "workers": 2, "master_weights_bytes": 4 * parameters,
                           # without a fixed threshold glibc keeps freed large blocks: the heap peak would
                           # then show earlier syncs' high-water mark, not this one's
                           "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_")}
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            for name, dtype, bucket in (("float32", "float32", 16 * 2**20), ("bfloat16", "bfloat16", 16 * 2**20),
                                        ("bfloat16_one_bucket", "bfloat16", 2**40)):
                cfg = resolve_config("grpo", smoke="random", overrides=["rollout.executor=ray", "rollout.workers=2",
                                                                        f"model.dtype={dtype}"])
                executor = RayExecutor(worker_spec(cfg, Path(folder)))
                executor.bucket_bytes = bucket
                rows = []
                for i in range(syncs + 1):  # the first is a warm-up
                    executor.take_metrics()
                    with PeakRss() as rss:
                        executor.sync_weights(model, i + 1)
                    metrics = executor.take_metrics()
                    rows.append({"seconds": metrics["time_sync_weights"], "bytes": metrics["sync_bytes"],
                                 "s_per_gb": metrics["sync_s_per_gb"], **rss.above()})
                executor.close()
                kept = rows[1:]
                out[name] = {"sync_bytes": kept[0]["bytes"], "bytes_per_parameter": kept[0]["bytes"] / parameters,
                             "bucket_bytes": min(bucket, 4 * parameters),
                             "seconds": sum(r["seconds"] for r in kept) / len(kept),
                             "s_per_gb": sum(r["s_per_gb"] for r in kept) / len(kept),
                             "driver_heap_peak_above_before_bytes": max(r["RssAnon"] for r in kept),
                             "driver_shmem_peak_above_before_bytes": max(r["RssShmem"] for r in kept)}
        finally:
            ray.shutdown()
    return out


def placement(draws: int = 50, workers: int = 8) -> dict[str, Any]:
    from tracerl.core.protocol import worker_of
    from tracerl.rollout.placement import imbalance, place

    out: dict[str, Any] = {"workers": workers, "draws": draws}
    for prompts in (16, 64):
        for kind in ("equal", "1-16"):
            hashed, balanced = [], []
            for d in range(draws):
                rng = random.Random(d)
                work = [(f"d{d}-t{i}", 8.0 if kind == "equal" else float(rng.randint(1, 16))) for i in range(prompts)]
                for placed, into in ((place(work, [0.0] * workers), balanced),
                                     ({t: worker_of(t, workers) for t, _ in work}, hashed)):
                    loads = [0.0] * workers
                    for task, amount in work:
                        loads[placed[task]] += amount
                    into.append(imbalance(loads))
            out[f"{prompts}_prompts_{kind}"] = {"hash_mean": sum(hashed) / draws, "hash_max": max(hashed),
                                                "balanced_mean": sum(balanced) / draws, "balanced_max": max(balanced)}
    return out


if __name__ == "__main__":
    import json

    clock = time.perf_counter()
    print(json.dumps({"placement": placement(), "weight_sync": weight_sync()}, indent=1))
    print(f"{time.perf_counter() - clock:.1f} s")
