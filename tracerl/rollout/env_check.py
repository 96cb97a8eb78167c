"""``tracerl env-check``: run a scripted policy through the real environment and summarise.

The oracle looks up each gold paragraph the way a policy would: it searches the paragraph's
title and, when the search does not return that paragraph (titles repeat, or ranking misses
it), opens it by id (``supporting_ids``) or by title (``supporting_titles`` only). A task
with neither searches its question once. It then answers the gold answer, so its own
success says nothing and is not reported; what it measures is whether the data and the
tools make the task solvable:

- ``retrieval_hit_rate``: share of gold paragraphs the title search returns by itself;
- ``evidence_hit_rate``: share of gold paragraphs the oracle read at all (search or open);
- ``answer_reachability``: share of tasks whose gold answer (any alias, normalised) occurs
  in the observations the oracle read. A task file whose corpus lacks the evidence (e.g.
  Bamboogle questions over an unrelated corpus) shows a low value here.

The random policy writes random (often malformed) react text, which checks that nothing
crashes; for it ``success_rate`` (random answers scored by exact match) is reported.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.agent.formats import ReactFormat
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment, ToolEpisode
from tracerl.envs.data import Document, load_corpus, load_tasks
from tracerl.envs.search import SearchIndex, search_environment
from tracerl.envs.verifiers import exact_match, normalize_answer

POLICIES = ("oracle", "random")


@dataclass
class OracleTrace:
    """What the oracle looked for and what it read, by document id."""

    wanted: list[frozenset[str]] = field(default_factory=list)
    """Per gold reference found in the corpus, the ids that satisfy it (one id, or every
    document carrying the title when the task has no ``supporting_ids``)."""
    searched: set[str] = field(default_factory=set)
    """Ids returned by the oracle's searches."""
    opened: set[str] = field(default_factory=set)
    """Ids the oracle opened (after a search missed)."""


def _gold_documents(task: Task, index: SearchIndex) -> list[list[Document]]:
    """Per gold reference, the documents it may be: one by id, or every document with the title."""
    if task.supporting_ids:
        return [[doc] for doc in map(index.get, task.supporting_ids) if doc is not None]
    return [docs for docs in map(index.resolve, task.supporting_titles) if docs]


def oracle_episode(env: ToolEnvironment, task: Task) -> ToolEpisode:
    """Search each supporting title in order, then answer the gold answer.

    Used for pretraining demonstrations on SynthWiki (unique titles): the finished episode's
    ``history`` holds the (action, observation) steps, which ``AgentFormat.render_episode``
    turns into a demonstration text.
    """
    episode = env.start(task)
    for title in task.supporting_titles:
        if episode.step(Action(kind="tool", name="search", arguments={"query": title})).done:
            return episode
    episode.step(Action(kind="answer", answer=task.gold))
    return episode


def oracle_check_episode(env: ToolEnvironment, task: Task, index: SearchIndex,
                         top_k: int) -> tuple[ToolEpisode, OracleTrace]:
    """env-check's oracle: per gold paragraph, search its title and open it if the search missed.

    It opens by id when the task has ``supporting_ids`` (titles may repeat), else by title (an
    ambiguous title then opens nothing: ``open`` lists the candidates). A task with no gold
    references searches its question once. ``index`` must be the one behind ``env``'s tools.
    """
    episode, trace = env.start(task), OracleTrace()
    golds = _gold_documents(task, index)
    queries = [docs[0].title for docs in golds] or [task.question]
    for i, query in enumerate(queries):
        trace.searched |= {d.id for d in index.search(query, top_k)}  # what the search tool shows
        if episode.step(Action(kind="tool", name="search", arguments={"query": query})).done:
            return episode, trace
        if i >= len(golds):
            continue
        ids = frozenset(d.id for d in golds[i])
        trace.wanted.append(ids)
        if trace.searched & ids:
            continue
        ref = golds[i][0].id if task.supporting_ids else golds[i][0].title
        opened = index.open(ref)
        if opened is not None:
            trace.opened.add(opened.id)
        if episode.step(Action(kind="tool", name="open", arguments={"title": ref})).done:
            return episode, trace
    episode.step(Action(kind="answer", answer=task.gold))
    return episode, trace


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


