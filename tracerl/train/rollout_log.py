"""Per-step rollout records: every tree a step trained on, as gzip JSONL (read by ``tracerl view``).

``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz`` holds one JSON object per rollout tree of step N::

    {"tree_id", "task_id", "question", "answers", "prompt",
     "nodes": [{"id", "parent", "depth", "text", "assistant_tokens", "observation",
                "observation_tokens", "action", "is_leaf", "reward", "visits", "value_target",
                "readiness", "predictor"}],
     "trajectories": [{"leaf", "node_path", "reward", "infra_failed", "answer",
                       "readiness": [l_0..l_T] | null, "turn_advantage": [one per turn] | null}]}

``prompt`` is the policy's prompt ``S_0`` as the tokenizer decodes it, special tokens kept (so a
chat template's markup shows), cut to :data:`PROMPT_CHARS`; empty when no decoder was given.
``turn_advantage`` is the mean advantage the estimator gave the sampled tokens of each turn
(estimators spread one value per turn, so it is that value). ``predictor`` is the success
predictor's ``P(success)`` of the prefix ending at the node, computed with its public
:meth:`~tracerl.allocation.predictor.SuccessPredictor.predict_nodes` at dump time (before
this step's predictor update, so it is what allocation could see), or null without one.

Crash consistency: a step's file is written atomically (temporary name, ``os.replace``)
before the step's metrics line, and :meth:`RolloutLog.truncate_after` removes files of steps
after the checkpoint on resume, so the folder always matches ``metrics.jsonl``.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import Tensor

from tracerl.core.types import Node, RolloutTree, Task, Trajectory
from tracerl.train.runfolder import remove_stale_temps, write_atomic

ROLLOUTS_DIR = "rollouts"
_STEP_FILE = re.compile(r"^step-(\d{6})\.jsonl\.gz$")
TEXT_CHARS = 600
"""Longest turn text kept per node (longer texts are cut, marked with an ellipsis)."""
OBSERVATION_CHARS = 240
"""Longest observation preview kept per node."""
PROMPT_CHARS = 4000
"""Longest prompt kept per tree (a system text with tool schemas fits)."""


def step_file(run_dir: Path, step: int) -> Path:
    """``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz``."""
    return Path(run_dir) / ROLLOUTS_DIR / f"step-{step:06d}.jsonl.gz"


def logged_steps(run_dir: Path) -> list[int]:
    """Steps with a rollout file, ascending."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


