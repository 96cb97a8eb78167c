"""Evaluation metrics on scripted policies (readable numbers) and the CLI on a random model."""

from __future__ import annotations

import json

import pytest
from helpers_tiny import ScriptedPolicy, bpe_tokenizer, tiny_model
from typer.testing import CliRunner

from tracerl.agent.formats import get_format
from tracerl.cli import app
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world, write_world
from tracerl.envs.verifiers import exact_match
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.evaluate import evaluate

SMALL = WorldConfig(num_people=20, num_cities=10, num_countries=4, num_books=10, num_bands=6,
                    num_companies=8, num_train=4, num_test=3, max_hops=2)


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


@pytest.fixture(scope="module")
def tok():
    return bpe_tokenizer()


def _engine(world, tok, respond, tmp_path) -> RolloutEngine:
    index = SearchIndex(world.documents, cache_dir=tmp_path)
    env = ToolEnvironment(search_tools(index, top_k=1, max_tokens=20), EnvConfig(max_turns=4))
    config = EngineConfig(max_turns=4, max_turn_tokens=96, max_total_tokens=600)
    return RolloutEngine(ScriptedPolicy(tok, respond), env, get_format("react"), exact_match, config)


def _script(world, answers: list[str | None], invalid_first: bool = False):
    """Search once (after an invalid turn if asked), then answer; answers cycle per answering turn.

    An entry of None means gold; a string is given verbatim.
    """
    gold = {t.question: t.gold for t in world.train}
    count = {"answers": 0}

    def respond(prefix: str) -> str:
        done = prefix.count("Action:") + prefix.count("Nonsense")
        if invalid_first and done == 0:
            return "Nonsense\nObservation:"
        if done <= int(invalid_first):
            return "Action: search[the question]\nObservation:"
        choice = answers[count["answers"] % len(answers)]
        count["answers"] += 1
        q = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        return f"Action: answer[{gold[q] if choice is None else choice}]"

    return respond


def test_all_right(world, tok, tmp_path) -> None:
    report = evaluate(_engine(world, tok, _script(world, [None]), tmp_path), world.train, samples=2)
    m = report.metrics
    assert (m["tasks"], m["trajectories"]) == (4, 8)
    assert m["em"] == m["f1"] == m["pass@2"] == m["answered"] == 1.0
    assert (m["mean_turns"], m["tool_calls"], m["error_action_rate"]) == (2.0, 1.0, 0.0)


def test_half_right_gives_full_pass_at_2(world, tok, tmp_path) -> None:
    engine = _engine(world, tok, _script(world, [None, "nobody"]), tmp_path)
    report = evaluate(engine, world.train, samples=2, batch_tasks=3)
    assert report.metrics["em"] == 0.5
    assert report.metrics["pass@2"] == 1.0
    by_task = {}
    for r in report.records:
        by_task.setdefault(r["task_id"], []).append(r["em"])
    assert all(sorted(v) == [0.0, 1.0] for v in by_task.values())


def test_invalid_turns_count_as_error_actions(world, tok, tmp_path) -> None:
    engine = _engine(world, tok, _script(world, ["nobody"], invalid_first=True), tmp_path)
    m = evaluate(engine, world.train[:2], samples=1).metrics
    assert m["em"] == 0.0 and m["pass@1"] == 0.0
    assert m["mean_turns"] == 3.0 and m["tool_calls"] == 1.0
    assert m["error_action_rate"] == pytest.approx(1 / 3)


