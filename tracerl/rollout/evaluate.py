"""Evaluation: roll a policy out on a task split and report accuracy and behaviour (issue 4 item 5).

Metrics (all means over trajectories unless said otherwise):

- ``em`` / ``f1``: exact match and token F1 of the final answer (0 when there is none);
- ``pass@k``: share of tasks with at least one exact-match success among their ``k`` samples;
- ``mean_turns``, ``tool_calls``: assistant turns and valid tool calls per trajectory;
- ``error_action_rate``: share of all turns whose action was invalid or whose tool call was
  rejected (the policy's fault; infrastructure failures are counted apart);
- ``answered``, ``infra_failed``: share of trajectories that gave an answer / hit a tool crash;
- ``generated_tokens``: policy tokens per trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.core.types import Task, Trajectory
from tracerl.envs.verifiers import exact_match, token_f1
from tracerl.rollout.engine import EngineConfig, RolloutEngine


@dataclass
class EvalReport:
    """Aggregate metrics plus one JSON-ready record per trajectory."""

    metrics: dict[str, float]
    records: list[dict[str, Any]]

    def write_jsonl(self, path: str | Path) -> None:
        """One trajectory per line (turn texts and token counts included)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8") as handle:
            for record in self.records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def trajectory_record(traj: Trajectory, task: Task, sample: int) -> dict[str, Any]:
    """A JSON-ready view of one trajectory (what ``tracerl eval --out`` writes)."""
    answer = traj.answer or ""
    return {
        "task_id": task.id,
        "question": task.question,
        "answers": list(task.answers),
        "sample": sample,
        "answer": traj.answer,
        "em": exact_match(answer, task) if traj.answer is not None else 0.0,
        "f1": token_f1(answer, task) if traj.answer is not None else 0.0,
        "reward": traj.reward,
        "infra_failed": traj.infra_failed,
        "num_turns": len(traj.turns),
        "tool_calls": sum(t.action.kind == "tool" and not t.tool_error for t in traj.turns),
        "prompt_tokens": len(traj.prompt_ids),
        "generated_tokens": traj.generated_tokens,
        "total_tokens": len(traj.token_ids),
        "turns": [
            {
                "text": t.text,
                "action": asdict(t.action),
                "observation": t.observation,
                "tool_error": t.tool_error,
                # a crashed tool on the last turn is the environment's fault, not the policy's
                "policy_error": t.action.kind == "invalid"
                or (t.tool_error and not (traj.infra_failed and i == len(traj.turns) - 1)),
                "assistant_tokens": len(t.assistant_ids),
                "observation_tokens": len(t.observation_ids),
            }
            for i, t in enumerate(traj.turns)
        ],
    }


def _batches(tasks: list[Task], size: int) -> Iterator[list[Task]]:
    for start in range(0, len(tasks), size):
        yield tasks[start : start + size]


def evaluate(
    engine: RolloutEngine,
    tasks: list[Task],
    samples: int = 1,
    batch_tasks: int = 16,
    generator: torch.Generator | None = None,
) -> EvalReport:
    """Roll out ``samples`` chains per task (``batch_tasks`` tasks per batched call) and score them."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if batch_tasks < 1:
        raise ValueError(f"batch_tasks must be >= 1, got {batch_tasks}")
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    records: list[dict[str, Any]] = []
    for batch in _batches(tasks, batch_tasks):
        trees, _ = engine.rollout(batch, [samples] * len(batch), generator=generator)
        for task, tree in zip(batch, trees):
            for sample, leaf in enumerate(tree.leaves()):
                records.append(trajectory_record(tree.trajectories[leaf], task, sample))
        engine.forget(trees)  # evaluation never branches: drop the stored episodes now
    return EvalReport(summarize(records, samples), records)


def summarize(records: list[dict[str, Any]], samples: int) -> dict[str, float]:
    """Aggregate metrics of trajectory records (see the module docstring)."""
    n = len(records)
    turns = [turn for r in records for turn in r["turns"]]
    policy_errors = sum(t["policy_error"] for t in turns)
    solved: dict[str, bool] = {}
    for r in records:
        solved[r["task_id"]] = solved.get(r["task_id"], False) or r["em"] > 0.5
    return {
        "tasks": float(len(solved)),
        "trajectories": float(n),
        "em": sum(r["em"] for r in records) / n,
        "f1": sum(r["f1"] for r in records) / n,
        f"pass@{samples}": sum(solved.values()) / len(solved),
        "mean_turns": len(turns) / n,
        "tool_calls": sum(r["tool_calls"] for r in records) / n,
        "error_action_rate": policy_errors / len(turns) if turns else 0.0,
        "answered": sum(r["answer"] is not None for r in records) / n,
        "infra_failed": sum(r["infra_failed"] for r in records) / n,
        "generated_tokens": sum(r["generated_tokens"] for r in records) / n,
    }


def run_eval(
    model: str,
    tasks_path: str,
    corpus_path: str,
    samples: int = 1,
    limit: int | None = None,
    out: str | None = None,
    format_name: str = "react",
    config: EngineConfig | None = None,
    top_k: int = 3,
    seed: int = 0,
    device: str = "cpu",
    batch_tasks: int = 16,
    system_prompt: str = "",
) -> dict[str, float]:
    """Load a model folder, tasks and corpus, evaluate, optionally write JSONL; returns the metrics."""
    from tracerl.agent.formats import get_format
    from tracerl.envs.data import load_corpus, load_tasks
    from tracerl.envs.search import search_environment
    from tracerl.models.backend import HFPolicy

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    config = config or EngineConfig()
    tasks = load_tasks(tasks_path)[:limit]
    env = search_environment(load_corpus(corpus_path), top_k, config)  # the limits training uses
    policy = HFPolicy.from_pretrained(model, device=device)
    fmt = get_format(format_name, tokenizer=policy.tokenizer, system=system_prompt)
    engine = RolloutEngine(policy, env, fmt, exact_match, config)
    report = evaluate(engine, tasks, samples, batch_tasks, torch.Generator(device=device).manual_seed(seed))
    if out is not None:
        report.write_jsonl(out)
    return report.metrics
