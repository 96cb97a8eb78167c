"""Issue 46's acceptance path for tools over the network: ``tracerl serve-retriever`` as a real
subprocess on 127.0.0.1 (a free port), ``data.environment=http_search`` training ``trace`` through the
CLI, and a server killed mid-run: one line, the checkpoint intact (a resume against a restarted server
continues from it).

The data is the smoke world (the one the shipped smoke model knows), written as files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers_cli import invoke
from tests.helpers_retriever import serve_subprocess
from tracerl.config.presets import SMOKE_WORLD
from tracerl.envs.health import ToolHealthError
from tracerl.envs.synthwiki import build_world, write_world

pytestmark = pytest.mark.slow


def _world(tmp_path: Path) -> dict[str, Path]:
    """The smoke world with one-hop questions (the smoke overlay's), as tasks and corpus files."""
    return write_world(build_world(replace(SMOKE_WORLD, fact_seed=1, max_hops=1)), tmp_path / "world")


def _sets(paths: dict[str, Path], url: str, *extra: str) -> list[str]:
    pairs = ["data.source=files", f"data.tasks={paths['train']}", "data.environment=http_search",
             f"data.retriever_url={url}", *extra]
    return [arg for pair in pairs for arg in ("--set", pair)]


def _records(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_serve_retriever_and_http_search_train_three_steps_of_trace(tmp_path: Path) -> None:
    paths, run = _world(tmp_path), tmp_path / "run"
    with serve_subprocess(paths["corpus"]) as (url, server):
        result = invoke("train", "trace", "--smoke", "--out", str(run), *_sets(paths, url, "steps=3"))
        assert result.exit_code == 0, (result.output, result.exception)
        assert server.poll() is None  # the server served the whole run
    records = _records(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert sum(int(r["tool_calls"]) for r in records) > 0  # type: ignore[call-overload]
    assert all(r["tool_failures"] == 0 and r["infra_failed"] == 0 for r in records)
    assert (run / "ckpt-000003").is_dir()


def test_a_server_killed_mid_run_stops_in_one_line_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    from tracerl.train.api import trainer

    paths, run = _world(tmp_path), tmp_path / "run"
    with serve_subprocess(paths["corpus"]) as (url, server):
        sets = ["data.source=files", f"data.tasks={paths['train']}", "data.environment=http_search",
                f"data.retriever_url={url}", "data.retriever_retries=1", "data.max_failed_tool_steps=1",
                "log.checkpoint_every=1"]
        with trainer("trace", run, overrides=sets, steps=4, smoke=True, quiet=True) as training:

            def kill_after_step_one(record: dict[str, object]) -> None:
                if record["step"] == 1:  # the event: step 1 is recorded (its checkpoint follows at once)
                    server.kill()
                    server.wait(30)

            training.echo = kill_after_step_one
            with pytest.raises(ToolHealthError) as stopped:
                training.run()
    line = str(stopped.value)
    assert "\n" not in line
    for needle in ("tool 'search' failed every call", url, "cannot connect", "data.retriever_url",
                   "ckpt-000001 (step 1), where a resume continues"):
        assert needle in line, line
    assert [r["step"] for r in _records(run)] == [1]
    # the checkpoint is intact: a resume against a restarted server (another port) continues from it
    with serve_subprocess(paths["corpus"]) as (new_url, _):
        result = invoke("train", "--resume", str(run), "--steps", "2", "--set", f"data.retriever_url={new_url}")
        assert result.exit_code == 0, (result.output, result.exception)
    records = _records(run)
    assert [r["step"] for r in records] == [1, 2] and records[1]["tool_failures"] == 0


def test_env_check_and_eval_model_over_the_server_match_the_local_corpus(tmp_path: Path) -> None:
    from tests.helpers_retriever import serve_app
    from tracerl.envs.data import load_corpus
    from tracerl.envs.retriever_server import build_app
    from tracerl.envs.search import SearchIndex

    paths = _world(tmp_path)
    tasks, corpus = str(paths["train"]), str(paths["corpus"])
    with serve_app(build_app(SearchIndex(load_corpus(corpus), use_cache=False))) as url:
        summaries = [json.loads(invoke("env-check", "--tasks", tasks, *where).stdout)
                     for where in (("--corpus", corpus), ("--retriever-url", url))]
        evals = [invoke("eval", "--model", "tiny", "--tiny-preset", "smoke", "--tasks", tasks, "--limit", "6",
                        "--no-progress", *where) for where in (("--corpus", corpus), ("--retriever-url", url))]
    assert summaries[0] == summaries[1] and summaries[0]["tasks"] == 20
    assert summaries[0]["evidence_hit_rate"] == 1.0  # the oracle found every gold paragraph, over HTTP too
    for result in evals:
        assert result.exit_code == 0, (result.output, result.exception)
    local, remote = (json.loads(r.stdout) for r in evals)
    assert local == remote and local["tool_calls"] > 0
