"""``tracerl data convert``: raw HotpotQA, MuSiQue, 2Wiki and Search-R1 files -> tracerl JSONL.

Fixtures in tests/data/raw are real questions and paragraphs in each data set's raw layout
(see tests/data/raw/SOURCES.md); expected values are computed from those raw rows or read off
them by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app
from tracerl.envs.convert import convert
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.errors import UserError

RAW = Path(__file__).parents[1] / "data" / "raw"


def _raw_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (RAW / name).read_text(encoding="utf-8").splitlines()]


def test_musique_keeps_hop_order_aliases_and_the_exact_supporting_paragraphs(tmp_path) -> None:
    report = convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path)
    rows = _raw_lines("musique_dev_sample.jsonl")
    tasks, docs = load_tasks(tmp_path / "tasks.jsonl"), load_corpus(tmp_path / "corpus.jsonl")
    distinct = {(p["title"], p["paragraph_text"]) for r in rows for p in r["paragraphs"]}
    assert report.tasks == len(tasks) == 100 and report.errors == []
    assert report.documents == len(docs) == len(distinct)  # a paragraph shared by questions is stored once
    assert len({d.id for d in docs}) == len(docs)
    assert len({d.title for d in docs}) < len(docs)  # titles repeat: only ids address these paragraphs
    first = tasks[0]  # read off the first raw row by hand
    assert first.id == "2hop__108336_772156" and first.answers == ("Mantua",) and first.hops == 2
    assert first.supporting_titles == ("Allegory of Isabella d'Este's Coronation", "Lorenzo Costa the Younger")
    by_id = {d.id: d for d in docs}
    for task, row in zip(tasks, rows, strict=True):
        paras = {p["idx"]: p for p in row["paragraphs"]}
        hop_order = [paras[s["paragraph_support_idx"]] for s in row["question_decomposition"]]
        assert [by_id[i].text for i in task.supporting_ids] == [p["paragraph_text"] for p in hop_order]
        assert task.answers == tuple([row["answer"]] + row["answer_aliases"])


@pytest.mark.parametrize("fmt, name", [("hotpotqa", "hotpotqa_dev_sample.json"), ("2wiki", "2wiki_dev_sample.json")])
def test_context_formats_join_sentences_and_map_supporting_facts(tmp_path, fmt, name) -> None:
    report = convert(fmt, RAW / name, tmp_path)
    rows = json.loads((RAW / name).read_text(encoding="utf-8"))
    tasks, docs = load_tasks(tmp_path / "tasks.jsonl"), load_corpus(tmp_path / "corpus.jsonl")
    assert report.tasks == 5 and report.errors == [] and report.documents == len(docs)
    assert all(d.id.startswith(fmt) for d in docs)
    by_id = {d.id: d for d in docs}
    for task, row in zip(tasks, rows, strict=True):
        assert task.id == row["_id"] and task.answers == (row["answer"],)
        context = dict((title, sents) for title, sents in row["context"])
        titles = list(dict.fromkeys(f[0] for f in row["supporting_facts"]))
        assert list(task.supporting_titles) == titles
        assert [by_id[i].text for i in task.supporting_ids] == [" ".join(s.strip() for s in context[t]) for t in titles]


def test_search_r1_rows_and_contents_corpus(tmp_path) -> None:
    report = convert("search-r1", RAW / "search_r1_sample.jsonl", tmp_path, corpus=RAW / "search_r1_corpus.jsonl")
    tasks, docs = load_tasks(tmp_path / "tasks.jsonl"), load_corpus(tmp_path / "corpus.jsonl")
    assert (report.tasks, report.documents, report.errors) == (5, 8, [])
    assert tasks[0].id == "bamboogle-000" and tasks[0].answers == ("james madison",)
    # row 1 holds neither id, question nor golden_answers: all come from prompt / reward_model / extra_info
    assert tasks[1].id == "bamboogle-test-1"
    assert tasks[1].question == "What rocket was the first spacecraft that ever approached Uranus launched on?"
    assert tasks[1].answers == ("Titan IIIE",)
    first = json.loads((RAW / "search_r1_corpus.jsonl").read_text(encoding="utf-8").splitlines()[0])
    title, text = first["contents"].split("\n", 1)
    assert docs[0].id == first["id"] and docs[0].title == title[1:-1] and docs[0].text == text


def test_search_r1_without_corpus_writes_tasks_only(tmp_path) -> None:
    report = convert("search-r1", RAW / "search_r1_sample.jsonl", tmp_path / "out", limit=2)
    assert report.tasks == 2 and report.documents == 0 and set(report.paths) == {"tasks"}
    assert not (tmp_path / "out" / "corpus.jsonl").exists()


def test_limit_keeps_only_the_paragraphs_of_the_kept_questions(tmp_path) -> None:
    report = convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path, limit=3)
    rows = _raw_lines("musique_dev_sample.jsonl")[:3]
    assert report.tasks == 3
    assert report.documents == len({(p["title"], p["paragraph_text"]) for r in rows for p in r["paragraphs"]})


def test_bad_rows_are_skipped_and_reported_with_their_line(tmp_path) -> None:
    good = _raw_lines("musique_dev_sample.jsonl")[0]
    unanswerable = dict(good, id="u1", answerable=False)
    no_question = {k: v for k, v in good.items() if k != "question"} | {"id": "q1"}
    no_support = dict(good, id="s1", question_decomposition=[],
                      paragraphs=[dict(p, is_supporting=False) for p in good["paragraphs"]])
    lines = [json.dumps(good), "{not json", json.dumps(unanswerable), json.dumps(no_question), json.dumps(good),
             json.dumps(no_support)]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = convert("musique", raw, tmp_path / "out")
    assert report.tasks == 1 and len(report.errors) == 5
    reasons = dict(e.split(": ", 1) for e in report.errors)
    assert "not valid JSON" in reasons[f"{raw}:2"] and "unanswerable" in reasons[f"{raw}:3"]
    assert "'question'" in reasons[f"{raw}:4"] and "repeats" in reasons[f"{raw}:5"]
    assert "no supporting paragraph" in reasons[f"{raw}:6"]
    # the rejected rows' paragraphs are not in the corpus: only the good row's
    assert report.documents == len({(p["title"], p["paragraph_text"]) for p in good["paragraphs"]})


def test_nothing_converted_is_an_error_and_writes_nothing(tmp_path) -> None:
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps([{"_id": "a", "question": "Q?"}]), encoding="utf-8")
    with pytest.raises(UserError, match=r"no row converted as hotpotqa .*raw.json\[0\]: field 'answer'"):
        convert("hotpotqa", raw, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match="--corpus is for search-r1 only"):
        convert("musique", raw, tmp_path / "out", corpus=raw)
    with pytest.raises(UserError, match="unknown format 'squad'"):
        convert("squad", raw, tmp_path / "out")


def test_cli_prints_counts_and_skipped_rows(tmp_path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["data", "convert", "2wiki", "--input", str(RAW / "2wiki_dev_sample.json"),
                             "--out", str(tmp_path / "a"), "--limit", "2"])
    assert ok.exit_code == 0, ok.output
    assert "2 tasks, " in ok.output and "0 skipped rows" in ok.output
    raw = tmp_path / "bad.jsonl"
    raw.write_text('{"id": "x"}\n', encoding="utf-8")
    bad = runner.invoke(app, ["data", "convert", "musique", "--input", str(raw), "--out", str(tmp_path / "b")])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines()[-1].startswith("data convert failed: ")
    assert f"{raw}:1: field 'question'" in bad.output


def test_eval_input_shares_one_corpus_and_loads_as_files_data(tmp_path) -> None:
    from tracerl.config.schema import resolve_config
    from tracerl.train.data import check_task_files

    lines = (RAW / "musique_dev_sample.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(lines[:60]), encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text("".join(lines[60:]), encoding="utf-8")
    result = CliRunner().invoke(app, ["data", "convert", "musique", "--input", str(tmp_path / "train.jsonl"),
                                      "--eval-input", str(tmp_path / "dev.jsonl"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "60 tasks + 40 held-out, " in result.output
    out = tmp_path / "out"
    rows = _raw_lines("musique_dev_sample.jsonl")
    docs = load_corpus(out / "corpus.jsonl")
    assert len(docs) == len({(p["title"], p["paragraph_text"]) for r in rows for p in r["paragraphs"]})
    held_out = load_tasks(out / "eval_tasks.jsonl")
    assert len(held_out) == 40 and {i for t in held_out for i in t.supporting_ids} <= {d.id for d in docs}
    config = resolve_config("grpo", overrides=["data.source=files", f"data.tasks={out / 'tasks.jsonl'}",
                                               f"data.corpus={out / 'corpus.jsonl'}",
                                               f"data.eval_tasks={out / 'eval_tasks.jsonl'}"])
    check_task_files(config.data)  # ids unique across the splits, every file well formed
