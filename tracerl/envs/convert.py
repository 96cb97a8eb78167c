"""``tracerl data convert``: official raw QA files -> tracerl ``tasks.jsonl`` + ``corpus.jsonl``.

Formats (field names as the data sets publish them):

- ``hotpotqa``: HotpotQA distractor JSON list; ``_id, question, answer, type, level,
  context: [[title, [sentence, ...]], ...], supporting_facts: [[title, sentence_index], ...]``.
- ``2wiki``: 2WikiMultihopQA JSON list; as HotpotQA plus ``evidences`` (triples, not needed
  here: the supporting facts already name the paragraphs).
- ``musique``: MuSiQue JSONL; ``id, question, answer, answer_aliases, answerable,
  paragraphs: [{idx, title, paragraph_text, is_supporting}], question_decomposition:
  [{paragraph_support_idx, ...}]``. Unanswerable rows are skipped (reported).
- ``search-r1``: Search-R1's training rows (parquet or JSONL); the question is ``question``
  or the text after ``Question:`` in ``prompt[0].content``; answers are ``golden_answers`` or
  ``reward_model.ground_truth.target``; ``data_source`` becomes the task's ``type``. It has
  no per-question corpus (it retrieves from a Wikipedia dump): pass one with ``corpus=``
  (JSONL of ``id, title, text`` or Search-R1's ``id, contents`` = ``"Title"\\ntext``).

A paragraph becomes one document; the same (title, text) seen in several questions is
stored once. Document ids are ``<format>-<n>`` in order of first appearance and unique;
titles may repeat (MuSiQue), which is why tasks carry ``supporting_ids``. A bad row is
skipped and reported (``file:line`` or ``file[index]`` and the reason); the conversion
fails only when no row converts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.core.types import Task
from tracerl.envs.bounded import MiB, TooLarge, is_regular, lines_limited, loads_json, open_regular, read_limited
from tracerl.envs.data import PARQUET_MISSING, Document, parquet_available, task_record
from tracerl.envs.manifest import publish, remove_stale_temps, remove_temps, write_temp_lines
from tracerl.errors import UserError

FORMATS = ("hotpotqa", "musique", "2wiki", "search-r1")
MAX_RAW_LINE = 16 * MiB
"""Longest raw JSONL row read (a MuSiQue row is ~10 KB); a longer one is skipped and reported."""
MAX_RAW_LIST = 2048 * MiB
"""Largest raw JSON list read whole (HotpotQA's training file is ~570 MB)."""


class RowError(ValueError):
    """A raw row that cannot be converted; the message says why (the row is skipped)."""


@dataclass
class Corpus:
    """Documents deduplicated by (title, text), with ids ``<prefix>-<n>`` in first-seen order."""

    prefix: str
    documents: list[Document] = field(default_factory=list)
    _ids: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, title: str, text: str) -> str:
        """The id of this paragraph (a new one the first time it is seen)."""
        key = (title, text)
        if key not in self._ids:
            doc = Document(id=f"{self.prefix}-{len(self.documents):06d}", title=title, text=text)
            self._ids[key] = doc.id
            self.documents.append(doc)
        return self._ids[key]

    def rollback(self, size: int) -> None:
        """Forget the documents added after the corpus held ``size`` (those of a rejected row)."""
        for doc in self.documents[size:]:
            del self._ids[(doc.title, doc.text)]
        del self.documents[size:]


@dataclass
class ConvertReport:
    """What a conversion wrote and what it skipped."""

    tasks: int
    documents: int
    errors: list[str]
    """One ``where: reason`` line per skipped row."""
    paths: dict[str, Path]
    eval_tasks: int = 0


# --- reading raw files ----------------------------------------------------------------------


