"""``tracerl env-check``: run a scripted policy through the real environment and summarise.

The oracle searches each supporting title in order, then answers the gold answer: its
retrieval hit rate says whether the search tool can find the chain at all, and its
answer-found rate whether the gold answer is visible in what it read. The random policy
writes random (often malformed) react text, which checks that nothing crashes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tracerl.agent.formats import ReactFormat
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, Observation, ToolEnvironment, ToolEpisode
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.envs.search import SearchIndex, search_environment
from tracerl.envs.verifiers import exact_match, normalize_answer

POLICIES = ("oracle", "random")


def oracle_episode(env: ToolEnvironment, task: Task) -> ToolEpisode:
    """Search each supporting title in order, then answer the gold answer.

    The finished episode's ``history`` holds the (action, observation) steps, which
    ``AgentFormat.render_episode`` turns into a demonstration text (pretraining data).
    """
    episode = env.start(task)
    for title in task.supporting_titles:
        if episode.step(Action(kind="tool", name="search", arguments={"query": title})).done:
            return episode
    episode.step(Action(kind="answer", answer=task.gold))
    return episode


def _hits(episode: ToolEpisode) -> tuple[int, int]:
    """(searches, searches whose results hold the searched title as a 'title:' line)."""
    searches = [(a.arguments["query"], o.text) for a, o in episode.history if a.kind == "tool"]
    hits = sum(any(line.startswith(f"{q}:") for line in text.split("\n")) for q, text in searches)
    return len(searches), hits


def _random_text(rng: random.Random, task: Task, titles: list[str]) -> str:
    words = task.question.rstrip("?").split() or ["x"]
    choice = rng.randrange(6)
    if choice == 0:
        return f"Action: search[{' '.join(rng.sample(words, min(len(words), rng.randint(1, 3))))}]\nObservation:"
    if choice == 1:
        return f"Action: open[{rng.choice(titles)}]\nObservation:"
    if choice == 2:
        return f"Action: answer[{rng.choice(words)}]"
    if choice == 3:
        return f"Action: {rng.choice(['lookup', 'search', 'answer'])}[]\nObservation:"
    if choice == 4:
        return "Thought: " + " ".join(rng.choices(words, k=4))
    return "".join(rng.choices("ab[]:\n {}\"", k=rng.randint(0, 20)))


def run_env_check(tasks_path: str | Path, corpus_path: str | Path, policy: str = "oracle",
                  limit: int | None = None, seed: int = 0, cache_dir: str | Path | None = None,
                  top_k: int = 3, max_turns: int = 8, tool_timeout_s: float | None = 30.0) -> dict[str, Any]:
    """Summary: tasks, success_rate, retrieval_hit_rate, answer_found_rate, mean_turns, errors.

    An empty tasks or corpus file is an error (``load_tasks``/``load_corpus``), not a summary of
    zero tasks; a tool call running past ``tool_timeout_s`` is counted as an infra failure.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    tasks = load_tasks(tasks_path)[:limit]
    documents = load_corpus(corpus_path)
    index = SearchIndex(documents, cache_dir=cache_dir)
    env = search_environment(index, top_k, EnvConfig(max_turns=max_turns), tool_timeout_s)  # training's factory and limits
    tools = env.tools
    fmt, rng = ReactFormat(), random.Random(seed)
    titles = [d.title for d in documents]
    known = set(titles)
    totals = {"success": 0.0, "searches": 0, "hits": 0, "found": 0, "turns": 0, "errors": 0, "infra": 0}
    missing = sum(t not in known for task in tasks for t in task.supporting_titles)
    for task in tasks:
        if policy == "oracle":
            episode = oracle_episode(env, task)
            searches, hits = _hits(episode)
            totals["searches"] += searches
            totals["hits"] += hits
        else:
            episode = env.start(task)
            while not episode.done:
                episode.step(fmt.parse(_random_text(rng, task, titles), tools))
        observations: list[Observation] = [obs for _, obs in episode.history]
        seen = normalize_answer(" ".join(o.text for o in observations))
        totals["found"] += normalize_answer(task.gold) in seen
        totals["success"] += exact_match(episode.answer, task) if episode.answer is not None else 0.0
        totals["turns"] += episode.turns_taken
        totals["errors"] += sum(o.error for o in observations)
        totals["infra"] += episode.infra_failed
    n = max(len(tasks), 1)
    return {
        "policy": policy,
        "tasks": len(tasks),
        "success_rate": totals["success"] / n,
        "retrieval_hit_rate": totals["hits"] / totals["searches"] if totals["searches"] else None,
        "answer_found_rate": totals["found"] / n,
        "mean_turns": totals["turns"] / n,
        "errors": totals["errors"],
        "infra_failures": totals["infra"],
        "missing_supporting_titles": missing,
    }
