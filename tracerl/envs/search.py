"""Closed-corpus search on bm25s, cached on disk by corpus hash.

The index is built once per corpus (hash of every id, title and text plus the scoring
parameters) and stored under ``cache_dir`` (default ``$XDG_CACHE_HOME/tracerl/bm25``), so
the many environments of a training run share it. Ranking is deterministic: documents with
equal scores are ordered by corpus position.

Documents are addressed by id: ``open`` takes an id or a title. Titles may repeat (MuSiQue
has several paragraphs per Wikipedia page), so an ambiguous title lists the matching ids
with a preview instead of silently opening the first one, and where titles repeat the
search results show each document's id (``Title [id]: text``) so the policy can open it.
Corpora with unique titles (SynthWiki) keep the plain ``Title: text`` rendering the
embedded tiny model was pretrained on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from tracerl.envs.base import EpisodeLimits, ToolEnvironment, env_config
from tracerl.envs.data import Document
from tracerl.envs.tools import ToolSet, truncate_words

_INDEX_VERSION = "tracerl-bm25-v1"
_WORD = re.compile(r"\w+")
_STOP = frozenset(STOPWORDS_EN)

logging.getLogger("bm25s").setLevel(logging.WARNING)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without English stopwords (single letters kept: ids, initials)."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracerl" / "bm25"


def corpus_hash(documents: list[Document], k1: float, b: float) -> str:
    digest = hashlib.sha256(f"{_INDEX_VERSION}|{k1}|{b}".encode())
    for doc in documents:
        for part in (doc.id, doc.title, doc.text):
            digest.update(part.encode("utf-8"))
            digest.update(b"\x00")
    return digest.hexdigest()[:32]


class SearchIndex:
    """BM25 over ``title + text`` of each document, with exact-title lookup."""

    def __init__(self, documents: list[Document], cache_dir: str | Path | None = None,
                 use_cache: bool = True, k1: float = 1.5, b: float = 0.75) -> None:
        if not documents:
            raise ValueError("SearchIndex needs at least one document")
        self.documents = list(documents)
        self.key = corpus_hash(self.documents, k1, b)
        self._by_id: dict[str, Document] = {d.id: d for d in self.documents}
        self._by_title: dict[str, list[Document]] = {}
        self._by_folded: dict[str, list[Document]] = {}
        for doc in self.documents:  # corpus order within a title
            self._by_title.setdefault(doc.title, []).append(doc)
            self._by_folded.setdefault(doc.title.casefold().strip(), []).append(doc)
        self.repeated_titles = any(len(docs) > 1 for docs in self._by_title.values())
        """Whether some title names several documents (then only ids address them)."""
        self.cache_path: Path | None = None
        if use_cache:
            self.cache_path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            self.cache_path = self.cache_path / self.key
        self.loaded_from_cache = False
        self._bm25 = self._load_or_build(k1, b)

    def _load_or_build(self, k1: float, b: float) -> bm25s.BM25:
        path = self.cache_path
        if path is not None and (path / "params.index.json").exists():
            try:
                bm25 = bm25s.BM25.load(str(path), show_progress=False)
                self.loaded_from_cache = True
                return bm25
            except (OSError, ValueError):
                pass  # a damaged cache entry is rebuilt below
        bm25 = bm25s.BM25(k1=k1, b=b, method="lucene")
        corpus_tokens = [tokenize(f"{d.title} {d.text}") for d in self.documents]
        bm25.index(corpus_tokens, show_progress=False)
        if path is not None:
            self._save(bm25, path)
        return bm25

    @staticmethod
    def _save(bm25: bm25s.BM25, path: Path) -> None:
        """Write to a temporary folder then rename, so readers never see half an index."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
        try:
            bm25.save(str(tmp), show_progress=False)
            os.replace(tmp, path)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race: use theirs

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (zeros when no query word is known)."""
        ids = self._bm25.get_tokens_ids(tokenize(query))
        if not ids:
            return np.zeros(len(self.documents), dtype=np.float32)
        return np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float32)

    def search(self, query: str, k: int = 3) -> list[Document]:
        """Top ``k`` documents with a positive score; ties broken by corpus order."""
        return [doc for doc, _ in self.search_scored(query, k)]

    def search_scored(self, query: str, k: int = 3) -> list[tuple[Document, float]]:
        """:meth:`search` with each document's BM25 score (what a retrieval server returns)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        scores = self.scores(query)
        positive = np.flatnonzero(scores > 0)
        if positive.size > k:
            kth = np.partition(scores[positive], positive.size - k)[positive.size - k]
            positive = positive[scores[positive] >= kth]  # keep every tie at the cut
        order = positive[np.lexsort((positive, -scores[positive]))][:k]
        return [(self.documents[i], float(scores[i])) for i in order]

    def resolve(self, ref: str) -> list[Document]:
        """Documents ``ref`` names: the one with that id, else all with that exact title, else
        all with that title up to case and surrounding space (corpus order)."""
        if ref in self._by_id:
            return [self._by_id[ref]]
        return self._by_title.get(ref) or self._by_folded.get(ref.casefold().strip()) or []

    def open(self, ref: str) -> Document | None:
        """The document ``ref`` names when it names exactly one, else None."""
        found = self.resolve(ref)
        return found[0] if len(found) == 1 else None

    def get(self, doc_id: str) -> Document | None:
        """The document with this id, or None."""
        return self._by_id.get(doc_id)


