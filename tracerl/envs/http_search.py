"""``data.environment = http_search``: ``search`` and ``open`` over a retrieval server.

The server is ``tracerl serve-retriever`` (:mod:`tracerl.envs.retriever_server`) or Search-R1's own
retrieval server: both answer ``POST /retrieve`` with Search-R1's shapes (request ``{"queries":
[...], "topk": k, "return_scores": true}``, response ``{"result": [[{"document": {"id", "contents":
"\\"Title\\"\\ntext"}, "score"}, ...], ...]}``). ``data.retriever_url`` is the server's base URL
(``http://127.0.0.1:8000``) or its ``/retrieve`` URL, as Search-R1's configs write it; ``data.corpus``
is then not read by the environment (the server holds the corpus).

``open`` (by id, or by title when one document has it) needs the server's ``POST /open``, which
``serve-retriever`` has and Search-R1's server does not: the environment asks ``GET /info`` when it
is built, and against a server without it offers ``search`` only (and says so once). Results are
rendered as the built-in ``search`` environment renders them (``Title: text``, with ``[id]`` when
the server reports repeated titles), so the same corpus gives the same observations in process
and over HTTP.

``search`` declares a batch form (:attr:`~tracerl.envs.tools.Tool.batch`): with concurrent tool
calls, the searches of different episodes arriving within :data:`BATCH_WINDOW_S` go to the server as
one ``/retrieve`` request, which Search-R1's API takes a list of queries for; each call still gets the
text the single form would give.

Failures: a refused connection, a timeout, a 5xx answer, or a body that is not JSON or not of the
expected shape are retried ``retries`` times with exponential backoff (``backoff_s``, doubled each
try); when they persist the call is a :class:`~tracerl.envs.tools.ToolFailure` (one line naming the
URL, what went wrong, the JSON field when the shape was wrong, and ``data.retriever_url``). The
episode then ends as an infrastructure failure (left out of the loss) and the call is counted in
the run's tool health, which stops the run after ``data.max_failed_tool_steps`` steps in which
every call failed, checkpoints intact. A 4xx answer is the request's fault and is not retried.
The per-try timeout splits ``data.tool_timeout_s`` across the tries, so the retries end before the
tool call's own timeout does.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import httpx

from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.data import Document
from tracerl.envs.search import render_choices, render_document
from tracerl.envs.tools import Tool, ToolSet
from tracerl.envs.tool_errors import ToolFailure, bounded_message
from tracerl.errors import UserError

FIELD = "data.retriever_url"
DEFAULT_TRY_TIMEOUT_S = 30.0
"""Seconds one HTTP try may take when ``data.tool_timeout_s`` is null (no limit)."""
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest response body read (a larger one counts as malformed)."""
BATCH_WINDOW_S = 0.005
"""How long a ``search`` call waits for others to share its ``/retrieve`` request (concurrent tools)."""


class ShapeError(ValueError):
    """The server's JSON is not of the expected shape; the message names the field."""


class Unsupported(Exception):
    """The server has no such endpoint (404/405): Search-R1's server has no ``/open`` or ``/info``."""


def base_url(url: str) -> str:
    """The server's base URL: ``url`` without a trailing ``/retrieve`` or ``/``."""
    url = url.strip().rstrip("/")
    return url[: -len("/retrieve")] if url.endswith("/retrieve") else url


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be a retriever URL (None when it can)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as err:
        return f"not a URL ({err})"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"
    return None


def parse_document(doc: Any, where: str) -> Document:
    """A hit's document: ``title``/``text`` when given, else split from Search-R1's ``contents``
    (first line is the title, in double quotes; the rest is the text)."""
    if not isinstance(doc, dict):
        raise ShapeError(f"{where} must be an object")
    doc_id = doc.get("id", "")
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise ShapeError(f"{where}.id must be a string")
    title, text = doc.get("title"), doc.get("text")
    if isinstance(title, str) and isinstance(text, str):
        return Document(str(doc_id), title, text)
    contents = doc.get("contents")
    if not isinstance(contents, str):
        raise ShapeError(f"{where}.contents must be a string (or give title and text)")
    head, _, body = contents.partition("\n")
    return Document(str(doc_id), head.strip().strip('"'), body)


def parse_hits(result: Any, queries: int, where: str = "result") -> list[list[Document]]:
    """``result`` of a ``/retrieve`` (or ``/open``) answer: per query its documents, in rank order."""
    if not isinstance(result, list) or len(result) != queries:
        size = len(result) if isinstance(result, list) else type(result).__name__
        raise ShapeError(f"{where} must be a list of {queries} lists (one per query), got {size}")
    out: list[list[Document]] = []
    for i, hits in enumerate(result):
        if not isinstance(hits, list):
            raise ShapeError(f"{where}[{i}] must be a list")
        docs = []
        for j, hit in enumerate(hits):
            scored = isinstance(hit, dict) and "document" in hit
            docs.append(parse_document(hit["document"] if scored else hit,
                                       f"{where}[{i}][{j}]" + (".document" if scored else "")))
        out.append(docs)
    return out


