"""``tracerl serve-retriever``: a corpus's bm25s index over HTTP, with Search-R1's ``/retrieve`` API.

Search-R1's retrieval server (``search_r1/search/retrieval_server.py``, FastAPI) answers
``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": bool}`` and returns
``{"result": [[hit, ...], ...]}``, one list per query, where a hit is ``{"document": doc, "score":
s}`` with ``return_scores`` and the bare ``doc`` without; ``doc`` is the corpus row, ``{"id": ...,
"contents": "\\"Title\\"\\ntext"}`` for its wiki-18 corpus. This server answers the same shapes (each
``doc`` also carries ``title`` and ``text``, as Search-R1's BM25 retriever adds), so the
``http_search`` environment (:mod:`tracerl.envs.http_search`) talks to either. Two endpoints of
its own, which Search-R1's server does not have: ``POST /open`` (``{"refs": [...]}``: per ref the
documents with that id, else that title, as the built-in ``open`` resolves them) and ``GET
/info`` (corpus size, whether titles repeat).

The index is :class:`~tracerl.envs.search.SearchIndex`, the one the built-in ``search``
environment uses (same tokenizer, ranking and ties, cached on disk), so a search over HTTP
returns what the in-process tool returns. Requests are served concurrently: the server is
uvicorn + starlette (the ``serve`` extra), and each BM25 query runs in starlette's thread pool
so a slow query never blocks the event loop. Request bodies, query counts and ``topk`` are
bounded; a malformed request gets a 422 whose JSON ``error`` names the field.

``latency_ms`` is a **test and benchmark injection**: every ``/retrieve`` and ``/open`` request
waits that long (without holding a thread) before it is answered, to stand in for a remote
retriever (``benchmarks/systems/tool_latency.py``). Leave it at 0 to serve.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
from collections.abc import Callable
from typing import Any

from tracerl.envs.data import Document, load_corpus
from tracerl.envs.search import SearchIndex
from tracerl.errors import UserError

SERVE_MISSING = 'tracerl serve-retriever needs the serve extra (uvicorn, starlette): pip install -e ".[serve]"'
MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body read (a larger one is refused with 413 before it is parsed)."""
MAX_QUERIES = 4096
"""Queries (or refs) one request may carry."""
MAX_TOPK = 1000
"""Largest ``topk`` one request may ask for."""
MAX_MATCHES = 50
"""Documents ``/open`` returns for one ref (an ambiguous title lists at most this many)."""


class RequestError(ValueError):
    """A malformed request; the message names the field (sent back as a 422's ``error``)."""


def serve_available() -> bool:
    """Whether the ``serve`` extra (uvicorn and starlette) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("uvicorn", "starlette"))


def document_json(doc: Document) -> dict[str, str]:
    """A document as Search-R1's corpus row (``id``, ``contents`` = ``"Title"\\ntext``) plus ``title``, ``text``."""
    return {"id": doc.id, "contents": f'"{doc.title}"\n{doc.text}', "title": doc.title, "text": doc.text}


def _strings(body: dict[str, Any], name: str) -> list[str]:
    value = body.get(name)
    if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
        raise RequestError(f"field {name!r} must be a list of strings")
    if len(value) > MAX_QUERIES:
        raise RequestError(f"field {name!r} holds {len(value)} items; at most {MAX_QUERIES} per request")
    return value


def parse_retrieve(body: Any, default_topk: int) -> tuple[list[str], int, bool]:
    """``(queries, topk, return_scores)`` of a ``/retrieve`` body (Search-R1's ``QueryRequest``:
    ``topk`` absent, null or 0 takes the server's default, ``return_scores`` defaults to false)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    queries = _strings(body, "queries")
    topk = body.get("topk") or default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise RequestError(f"field 'topk' must be an integer in 1..{MAX_TOPK}, got {body.get('topk')!r}")
    scores = body.get("return_scores", False)
    if not isinstance(scores, bool):
        raise RequestError(f"field 'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def parse_open(body: Any) -> list[str]:
    """The ``refs`` (ids or titles) of an ``/open`` body."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return _strings(body, "refs")


def retrieve_result(index: SearchIndex, queries: list[str], topk: int, scores: bool) -> list[list[Any]]:
    """``/retrieve``'s ``result``: per query its hits in rank order (see the module docstring)."""
    out: list[list[Any]] = []
    for query in queries:
        hits = index.search_scored(query, topk)
        out.append([{"document": document_json(d), "score": s} if scores else document_json(d) for d, s in hits])
    return out


def open_result(index: SearchIndex, refs: list[str]) -> list[list[dict[str, str]]]:
    """``/open``'s ``result``: per ref the documents it names (none, one, or several sharing a title)."""
    return [[document_json(d) for d in index.resolve(ref)[:MAX_MATCHES]] for ref in refs]


def build_app(index: SearchIndex, top_k: int = 3, latency_s: float = 0.0) -> Any:
    """The starlette application serving ``index`` (``latency_s``: test/benchmark injection, see above)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def body_json(request: Request) -> Any:
        size, chunks = 0, []
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise RequestError(f"the body is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks))
        except ValueError as err:
            raise RequestError(f"the body is not JSON ({err})") from None

    def answer(work: Callable[[Any], Callable[[], Any]]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> JSONResponse:
            try:
                job = work(await body_json(request))
            except RequestError as err:
                return JSONResponse({"error": str(err)}, status_code=422)
            if latency_s > 0:
                await asyncio.sleep(latency_s)  # injected latency: waits without holding a thread
            return JSONResponse({"result": await run_in_threadpool(job)})
        return endpoint

    def retrieve(body: Any) -> Callable[[], Any]:
        queries, k, scores = parse_retrieve(body, top_k)
        return lambda: retrieve_result(index, queries, k, scores)

    def open_(body: Any) -> Callable[[], Any]:
        refs = parse_open(body)
        return lambda: open_result(index, refs)

    async def info(request: Request) -> JSONResponse:
        return JSONResponse({"server": "tracerl", "documents": len(index.documents), "topk": top_k,
                             "repeated_titles": index.repeated_titles, "open": True,
                             "latency_ms": latency_s * 1000})

    return Starlette(routes=[Route("/retrieve", answer(retrieve), methods=["POST"]),
                             Route("/open", answer(open_), methods=["POST"]),
                             Route("/info", info, methods=["GET"])])


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one; read it from ``getsockname``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})") from None
    sock.listen(2048)
    return sock


def serve(corpus: str, host: str = "127.0.0.1", port: int = 8000, top_k: int = 3, latency_ms: float = 0.0,
          echo: Callable[[str], None] = print) -> None:
    """Index ``corpus`` and serve it until interrupted; ``echo`` gets one line once it listens
    (``serving N documents ... on http://HOST:PORT``: a caller that passed port 0 reads the port there)."""
    if not serve_available():
        raise UserError(SERVE_MISSING)
    if top_k < 1 or top_k > MAX_TOPK:
        raise UserError(f"--top-k must be in 1..{MAX_TOPK}, got {top_k}")
    if latency_ms < 0:
        raise UserError(f"--latency-ms must be >= 0, got {latency_ms}")
    import uvicorn

    index = SearchIndex(load_corpus(corpus))
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    app = build_app(index, top_k, latency_ms / 1000)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30))
    injected = f"; injected latency {latency_ms:g} ms per request (test/benchmark only)" if latency_ms else ""
    echo(f"serving {len(index.documents)} documents of {corpus} on http://{shown}:{bound} "
         f"(POST /retrieve, POST /open, GET /info){injected}")
    server.run(sockets=[sock])
