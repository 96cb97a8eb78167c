"""Documents addressed by id where titles repeat, and env-check's honest figures on converted data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.core.types import Task
from tracerl.rollout.env_check import run_env_check
from tracerl.envs.convert import convert
from tracerl.envs.data import Document, write_corpus, write_tasks
from tracerl.envs.search import SearchIndex, search_tools

RAW = Path(__file__).parents[1] / "data" / "raw"
DOCS = [
    Document("p1", "Paris", "Paris is the capital of France."),
    Document("p2", "Paris", "Paris is a city in Texas, in Lamar County."),
    Document("h1", "Hugo", "Victor Hugo lived in Paris."),
]


def test_open_takes_an_id_and_lists_the_ids_of_an_ambiguous_title() -> None:
    index = SearchIndex(DOCS, use_cache=False)
    tools = search_tools(index, top_k=2)
    assert index.repeated_titles
    assert tools.call("open", {"title": "p2"}) == "Paris [p2]: Paris is a city in Texas, in Lamar County."
    assert tools.call("open", {"title": "hugo"}) == "Hugo [h1]: Victor Hugo lived in Paris."  # a unique title still opens
    listing = tools.call("open", {"title": "Paris"}).split("\n")
    assert listing[0] == "2 documents are titled Paris; open one by id:"
    assert listing[1].startswith("[p1] Paris is the capital") and listing[2].startswith("[p2] Paris is a city")
    assert tools.call("open", {"title": "Lyon"}) == "No document titled Lyon."
    assert "Paris [p2]: " in tools.call("search", {"query": "Texas Lamar"})  # results show ids to open


def test_unique_titles_keep_the_plain_rendering() -> None:
    tools = search_tools(SearchIndex(DOCS[1:], use_cache=False))
    assert tools.call("open", {"title": "p2"}) == "Paris: Paris is a city in Texas, in Lamar County."
    assert tools.call("search", {"query": "Hugo"}).startswith("Hugo: Victor Hugo")


def _files(tmp_path: Path, tasks: list[Task]) -> tuple[Path, Path]:
    write_tasks(tasks, tmp_path / "t.jsonl")
    write_corpus(DOCS, tmp_path / "c.jsonl")
    return tmp_path / "t.jsonl", tmp_path / "c.jsonl"


def test_oracle_uses_supporting_ids_where_titles_repeat(tmp_path) -> None:
    # the Texas paragraph: a title search ranks p1 first with top_k=1, so only an open by id reads it
    task = Task("t", "Which county is Paris, Texas in?", ("Lamar County",), ("Paris",), supporting_ids=("p2",))
    summary = run_env_check(*_files(tmp_path, [task]), top_k=1)
    assert summary["retrieval_hit_rate"] == 0.0 and summary["evidence_hit_rate"] == 1.0
    assert summary["answer_reachability"] == 1.0 and summary["mean_turns"] == 3.0  # search, open, answer
    titles_only = Task("t", "Which county is Paris, Texas in?", ("Lamar County",), ("Paris",))
    summary = run_env_check(*_files(tmp_path, [titles_only]), top_k=1)
    assert summary["evidence_hit_rate"] == 1.0  # either Paris paragraph satisfies a title reference...
    assert summary["answer_reachability"] == 0.0  # ...but the one read does not hold the answer


def test_env_check_shows_a_task_file_without_evidence(tmp_path) -> None:
    tasks = [Task("b1", "Who founded Citibank?", ("Samuel Osgood",)),
             Task("b2", "Where did Victor Hugo live?", ("Paris",))]
    summary = run_env_check(*_files(tmp_path, tasks))
    assert "success_rate" not in summary
    assert summary["answer_reachability"] == 0.5  # only b2's answer is in what the question search returned
    assert summary["evidence_hit_rate"] is None and summary["tasks_without_supporting_refs"] == 2


def test_env_check_on_converted_musique(tmp_path) -> None:
    convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path)
    summary = run_env_check(tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl")
    assert summary["tasks"] == 100 and summary["repeated_titles"] and summary["missing_supporting_ids"] == 0
    assert summary["evidence_hit_rate"] == 1.0  # every gold paragraph is read: searched, or opened by id
    assert 0.8 <= summary["retrieval_hit_rate"] < 1.0  # title search alone misses some same-titled paragraphs
    assert summary["answer_reachability"] >= 0.9 and summary["errors"] == 0


@pytest.mark.parametrize("top_k", [1, 3])
def test_oracle_never_reads_fewer_gold_paragraphs_than_it_searches(tmp_path, top_k) -> None:
    convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path, limit=20)
    summary = run_env_check(tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl", top_k=top_k)
    assert summary["retrieval_hit_rate"] <= summary["evidence_hit_rate"] == 1.0
