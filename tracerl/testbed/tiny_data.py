"""Pretraining data for the embedded tiny base model: documents and exploratory episodes.

Exploratory episodes are *not* expert demonstrations. A scripted explorer runs the real
search tools of a SynthWiki world through the real :class:`~tracerl.envs.base.ToolEnvironment`
and agent format: its first query is an entity named in the question, later queries follow
a link of the document it just looked up (probability ``focus``) or pick any entity seen so
far, the number of searches is drawn independently of the question (or, with ``hop_aware``, is
the question's hop count), and the final answer
is an entity seen in context (again a link of the last document with probability ``focus``).
The gold answer is never consulted. A model trained on this knows the format, copies names
out of observations and succeeds by luck only now and then, which gives RL a signal to
amplify and makes the frozen reference's gold log-prob rise once evidence is in context
(issue 4 item 4).

Episodes are tokenised piece by piece exactly as the rollout engine builds trajectories
(prompt, then each assistant turn, then each rendered observation, EOS after the answer),
so the policy sees familiar prefixes at RL time.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tracerl.agent.formats import AgentFormat
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, Observation, ToolEnvironment
from tracerl.envs.search import SearchIndex, render_document, search_tools
from tracerl.envs.synthwiki import ATTRIBUTES, RELATIONS, RELATIONS_OF, World, WorldConfig, build_world, draw_names

_CAPITALISED = re.compile(r"\b[A-Z][a-z]+\b")


@dataclass(frozen=True)
class ExplorerConfig:
    """How the scripted explorer behaves (all probabilities in [0, 1])."""

    focus: float = 1.0
    """Chance to follow a link of the document just looked up (else any entity seen so far).
    Which link, and how many hops, stay random: the explorer never knows the question's relations."""
    search_count_weights: tuple[float, ...] = (0.3, 0.4, 0.2, 0.1)
    """Relative chance of 1, 2, 3, ... tool calls before answering (independent of the question)."""
    open_prob: float = 0.1
    """Chance that a tool call uses ``open[title]`` instead of ``search[query]``."""
    top_k: int = 2
    """Documents returned by one search: keep it equal to the RL environment's (the demo uses 2)."""
    doc_max_tokens: int = 100
    """Words kept per returned document."""
    guided: float = 0.0
    """Chance that an episode is a demonstration instead: it searches the question's supporting
    titles in order and answers the gold answer. 0 (the default presets) keeps every episode
    question-agnostic; the ``bench_guided`` preset uses a small share so that the base model
    solves a few multi-hop questions (issue 13)."""
    hop_aware: float = 0.0
    """Chance that the number of tool calls equals the question's hop count (its number of nested
    relation phrases, readable from the question) instead of a draw from ``search_count_weights``.
    Which links are followed and which entity is answered stay random, so the base model learns
    how many lookups a question needs but not which ones. 0 (the default presets) keeps the count
    question-agnostic; the ``bench_hops`` preset uses it (issue 13)."""


@dataclass
class Sample:
    """One pretraining row: token ids and the loss weight of predicting each of them."""

    ids: list[int]
    weights: list[float]


class WorldTools:
    """A world with its search index, tools and environment, ready for exploration."""

    def __init__(self, world: World, explorer: ExplorerConfig, max_turns: int) -> None:
        self.world = world
        self.index = SearchIndex(world.documents, use_cache=False)
        self.tools = search_tools(self.index, top_k=explorer.top_k, max_tokens=explorer.doc_max_tokens)
        self.env = ToolEnvironment(self.tools, EnvConfig(max_turns=max_turns))
        self.names = frozenset(e.name for e in world.entities)
        # With clue sentences a document names more entities than it links: the explorer follows
        # relations only, so its behaviour (and the base's success rate) is that of the world without.
        self.relation_targets: dict[str, frozenset[str]] | None = None
        if world.config.clues:
            self.relation_targets = {e.name: frozenset(world.entities[world.facts[(e.index, r.name)]].name
                                                       for r in RELATIONS_OF[e.type]) for e in world.entities}

    def entities_in(self, text: str) -> list[str]:
        """Entity names in ``text``, first occurrence order, without repeats."""
        out: list[str] = []
        for word in _CAPITALISED.findall(text):
            if word in self.names and word not in out:
                out.append(word)
        return out

    def named_in(self, title: str) -> list[str]:
        """Entities named in the document titled ``title`` other than itself (clue sentences included)."""
        doc = self.index.open(title)
        return [] if doc is None else [n for n in self.entities_in(doc.text) if n != title]

    def links(self, title: str) -> list[str]:
        """Entities the document titled ``title`` links by a relation (every entity it names in a
        world without clue sentences)."""
        linked = self.named_in(title)
        if self.relation_targets is not None:
            linked = [n for n in linked if n in self.relation_targets[title]]
        return linked


def pretraining_worlds(world: WorldConfig, fact_seeds: Sequence[int], questions: int) -> Iterator[World]:
    """Worlds sharing ``world``'s names, one per fact seed, each with ``questions`` train tasks."""
    for seed in fact_seeds:
        yield build_world(replace(world, fact_seed=seed, num_train=questions, num_test=0))