def render_document(doc: Document, max_tokens: int, show_id: bool = False) -> str:
    """``Title: text`` (``Title [id]: text`` with ``show_id``), cut to ``max_tokens`` words."""
    head = f"{doc.title} [{doc.id}]" if show_id else doc.title
    return truncate_words(f"{head}: {doc.text}", max_tokens)


def render_choices(title: str, docs: list[Document], preview_words: int = 12) -> str:
    """What ``open`` answers for an ambiguous title: one ``[id] preview`` line per match."""
    lines = [f"{len(docs)} documents are titled {title}; open one by id:"]
    lines += [truncate_words(f"[{d.id}] {d.text}", preview_words) for d in docs]
    return "\n".join(lines)


def search_tools(index: SearchIndex, top_k: int = 3, max_tokens: int = 100,
                 show_ids: bool | None = None) -> ToolSet:
    """``search(query)`` and ``open(title)`` over ``index``; ``max_tokens`` caps each document.

    ``show_ids`` (default: when titles repeat) adds each document's id to what the tools show.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    with_ids = index.repeated_titles if show_ids is None else show_ids

    def search(query: str) -> str:
        """Search the corpus; returns the best matching documents as 'title: text' lines."""
        hits = index.search(query, top_k)
        if not hits:
            return "No results."
        return "\n".join(render_document(d, max_tokens, with_ids) for d in hits)

    def open(title: str) -> str:  # noqa: A001 - the tool is called open in the action grammar
        """Open a document by its id, or by its title when only one document has that title."""
        docs = index.resolve(title)
        if not docs:
            return f"No document titled {title}."
        if len(docs) > 1:
            return render_choices(title, docs)
        return render_document(docs[0], max_tokens, with_ids)

    return ToolSet([search, open])


def search_environment(documents: list[Document] | SearchIndex, top_k: int, limits: EpisodeLimits,
                       tool_timeout_s: float | None = None) -> ToolEnvironment:
    """``search``/``open`` over ``documents`` under ``limits`` (an ``EngineConfig``).

    Training (``train/data.py``), evaluation (``run_eval``) and ``env-check`` build their
    environments here, so a document and an observation are cut the same way in all of them.
    """
    index = documents if isinstance(documents, SearchIndex) else SearchIndex(documents)
    tools = search_tools(index, top_k=top_k, max_tokens=limits.max_observation_tokens)
    return ToolEnvironment(tools, env_config(limits, tool_timeout_s))
