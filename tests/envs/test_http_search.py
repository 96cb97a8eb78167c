"""The http_search environment against real servers on 127.0.0.1: tracerl's own (serve-retriever's
app), one with Search-R1's shapes and no /open, and misbehaving ones (5xx, not JSON, wrong shape,
silent, closed port). Expected texts and request counts are written out by hand."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.helpers_cli import invoke, one_line
from tests.helpers_retriever import serve_app
from tracerl.config.loading import ConfigError
from tracerl.config.schema import DataConfig
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig
from tracerl.envs.data import Document
from tracerl.envs.http_search import MAX_RESPONSE_BYTES, RetrieverClient, http_search_environment
from tracerl.envs.retriever_server import build_app
from tracerl.envs.search import SearchIndex, search_environment
from tracerl.envs.tools import ToolFailure
from tracerl.errors import UserError

DOCS = [
    Document("a1", "Alpha", "Alpha is a red planet."),
    Document("b1", "Beta", "Beta orbits Alpha twice."),
    Document("b2", "Beta", "Another Beta page about moons."),
    Document("c1", "Gamma", "Gamma has no moons."),
]
CONFIG = EnvConfig(max_turns=4, max_observation_tokens=50, tool_timeout_s=20.0)
TASK = Task("t1", "Which planet is red?", ("Alpha",))
pytestmark = pytest.mark.filterwarnings("ignore:retriever .* has no /open endpoint:UserWarning")


def _index() -> SearchIndex:
    return SearchIndex(DOCS, use_cache=False)


def test_retrieve_speaks_search_r1s_shapes() -> None:
    import httpx

    with serve_app(build_app(_index(), top_k=2)) as url:
        scored = httpx.post(f"{url}/retrieve", json={"queries": ["red planet", "zzz"], "topk": 1,
                                                     "return_scores": True}).json()
        bare = httpx.post(f"{url}/retrieve", json={"queries": ["moons"]}).json()  # topk: the server's 2
        bad = httpx.post(f"{url}/retrieve", json={"queries": "moons"})
        info = httpx.get(f"{url}/info").json()
    [hit], [] = scored["result"]
    assert hit["document"] == {"id": "a1", "contents": '"Alpha"\nAlpha is a red planet.', "title": "Alpha",
                               "text": "Alpha is a red planet."}
    assert hit["score"] > 0
    # "moons" is in b2 and c1 only; both are returned bare (no "document" wrapper) without return_scores
    assert sorted(d["id"] for d in bare["result"][0]) == ["b2", "c1"]
    assert bad.status_code == 422 and "'queries'" in bad.json()["error"]
    assert info["open"] is True and info["repeated_titles"] is True and info["documents"] == 4


def test_http_search_observes_what_the_in_process_search_observes() -> None:
    local = search_environment(_index(), 2, CONFIG, CONFIG.tool_timeout_s)
    with serve_app(build_app(_index())) as url:
        remote = http_search_environment(url, 2, CONFIG)
        calls = [("search", {"query": q}) for q in ("Alpha", "Beta moons", "zzz", "red planet")]
        calls += [("open", {"title": t}) for t in ("Alpha", "Beta", "b2", "Delta")]
        for name, args in calls:
            assert remote.tools.call(name, args) == local.tools.call(name, args), (name, args)
        remote.retriever.close()
    assert local.tools.call("open", {"title": "Beta"}).startswith("2 documents are titled Beta; open one by id:")
    assert "Beta [b2]:" in local.tools.call("open", {"title": "b2"})  # repeated titles: ids are shown


def test_the_batch_form_sends_one_request_and_answers_each_query_as_the_single_form() -> None:
    with serve_app(build_app(_index())) as url:
        env = http_search_environment(url, 2, CONFIG)
        queries = ["Alpha", "Beta moons", "zzz"]
        singles = [env.tools.call("search", {"query": q}) for q in queries]
        before = env.retriever.counts.requests
        batch = env.tools["search"].batch
        assert batch is not None and batch(queries) == singles
        assert env.retriever.counts.requests == before + 1
        assert env.retriever.counts.peak_in_flight == 3  # the batch's three queries were in one request
        env.retriever.close()


def _search_r1_app() -> Starlette:
    """Search-R1's /retrieve (its retrieval_server.py): corpus rows of id and contents only, no /open."""

    async def retrieve(request: Request) -> JSONResponse:
        body = await request.json()
        rows = [{"id": "7", "contents": '"Alpha"\nAlpha is a red planet.'}]
        result = [[{"document": r, "score": 1.5} for r in rows] if body.get("return_scores") else rows
                   for _ in body["queries"]]
        return JSONResponse({"result": result})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"])])


def test_search_r1s_server_gives_search_only_and_says_so() -> None:
    with serve_app(_search_r1_app()) as url:
        with pytest.warns(UserWarning, match="no /open endpoint"):
            env = http_search_environment(f"{url}/retrieve", 3, CONFIG)  # Search-R1's configs give /retrieve
        assert list(env.tools) == ["search"]
        assert env.tools.call("search", {"query": "anything"}) == "Alpha: Alpha is a red planet."


def _scripted(replies: list[Callable[[], Response]]) -> tuple[Starlette, list[int]]:
    """A server answering its n-th /retrieve with ``replies[min(n, last)]``; counts the requests."""
    seen = [0]
    lock = threading.Lock()

    async def retrieve(request: Request) -> Response:
        await request.body()
        with lock:
            n, seen[0] = seen[0], seen[0] + 1
        return replies[min(n, len(replies) - 1)]()

    async def info(request: Request) -> JSONResponse:
        return JSONResponse({"open": False})

    return Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/info", info)]), seen