def read_step(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The tree records of ``step`` (a ``ValueError`` naming the file when it is damaged)."""
    path = step_file(run_dir, step)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: step {step} has no rollout record "
                                f"(logged steps: {_ranges(logged_steps(run_dir)) or 'none'})")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except (OSError, EOFError, ValueError) as err:
        raise ValueError(f"{path} is damaged ({type(err).__name__}); rerun the step or delete the file") from None


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _num(value: float | None) -> float | None:
    """JSON has no NaN/inf: null instead; 6 significant digits keep files small."""
    if value is None or not math.isfinite(float(value)):
        return None
    return float(f"{float(value):.6g}")


def node_record(node: Node, predicted: float | None) -> dict[str, Any]:
    """One tree node: its turn (text cut to :data:`TEXT_CHARS`), leaf reward and statistics."""
    turn = node.turn
    return {
        "id": node.id, "parent": node.parent, "depth": node.depth,
        "text": _cut(turn.text, TEXT_CHARS) if turn else "",
        "assistant_tokens": len(turn.assistant_ids) if turn else 0,
        "observation": _cut(turn.observation, OBSERVATION_CHARS) if turn else "",
        "observation_tokens": len(turn.observation_ids) if turn else 0,
        "action": turn.action.kind if turn else "prompt",
        "is_leaf": node.is_leaf, "reward": _num(node.reward), "visits": node.visits,
        "value_target": _num(node.value_target), "readiness": _num(node.readiness),
        "predictor": _num(predicted),
    }


def trajectory_record(leaf: int, traj: Trajectory, advantage: Tensor | None) -> dict[str, Any]:
    """One finished trajectory: reward, readiness ``l_0..l_T`` and the advantage of each turn.

    ``advantage``: the estimator's ``[len(traj.token_ids)]`` tensor; the per-turn value is the
    mean over the turn's assistant span (an empty span gives null).
    """
    per_turn = None
    if advantage is not None:
        per_turn = [_num(float(advantage[s:e].mean())) if e > s else None for s, e in traj.turn_spans]
    return {
        "leaf": leaf, "node_path": list(traj.node_path), "reward": _num(traj.reward),
        "infra_failed": traj.infra_failed, "answer": traj.answer,
        "readiness": [_num(x) for x in traj.readiness] if traj.readiness is not None else None,
        "turn_advantage": per_turn,
    }


def _predictions(trees: Sequence[RolloutTree], predictor: Any) -> list[list[float | None]]:
    """``P(success)`` of every node of every tree with one batched predictor call (None without one)."""
    if predictor is None:
        return [[None] * len(t.nodes) for t in trees]
    flat_trees = [t for t in trees for _ in t.nodes]
    flat_ids = [n.id for t in trees for n in t.nodes]
    values = predictor.predict_nodes(flat_trees, flat_ids) if flat_ids else []
    out, pos = [], 0
    for tree in trees:
        out.append(list(values[pos : pos + len(tree.nodes)]))
        pos += len(tree.nodes)
    return out


def tree_records(trees: Sequence[RolloutTree], tasks: dict[str, Task], advantages: dict[int, Tensor],
                 predictor: Any = None, decode: Callable[[list[int]], str] | None = None) -> list[dict[str, Any]]:
    """JSON-ready records of ``trees``; ``advantages`` maps ``id(trajectory)`` to its advantage;
    ``decode`` turns the prompt's token ids into text (None: no prompt text)."""
    records = []
    for tree, predicted in zip(trees, _predictions(trees, predictor)):
        task = tasks.get(tree.task_id)
        tree.backup()  # visits and value targets (idempotent)
        prompt = decode(list(tree.prompt_ids)) if decode is not None else ""
        records.append({
            "tree_id": tree.tree_id, "task_id": tree.task_id,
            "question": task.question if task else "", "answers": list(task.answers) if task else [],
            "prompt": _cut(prompt, PROMPT_CHARS),
            "nodes": [node_record(n, p) for n, p in zip(tree.nodes, predicted)],
            "trajectories": [trajectory_record(leaf, traj, advantages.get(id(traj)))
                             for leaf, traj in sorted(tree.trajectories.items())],
        })
    return records


class RolloutLog:
    """Writes one gzip JSONL file of tree records per step (a no-op when disabled); ``decode``
    renders each tree's prompt ids as text (the tokenizer's ``decode``, special tokens kept)."""

    def __init__(self, run_dir: Path, tasks: dict[str, Task], *, enabled: bool = True,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.folder = Path(run_dir) / ROLLOUTS_DIR
        self.run_dir, self.tasks, self.enabled, self.decode = Path(run_dir), tasks, enabled, decode
        if self.folder.is_dir():  # the Trainer holds the run lock: every temporary is stale
            remove_stale_temps(self.folder, holding_lock=True)

    def write(self, step: int, trees: Sequence[RolloutTree], advantages: Sequence[Tensor],
              predictor: Any = None) -> Path | None:
        """Write step ``step``'s trees atomically; ``advantages`` align with the step's trajectories
        in tree order (``[t for tree in trees for t in tree.trajectories.values()]``)."""
        if not self.enabled:
            return None
        trajectories = [t for tree in trees for t in tree.trajectories.values()]
        by_traj = {id(t): a for t, a in zip(trajectories, advantages)}
        lines = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                        for r in tree_records(trees, self.tasks, by_traj, predictor, self.decode))
        self.folder.mkdir(exist_ok=True)
        path = step_file(self.run_dir, step)
        # mtime=0: the same records give byte-identical files (a rerun step after resume, say).
        write_atomic(path, gzip.compress(lines.encode("utf-8"), compresslevel=6, mtime=0))
        return path

    def truncate_after(self, step: int) -> list[int]:
        """Remove files of steps after ``step`` (a kill lost them; they rerun). Returns those removed."""
        removed = [s for s in logged_steps(self.run_dir) if s > step]
        for s in removed:
            step_file(self.run_dir, s).unlink(missing_ok=True)
        return removed
