"""Task and corpus files: one JSONL format shared by SynthWiki and real data sets.

Tasks: ``{"id", "question", "answers": [...], "supporting_titles"?: [...], "supporting_ids"?: [...],
"hops"?: int}`` (other fields, such as ``type``, are ignored). ``supporting_ids`` name the gold
paragraphs by corpus id, which is what addresses them when titles repeat (MuSiQue). Corpus:
``{"id", "title", "text"}``, UTF-8. Bad data fails with a :class:`UserError` naming the file,
the line and the field, so a broken data set is found before a training run starts; a file
with no records is an error too (an empty task list cannot be trained or checked).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.envs.bounded import MiB, TooLarge, is_regular, line_too_long, lines_limited, loads_json, open_regular, read_limited
from tracerl.core.types import Task
from tracerl.envs.manifest import check_manifest
from tracerl.errors import UserError

MAX_LINE_BYTES = 4 * MiB
"""Default ``data.max_line_bytes``: longest JSONL record read (a long Wikipedia page is ~200 KB)."""
MAX_JSON_BYTES = 512 * MiB
"""Largest ``.json`` data file (one list, parsed whole); a larger data set belongs in ``.jsonl``."""
MAX_QUESTION_CHARS = 4000
"""Default ``data.max_question_chars`` (HotpotQA's and MuSiQue's longest questions are under 1,000)."""


@dataclass(frozen=True)
class Document:
    """One corpus entry: an encyclopedia page or a paragraph."""

    id: str
    title: str
    text: str


PARQUET_MISSING = ("reading .parquet files needs pyarrow: pip install -e '.[datasets]' "
                   "(or convert the file to .jsonl)")


def parquet_available() -> bool:
    """Whether the optional ``datasets`` extra (pyarrow) is installed; nothing is imported."""
    return importlib.util.find_spec("pyarrow") is not None


def _records(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (``file:line`` or ``file[row]``, JSON object) for each record of ``path``.

    ``.parquet`` (one row a record, through pyarrow) and ``.json`` (one list of objects) are
    read whole; anything else is JSONL, decoded line by line so that bytes which are not UTF-8
    are reported with their line (a text-mode read fails somewhere in a buffer, naming neither
    file nor line).
    """
    if path.suffix == ".parquet":
        yield from _parquet_records(path, max_line_bytes)
        return
    if path.suffix == ".json":
        yield from _json_list_records(path)
        return
    with open_regular(path) as handle:
        for lineno, raw in lines_limited(handle, max_line_bytes):
            if raw is None:  # refused before it is read whole: memory stays bounded
                raise UserError(line_too_long(f"{path}:{lineno}", max_line_bytes, "data.max_line_bytes"))
            try:  # utf-8-sig on line 1 drops a byte-order mark some editors write
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = loads_json(line)
            except ValueError as exc:  # JSONDecodeError, or nesting too deep for the parser
                raise UserError(f"{path}:{lineno}: invalid JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield f"{path}:{lineno}", record


def _json_list_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:  # checked as a regular file before it is opened, read bounded (a link to /dev/zero never ends)
        data = loads_json(read_limited(path, MAX_JSON_BYTES, "a .json data file").decode("utf-8-sig"))
    except TooLarge as exc:
        raise UserError(f"{exc} (write a larger data set as .jsonl: it is read line by line)") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not valid UTF-8; save the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    except ValueError as exc:  # nested too deeply
        raise UserError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: a .json data file must hold a list of objects, got {type(data).__name__}; "
                        "write one object per line as .jsonl otherwise")
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise UserError(f"{path}[{index}]: expected a JSON object, got {type(record).__name__}")
        yield f"{path}[{index}]", record