def raw_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(``file:line`` or ``file[index]``, parsed row) of a JSON list, JSONL or parquet file.

    A line that is not JSON is yielded as a :class:`RowError` (reported, not fatal); a file
    that cannot be read at all raises :class:`UserError`.
    """
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if not is_regular(path):  # checked before any open: a FIFO would block it, /dev/zero never end
        raise UserError(f"{path} is not a regular file (a device, FIFO or socket); give a file")
    if path.suffix == ".parquet":
        if not parquet_available():
            raise UserError(f"{path}: {PARQUET_MISSING}")
        from tracerl.envs.parquet_bounds import parquet_rows  # optional extra: sizes bounded from the metadata

        yield from parquet_rows(path, MAX_RAW_LINE)
        return
    with open_regular(path) as handle:
        head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):  # one JSON list (HotpotQA, 2Wiki)
        try:
            rows = loads_json(read_limited(path, MAX_RAW_LIST, "a raw JSON list").decode("utf-8-sig"))
        except TooLarge:
            raise
        except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, nesting too deep
            raise UserError(f"{path}: not a valid JSON list ({exc})") from None
        yield from ((f"{path}[{i}]", row) for i, row in enumerate(rows))
        return
    with open_regular(path) as handle:
        for lineno, raw in lines_limited(handle, MAX_RAW_LINE):
            if raw is None:
                yield f"{path}:{lineno}", RowError(f"line longer than {MAX_RAW_LINE // MiB} MiB")
                continue
            if not raw.strip():
                continue
            try:
                yield f"{path}:{lineno}", loads_json(raw.decode("utf-8-sig" if lineno == 1 else "utf-8"))
            except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, nesting too deep
                yield f"{path}:{lineno}", RowError(f"not valid JSON ({exc})")


def _text(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"field {name!r} must be a non-empty string, got {value!r:.60}")
    return value.strip()


def _object(row: Any) -> dict[str, Any]:
    if isinstance(row, RowError):
        raise row
    if not isinstance(row, dict):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    return row


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --- HotpotQA and 2WikiMultihopQA -----------------------------------------------------------


def context_task(row: dict[str, Any], corpus: Corpus) -> Task:
    """One HotpotQA/2Wiki row: every context paragraph into ``corpus``, the question as a Task.

    A paragraph is its sentences, each stripped, joined with single spaces; the supporting
    paragraphs are the context entries whose title a supporting fact names (in fact order).
    """
    question, answer = _text(row, "question"), _text(row, "answer")
    context, facts = row.get("context"), row.get("supporting_facts")
    if not isinstance(context, list) or not context:
        raise RowError("field 'context' must be a non-empty list of [title, [sentences]]")
    ids: dict[str, str] = {}
    for entry in context:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and all(isinstance(s, str) for s in entry[1])):
            raise RowError(f"a 'context' entry must be [title, [sentences]], got {entry!r:.60}")
        text = " ".join(s.strip() for s in entry[1] if s.strip())
        if text:
            ids.setdefault(entry[0], corpus.add(entry[0], text))
    if not isinstance(facts, list) or not all(isinstance(f, (list, tuple)) and f and isinstance(f[0], str)
                                              for f in facts):
        raise RowError("field 'supporting_facts' must be a list of [title, sentence_index]")
    titles = _unique([f[0] for f in facts])
    missing = [t for t in titles if t not in ids]
    if missing:
        raise RowError(f"supporting title {missing[0]!r} is not in the row's context")
    task_id = str(row.get("_id") or row.get("id") or "")
    if not task_id:
        raise RowError("field '_id' is missing")
    return Task(id=task_id, question=question, answers=(answer,), supporting_titles=tuple(titles),
                supporting_ids=tuple(ids[t] for t in titles))


# --- MuSiQue --------------------------------------------------------------------------------


def musique_task(row: dict[str, Any], corpus: Corpus) -> Task:
    """One MuSiQue row; supporting paragraphs in hop order (``question_decomposition``)."""
    if row.get("answerable") is False:
        raise RowError("unanswerable question (answerable = false): skipped")
    question, answer = _text(row, "question"), _text(row, "answer")
    aliases = row.get("answer_aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise RowError("field 'answer_aliases' must be a list of strings")
    paragraphs = row.get("paragraphs")
    if not isinstance(paragraphs, list) or not paragraphs:
        raise RowError("field 'paragraphs' must be a non-empty list")
    by_idx: dict[int, tuple[str, str]] = {}
    for i, para in enumerate(paragraphs):
        if not isinstance(para, dict):
            raise RowError(f"paragraph {i} is not an object")
        title, text = _text(para, "title"), _text(para, "paragraph_text")
        by_idx[_idx(para, i)] = (title, corpus.add(title, text))
    hops = [step.get("paragraph_support_idx") for step in row.get("question_decomposition") or []
            if isinstance(step, dict)]
    order = [i for i in hops if isinstance(i, int) and i in by_idx]
    order += [_idx(p, i) for i, p in enumerate(paragraphs) if p.get("is_supporting")]
    order = list(dict.fromkeys(order))
    if not order:
        raise RowError("no supporting paragraph (is_supporting / paragraph_support_idx)")
    task_id = _text(row, "id")
    return Task(id=task_id, question=question, answers=tuple(_unique([answer] + [a.strip() for a in aliases
                                                                                if a.strip()])),
                supporting_titles=tuple(by_idx[i][0] for i in order),
                supporting_ids=tuple(by_idx[i][1] for i in order), hops=len(order))


def _idx(paragraph: dict[str, Any], position: int) -> int:
    """A paragraph's ``idx`` (its position when absent); anything but an integer is a bad row
    (JSON's ``Infinity`` or ``1e400`` would overflow ``int()``)."""
    idx = paragraph.get("idx", position)
    if not isinstance(idx, int) or isinstance(idx, bool):
        raise RowError(f"paragraph {position}: field 'idx' must be an integer, got {type(idx).__name__}")
    return idx


# --- Search-R1 ------------------------------------------------------------------------------


def search_r1_question(row: dict[str, Any]) -> str:
    """The bare question: ``question``, else the text after the last ``Question:`` of the prompt."""
    if isinstance(row.get("question"), str) and row["question"].strip():
        return row["question"].strip()
    prompt = row.get("prompt")
    content = prompt[0].get("content") if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) \
        else prompt
    if not isinstance(content, str) or "Question:" not in content:
        raise RowError("no 'question' field and no 'Question:' in prompt[0].content")
    question = content.rsplit("Question:", 1)[1].strip()
    if not question:
        raise RowError("empty question after 'Question:' in the prompt")
    return question


