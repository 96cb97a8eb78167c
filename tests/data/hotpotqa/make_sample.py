"""Rebuild this HotpotQA sample from tracerl's shared data copy (run once by hand, not by tests).

Usage: python tests/data/hotpotqa/make_sample.py SHARED_DATA_DIR
Takes the first 50 questions of ``hotpotqa_dev_public.jsonl``, the corpus paragraphs their
``supporting_ids`` name, and 300 other paragraphs (seeded choice) as distractors.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def main(shared: Path, out: Path, n_questions: int = 50, n_distractors: int = 300) -> None:
    with open(shared / "hotpotqa_dev_public.jsonl", encoding="utf-8") as handle:
        questions = [json.loads(line) for line in handle if line.strip()][:n_questions]
    with open(shared / "hotpotqa_corpus.jsonl", encoding="utf-8") as handle:
        corpus = [json.loads(line) for line in handle if line.strip()]
    needed = {pid for q in questions for pid in q["supporting_ids"]}
    gold_titles = {p["title"] for p in corpus if p["id"] in needed}
    others = [p for p in corpus if p["id"] not in needed and p["title"] not in gold_titles]
    chosen = needed | {p["id"] for p in random.Random(0).sample(others, n_distractors)}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tasks.jsonl", "w", encoding="utf-8", newline="\n") as handle:
        for q in questions:
            handle.write(json.dumps(q, ensure_ascii=False) + "\n")
    with open(out / "corpus.jsonl", "w", encoding="utf-8", newline="\n") as handle:
        for p in corpus:
            if p["id"] in chosen:
                handle.write(json.dumps(p, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent)