def _parquet_records(path: Path, max_row_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a parquet file as plain Python objects (pyarrow: the optional ``datasets`` extra),
    each within ``max_row_bytes`` as a JSONL line is, checked from the metadata first
    (:mod:`tracerl.envs.parquet_bounds`)."""
    if not parquet_available():
        raise UserError(f"{path}: {PARQUET_MISSING}")
    from tracerl.envs.parquet_bounds import parquet_rows  # imports pyarrow: only for a .parquet file

    yield from parquet_rows(path, max_row_bytes, "data.max_line_bytes")


def _position(where: str) -> str:
    """``line 3`` for ``file:3``, ``row 3`` for ``file[3]`` (to name the first of two repeated ids)."""
    if where.endswith("]"):
        return "row " + where[where.rindex("[") + 1:-1]
    return "line " + where[where.rindex(":") + 1:]


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
    for text in (value if kind is list else [value] if kind is str else []):
        _utf8_text(text, name, where)
    return value


def _utf8_text(text: str, name: str, where: str) -> None:
    """Refuse a lone surrogate (JSON's ``"\\ud800"`` decodes to one): it is no character, and the
    tokenizer, the search index and every UTF-8 writer fail on it deep inside, naming no file."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"{where}: field {name!r} holds a lone surrogate (U+{ord(text[err.start]):04X} at "
                        f"character {err.start}), which is not text; fix or drop the record") from None


RAW_FORMATS = {"musique": ("paragraphs", "question_decomposition"), "hotpotqa": ("context", "supporting_facts"),
               "search-r1": ("golden_answers", "reward_model")}
"""Fields by which a raw data-set row is recognised (it must be converted before use)."""


def raw_format(record: dict[str, Any]) -> str | None:
    """The raw format ``tracerl data convert`` reads that ``record`` looks like, or None."""
    if "answers" in record:
        return None
    for name, fields in RAW_FORMATS.items():
        if any(f in record for f in fields):
            return name
    return None


def _task(record: dict[str, Any], where: str, max_question_chars: int = MAX_QUESTION_CHARS) -> Task:
    raw = raw_format(record)
    if raw is not None:  # one line for the whole file, not an error per field
        raise UserError(f"{where}: this looks like a raw {raw} row, not a tracerl task; convert the file first: "
                        f"tracerl data convert {raw} --input FILE --out FOLDER")
    task_id = _field(record, "id", str, where)
    question = _field(record, "question", str, where)
    if not question.strip():
        raise UserError(f"{where}: field 'question' is empty")
    if len(question) > max_question_chars:
        raise UserError(f"{where}: field 'question' has {len(question)} characters, more than "
                        f"data.max_question_chars = {max_question_chars}")
    answers = _field(record, "answers", list, where)
    if not answers or not all(a.strip() for a in answers):
        raise UserError(f"{where}: field 'answers' must hold at least one non-empty alias")
    titles = _field(record, "supporting_titles", list, where, required=False) or []
    ids = _field(record, "supporting_ids", list, where, required=False) or []
    hops = _field(record, "hops", int, where, required=False)
    if hops is not None and hops < 1:
        raise UserError(f"{where}: field 'hops' must be >= 1, got {hops}")
    return Task(id=task_id, question=question, answers=tuple(answers),
                supporting_titles=tuple(titles), hops=hops, supporting_ids=tuple(ids))


def load_tasks(path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES,
               max_question_chars: int = MAX_QUESTION_CHARS) -> list[Task]:
    """Read a tasks file (``.jsonl``, ``.json`` list or ``.parquet``); ids must be unique.

    The limits (``data.max_line_bytes``, ``data.max_question_chars``) refuse oversized records
    here, before a run folder exists, instead of at the first step that meets them. A file that
    ``tracerl data convert`` wrote is checked against its manifest first (envs/manifest.py).
    """
    path = _regular(path)
    expected = check_manifest(path)
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for where, record in _records(path, max_line_bytes):
        task = _task(record, where, max_question_chars)
        if task.id in seen:
            raise UserError(f"{where}: field 'id' {task.id!r} repeats {seen[task.id]}")
        seen[task.id] = _position(where)
        tasks.append(task)
    _not_empty(tasks, path, "tasks")
    _counted(tasks, expected, path)
    return tasks


def _regular(path: str | Path) -> Path:
    """``path``, refused before any open unless it is a regular file (a FIFO would block the open)."""
    path = Path(path)
    if path.exists() and not is_regular(path):
        raise UserError(f"{path} is not a regular file (a device, FIFO or socket); give a file")
    return path


def _counted(items: list[Any], expected: int | None, path: Path) -> None:
    if expected is not None and len(items) != expected:
        raise UserError(f"{path} holds {len(items)} records, its convert manifest {expected}; convert again")


def load_corpus(path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> list[Document]:
    """Read a corpus file (``.jsonl``, ``.json`` list or ``.parquet``); ids must be unique.

    Lines past ``max_line_bytes`` and a file torn since ``tracerl data convert`` are refused."""
    path = _regular(path)
    expected = check_manifest(path)
    docs: list[Document] = []
    seen: dict[str, str] = {}
    for where, record in _records(path, max_line_bytes):
        doc = Document(
            id=_field(record, "id", str, where),
            title=_field(record, "title", str, where),
            text=_field(record, "text", str, where),
        )
        if doc.id in seen:
            raise UserError(f"{where}: field 'id' {doc.id!r} repeats {seen[doc.id]}")
        seen[doc.id] = _position(where)
        docs.append(doc)
    _not_empty(docs, path, "documents")
    _counted(docs, expected, path)
    return docs


def task_record(task: Task) -> dict[str, Any]:
    """The JSON object written for one task (fixed key order, so files are byte-stable)."""
    record: dict[str, Any] = {"id": task.id, "question": task.question, "answers": list(task.answers)}
    if task.supporting_titles:
        record["supporting_titles"] = list(task.supporting_titles)
    if task.supporting_ids:
        record["supporting_ids"] = list(task.supporting_ids)
    if task.hops is not None:
        record["hops"] = task.hops
    return record


def _write_lines(path: Path, records: Iterable[dict[str, Any]]) -> None:
    from tracerl.atomic import write_atomic_lines  # every output file whole or not at all

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic_lines(path, (json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def write_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as JSONL (inverse of :func:`load_tasks`)."""
    _write_lines(Path(path), (task_record(t) for t in tasks))


def write_corpus(documents: Iterable[Document], path: str | Path) -> None:
    """Write documents as JSONL (inverse of :func:`load_corpus`)."""
    _write_lines(Path(path), ({"id": d.id, "title": d.title, "text": d.text} for d in documents))