def answer_reachable(task: Task, episode: ToolEpisode) -> bool:
    """Whether any gold alias, normalised, occurs in the normalised observations of ``episode``."""
    seen = f" {normalize_answer(' '.join(obs.text for _, obs in episode.history))} "
    return any(f" {normalize_answer(a)} " in seen for a in task.answers if normalize_answer(a))


def _missing(tasks: list[Task], index: SearchIndex) -> dict[str, int]:
    return {"missing_supporting_titles": sum(not index.resolve(t) for task in tasks for t in task.supporting_titles),
            "missing_supporting_ids": sum(index.get(i) is None for task in tasks for i in task.supporting_ids),
            "tasks_without_supporting_refs": sum(not (t.supporting_ids or t.supporting_titles) for t in tasks)}


def run_env_check(tasks_path: str | Path, corpus_path: str | Path | None, policy: str = "oracle",
                  limit: int | None = None, seed: int = 0, cache_dir: str | Path | None = None,
                  top_k: int = 3, max_turns: int = 8, tool_timeout_s: float | None = 30.0,
                  retriever_url: str | None = None) -> dict[str, Any]:
    """Summary: tasks, answer_reachability, evidence_hit_rate, retrieval_hit_rate, mean_turns, errors.

    Rates with nothing to count (no gold references; the random policy's evidence) are None.
    An empty tasks or corpus file is an error (``load_tasks``/``load_corpus``), not a summary of
    zero tasks; a tool call running past ``tool_timeout_s`` is counted as an infra failure.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(POLICIES)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    tasks = load_tasks(tasks_path)[:limit]
    index: Any
    if retriever_url:  # the http_search environment: the server holds the corpus (tracerl/envs/http_search.py)
        from tracerl.envs.http_search import http_search_environment, remote_index

        limits = EnvConfig(max_turns=max_turns, tool_timeout_s=tool_timeout_s)
        env: ToolEnvironment = http_search_environment(retriever_url, top_k, limits)
        index = remote_index(env)  # type: ignore[arg-type]
        titles = [t for task in tasks for t in task.supporting_titles] or [task.question for task in tasks]
    else:
        if corpus_path is None:
            raise ValueError("env-check needs a corpus file or a retriever URL")
        documents = load_corpus(corpus_path)
        index = SearchIndex(documents, cache_dir=cache_dir)
        env = search_environment(index, top_k, EnvConfig(max_turns=max_turns), tool_timeout_s)  # training's factory and limits
        titles = [d.title for d in documents]
    fmt, rng = ReactFormat(), random.Random(seed)
    totals = {"success": 0.0, "wanted": 0, "searched": 0, "read": 0, "reachable": 0, "turns": 0, "errors": 0,
              "infra": 0}
    for task in tasks:
        if policy == "oracle":
            episode, trace = oracle_check_episode(env, task, index, top_k)
            read = trace.searched | trace.opened
            totals["wanted"] += len(trace.wanted)
            totals["searched"] += sum(bool(ids & trace.searched) for ids in trace.wanted)
            totals["read"] += sum(bool(ids & read) for ids in trace.wanted)
        else:
            episode = env.start(task)
            while not episode.done:
                episode.step(fmt.parse(_random_text(rng, task, titles), env.tools))
            totals["success"] += exact_match(episode.answer, task) if episode.answer is not None else 0.0
        totals["reachable"] += answer_reachable(task, episode)
        totals["turns"] += episode.turns_taken
        totals["errors"] += sum(obs.error for _, obs in episode.history)
        totals["infra"] += episode.infra_failed
    n, wanted = max(len(tasks), 1), totals["wanted"]
    summary: dict[str, Any] = {
        "policy": policy,
        "tasks": len(tasks),
        "answer_reachability": totals["reachable"] / n,
        "evidence_hit_rate": totals["read"] / wanted if wanted else None,
        "retrieval_hit_rate": totals["searched"] / wanted if wanted else None,
    }
    if policy == "random":
        summary["success_rate"] = totals["success"] / n
    summary.update(mean_turns=totals["turns"] / n, errors=totals["errors"], infra_failures=totals["infra"],
                   repeated_titles=index.repeated_titles, **_missing(tasks, index))
    return summary
