"""Task/corpus JSONL: round trips and errors that name file, line and field."""

from __future__ import annotations

import pytest

from tracerl.core.types import Task
from tracerl.envs.data import Document, load_corpus, load_tasks, write_corpus, write_tasks


def test_round_trip(tmp_path) -> None:
    tasks = [Task("a", "Who?", ("X", "x"), ("T1", "T2"), 2), Task("b", "What?", ("Y",))]
    docs = [Document("d1", "T1", "T1 is here."), Document("d2", "Élan", "ünïcode text")]
    write_tasks(tasks, tmp_path / "t.jsonl")
    write_corpus(docs, tmp_path / "c.jsonl")
    assert load_tasks(tmp_path / "t.jsonl") == tasks
    assert load_corpus(tmp_path / "c.jsonl") == docs


def test_extra_fields_and_blank_lines_are_ignored(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('\n{"id": "q", "question": "Q?", "answers": ["A"], "type": "bridge"}\n\n')
    assert load_tasks(path) == [Task("q", "Q?", ("A",))]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"id": "q", "question": "Q?"}', "missing field 'answers'"),
        ('{"id": "q", "question": "Q?", "answers": []}', "'answers'"),
        ('{"id": "q", "question": "Q?", "answers": "A"}', "'answers' must be a list"),
        ('{"id": 3, "question": "Q?", "answers": ["A"]}', "'id' must be a string"),
        ('{"id": "q", "question": "Q?", "answers": ["A"], "hops": "2"}', "'hops'"),
        ('{"id": "q", "question": "", "answers": ["A"]}', "'question' is empty"),
        ('{"id": "q", "question": "Q?", "answers": ["A"]', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
    ],
)
def test_bad_task_lines_name_file_line_and_field(tmp_path, line, needle) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "ok", "question": "Q?", "answers": ["A"]}\n' + line + "\n")
    with pytest.raises(ValueError) as info:
        load_tasks(path)
    assert f"{path}:2:" in str(info.value) and needle in str(info.value)


def test_bad_corpus_and_duplicate_ids(tmp_path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "d", "title": "T", "text": "x"}\n{"id": "e", "text": "y"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: missing field 'title'"):
        load_corpus(path)
    path.write_text('{"id": "d", "title": "T", "text": "x"}\n{"id": "d", "title": "U", "text": "y"}\n')
    with pytest.raises(ValueError, match=r":2: field 'id' 'd' repeats line 1"):
        load_corpus(path)