def explore(task: Task, wt: WorldTools, fmt: AgentFormat, rng: random.Random,
            cfg: ExplorerConfig) -> list[tuple[str, bool]]:
    """One exploratory episode as ``(text, is_assistant)`` pieces in the engine's order."""
    if cfg.guided > 0 and task.supporting_titles and rng.random() < cfg.guided:
        return demonstrate(task, wt, fmt)
    episode = wt.env.start(task)
    pieces = [(fmt.render_prompt(task, wt.tools), False)]
    seen = wt.entities_in(task.question)
    searched: list[str] = []
    links: list[str] = []
    if cfg.hop_aware > 0 and task.hops and rng.random() < cfg.hop_aware:
        calls = task.hops
    else:  # hop_aware = 0 draws exactly as before the option existed
        calls = rng.choices(range(1, len(cfg.search_count_weights) + 1), weights=cfg.search_count_weights)[0]
    for turn in range(calls):
        fresh_links = [n for n in links if n not in searched]
        if turn > 0 and fresh_links and rng.random() < cfg.focus:
            pool = fresh_links
        else:
            pool = [n for n in seen if n not in searched] or seen
        if not pool:
            break
        target = rng.choice(pool)
        tool = "open" if rng.random() < cfg.open_prob else "search"
        param = wt.tools[tool].parameters[0].name
        action = Action(kind="tool", name=tool, arguments={param: target})
        obs = episode.step(action)
        pieces += [(fmt.render_action(action), True), (fmt.render_observation(obs), False)]
        searched.append(target)
        links = wt.links(target)
        seen += [n for n in wt.entities_in(obs.text) if n not in seen]
        if obs.done:
            return pieces  # out of turns: the episode ends without an answer
    answer_pool = links if links and rng.random() < cfg.focus else seen
    if answer_pool:
        pieces.append((fmt.render_action(Action(kind="answer", answer=rng.choice(answer_pool))), True))
    return pieces


def demonstrate(task: Task, wt: WorldTools, fmt: AgentFormat) -> list[tuple[str, bool]]:
    """The gold path of ``task`` as ``(text, is_assistant)`` pieces: one search per supporting
    title (the chain's entities in order), then the gold answer."""
    episode = wt.env.start(task)
    pieces = [(fmt.render_prompt(task, wt.tools), False)]
    for title in task.supporting_titles:
        action = Action(kind="tool", name="search", arguments={wt.tools["search"].parameters[0].name: title})
        obs = episode.step(action)
        pieces += [(fmt.render_action(action), True), (fmt.render_observation(obs), False)]
        if obs.done:
            return pieces
    pieces.append((fmt.render_action(Action(kind="answer", answer=task.gold)), True))
    return pieces


def encode_pieces(tokenizer: Any, episodes: list[list[tuple[str, bool]]], eos_id: int,
                  context_weight: float = 1.0) -> list[Sample]:
    """Tokenise each piece on its own (as the engine does) and append EOS after an answer.

    Assistant tokens (and EOS) get loss weight 1, prompt and observation tokens ``context_weight``.
    """
    flat = [text for ep in episodes for text, _ in ep]
    encoded = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
    samples, pos = [], 0
    for ep in episodes:
        ids: list[int] = []
        weights: list[float] = []
        for _, is_assistant in ep:
            piece = encoded[pos]
            pos += 1
            ids += piece
            weights += [1.0 if is_assistant else context_weight] * len(piece)
        if ep and ep[-1][1]:  # ended on the answer: the policy ends its turn with EOS
            ids.append(eos_id)
            weights.append(1.0)
        samples.append(Sample(ids, weights))
    return samples


def document_rows(world: World, rng: random.Random, count: int, docs_per_row: int) -> list[str]:
    """``count`` rows of ``docs_per_row`` random documents rendered as search results are."""
    rows = []
    for _ in range(count):
        docs = rng.sample(world.documents, min(docs_per_row, len(world.documents)))
        rows.append(" ".join(render_document(d, 10_000) for d in docs))
    return rows


def vocabulary_texts(world: WorldConfig, fmt: AgentFormat) -> list[str]:
    """Texts that cover the word-level vocabulary: every name, document and question words,
    and the format's fixed strings (error observations, tool list, thoughts)."""
    first = build_world(replace(world, num_train=min(world.num_train, 500), num_test=0))
    texts = [" ".join(e.name for e in draw_names(world))]
    texts += [render_document(d, 10_000) for d in first.documents]
    texts += [t.question for t in first.train]
    # Every template word, whichever values this world happened to draw.
    texts += [tpl.format(s="X", v=v) for attrs in ATTRIBUTES.values() for tpl, vals in attrs for v in vals]
    texts += [s.format(s="X", o="Y") for r in RELATIONS for s in r.sentences]
    texts += [f"Who is {r.phrase.format(x='X')}? What is {r.phrase.format(x='X')}?" for r in RELATIONS]
    index = SearchIndex(first.documents[:2], use_cache=False)
    tools = search_tools(index)
    task = first.train[0] if first.train else Task(id="x", question="Who?", answers=("x",))
    texts.append(fmt.render_prompt(task, tools))
    texts.append(type(fmt)(tool_list=True).render_prompt(task, tools) if hasattr(fmt, "tool_list") else "")
    for why in ("no action found", "missing ] after the argument", "empty answer", "unknown action x",
                "empty query", "empty title", "search takes no argument", "invalid action"):
        obs = Observation(why, done=False, error=True, valid_actions=(("search", "query"), ("open", "title")))
        texts.append(fmt.render_observation(obs))
    texts += ["No results.", "No document titled x.", "Thought: I should search.\n", " ..."]
    texts.append(fmt.render_action(Action(kind="tool", name="search", arguments={"query": "x"})))
    texts.append(fmt.render_action(Action(kind="answer", answer="x")))
    return texts
