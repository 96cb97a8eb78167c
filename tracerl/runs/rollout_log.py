"""Per-step rollout records: every tree a step trained on, as gzip JSONL (read by ``tracerl view``).

``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz`` holds one JSON object per rollout tree of step N::

    {"tree_id", "task_id", "question", "answers", "prompt",
     "nodes": [{"id", "parent", "depth", "text", "assistant_tokens", "observation",
                "observation_tokens", "action", "is_leaf", "reward", "visits", "value_target",
                "readiness", "predictor"}],
     "trajectories": [{"leaf", "node_path", "reward", "infra_failed", "answer",
                       "readiness": [l_0..l_T] | null, "turn_advantage": [one per turn] | null,
                       "outcome_advantage": A_out | null, "values": [V_0..V_T] | null,
                       "credit": [c_0..c_{T-1}] | null}],
     "credit_options": {"value", "eps", "horizon", "gamma", "terminal_scale", "w_out", "w_turn"} | null}

``prompt`` is the policy's prompt ``S_0`` as the tokenizer decodes it, special tokens kept (so a
chat template's markup shows), cut to :data:`PROMPT_CHARS`; empty when no decoder was given.
``turn_advantage`` is the mean advantage the estimator gave the sampled tokens of each turn
(estimators spread one value per turn, so it is that value). ``predictor`` is the success
predictor's ``P(success)`` of the prefix ending at the node, computed with its public
:meth:`~tracerl.allocation.predictor.SuccessPredictor.predict_nodes` at dump time (before
this step's predictor update, so it is what allocation could see), or null without one.
``values`` and ``credit`` are TRACE credit's state values ``V_k`` and per-transition credits
``c_k``, computed at write time with the pure functions of :mod:`tracerl.core.credit` and the
run's ``algo.advantage`` options (``credit_options``), from the same readiness and the same
outcome advantage ``A_out`` (the leaf's group GRPO advantage) the estimator saw; null when
credit is off (``algo.credit: false``), for infra failures, and in records written before.

Reading is bounded (:data:`MAX_LINE_BYTES`, :data:`MAX_FILE_BYTES` of decompressed text), so a
crafted gzip file cannot exhaust memory; a ``rollouts/`` that is a symbolic link is refused, so
nothing is written or deleted outside the run folder.

Crash consistency: a step's file is written atomically (temporary name, ``os.replace``)
before the step's metrics line, and :meth:`RolloutLog.truncate_after` removes files of steps
after the checkpoint on resume, so the folder always matches ``metrics.jsonl``.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from tracerl.core.advantages import AdvantageBatch, AdvantageOptions
from tracerl.core.credit import prefix_values
from tracerl.core.tree_advantages import trajectory_turn_credit, tree_outcome_turn_advantages
from tracerl.core.types import Node, RolloutTree, Task, Trajectory
from tracerl.envs.bounded import open_regular
from tracerl.errors import UserError
from tracerl.runs.folder import remove_stale_temps, write_atomic

ROLLOUTS_DIR = "rollouts"
_STEP_FILE = re.compile(r"^step-(\d{6})\.jsonl\.gz$")
TEXT_CHARS = 600
"""Longest turn text kept per node (longer texts are cut, marked with an ellipsis)."""
OBSERVATION_CHARS = 240
"""Longest observation preview kept per node."""
PROMPT_CHARS = 4000
"""Longest prompt kept per tree (a system text with tool schemas fits)."""
MAX_LINE_BYTES = 16 * 2**20
"""Most decompressed bytes one record (one tree) may hold when read back: far above what the
writer makes (texts are cut above), low enough that a crafted file cannot exhaust memory."""
MAX_FILE_BYTES = 64 * 2**20
"""Most decompressed bytes one step file may hold when read back."""


def step_file(run_dir: Path, step: int) -> Path:
    """``RUN_DIR/rollouts/step-NNNNNN.jsonl.gz``."""
    return Path(run_dir) / ROLLOUTS_DIR / f"step-{step:06d}.jsonl.gz"


def logged_steps(run_dir: Path) -> list[int]:
    """Steps with a rollout file, ascending."""
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))


class RolloutRecordError(UserError):
    """A rollout record file is damaged, oversized, crafted or not where it should be."""


def refuse_link(path: Path, what: str) -> None:
    """Raise :class:`RolloutRecordError` when ``path`` is a symbolic link (dangling ones too):
    following it would read, write or delete outside the run folder."""
    if path.is_symlink():
        raise RolloutRecordError(f"{path} is a symbolic link; {what} only inside the run folder "
                                 "(replace the link by a plain folder or file)")


def record_lines(path: Path, *, max_line: int = MAX_LINE_BYTES,
                 max_file: int = MAX_FILE_BYTES) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` of each non-blank line of a gzip JSONL file, reading at most
    ``max_line`` decompressed bytes per line and ``max_file`` in all (a gzip bomb stops at the cap,
    named in the error). Errors are :class:`RolloutRecordError` naming ``file:line``."""
    refuse_link(path, "rollout records are read")
    total, number = 0, 0
    try:  # checked as a regular file before it is opened: a FIFO would block the open
        with open_regular(path) as raw_file, gzip.GzipFile(fileobj=raw_file, mode="rb") as handle:
            while raw := handle.readline(max_line + 1):
                number, total = number + 1, total + len(raw)
                if len(raw) > max_line:
                    raise RolloutRecordError(f"{path}:{number}: a record decompresses to more than {_size(max_line)} "
                                             "(rollout_log.MAX_LINE_BYTES); the file is not one tracerl wrote")
                if total > max_file:
                    raise RolloutRecordError(f"{path}:{number}: the file decompresses to more than {_size(max_file)} "
                                             "(rollout_log.MAX_FILE_BYTES); the file is not one tracerl wrote")
                if raw.strip():
                    yield number, _parse(path, number, raw)
    except UserError as err:  # not a regular file
        raise RolloutRecordError(str(err)) from None
    except (OSError, EOFError, zlib.error) as err:
        raise RolloutRecordError(f"{path}:{number + 1}: damaged gzip ({type(err).__name__}); "
                                 "rerun the step or delete the file") from None