def _ok() -> JSONResponse:
    return JSONResponse({"result": [[{"document": {"id": "a1", "title": "Alpha", "text": "red"}, "score": 1.0}]]})


def test_a_flaky_server_is_retried_and_the_call_succeeds() -> None:
    app, seen = _scripted([lambda: PlainTextResponse("busy", 503), lambda: PlainTextResponse("busy", 503), _ok])
    with serve_app(app) as url:
        env = http_search_environment(url, 1, CONFIG, retries=3, backoff_s=0.001)
        obs = env.start(TASK).step(Action(kind="tool", name="search", arguments={"query": "red"}))
    assert obs.text == "Alpha: red" and not obs.infra_failed
    # requests: GET /info when the environment was built, then 3 tries of /retrieve
    assert seen[0] == 3 and env.retriever.counts.requests == 1 + 3 and env.retriever.counts.retries == 2
    assert env.take_tool_stats().per_tool == {"search": [1, 0]}


@pytest.mark.parametrize("reply, why", [
    (lambda: PlainTextResponse("boom", 500), "HTTP 500 Internal Server Error"),
    (lambda: PlainTextResponse("<html>oops</html>"), "the response is not JSON"),
    (lambda: JSONResponse({"result": [[{"document": {"id": "x"}}]]}),
     "result[0][0].document.contents must be a string"),
    (lambda: JSONResponse({"hits": []}), "field 'result'"),
    (lambda: Response(b" " * (MAX_RESPONSE_BYTES + 1), media_type="application/json"),
     f"the response is over {MAX_RESPONSE_BYTES} bytes"),
])
def test_persistent_failures_are_one_infra_failure_naming_url_and_field(reply: Any, why: str) -> None:
    app, seen = _scripted([reply])
    with serve_app(app) as url:
        env = http_search_environment(url, 1, CONFIG, retries=2, backoff_s=0.001)
        obs = env.start(TASK).step(Action(kind="tool", name="search", arguments={"query": "red"}))
    assert obs.infra_failed and obs.done
    assert "\n" not in obs.text and why in obs.text and f"{url}/retrieve" in obs.text, obs.text
    assert "after 3 tries (data.retriever_url)" in obs.text
    assert seen[0] == 3  # 1 try + 2 retries
    stats = env.take_tool_stats()
    assert stats.per_tool == {"search": [1, 1]} and stats.last_failure["search"] == obs.text


def test_a_4xx_is_the_requests_fault_and_is_not_retried() -> None:
    app, seen = _scripted([lambda: JSONResponse({"error": "field 'topk' must be an integer"}, 422)])
    with serve_app(app) as url:
        client = RetrieverClient(url, 10.0, retries=3, backoff_s=0.001)
        with pytest.raises(ToolFailure, match="refused the request: HTTP 422"):
            client.retrieve(["q"], 1)
    assert seen[0] == 1


def test_a_silent_server_times_out_and_a_closed_port_refuses() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel's backlog) and never answers
    try:
        client = RetrieverClient(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5, retries=1, backoff_s=0.001)
        with pytest.raises(ToolFailure, match=r"no answer within .* s, after 2 tries \(data.retriever_url\)"):
            client.retrieve(["q"], 1)
    finally:
        silent.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    with pytest.raises(UserError, match=f"data.retriever_url = 'http://127.0.0.1:{port}': no retrieval server"):
        http_search_environment(f"http://127.0.0.1:{port}", 1, CONFIG, retries=1, backoff_s=0.001)


def test_config_fields(tmp_path: Any) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "1", "question": "q?", "answers": ["a"]}\n')
    data = DataConfig(source="files", tasks=str(tasks), environment="http_search",
                      retriever_url="http://127.0.0.1:8000")
    assert data.corpus == ""  # not needed: the server holds the corpus
    with pytest.raises(ConfigError, match="data.retriever_url = '': is required by data.environment"):
        DataConfig(source="files", tasks=str(tasks), environment="http_search")
    with pytest.raises(ConfigError, match="must be an http:// or https:// URL"):
        DataConfig(source="files", tasks=str(tasks), environment="http_search", retriever_url="127.0.0.1:8000")
    with pytest.raises(ConfigError, match="set data.source=files"):
        DataConfig(environment="http_search", retriever_url="http://127.0.0.1:8000")
    with pytest.raises(ConfigError, match="is read only by data.environment = 'http_search'"):
        DataConfig(retriever_url="http://127.0.0.1:8000")


def test_serve_retriever_without_the_extra_says_how_to_install_it(tmp_path: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an install without the serve extra looks like
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "title": "T", "text": "x"}\n')
    one_line(invoke("serve-retriever", "--corpus", str(corpus), "--port", "0"), 'pip install -e ".[serve]"')


def test_the_core_and_the_client_never_import_the_server_libraries() -> None:
    code = ("import sys, tracerl.cli, tracerl.envs.http_search, tracerl.envs.environments, tracerl.config.schema, "
            "tracerl.train.demo; "
            "bad = sorted(m for m in ('uvicorn', 'starlette', 'fastapi') if m in sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_training_against_no_server_is_refused_in_one_line_and_leaves_no_run_folder(tmp_path: Any) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": "{i}", "question": "q{i}?", "answers": ["a"]}}\n' for i in range(4)))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there
    out = tmp_path / "run"
    result = invoke("train", "grpo", "--smoke", "--out", str(out), "--set", "data.source=files", "--set",
                    f"data.tasks={tasks}", "--set", "data.environment=http_search", "--set",
                    f"data.retriever_url={url}", "--set", "data.retriever_retries=0")
    one_line(result, "train failed:", f"data.retriever_url = '{url}': no retrieval server answers there",
             "cannot connect", "tracerl serve-retriever")
    assert not out.exists()
