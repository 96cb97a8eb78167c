"""env-check on a small SynthWiki world and on the HotpotQA sample; the CLI commands."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.rollout.env_check import run_env_check
from tracerl.envs.synthwiki import write_world


def test_oracle_on_synthwiki_finds_every_chain(tmp_path, small_world) -> None:
    paths = write_world(small_world, tmp_path / "w")
    summary = run_env_check(paths["test"], paths["corpus"])
    hops = [t.hops for t in small_world.test]
    assert summary["tasks"] == len(small_world.test) == 20
    assert "success_rate" not in summary  # the oracle answers gold: its success would say nothing
    assert summary["retrieval_hit_rate"] == summary["evidence_hit_rate"] == 1.0
    assert summary["answer_reachability"] == 1.0
    assert summary["mean_turns"] == pytest.approx(sum(h + 1 for h in hops) / len(hops))  # k searches + answer
    assert summary["errors"] == 0 and summary["infra_failures"] == 0


def test_random_policy_runs_without_crashing(tmp_path, small_world) -> None:
    paths = write_world(small_world, tmp_path / "w")
    summary = run_env_check(paths["train"], paths["corpus"], policy="random", limit=30, seed=3)
    assert summary["tasks"] == 30 and summary["retrieval_hit_rate"] is None and summary["evidence_hit_rate"] is None
    assert 0.0 <= summary["success_rate"] <= 1.0
    assert 1 <= summary["mean_turns"] <= 8 and summary["errors"] > 0


def test_oracle_on_hotpotqa_sample(hotpotqa_dir) -> None:
    summary = run_env_check(hotpotqa_dir / "tasks.jsonl", hotpotqa_dir / "corpus.jsonl")
    assert summary["tasks"] == 50 and summary["missing_supporting_titles"] == 0
    assert summary["errors"] == 0 and summary["evidence_hit_rate"] == 1.0
    assert summary["retrieval_hit_rate"] >= 0.9 and 3.0 <= summary["mean_turns"] <= 5.0
    assert summary["answer_reachability"] >= 0.9


def test_hotpotqa_sample_is_self_contained(hotpotqa_dir) -> None:
    corpus = [json.loads(line) for line in (hotpotqa_dir / "corpus.jsonl").read_text().splitlines()]
    ids = {p["id"] for p in corpus}
    for line in (hotpotqa_dir / "tasks.jsonl").read_text().splitlines():
        assert set(json.loads(line)["supporting_ids"]) <= ids
    assert "CC BY-SA 4.0" in (hotpotqa_dir / "README.md").read_text()


def test_bad_arguments(tmp_path, small_world) -> None:
    paths = write_world(small_world, tmp_path / "w")
    with pytest.raises(ValueError, match="unknown policy"):
        run_env_check(paths["test"], paths["corpus"], policy="greedy")
    with pytest.raises(ValueError, match="limit"):
        run_env_check(paths["test"], paths["corpus"], limit=0)


def test_cli_world_build_and_env_check(tmp_path) -> None:
    runner = CliRunner()
    args = ["world", "build", "--seed", "4", "--num-train", "30", "--num-test", "10"]
    for name in ("a", "b"):
        result = runner.invoke(app, args + ["--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    result = runner.invoke(app, ["env-check", "--tasks", str(tmp_path / "a" / "test.jsonl"),
                                 "--corpus", str(tmp_path / "a" / "corpus.jsonl"), "--limit", "5"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["answer_reachability"] == 1.0


def test_cli_env_check_names_bad_data(tmp_path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "question": "Q?", "answers": ["A"]}\n{"id": "b", "answers": ["A"]}\n')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "d", "title": "T", "text": "x"}\n')
    result = CliRunner().invoke(app, ["env-check", "--tasks", str(tasks), "--corpus", str(corpus)])
    assert result.exit_code == 1
    assert f"{tasks}:2: missing field 'question'" in result.output


def test_oracle_episode_renders_a_react_demonstration(small_world) -> None:
    from tracerl.agent.formats import get_format
    from tracerl.envs.base import ToolEnvironment
    from tracerl.rollout.env_check import oracle_episode
    from tracerl.envs.search import SearchIndex, search_tools

    tools = search_tools(SearchIndex(small_world.documents, use_cache=False))
    task = next(t for t in small_world.train if t.hops == 2)
    episode = oracle_episode(ToolEnvironment(tools), task)
    text = get_format("react").render_episode(task, tools, episode.history)
    first, second = task.supporting_titles
    assert text.startswith(f"Question: {task.question}\nAction: search[{first}]\nObservation: {first}: ")
    assert f"\nAction: search[{second}]\nObservation: {second}: " in text
    assert text.endswith(f"\nAction: answer[{task.gold}]")