def _size(limit: int) -> str:
    return f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit} bytes"


def _parse(path: Path, number: int, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise RolloutRecordError(f"{path}:{number}: JSON nested too deeply to be a rollout record") from None
    except ValueError as err:  # bad JSON, bad UTF-8, an integer of thousands of digits
        raise RolloutRecordError(f"{path}:{number}: not a JSON record ({str(err)[:80]})") from None


def read_step(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The tree records of ``step``, read within the caps (a one-line error naming ``file:line``
    when the file is damaged, oversized or a symbolic link)."""
    path = step_file(run_dir, step)
    refuse_link(path.parent, "rollout records are read")
    if not path.is_file() and not path.is_symlink():
        raise FileNotFoundError(f"{path} not found: step {step} has no rollout record "
                                f"(logged steps: {_ranges(logged_steps(run_dir)) or 'none'})")
    return [record for _, record in record_lines(path)]


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


def trajectory_record(leaf: int, traj: Trajectory, advantage: Tensor | None,
                      credit: dict[str, Any] | None = None) -> dict[str, Any]:
    """One finished trajectory: reward, readiness ``l_0..l_T``, the advantage of each turn and,
    with credit on, ``A_out``, ``V_0..V_T`` and ``c_0..c_{T-1}`` (:func:`credit_parts`).

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
        **(credit or {"outcome_advantage": None, "values": None, "credit": None}),
    }


def credit_options(options: AdvantageOptions) -> dict[str, Any]:
    """The ``algo.advantage`` options that shape ``V_k`` and ``c_k``, as recorded beside them."""
    return {"value": options.credit_value, "eps": options.credit_eps, "horizon": options.horizon,
            "gamma": options.gamma_td, "terminal_scale": options.terminal_scale,
            "w_out": options.w_out, "w_turn": options.w_turn}


def credit_parts(trees: Sequence[RolloutTree], options: AdvantageOptions) -> dict[int, dict[str, Any]]:
    """``id(trajectory)`` -> its ``outcome_advantage`` ``A_out``, ``values`` ``[T+1]`` and ``credit``
    ``[T]``: what ``trace_credit`` computes (spec section 2 steps 2-5), from the same batch.

    ``A_out`` is the leaf's group GRPO advantage over the step's trajectories (infra failures
    left out), as :func:`~tracerl.core.tree_advantages.tree_outcome_turn_advantages` gives it;
    an infra failure or a trajectory without readiness gets null values and credit.
    """
    trajectories = [t for tree in trees for t in tree.trajectories.values()]
    if not trajectories:
        return {}
    batch = AdvantageBatch(trajectories, {tree.tree_id: tree for tree in trees})
    _, group_adv = tree_outcome_turn_advantages(batch, options)
    parts: dict[int, dict[str, Any]] = {}
    for traj, a_out in zip(trajectories, group_adv.tolist(), strict=True):
        values = credit = None
        if not traj.infra_failed and traj.readiness is not None:
            scores = torch.tensor(traj.readiness, dtype=torch.float64)
            values = [_num(v) for v in prefix_values(scores, options.credit_value, options.credit_eps).tolist()]
            credit = [_num(c) for c in trajectory_turn_credit(traj, a_out, options).tolist()]
        parts[id(traj)] = {"outcome_advantage": _num(a_out), "values": values, "credit": credit}
    return parts


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
                 predictor: Any = None, decode: Callable[[list[int]], str] | None = None,
                 credit: AdvantageOptions | None = None) -> list[dict[str, Any]]:
    """JSON-ready records of ``trees``; ``advantages`` maps ``id(trajectory)`` to its advantage;
    ``decode`` turns the prompt's token ids into text (None: no prompt text); ``credit``: the
    run's ``algo.advantage`` when credit is on (records ``V_k`` and ``c_k``), else None."""
    parts = credit_parts(trees, credit) if credit is not None else {}
    options = credit_options(credit) if credit is not None else None
    records = []
    for tree, predicted in zip(trees, _predictions(trees, predictor), strict=True):
        task = tasks.get(tree.task_id)
        tree.backup()  # visits and value targets (idempotent)
        prompt = decode(list(tree.prompt_ids)) if decode is not None else ""
        records.append({
            "tree_id": tree.tree_id, "task_id": tree.task_id,
            "question": task.question if task else "", "answers": list(task.answers) if task else [],
            "prompt": _cut(prompt, PROMPT_CHARS),
            "nodes": [node_record(n, p) for n, p in zip(tree.nodes, predicted, strict=True)],
            "trajectories": [trajectory_record(leaf, traj, advantages.get(id(traj)), parts.get(id(traj)))
                             for leaf, traj in sorted(tree.trajectories.items())],
            "credit_options": options,
        })
    return records


