"""Task and corpus files: one JSONL format shared by SynthWiki and real data sets.

Tasks: ``{"id", "question", "answers": [...], "supporting_titles"?: [...], "hops"?: int}``
(extra fields such as HotpotQA's ``supporting_ids`` are ignored). Corpus:
``{"id", "title", "text"}``. Bad data fails with the file, the line and the field named,
so a broken data set is found before a training run starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.core.types import Task


@dataclass(frozen=True)
class Document:
    """One corpus entry: an encyclopedia page or a paragraph."""

    id: str
    title: str
    text: str


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, JSON object) for each non-blank line."""
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def _field(record: dict[str, Any], name: str, kind: type, where: str, required: bool = True) -> Any:
    if name not in record or record[name] is None:
        if required:
            raise ValueError(f"{where}: missing field {name!r}")
        return None
    value = record[name]
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{where}: field {name!r} must be an integer, got {value!r}")
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: field {name!r} must be a list of strings")
    return value


def _task(record: dict[str, Any], where: str) -> Task:
    task_id = _field(record, "id", str, where)
    question = _field(record, "question", str, where)
    if not question.strip():
        raise ValueError(f"{where}: field 'question' is empty")
    answers = _field(record, "answers", list, where)
    if not answers or not all(a.strip() for a in answers):
        raise ValueError(f"{where}: field 'answers' must hold at least one non-empty alias")
    titles = _field(record, "supporting_titles", list, where, required=False) or []
    hops = _field(record, "hops", int, where, required=False)
    if hops is not None and hops < 1:
        raise ValueError(f"{where}: field 'hops' must be >= 1, got {hops}")
    return Task(id=task_id, question=question, answers=tuple(answers),
                supporting_titles=tuple(titles), hops=hops)


def load_tasks(path: str | Path) -> list[Task]:
    """Read a tasks JSONL file; ids must be unique."""
    path = Path(path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, record in _records(path):
        where = f"{path}:{lineno}"
        task = _task(record, where)
        if task.id in seen:
            raise ValueError(f"{where}: field 'id' {task.id!r} repeats line {seen[task.id]}")
        seen[task.id] = lineno
        tasks.append(task)
    return tasks


def load_corpus(path: str | Path) -> list[Document]:
    """Read a corpus JSONL file; ids must be unique."""
    path = Path(path)
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for lineno, record in _records(path):
        where = f"{path}:{lineno}"
        doc = Document(
            id=_field(record, "id", str, where),
            title=_field(record, "title", str, where),
            text=_field(record, "text", str, where),
        )
        if doc.id in seen:
            raise ValueError(f"{where}: field 'id' {doc.id!r} repeats line {seen[doc.id]}")
        seen[doc.id] = lineno
        docs.append(doc)
    return docs


def task_record(task: Task) -> dict[str, Any]:
    """The JSON object written for one task (fixed key order, so files are byte-stable)."""
    record: dict[str, Any] = {"id": task.id, "question": task.question, "answers": list(task.answers)}
    if task.supporting_titles:
        record["supporting_titles"] = list(task.supporting_titles)
    if task.hops is not None:
        record["hops"] = task.hops
    return record


def _write_lines(path: Path, records: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as JSONL (inverse of :func:`load_tasks`)."""
    _write_lines(Path(path), (task_record(t) for t in tasks))


def write_corpus(documents: Iterable[Document], path: str | Path) -> None:
    """Write documents as JSONL (inverse of :func:`load_corpus`)."""
    _write_lines(Path(path), ({"id": d.id, "title": d.title, "text": d.text} for d in documents))
