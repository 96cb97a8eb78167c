"""Task and corpus files: one JSONL format shared by SynthWiki and real data sets.

Tasks: ``{"id", "question", "answers": [...], "supporting_titles"?: [...], "hops"?: int}``
(extra fields such as HotpotQA's ``supporting_ids`` are ignored). Corpus:
``{"id", "title", "text"}``, UTF-8. Bad data fails with a :class:`UserError` naming the file,
the line and the field, so a broken data set is found before a training run starts; a file
with no records is an error too (an empty task list cannot be trained or checked).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.core.types import Task
from tracerl.errors import UserError


@dataclass(frozen=True)
class Document:
    """One corpus entry: an encyclopedia page or a paragraph."""

    id: str
    title: str
    text: str


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, JSON object) for each non-blank line.

    Lines are decoded one by one, so bytes that are not UTF-8 are reported with their line
    (a text-mode read fails somewhere in a buffer, naming neither file nor line).
    """
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:  # utf-8-sig on line 1 drops a byte-order mark some editors write
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record


def _not_empty(items: list[Any], path: Path, what: str) -> None:
    if not items:
        raise UserError(f"{path}: no {what} (the file is empty or blank); write one JSON object per line")


def _field(record: dict[str, Any], name: str, kind: type, where: str, required: bool = True) -> Any:
    if name not in record or record[name] is None:
        if required:
            raise UserError(f"{where}: missing field {name!r}")
        return None
    value = record[name]
    if kind is str and not isinstance(value, str):
        raise UserError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise UserError(f"{where}: field {name!r} must be an integer, got {value!r}")
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{where}: field {name!r} must be a list of strings")
    return value


def _task(record: dict[str, Any], where: str) -> Task:
    task_id = _field(record, "id", str, where)
    question = _field(record, "question", str, where)
    if not question.strip():
        raise UserError(f"{where}: field 'question' is empty")
    answers = _field(record, "answers", list, where)
    if not answers or not all(a.strip() for a in answers):
        raise UserError(f"{where}: field 'answers' must hold at least one non-empty alias")
    titles = _field(record, "supporting_titles", list, where, required=False) or []
    hops = _field(record, "hops", int, where, required=False)
    if hops is not None and hops < 1:
        raise UserError(f"{where}: field 'hops' must be >= 1, got {hops}")
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
            raise UserError(f"{where}: field 'id' {task.id!r} repeats line {seen[task.id]}")
        seen[task.id] = lineno
        tasks.append(task)
    _not_empty(tasks, path, "tasks")
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
            raise UserError(f"{where}: field 'id' {doc.id!r} repeats line {seen[doc.id]}")
        seen[doc.id] = lineno
        docs.append(doc)
    _not_empty(docs, path, "documents")
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