class RolloutLog:
    """Writes one gzip JSONL file of tree records per step (a no-op when disabled); ``decode``
    renders each tree's prompt ids as text (the tokenizer's ``decode``, special tokens kept);
    ``credit``: the run's ``algo.advantage`` when ``algo.credit`` is on, to record ``V_k`` and
    ``c_k`` (None: not recorded). A ``rollouts/`` that is a symbolic link is refused here, before
    anything is written or deleted through it."""

    def __init__(self, run_dir: Path, tasks: dict[str, Task], *, enabled: bool = True,
                 decode: Callable[[list[int]], str] | None = None, credit: AdvantageOptions | None = None) -> None:
        self.folder = Path(run_dir) / ROLLOUTS_DIR
        self.run_dir, self.tasks, self.enabled, self.decode = Path(run_dir), tasks, enabled, decode
        self.credit = credit
        refuse_link(self.folder, "rollout records are written and removed")
        if self.folder.is_dir():  # the Trainer holds the run lock: every temporary is stale
            remove_stale_temps(self.folder, holding_lock=True)

    def write(self, step: int, trees: Sequence[RolloutTree], advantages: Sequence[Tensor],
              predictor: Any = None) -> Path | None:
        """Write step ``step``'s trees atomically; ``advantages`` align with the step's trajectories
        in tree order (``[t for tree in trees for t in tree.trajectories.values()]``)."""
        if not self.enabled:
            return None
        trajectories = [t for tree in trees for t in tree.trajectories.values()]
        by_traj = {id(t): a for t, a in zip(trajectories, advantages, strict=True)}
        lines = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                        for r in tree_records(trees, self.tasks, by_traj, predictor, self.decode, self.credit))
        self.folder.mkdir(exist_ok=True)
        path = step_file(self.run_dir, step)
        # mtime=0: the same records give byte-identical files (a rerun step after resume, say).
        write_atomic(path, gzip.compress(lines.encode("utf-8"), compresslevel=6, mtime=0))
        return path

    def truncate_after(self, step: int) -> list[int]:
        """Remove files of steps after ``step`` (a kill lost them; they rerun). Returns those removed.

        Refuses a ``rollouts/`` that became a symbolic link: removing through it would delete
        files outside the run folder."""
        refuse_link(self.folder, "rollout records are written and removed")
        removed = [s for s in logged_steps(self.run_dir) if s > step]
        for s in removed:
            step_file(self.run_dir, s).unlink(missing_ok=True)
        return removed