def search_r1_answers(row: dict[str, Any]) -> list[str]:
    """``golden_answers``, else ``reward_model.ground_truth.target`` (a string or a list)."""
    answers = row.get("golden_answers")
    if answers is None:
        truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) \
            else None
        answers = truth.get("target") if isinstance(truth, dict) else None
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise RowError("no answers: need 'golden_answers' or 'reward_model.ground_truth.target' (strings)")
    answers = _unique([a.strip() for a in answers if a.strip()])
    if not answers:
        raise RowError("every answer is empty")
    return answers


def search_r1_task(row: dict[str, Any], position: int) -> Task:
    source = row.get("data_source") if isinstance(row.get("data_source"), str) else "search-r1"
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    task_id = row.get("id")
    if task_id is None:
        task_id = f"{source}-{extra.get('split', 'row')}-{extra.get('index', position)}"
    return Task(id=str(task_id), question=search_r1_question(row), answers=tuple(search_r1_answers(row)))


def corpus_document(row: dict[str, Any], position: int) -> Document:
    """``id, title, text`` or Search-R1/FlashRAG's ``id, contents`` (first line the quoted title)."""
    doc_id = str(row.get("id", position))
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str) or not contents.strip():
            raise RowError("field 'contents' must be a non-empty string")
        title, _, text = contents.partition("\n")
        title = title.strip()
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
        return Document(id=doc_id, title=title, text=text.strip() or title)
    return Document(id=doc_id, title=_text(row, "title"), text=_text(row, "text"))


# --- the driver -----------------------------------------------------------------------------


def _rows_to_tasks(rows: Iterator[tuple[str, Any]], make: Callable[[dict[str, Any], int], Task],
                   limit: int | None, errors: list[str], corpus: Corpus | None = None) -> list[Task]:
    """Convert rows until ``limit`` tasks; a failing row is recorded in ``errors`` and skipped.

    The paragraphs a failing row added to ``corpus`` are taken out again, so the corpus holds
    exactly the paragraphs of the converted questions (distractors included).
    """
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for position, (where, row) in enumerate(rows):
        if limit is not None and len(tasks) >= limit:
            break
        if position == 0:
            refuse_converted(where, row)
        size = len(corpus.documents) if corpus is not None else 0
        try:
            task = make(_object(row), position)
            if task.id in seen:
                raise RowError(f"id {task.id!r} repeats {seen[task.id]}")
        except (RowError, ValueError, TypeError, OverflowError) as exc:  # one bad row: listed, skipped
            errors.append(f"{where}: {exc}")
            if corpus is not None:
                corpus.rollback(size)
            continue
        seen[task.id] = where
        tasks.append(task)
    return tasks


