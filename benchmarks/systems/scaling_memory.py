"""Peak memory per FSDP rank while the policy and its frozen reference are built (scaling.py's ``memory`` part).

Two ways of building a rank's sharded policy and reference (the KL term on) from a model folder,
each in a fresh ``torchrun`` launch so the peaks do not mix:

* ``full``: what every rank did before: load the whole float32 model, then deep-copy it twice and
  shard the copies (policy and reference);
* ``shards``: what the trainer does now (:func:`tracerl.distributed.shard_load.sharded_from_folder`):
  build on the meta device, allocate the local shard, read only its rows from the safetensors.

Per rank: the resident set's high-water mark above its level just before building (``ru_maxrss``
minus ``VmRSS``; it counts the safetensors pages a rank touches), and the bytes of its shards.
Run as ``torchrun --nproc_per_node N scaling_memory.py MODE FOLDER OUT.json``; scaling.py drives it.

:func:`measure_training` (with Ray: run scaling.py with .venv-dist): each rank's resident memory
while ``tracerl train --nproc 2`` trains a 38M-parameter model (the smoke tokenizer, random
weights), with the in-process rollout backend against one Ray rollout worker (16 MiB weight
buckets: the default 256 MiB would hold this whole model in one). With the backend rank 0 keeps a
whole copy of the policy to sample from; with Ray workers it keeps none after start (it still
loads the model once, to write the run's ``initial/``). Private memory (``RssAnon``) is compared:
the pages of Ray's object store a rank maps count as shared.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "tie_word_embeddings": True}
"""A 41M-parameter Qwen3 (165 MB in float32): large enough that weights, not the interpreter, set the peaks."""


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def write_model(folder: Path) -> int:
    """Save the benchmark's model (seeded) to ``folder``; its float32 parameter bytes."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**SHAPE), dtype=torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def rank_main(mode: str, folder: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from tracerl.distributed.fsdp import init_distributed, shard_model
    from tracerl.distributed.shard_load import local_bytes, sharded_from_folder

    torch.set_num_threads(1)
    mesh = init_distributed("gloo", "cpu", timeout_s=300)
    before = _rss_bytes()
    if mode == "full":
        whole = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        reference = shard_model(copy.deepcopy(whole).eval().requires_grad_(False), mesh)
        policy = shard_model(copy.deepcopy(whole), mesh)
        del whole
    else:
        reference = sharded_from_folder(folder, mesh, "float32", "cpu").requires_grad_(False)
        policy = sharded_from_folder(folder, mesh, "float32", "cpu")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row = {"rank": dist.get_rank(), "peak_above_before_bytes": max(0, peak - before),
           "shard_bytes": local_bytes(policy) + local_bytes(reference)}
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(rows))
    dist.destroy_process_group()


def measure(nprocs: list[int], work: Path) -> dict[str, Any]:
    """Both modes at each process count: per-rank peaks and shard bytes, against the model's size."""
    folder = work / "model"
    whole = write_model(folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = []
    for nproc in nprocs:
        for mode in ("full", "shards"):
            out = work / f"{mode}_{nproc}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                   __file__, mode, str(folder), str(out)]
            subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=900)
            rows = json.loads(out.read_text())
            peak = max(r["peak_above_before_bytes"] for r in rows)
            runs.append({"nproc": nproc, "mode": mode, "ranks": rows, "max_peak_bytes": peak,
                         "max_peak_over_model": peak / whole})
    return {"model": {**SHAPE, "float32_bytes": whole},
            "what": "policy + frozen reference per rank; peak resident set above the level before building",
            "runs": runs}


TRAIN_SHAPE = {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 12,
               "num_key_value_heads": 4, "head_dim": 64, "tie_word_embeddings": True}
"""The training measurement's model: 38M parameters (151 MB in float32) over the smoke tokenizer's vocabulary."""


def _training_model(folder: Path) -> int:
    """The smoke model's folder (tokenizer, format) with random weights of :data:`TRAIN_SHAPE`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    shutil.copytree(ROOT / "tracerl" / "testbed" / "weights" / "smoke", folder,
                    ignore=shutil.ignore_patterns("model.safetensors", "manifest.json", "pretrain_log.json"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=vocab, **TRAIN_SHAPE), dtype=torch.float32)
    model.save_pretrained(folder)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _ranks(tag: str) -> dict[int, int]:
    """pid -> RANK of the live processes whose environment carries ``TRACERL_MEM_TAG=tag``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in (entry / "environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if env.get("TRACERL_MEM_TAG") == tag and "RANK" in env:
            found[int(entry.name)] = int(env["RANK"])
    return found


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _train_and_watch(run: Path, extra: list[str], tag: str) -> dict[str, Any]:
    """``tracerl train --nproc 2`` (2 steps), polling each rank's resident memory: its high-water
    mark (``VmHWM``) and its largest resident set once the first step's line is written."""
    # a fixed mmap threshold: glibc then returns freed large blocks, so a rank's resident set is what it holds
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRACERL_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRACERL_MEM_TAG": tag, "RAY_AUTH_MODE": "disabled", "MALLOC_MMAP_THRESHOLD_": "131072"}
    cmd = [sys.executable, "-m", "tracerl.cli", "train", "grpo", "--smoke", "--steps", "3", "--out", str(run),
           "--nproc", "2", "--set", f"model.name_or_path={run.parent / 'model'}", "--set", "eval.every=0",
           "--set", "optim.kl_coef=0", "--set", "log.checkpoint_every=1000", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hwm: dict[int, int] = {}
    steady: dict[str, dict[int, int]] = {"VmRSS": {}, "RssAnon": {}, "RssShmem": {}}
    while proc.poll() is None:
        training = (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size > 0
        for pid, rank in _ranks(tag).items():
            try:
                hwm[rank] = max(hwm.get(rank, 0), _status(pid, "VmHWM"))
                for field, seen in steady.items() if training else ():
                    seen[rank] = max(seen.get(rank, 0), _status(pid, field))
            except OSError:
                pass
        time.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"tracerl train failed: {proc.stderr.read()[-2000:]}")
    return {"peak_bytes": dict(sorted(hwm.items())), "training_bytes": dict(sorted(steady["VmRSS"].items())),
            "training_private_bytes": dict(sorted(steady["RssAnon"].items())),
            "training_shared_bytes": dict(sorted(steady["RssShmem"].items()))}


def measure_training(work: Path) -> dict[str, Any]:
    """Per-rank memory of ``--nproc 2`` training with the in-process backend and with one Ray worker."""
    whole = _training_model(work / "model")
    runs = {"in_process_backend": _train_and_watch(work / "local", [], "local"),
            "ray_worker": _train_and_watch(work / "ray", ["--set", "rollout.executor=ray", "--set", "rollout.workers=1",
                                                          "--set", "rollout.sync_bucket_mb=16"], "ray")}
    for row in runs.values():  # private memory: the object store's pages a rank maps are shared (RssShmem)
        r0, r1 = row["training_private_bytes"].get(0, 0), row["training_private_bytes"].get(1, 0)
        row["rank0_minus_rank1_private_over_model"] = (r0 - r1) / whole
    return {"model": {**TRAIN_SHAPE, "float32_bytes": whole}, "runs": runs,
            "what": "resident memory per rank: VmHWM (whole run); after step 1 began, the largest VmRSS, RssAnon "
                    "(private) and RssShmem (shared: Ray's object store pages a rank maps)"}


if __name__ == "__main__":
    rank_main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
