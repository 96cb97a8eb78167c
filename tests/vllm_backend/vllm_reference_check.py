"""``algo.reference_backend = 'vllm'`` in a real training run, as a script; prints one JSON line of facts.

Two steps of ``trace --smoke-random`` (model.backend = hf) with readiness scored by a frozen vLLM engine of
the initial policy; then every trajectory the steps trained on is rescored by the HF scorer (the
reference's HF copy, same initial weights) and compared with the readiness the run wrote to its
rollout log. Run in a subprocess by ``test_vllm_backend.py`` (one engine start, and vLLM's
in-process CPU worker never touches the pytest process).

    python tests/vllm_backend/vllm_reference_check.py RUN_DIR  # from the repository root, in .venv-vllm
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]  # this checkout's tracerl

from tracerl.models.scoring import score_readiness  # noqa: E402
from tracerl.models.vllm_scoring import VLLMReference  # noqa: E402
from tracerl.config.schema import resolve_config  # noqa: E402
from tracerl.train.loop import Trainer  # noqa: E402
from tracerl.runs.rollout_log import read_step  # noqa: E402


def main(run_dir: Path) -> None:
    config = resolve_config("trace", smoke="random", overrides=[
        "steps=2", "algo.reference_backend=vllm", "model.vllm_gpu_memory_utilization=0.2"])
    out: dict = {}
    start = time.perf_counter()
    with Trainer(config, run_dir) as trainer:
        out["build_s"] = round(time.perf_counter() - start, 2)
        out["engine_is_vllm"] = isinstance(trainer.reference.batch_scorer, VLLMReference)
        vllm_scorer, calls = trainer.reference.batch_scorer, []

        def counted(*args, **kwargs):
            calls.append(1)
            return vllm_scorer(*args, **kwargs)

        trainer.reference.batch_scorer = counted
        trees: dict[str, object] = {}
        write = trainer.rollout_log.write

        def keep(step, step_trees, *args, **kwargs):
            trees.update({t.tree_id: t for t in step_trees})
            return write(step, step_trees, *args, **kwargs)

        trainer.rollout_log.write = keep
        trainer.run()
        out["run_s"] = round(time.perf_counter() - start - out["build_s"], 2)
        out["vllm_calls"] = len(calls)
        out["engine_version"] = vllm_scorer.policy.version  # never synced: still the initial weights
        out["policy_moved"] = any(not torch.equal(a, b) for a, b in
                                  zip(trainer.model.parameters(), trainer.reference.model.parameters(), strict=True))
        # the HF scorer on copies of the same trajectories (no tree: every cut is scored afresh)
        pairs = [((tree.tree_id, leaf), traj) for tree in trees.values()
                 for leaf, traj in tree.trajectories.items() if traj.readiness is not None]
        copies = []
        for _, traj in pairs:
            c = copy.copy(traj)
            c.readiness = None
            copies.append(c)
        score_readiness(trainer.reference.model, copies, trainer.tasks, trainer.reference._answer_ids)
        hf = {key: c.readiness for (key, _), c in zip(pairs, copies, strict=True)}
        in_memory = [abs(a - b) for (key, traj) in pairs for a, b in zip(traj.readiness, hf[key], strict=True)]
        written = []
        for step in (1, 2):
            for rec in read_step(run_dir, step):
                for t in rec["trajectories"]:
                    if t["readiness"] is not None:
                        written += [abs(a - b) for a, b in zip(t["readiness"], hf[(rec["tree_id"], t["leaf"])], strict=True)]
        out["scored_values"] = len(in_memory)
        out["written_values"] = len(written)
        out["max_abs_diff"] = max(in_memory)
        out["written_max_abs_diff"] = max(written)
        out["mean_abs_readiness"] = sum(abs(v) for r in hf.values() for v in r) / len(in_memory)
    out["engine_closed"] = trainer.reference_engine is None
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