def test_records_hold_turn_texts_and_token_counts(world, tok, tmp_path) -> None:
    report = evaluate(_engine(world, tok, _script(world, [None]), tmp_path), world.train[:1])
    (record,) = report.records
    assert record["answer"] == world.train[0].gold and record["em"] == 1.0
    assert [t["action"]["kind"] for t in record["turns"]] == ["tool", "answer"]
    assert record["turns"][0]["text"] == "Action: search[the question]\nObservation:"
    assert record["generated_tokens"] == sum(t["assistant_tokens"] for t in record["turns"])
    assert record["total_tokens"] == record["prompt_tokens"] + sum(
        t["assistant_tokens"] + t["observation_tokens"] for t in record["turns"]
    )
    report.write_jsonl(tmp_path / "out" / "r.jsonl")
    assert json.loads((tmp_path / "out" / "r.jsonl").read_text()) == json.loads(json.dumps(record))
    with pytest.raises(ValueError, match="samples"):
        evaluate(_engine(world, tok, _script(world, [None]), tmp_path), world.train, samples=0)


def test_cli_eval_runs_a_random_model(world, tok, tmp_path) -> None:
    paths = write_world(world, tmp_path / "world")
    model_dir = tmp_path / "model"
    tiny_model(len(tok), seed=5).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "results.jsonl"
    args = ["eval", "--model", str(model_dir), "--tasks", str(paths["test"]), "--corpus", str(paths["corpus"]),
            "--samples", "2", "--limit", "2", "--out", str(out), "--max-turns", "2", "--max-turn-tokens", "12"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["trajectories"] == 4 and metrics["em"] == 0.0
    assert 1.0 <= metrics["mean_turns"] <= 2.0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4
    assert all(turn["assistant_tokens"] >= 1 for line in lines for turn in line["turns"])
    bad = CliRunner().invoke(app, args[:-4] + ["--samples", "0"])
    assert bad.exit_code == 1 and "samples" in bad.output


def test_evaluation_and_training_cut_an_observation_identically(tok, tmp_path, monkeypatch) -> None:
    """One definition of limits: ``run_eval`` and training's environment (train/data.py) build the
    same search environment from the same ``EngineConfig``, so a long document reaches the policy
    as the same observation (before, evaluation cut documents at 100 words and observations at 300
    words while training cut both at 256)."""
    from tracerl.envs.data import Document, load_tasks, write_corpus, write_tasks
    from tracerl.core.types import Task
    from tracerl.models import backend
    from tracerl.rollout import evaluate as evaluation
    from tracerl.config.schema import DataConfig
    from tracerl.train.data import load_task_data

    words = " ".join(f"Lumen{i % 7} river" for i in range(200))  # 400 words
    write_corpus([Document("d1", "Blue River", words)], tmp_path / "corpus.jsonl")
    write_tasks([Task(f"t{i}", f"Where is river {i}?", ("Lumen",)) for i in range(3)], tmp_path / "tasks.jsonl")

    def respond(prefix: str) -> str:
        return "Action: answer[Lumen]" if "Observation:" in prefix else "Action: search[Blue River]\nObservation:"

    config = EngineConfig(max_turns=3, max_observation_tokens=150)
    records = tmp_path / "eval.jsonl"
    monkeypatch.setattr(backend.HFPolicy, "from_pretrained", classmethod(lambda cls, *a, **k: ScriptedPolicy(tok, respond)))
    evaluation.run_eval("unused", str(tmp_path / "tasks.jsonl"), str(tmp_path / "corpus.jsonl"), config=config,
                        top_k=1, out=str(records))
    evaluated = json.loads(records.read_text().splitlines()[0])["turns"][0]

    data = load_task_data(DataConfig(source="files", tasks=str(tmp_path / "tasks.jsonl"),
                                     corpus=str(tmp_path / "corpus.jsonl"), search_top_k=1), config, seed=0)
    engine = RolloutEngine(ScriptedPolicy(tok, respond), data.environment, get_format("react"), exact_match, config)
    trees, _ = engine.rollout(load_tasks(tmp_path / "tasks.jsonl")[:1], [1])
    trained = next(iter(trees[0].trajectories.values())).turns[0]

    assert evaluated["observation"] == trained.observation and evaluated["observation"].startswith("Blue River: Lumen0")
    assert evaluated["observation_tokens"] == len(trained.observation_ids) <= 150
    assert len(trained.observation_ids) > 140  # the token cut, not a word cut far below it, decided
