"""Evaluation: roll a policy out on a task split and report accuracy and behaviour (issue 4 item 5).

Metrics (all means over trajectories unless said otherwise):

- ``em`` / ``f1``: exact match and token F1 of the final answer (0 when there is none);
- ``pass@k``: share of tasks with at least one exact-match success among their ``k`` samples;
- ``mean_turns``, ``tool_calls``: assistant turns and valid tool calls per trajectory;
- ``error_action_rate``: share of all turns whose action was invalid or whose tool call was
  rejected (the policy's fault; infrastructure failures are counted apart);
- ``answered``, ``infra_failed``: share of trajectories that gave an answer / hit a tool crash;
- ``generated_tokens``: policy tokens per trajectory;
- ``em_hops{k}``: exact match over the trajectories of ``k``-hop tasks (``Task.hops``), one key per
  hop count present (tasks without a hop count are left out of these).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.atomic import write_atomic_lines
from tracerl.core.types import Task, Trajectory
from tracerl.envs.verifiers import exact_match, token_f1
from tracerl.rollout.engine import EngineConfig, RolloutEngine


@dataclass
class EvalReport:
    """Aggregate metrics plus one JSON-ready record per trajectory."""

    metrics: dict[str, float]
    records: list[dict[str, Any]]

    def write_jsonl(self, path: str | Path) -> None:
        """One trajectory per line (turn texts and token counts included), atomically: a full disk or
        a kill leaves the file's earlier content whole (a hard link planted at ``path`` is broken off,
        never written through)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic_lines(out, (json.dumps(record, ensure_ascii=False) + "\n" for record in self.records))


def trajectory_record(traj: Trajectory, task: Task, sample: int) -> dict[str, Any]:
    """A JSON-ready view of one trajectory (what ``tracerl eval --out`` writes)."""
    answer = traj.answer or ""
    return {
        "task_id": task.id,
        "question": task.question,
        "answers": list(task.answers),
        "hops": task.hops,
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
    progress: Callable[[int], None] | None = None,
) -> EvalReport:
    """Roll out ``samples`` chains per task (``batch_tasks`` tasks per batched call) and score them.

    ``progress`` is called with the number of tasks done after each batch (a display hook)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if batch_tasks < 1:
        raise ValueError(f"batch_tasks must be >= 1, got {batch_tasks}")
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    records: list[dict[str, Any]] = []
    for batch in _batches(tasks, batch_tasks):
        trees, _ = engine.rollout(batch, [samples] * len(batch), generator=generator)
        for task, tree in zip(batch, trees, strict=True):
            for sample, leaf in enumerate(tree.leaves()):
                records.append(trajectory_record(tree.trajectories[leaf], task, sample))
        engine.forget(trees)  # evaluation never branches: drop the stored episodes now
        if progress is not None:
            progress(len({r["task_id"] for r in records}))
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
        **{f"em_hops{k}": v for k, v in em_by_hops(records).items()},
    }


def em_by_hops(records: list[dict[str, Any]]) -> dict[int, float]:
    """Mean exact match per hop count, ``{hops: em}`` in increasing hop order.

    Multi-hop chains are what allocation and turn credit should help with, so accuracy is
    reported per hop count as well as overall. Records without ``hops`` (non-SynthWiki tasks)
    are skipped; an empty dict when none has one.
    """
    groups: dict[int, list[float]] = {}
    for r in records:
        if r.get("hops") is not None:
            groups.setdefault(int(r["hops"]), []).append(float(r["em"]))
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


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
    tiny_preset: str = "default",
    show_progress: bool = False,
    retriever_url: str | None = None,
) -> dict[str, float]:
    """Load a model (a folder, a hub name, or ``tiny``: the embedded model), tasks and corpus,
    evaluate, optionally write JSONL; returns the metrics. ``config.temperature`` 0 is greedy.
    ``retriever_url``: search over that retrieval server instead (``http_search``; no corpus read)."""
    from tracerl.agent.formats import get_format
    from tracerl.envs.data import load_corpus, load_tasks
    from tracerl.envs.search import search_environment

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    config = config or EngineConfig()
    tasks = load_tasks(tasks_path)[:limit]
    env: Any
    if retriever_url:  # http_search: the server holds the corpus
        from tracerl.envs.base import env_config
        from tracerl.envs.http_search import http_search_environment

        documents, env = [], http_search_environment(retriever_url, top_k, env_config(config, 30.0))
    else:
        documents = load_corpus(corpus_path)
        env = search_environment(documents, top_k, config)  # the limits training uses
    policy = load_policy(model, device, tiny_preset)
    from tracerl.envs.coverage import check_eval_coverage  # training's guard: unreadable answers score 0

    check_eval_coverage(policy.tokenizer, tasks, documents, who=f"--model {model}", tasks_path=tasks_path,
                        tiny=model == "tiny")
    fmt = get_format(format_name, tokenizer=policy.tokenizer, system=system_prompt)
    engine = RolloutEngine(policy, env, fmt, exact_match, config)
    return evaluate_and_write(engine, tasks, samples, seed, device, batch_tasks, out, show_progress)


def load_policy(model: str, device: str = "cpu", tiny_preset: str = "default") -> Any:
    """An :class:`~tracerl.models.backend.HFPolicy` of a folder or hub name; ``tiny`` is the embedded
    model (pretrained once and cached, never fetched from the Hub)."""
    from tracerl.models.backend import HFPolicy

    if model == "tiny":
        from tracerl.testbed.loading import load_model

        net, tokenizer = load_model("tiny", tiny_preset=tiny_preset, device=device)
        net.eval()
        return HFPolicy(net, tokenizer)
    if model == "random-tiny":
        raise ValueError("--model random-tiny has no fixed weights to evaluate; use tiny, a folder or --run")
    return HFPolicy.from_pretrained(model, device=device)


def evaluate_and_write(engine: RolloutEngine, tasks: list[Task], samples: int, seed: int, device: str,
                       batch_tasks: int = 16, out: str | None = None, show_progress: bool = False) -> dict[str, float]:
    """:func:`evaluate` with a seeded generator and a progress display; writes ``out`` JSONL when given."""
    generator = torch.Generator(device=device).manual_seed(seed)
    with TaskProgress(len(tasks), enabled=show_progress) as progress:
        report = evaluate(engine, tasks, samples, batch_tasks, generator, progress=progress.update)
    if out is not None:
        report.write_jsonl(out)
    return report.metrics


class TaskProgress:
    """Tasks done of ``total`` on stderr: a rich bar on a terminal, else a plain line every
    ``every`` tasks (and at the end), so CI logs and pipes show progress without control codes."""

    def __init__(self, total: int, *, enabled: bool = True, every: int | None = None) -> None:
        self.total, self.enabled = total, enabled
        self.every = every or max(1, total // 10)
        self._next, self._start, self._bar, self._task = self.every, time.perf_counter(), None, None

    def __enter__(self) -> TaskProgress:
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        if done >= self._next or done >= self.total:
            print(f"eval: {done}/{self.total} tasks ({time.perf_counter() - self._start:.0f} s)",
                  file=sys.stderr, flush=True)
            self._next = (done // self.every + 1) * self.every

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