@dataclass
class CallCounts:
    """HTTP requests sent, how many were retries, and queries in flight (tests and benchmarks read them)."""

    requests: int = 0
    retries: int = 0
    failed_calls: int = 0
    in_flight: int = 0
    """Queries (or refs) inside a request now: a batch of 10 searches counts 10."""
    peak_in_flight: int = 0


class RetrieverClient:
    """Search-R1 ``/retrieve`` (and tracerl's ``/open``, ``/info``) over httpx, with retries.

    Thread-safe: one :class:`httpx.Client` (its connection pool) serves concurrent tool calls.
    """

    def __init__(self, url: str, timeout_s: float | None = 30.0, retries: int = 3, backoff_s: float = 0.1,
                 max_connections: int = 256) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base = base_url(url)
        self.retries, self.backoff_s = retries, backoff_s
        backoff_total = backoff_s * (2**retries - 1)
        self.try_timeout_s = (DEFAULT_TRY_TIMEOUT_S if timeout_s is None
                              else max(0.05, (timeout_s - backoff_total) / (retries + 1)))
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.Client(timeout=self.try_timeout_s, limits=limits)
        self._lock = threading.Lock()
        self.counts = CallCounts()

    def close(self) -> None:
        self._client.close()

    def _count(self, retry: bool) -> None:
        with self._lock:
            self.counts.requests += 1
            self.counts.retries += retry

    def _try(self, method: str, path: str, payload: Any) -> tuple[Any, str]:
        """One request: ``(json, "")`` on success, ``(None, why)`` for a retryable failure."""
        try:
            with self._client.stream(method, self.base + path, json=payload) as resp:
                status, reason = resp.status_code, resp.reason_phrase
                body = _bounded_body(resp)
        except httpx.TimeoutException:
            return None, f"no answer within {self.try_timeout_s:g} s"
        except httpx.ConnectError as err:
            return None, f"cannot connect ({bounded_message(str(err) or type(err).__name__, 200)})"
        except httpx.TransportError as err:
            return None, f"{type(err).__name__} ({bounded_message(str(err), 200)})"
        if status in (404, 405):
            raise Unsupported(path)
        if status >= 500:
            return None, f"HTTP {status} {reason}"
        text = (body or b"").decode("utf-8", errors="replace")
        if status >= 400:  # the request's fault: retrying sends the same request again
            raise ToolFailure(f"retriever {self.base}{path} refused the request: HTTP {status} "
                              f"{bounded_message(' '.join(text.split()), 300)} ({FIELD})")
        if body is None:
            return None, f"the response is over {MAX_RESPONSE_BYTES} bytes"
        try:
            return json.loads(body), ""
        except ValueError:
            return None, f"the response is not JSON ({bounded_message(' '.join(text.split()), 80)!r})"

    def request(self, method: str, path: str, payload: Any, check: Any) -> Any:
        """``check(json)`` of the server's answer, retried with backoff; :class:`ToolFailure` when the
        failures persist, :class:`Unsupported` on 404/405. ``check`` raises :class:`ShapeError`."""
        size = len(payload.get("queries") or payload.get("refs") or ()) if isinstance(payload, dict) else 0
        self._flying(size)
        try:
            return self._request(method, path, payload, check)
        finally:
            self._flying(-size)

    def _flying(self, change: int) -> None:
        with self._lock:
            self.counts.in_flight += change
            self.counts.peak_in_flight = max(self.counts.peak_in_flight, self.counts.in_flight)

    def _request(self, method: str, path: str, payload: Any, check: Any) -> Any:
        why = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self._count(retry=attempt > 0)
            data, why = self._try(method, path, payload)
            if not why:
                try:
                    return check(data)
                except ShapeError as err:
                    why = f"malformed answer: {err}"
        with self._lock:
            self.counts.failed_calls += 1
        raise ToolFailure(f"retriever {self.base}{path}: {why}, after {self.retries + 1} tries ({FIELD})")

    def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        """Per query its top ``topk`` documents (one ``POST /retrieve`` for all of them)."""
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        try:
            return self.request("POST", "/retrieve", payload, lambda d: parse_hits(_field(d, "result"), len(queries)))
        except Unsupported:
            raise ToolFailure(f"retriever {self.base} has no POST /retrieve endpoint ({FIELD})") from None

    def open(self, refs: list[str]) -> list[list[Document]]:
        """Per ref the documents it names (``POST /open``); :class:`Unsupported` on Search-R1's server."""
        return self.request("POST", "/open", {"refs": list(refs)}, lambda d: parse_hits(_field(d, "result"), len(refs)))

    def info(self) -> dict[str, Any] | None:
        """``GET /info`` (tracerl's server), or None where the server has none (Search-R1's)."""
        def check(data: Any) -> dict[str, Any]:
            if not isinstance(data, dict):
                raise ShapeError("the /info answer must be an object")
            return data
        try:
            return self.request("GET", "/info", None, check)
        except Unsupported:
            return None


def _bounded_body(resp: httpx.Response) -> bytes | None:
    """The response body, or None once it passes :data:`MAX_RESPONSE_BYTES` (the rest is not read)."""
    body = bytearray()
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) > MAX_RESPONSE_BYTES:
            return None
    return bytes(body)


