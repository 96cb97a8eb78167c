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
"""

from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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


if __name__ == "__main__":
    rank_main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
