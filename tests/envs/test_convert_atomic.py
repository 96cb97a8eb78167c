"""``tracerl data convert`` writes its outputs as one atomic set under a manifest; readers refuse
a torn or interrupted set; oversized and deeply nested records end in one line naming file:line,
before any run folder exists."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import tracerl.envs.convert as convert_module
from tracerl.envs.convert import convert
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.envs.manifest import MANIFEST
from tracerl.errors import UserError
from helpers_cli import invoke, one_line
from helpers_temps import dead_writer_temps

RAW = Path(__file__).parents[1] / "data" / "raw" / "musique_dev_sample.jsonl"
TASK = '{{"id": "{i}", "question": "Who is {i}?", "answers": ["A{i}"]}}\n'
DOC = '{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n'
DEEP = "[" * 100_000 + "]" * 100_000


def test_a_conversion_writes_a_complete_manifest(tmp_path: Path) -> None:
    report = convert("musique", RAW, tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["status"] == "complete"
    assert manifest["files"]["tasks.jsonl"]["records"] == report.tasks == 100
    assert manifest["files"]["corpus.jsonl"]["bytes"] == (tmp_path / "corpus.jsonl").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert_manifest.json", "corpus.jsonl", "tasks.jsonl"]


def test_a_torn_tasks_file_is_refused_by_env_check_and_training(tmp_path: Path) -> None:
    convert("musique", RAW, tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    lines = tasks.read_bytes().splitlines(keepends=True)
    tasks.write_bytes(b"".join(lines[:37]))  # cut at a line boundary: every line still parses
    with pytest.raises(UserError, match="differs from what tracerl data convert wrote"):
        load_tasks(tasks)
    one_line(invoke("env-check", "--tasks", str(tasks), "--corpus", str(tmp_path / "corpus.jsonl")),
             "env-check failed:", "tasks.jsonl", "torn or edited")
    out = tmp_path / "run"
    result = invoke("train", "grpo", "--smoke-random", "--out", str(out), "--set", "data.source=files",
                    "--set", f"data.tasks={tasks}", "--set", f"data.corpus={tmp_path / 'corpus.jsonl'}")
    one_line(result, "train failed:", "tasks.jsonl", "torn or edited")
    assert not out.exists()


def test_an_interrupted_conversion_is_refused(tmp_path: Path) -> None:
    convert("musique", RAW, tmp_path)
    manifest = tmp_path / MANIFEST
    manifest.write_text(manifest.read_text().replace('"complete"', '"converting"'))
    with pytest.raises(UserError, match="was interrupted"):
        load_corpus(tmp_path / "corpus.jsonl")


def test_a_hand_written_file_needs_no_manifest(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text(TASK.format(i=1))
    assert [t.id for t in load_tasks(tmp_path / "tasks.jsonl")] == ["1"]


def test_a_full_disk_leaves_the_previous_output_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    convert("musique", RAW, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real, written = convert_module.task_record, []

    def fills_the_disk(task):  # noqa: ANN001, ANN202
        written.append(task.id)
        if len(written) > 10:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".tasks.jsonl.tmp"))
        return real(task)

    monkeypatch.setattr(convert_module, "task_record", fills_the_disk)
    result = invoke("data", "convert", "musique", "--input", str(RAW), "--out", str(tmp_path))
    one_line(result, "data convert failed:", "no space left")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporaries either
    assert len(load_tasks(tmp_path / "tasks.jsonl")) == 100


def test_stale_temporaries_of_a_killed_conversion_are_removed(tmp_path: Path) -> None:
    (stale,) = dead_writer_temps(tmp_path, files=["tasks.jsonl"])
    (tmp_path / ".tasks.jsonl.tmp-999999999").write_text("a user's file in a temporary-like name")
    convert("musique", RAW, tmp_path)
    assert not (tmp_path / stale).exists()
    assert (tmp_path / ".tasks.jsonl.tmp-999999999").read_text() == "a user's file in a temporary-like name"


# --- item 7: deeply nested JSON --------------------------------------------------------------


def test_deep_json_is_one_line_in_env_check_train_and_convert(tmp_path: Path) -> None:
    tasks, corpus = tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl"
    tasks.write_text(TASK.format(i=1) + DEEP + "\n")
    corpus.write_text(DOC)
    one_line(invoke("env-check", "--tasks", str(tasks), "--corpus", str(corpus)), "tasks.jsonl:2", "nested too deeply")
    out = tmp_path / "run"
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), "--set", "data.source=files",
                    "--set", f"data.tasks={tasks}", "--set", f"data.corpus={corpus}"), "tasks.jsonl:2")
    assert not out.exists()
    raw = tmp_path / "raw.jsonl"
    raw.write_text(RAW.read_text().splitlines()[0] + "\n" + DEEP + "\n")
    result = invoke("data", "convert", "musique", "--input", str(raw), "--out", str(tmp_path / "conv"))
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert f"skipped {raw}:2: not valid JSON (JSON nested too deeply)" in result.stderr
    one_line(invoke("data", "convert", "hotpotqa", "--input", str(_deep_list(tmp_path)), "--out", str(tmp_path / "c2")),
             "deep.json", "nested too deeply")


def _deep_list(tmp_path: Path) -> Path:
    path = tmp_path / "deep.json"
    path.write_text("[" + DEEP + "]")
    return path


# --- item 12: sizes checked at load, limits in config ------------------------------------


def test_an_oversized_question_fails_before_the_run_folder(tmp_path: Path) -> None:
    tasks, corpus = tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl"
    big = json.dumps({"id": "big", "question": "Who? " * 200_000, "answers": ["A"]})  # 1 MB
    tasks.write_text(TASK.format(i=1) + TASK.format(i=2) + big + "\n")
    corpus.write_text(DOC)
    files = ["--set", "data.source=files", "--set", f"data.tasks={tasks}", "--set", f"data.corpus={corpus}"]
    out = tmp_path / "run"
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), *files), "tasks.jsonl:3",
             "data.max_question_chars = 4000")
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), *files, "--set", "data.max_line_bytes=100000"),
             "tasks.jsonl:3", "line longer than 100000 bytes", "data.max_line_bytes")
    assert not out.exists()


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "tasks.jsonl"
    with open(path, "wb") as handle:
        handle.write(TASK.format(i=1).encode() + b'{"id": "2", "question": "')
        for _ in range(200):  # a 200 MB line, written in 1 MB pieces
            handle.write(b"x" * (1 << 20))
        handle.write(b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"tasks.jsonl:2: line longer than 4 MiB"):
            load_tasks(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # about one 4 MiB line buffer, never the 200 MB line


def test_size_limits_are_validated_config_fields(tmp_path: Path) -> None:
    result = invoke("config", "show", "grpo", "--set", "data.max_line_bytes=0")
    one_line(result, "data.max_line_bytes must be > 0")