TRACERL_TASK_FIELDS = ("id", "question", "answers")


def refuse_converted(where: str, row: Any) -> None:
    """Raise :class:`UserError` when the first row is already a tracerl task (``id, question, answers``
    and no raw field): converting it would fail on every row, one error each."""
    if isinstance(row, dict) and all(k in row for k in TRACERL_TASK_FIELDS) and isinstance(row["answers"], list) \
            and not any(k in row for k in ("answer", "context", "paragraphs", "golden_answers", "reward_model")):
        file = where.rsplit(":", 1)[0] if not where.endswith("]") else where[:where.rindex("[")]
        raise UserError(f"{file} is already in tracerl's task format (id, question, answers): nothing to convert; "
                        "give it as data.tasks (with its corpus as data.corpus) or to tracerl env-check --tasks")


def _read_corpus(path: Path, errors: list[str]) -> list[Document]:
    documents: list[Document] = []
    seen: set[str] = set()
    for position, (where, row) in enumerate(raw_rows(path)):
        try:
            doc = corpus_document(_object(row), position)
            if doc.id in seen:
                raise RowError(f"document id {doc.id!r} repeats")
        except RowError as exc:
            errors.append(f"{where}: {exc}")
            continue
        seen.add(doc.id)
        documents.append(doc)
    return documents


def _write_outputs(out: Path, splits: dict[str, list[Task]], documents: list[Document]) -> dict[str, Path]:
    """Write every output file atomically as one set (envs/manifest.py); their paths by split name."""
    records: dict[str, Any] = {f"{name}.jsonl": (task_record(t) for t in tasks) for name, tasks in splits.items()}
    if documents:
        records["corpus.jsonl"] = ({"id": d.id, "title": d.title, "text": d.text} for d in documents)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    temps = {}
    try:
        for name, rows in records.items():
            temps[name] = write_temp_lines(out / name, rows)
        publish(out, temps)
    except BaseException:
        remove_temps(tmp for tmp, _ in temps.values())
        raise
    return {name.removesuffix(".jsonl"): out / name for name in records}


def convert(fmt: str, raw: str | Path, out: str | Path, limit: int | None = None,
            corpus: str | Path | None = None, eval_raw: str | Path | None = None) -> ConvertReport:
    """Convert ``raw`` (format ``fmt``) into ``out/tasks.jsonl`` (+ ``out/corpus.jsonl``).

    ``eval_raw`` (a held-out split, e.g. the dev file) goes to ``out/eval_tasks.jsonl`` with
    its paragraphs in the same corpus, so one ``data.corpus`` serves both splits and document
    ids never clash. ``limit`` keeps the first N converted questions of each file (and only
    their paragraphs). ``corpus`` is read for ``search-r1`` only (the other formats carry
    their paragraphs). Raises :class:`UserError` when no row of a file converts (nothing is
    written then).
    """
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    if corpus is not None and fmt != "search-r1":
        raise UserError(f"--corpus is for search-r1 only; {fmt} files carry their own paragraphs")
    out, errors = Path(out), []
    docs = Corpus(prefix=fmt.replace("-", ""))
    splits: dict[str, list[Task]] = {}
    for name, path in (("tasks", raw), ("eval_tasks", eval_raw)):
        if path is None:
            continue
        if fmt == "search-r1":
            tasks = _rows_to_tasks(raw_rows(Path(path)), search_r1_task, limit, errors)
        else:
            make = musique_task if fmt == "musique" else context_task
            tasks = _rows_to_tasks(raw_rows(Path(path)), lambda row, _: make(row, docs), limit, errors, docs)
        if not tasks:
            shown = "; ".join(errors[:3]) or "the file holds no rows"
            raise UserError(f"{path}: no row converted as {fmt} ({len(errors)} bad rows: {shown})")
        splits[name] = tasks
    documents = _read_corpus(Path(corpus), errors) if corpus is not None else docs.documents
    paths = _write_outputs(out, splits, documents)
    return ConvertReport(tasks=len(splits["tasks"]), documents=len(documents), errors=errors, paths=paths,
                         eval_tasks=len(splits.get("eval_tasks", [])))