def _field(data: Any, name: str) -> Any:
    if not isinstance(data, dict) or name not in data:
        raise ShapeError(f"the answer must be an object with field {name!r}")
    return data[name]


def http_search_tools(client: RetrieverClient, top_k: int, max_tokens: int, show_ids: bool = False,
                      with_open: bool = True) -> ToolSet:
    """``search(query)`` (and ``open(title)`` when the server has ``/open``) over ``client``,
    rendered as the built-in tools render (:func:`tracerl.envs.search.search_tools`)."""

    def render(hits: list[Document]) -> str:
        return "\n".join(render_document(d, max_tokens, show_ids) for d in hits) if hits else "No results."

    def search(query: str) -> str:
        """Search the corpus; returns the best matching documents as 'title: text' lines."""
        return render(client.retrieve([query], top_k)[0])

    def search_many(query: list[str]) -> list[str]:
        """The batch form: calls arriving together go in one ``/retrieve`` (Search-R1 takes a list)."""
        return [render(hits) for hits in client.retrieve(query, top_k)]

    def open(title: str) -> str:  # noqa: A001 - the tool is called open in the action grammar
        """Open a document by its id, or by its title when only one document has that title."""
        try:
            docs = client.open([title])[0]
        except Unsupported:
            raise ToolFailure(f"retriever {client.base} has no /open endpoint ({FIELD})") from None
        if not docs:
            return f"No document titled {title}."
        if len(docs) > 1:
            return render_choices(title, docs)
        return render_document(docs[0], max_tokens, show_ids)

    search_tool = Tool.from_function(search, batch=search_many, batch_window_s=BATCH_WINDOW_S)
    return ToolSet([search_tool, open] if with_open else [search_tool])


def probe(client: RetrieverClient) -> dict[str, Any]:
    """What the server offers: its ``/info``, or (Search-R1's server) a one-query ``/retrieve`` that
    shows it answers. Raises :class:`UserError` (one line) when no retriever answers there."""
    try:
        info = client.info()
        if info is None:
            client.retrieve(["probe"], 1)
            return {"open": False, "repeated_titles": False}
        return info
    except (ToolFailure, Unsupported) as err:
        raise UserError(f"{FIELD} = {client.base!r}: no retrieval server answers there ({err}); start one "
                        "with `tracerl serve-retriever --corpus corpus.jsonl --port PORT`") from None


def http_search_environment(url: str, top_k: int, config: EnvConfig, retries: int = 3,
                            backoff_s: float = 0.1) -> HttpSearchEnvironment:
    """The ``http_search`` environment over the server at ``url`` (probed now: see :func:`probe`)."""
    why = check_url(url)
    if why:
        raise UserError(f"{FIELD} = {url!r}: {why}")
    client = RetrieverClient(url, config.tool_timeout_s, retries, backoff_s)
    info = probe(client)
    with_open = bool(info.get("open", False))
    if not with_open:
        warnings.warn(f"retriever {client.base} has no /open endpoint (Search-R1's server has none): the "
                      "http_search environment offers search only", stacklevel=2)
    show_ids = bool(info.get("repeated_titles", False))
    tools = http_search_tools(client, top_k, config.max_observation_tokens, show_ids=show_ids, with_open=with_open)
    return HttpSearchEnvironment(tools, config, client, show_ids)


class HttpSearchEnvironment(ToolEnvironment):
    """A :class:`ToolEnvironment` that keeps its :class:`RetrieverClient` (its counts, its close)."""

    def __init__(self, tools: ToolSet, config: EnvConfig, retriever: RetrieverClient, show_ids: bool = False) -> None:
        super().__init__(tools, config)
        self.retriever, self.show_ids = retriever, show_ids


class RemoteIndex:
    """The lookups env-check's oracle makes of a :class:`~tracerl.envs.search.SearchIndex`, answered by
    the server: ``search`` through ``/retrieve``; ``resolve``/``get``/``open`` through ``/open`` (none
    on Search-R1's server: gold documents then cannot be looked up, and the oracle only searches)."""

    def __init__(self, client: RetrieverClient, info: dict[str, Any]) -> None:
        self.client = client
        self.has_open = bool(info.get("open", False))
        self.repeated_titles = bool(info.get("repeated_titles", False))

    def search(self, query: str, k: int = 3) -> list[Document]:
        return self.client.retrieve([query], k)[0]

    def resolve(self, ref: str) -> list[Document]:
        return self.client.open([ref])[0] if self.has_open else []

    def get(self, doc_id: str) -> Document | None:
        return next((d for d in self.resolve(doc_id) if d.id == doc_id), None)

    def open(self, ref: str) -> Document | None:
        found = self.resolve(ref)
        return found[0] if len(found) == 1 else None


def remote_index(env: HttpSearchEnvironment) -> RemoteIndex:
    """The :class:`RemoteIndex` behind ``env``'s tools (env-check's oracle reads what they read)."""
    return RemoteIndex(env.retriever, {"open": "open" in env.tools, "repeated_titles": env.show_ids})
