"""bm25s search: ranking, stable ties, disk cache, open(), truncation and the tool set."""

from __future__ import annotations

from tracerl.envs.data import Document
from tracerl.envs.search import SearchIndex, search_tools, truncate_words

DOCS = [
    Document("0", "Kalvoran", "Kalvoran is a city in Ostria. Kalvoran sits on a river."),
    Document("1", "Kalvoren", "Kalvoren is a city in Brenna."),
    Document("2", "Tarsik", "Tarsik was born in Kalvoran."),
    Document("3", "Twin A", "same words here"),
    Document("4", "Twin B", "same words here"),
    Document("5", "Long", " ".join(f"w{i}" for i in range(50))),
]


def test_title_query_ranks_own_document_first(tmp_path) -> None:
    index = SearchIndex(DOCS, cache_dir=tmp_path)
    assert [d.id for d in index.search("Kalvoran", 3)] == ["0", "2"]  # look-alike Kalvoren not matched
    assert [d.id for d in index.search("Kalvoren", 3)] == ["1"]
    assert index.search("zzz unknown", 3) == []
    assert index.search("", 3) == []


def test_ties_break_by_corpus_order(tmp_path) -> None:
    index = SearchIndex(DOCS, cache_dir=tmp_path)
    twins = [d for d in index.search("same words", 2)]
    assert [d.id for d in twins] == ["3", "4"]
    assert [d.id for d in index.search("same words", 1)] == ["3"]


def test_disk_cache_is_reused_and_keyed_by_corpus(tmp_path) -> None:
    first = SearchIndex(DOCS, cache_dir=tmp_path)
    second = SearchIndex(DOCS, cache_dir=tmp_path)
    assert not first.loaded_from_cache and second.loaded_from_cache
    assert first.key == second.key and (tmp_path / first.key).is_dir()
    for query in ["Kalvoran river", "Tarsik", "same words", "w7 w8"]:
        assert first.search(query, 3) == second.search(query, 3)
    changed = SearchIndex(DOCS[:-1] + [Document("5", "Long", "other text")], cache_dir=tmp_path)
    assert changed.key != first.key and not changed.loaded_from_cache


def test_default_cache_dir_follows_xdg(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    index = SearchIndex(DOCS)
    assert index.cache_path == tmp_path / "tracerl" / "bm25" / index.key


def test_open_exact_then_case_insensitive(tmp_path) -> None:
    index = SearchIndex(DOCS, use_cache=False)
    assert index.open("Kalvoren").id == "1"
    assert index.open(" twin b ").id == "4"
    assert index.open("Nowhere") is None


def test_truncation_keeps_layout() -> None:
    assert truncate_words("a b\nc d", 3) == "a b\nc ..."
    assert truncate_words("a b\nc", 3) == "a b\nc"


def test_search_tools_render_title_text(tmp_path) -> None:
    tools = search_tools(SearchIndex(DOCS, cache_dir=tmp_path), top_k=2, max_tokens=5)
    assert tools.names == ("search", "open")
    assert tools.call("search", {"query": "Kalvoran"}) == (
        "Kalvoran: Kalvoran is a city ...\nTarsik: Tarsik was born in ..."
    )
    assert tools.call("search", {"query": "qqq"}) == "No results."
    assert tools.call("open", {"title": "Tarsik"}) == "Tarsik: Tarsik was born in ..."
    assert tools.call("open", {"title": "Nope"}) == "No document titled Nope."
