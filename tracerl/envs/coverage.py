"""Tokenizer coverage: can the policy's tokenizer read this data at all?

A word-level tokenizer built for SynthWiki (the embedded tiny model) maps most words of real
text to ``<unk>``: on a MuSiQue sample 47% of question tokens, 55% of document tokens and 61%
of answer tokens were ``<unk>`` and 1 gold answer in 100 encoded at all. Training then runs
"successfully" with reward 0 and loss 0, and reference credit is scored on ``<unk>`` answers.
This check runs once at training start on a sample of the data: it warns when more than a
few percent of tokens are unknown and fails when a gold answer cannot be encoded (empty, or
only ``<unk>`` tokens), naming the examples. A byte-level BPE tokenizer (Qwen, Llama) has no
unknown tokens and passes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.core.types import Task
from tracerl.envs.data import Document
from tracerl.errors import UserError

WARN_UNK_SHARE = 0.03
"""Unknown-token share above which the check warns (a few percent: names, rare symbols)."""


@dataclass
class CoverageReport:
    """Unknown-token shares of a data sample and the gold answers that cannot be encoded."""

    unk_share: dict[str, float]
    """``questions``, ``documents``, ``answers``: share of their tokens that are ``<unk>``."""
    unencodable: list[tuple[str, str]] = field(default_factory=list)
    """(task id, answer) of sampled gold answers that encode to nothing or only ``<unk>``."""
    sampled_answers: int = 0
    answers_with_unk: int = 0
    """Sampled gold answers with at least one ``<unk>`` token (readable only in part)."""
    warnings: list[str] = field(default_factory=list)
    """One line per kind of text whose unknown share is above the threshold."""


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _unk_share(tokenizer: Any, texts: Sequence[str]) -> float:
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = [i for text in texts for i in _encode(tokenizer, text)]
    if unk is None or not ids:
        return 0.0
    return sum(i == unk for i in ids) / len(ids)


def _has_unk(tokenizer: Any, text: str) -> bool:
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk is not None and unk in _encode(tokenizer, text)


def _unencodable(tokenizer: Any, answer: str) -> bool:
    """No tokens, or none but ``<unk>`` and whitespace (a word-level tokenizer keeps the spaces)."""
    ids, unk = _encode(tokenizer, answer), getattr(tokenizer, "unk_token_id", None)
    known = [i for i in ids if i != unk]
    return not ids or (len(known) < len(ids) and not tokenizer.decode(known).strip())


def tokenizer_coverage(tokenizer: Any, tasks: Sequence[Task], documents: Sequence[Document],
                       sample: int = 100, seed: int = 0, warn_above: float = WARN_UNK_SHARE) -> CoverageReport:
    """Measure ``<unk>`` shares on up to ``sample`` questions, documents and gold answers.

    Pure apart from tokenising: the sample is drawn with ``random.Random(seed)``, so the
    same data gives the same report. ``tokenizer`` is any Hugging Face tokenizer (callable,
    ``unk_token_id`` may be None).
    """
    if sample < 1:
        raise ValueError(f"sample must be >= 1, got {sample}")
    rng = random.Random(seed)
    picked = rng.sample(list(tasks), min(sample, len(tasks)))
    docs = rng.sample(list(documents), min(sample, len(documents)))
    texts = {"questions": [t.question for t in picked], "documents": [f"{d.title}: {d.text}" for d in docs],
             "answers": [t.gold for t in picked]}
    shares = {kind: _unk_share(tokenizer, items) for kind, items in texts.items()}
    report = CoverageReport(unk_share=shares, sampled_answers=len(picked))
    report.unencodable = [(t.id, t.gold) for t in picked if _unencodable(tokenizer, t.gold)]
    report.answers_with_unk = sum(_has_unk(tokenizer, t.gold) for t in picked)
    report.warnings = [f"{shares[kind]:.0%} of {kind[:-1]} tokens are <unk> (sample of {len(items)})"
                       for kind, items in texts.items() if shares[kind] > warn_above]
    if report.warnings and report.answers_with_unk:
        report.warnings.append(f"{report.answers_with_unk} of {len(picked)} sampled gold answers contain <unk>")
    return report


def check_tokenizer_coverage(tokenizer: Any, tasks: Sequence[Task], documents: Sequence[Document],
                             sample: int = 100, seed: int = 0,
                             warn_above: float = WARN_UNK_SHARE) -> CoverageReport:
    """:func:`tokenizer_coverage`, raising :class:`UserError` when a gold answer cannot be encoded.

    The caller prints ``report.warnings`` (training's logger). The error names up to three
    examples and what to do: a model whose tokenizer covers the data (a real checkpoint with
    a byte-level BPE tokenizer), or SynthWiki data for the embedded tiny model.
    """
    report = tokenizer_coverage(tokenizer, tasks, documents, sample=sample, seed=seed, warn_above=warn_above)
    if report.unencodable:
        shown = ", ".join(f"{tid!r}: {ans!r}" for tid, ans in report.unencodable[:3])
        raise UserError(
            f"the tokenizer cannot encode {len(report.unencodable)} of {report.sampled_answers} sampled gold answers "
            f"(empty or only <unk>), e.g. {shown}; {report.unk_share['questions']:.0%} of question and "
            f"{report.unk_share['documents']:.0%} of document tokens are <unk>. Use a model whose tokenizer "
            "covers this data (model.name_or_path=/path/to/checkpoint) or SynthWiki data with the tiny model")
    return report


TINY_WORLD_HINT = ("it knows the names of its own SynthWiki worlds only: build one with `tracerl world build "
                   "--seed 7 --out world` (--size tiny, the default)")
"""What the embedded ``tiny`` model can read (``tracerl world build --size full`` makes worlds it cannot)."""


def check_eval_coverage(tokenizer: Any, tasks: Sequence[Task], documents: Sequence[Document], *, who: str,
                        tasks_path: str, tiny: bool = False, sample: int = 100) -> CoverageReport:
    """``tracerl eval``'s guard, the one training runs (:func:`tokenizer_coverage`): refuse tasks
    whose gold answers the model's tokenizer cannot encode, since every one of them scores 0 whatever
    the model does. ``who``: the model as the user named it (``--model tiny``); ``tiny``: it is the
    embedded word-level model (the refusal says which worlds it reads)."""
    report = tokenizer_coverage(tokenizer, tasks, documents, sample=sample, seed=0)
    if report.unencodable:
        shown = ", ".join(f"{tid!r}: {ans!r}" for tid, ans in report.unencodable[:2])
        fix = (TINY_WORLD_HINT + ", or give --model a checkpoint whose tokenizer covers this data"
               if tiny else "evaluate a model whose tokenizer covers this data (a byte-level BPE model)")
        raise UserError(f"{who} cannot encode {len(report.unencodable)} of {report.sampled_answers} sampled gold "
                        f"answers of {tasks_path} (e.g. {shown}), so they score 0 whatever it answers; {fix}")
    return report


# --- tools and the format's markup ---------------------------------------------------------------

BUILTIN_TOOLS = ("search", "open")
"""The search environment's tools (in every embedded vocabulary)."""


def _unk_words(tokenizer: Any, text: str) -> list[str]:
    """Whitespace-separated words of ``text`` whose encoding holds ``<unk>``, in order, once each."""
    seen: dict[str, None] = {}
    for word in text.split():
        if word not in seen and _has_unk(tokenizer, word):
            seen[word] = None
    return list(seen)


def tool_texts(tools: Any) -> list[str]:
    """What a prompt may show of the tools other than search/open: names, argument names and
    descriptions, in the react style ``name[argument]`` (a vocabulary built for a run includes them)."""
    texts = []
    for name in tools:
        if name in BUILTIN_TOOLS:
            continue
        tool = tools[name]
        params = " ".join(p.name for p in tool.parameters)
        # each name both first and after a space: a word-level tokenizer may spell the two differently
        texts.append(f"{name} {name}[{params}] {params} {tool.description}")
    return texts


def check_tool_coverage(tokenizer: Any, tools: Any, fmt: Any, task: Task) -> list[str]:
    """Refuse tools the tokenizer cannot spell; return warnings for ``<unk>`` in the prompt's markup.

    A tool or argument name that encodes to ``<unk>`` reaches the prompt as ``open[title]<unk>[country]``:
    the policy can never write the call, so that is a :class:`UserError` naming it. ``<unk>`` words
    of the rendered prompt without its question (the format's markup, the tool list) are warnings.
    ``tools``: a ToolSet; ``fmt``: the agent format; ``task``: any task (its question is blanked).
    """
    for name in tools:
        if _has_unk(tokenizer, name):
            raise UserError(f"the tokenizer cannot encode tool name {name!r} (it becomes <unk> in the prompt), "
                            "so the policy cannot call it; rename the tool or use a model whose tokenizer covers it")
        for param in tools[name].parameters:
            if _has_unk(tokenizer, param.name):
                raise UserError(f"the tokenizer cannot encode argument {param.name!r} of tool {name!r} (it becomes "
                                "<unk> in the prompt); rename it or use a model whose tokenizer covers it")
    blank = Task(id=task.id, question="", answers=task.answers)
    words = _unk_words(tokenizer, fmt.render_prompt(blank, tools))
    if not words:
        return []
    shown = ", ".join(repr(w) for w in words[:5]) + (f" (+{len(words) - 5} more)" if len(words) > 5 else "")
    return [f"the prompt's markup and tool list have words the tokenizer encodes as <unk>: {shown}"]
