"""Rebuild the raw-format fixtures in this folder from the project's shared data samples.

The shared samples (``../shared/data``, see SOURCES.md here) are already in tracerl's format;
this script writes them back in each data set's official raw layout so the converters can be
tested on real text. Tests never run it (they must not read ``../shared``). Deterministic.

    python tests/data/raw/make_raw.py /work/shared/data
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
PREFIX = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
          "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
          "engine by <search> query </search> and it will return the top searched results between <information> "
          "and </information>. You can search as many times as your want. If you find no further external "
          "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
          "illustrations. For example, <answer> Beijing </answer>. Question: ")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _sentences(text: str) -> list[str]:
    """Split a joined paragraph back into sentences (approximate: the originals were joined by spaces)."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", text)
    return [p for p in parts if p]


def _musique(shared: Path, rng: random.Random, n: int = 100) -> None:
    tasks = _jsonl(shared / "musique_dev_public.jsonl")[:n]
    docs = _jsonl(shared / "musique_corpus.jsonl")
    by_id = {d["id"]: d for d in docs}
    by_title: dict[str, list[dict]] = {}
    for d in docs:
        by_title.setdefault(d["title"], []).append(d)
    rows = []
    for task in tasks:
        gold = [by_id[i] for i in task["supporting_ids"]]
        same_title = [d for g in gold for d in by_title[g["title"]] if d["id"] not in task["supporting_ids"]]
        distractors = list({d["id"]: d for d in same_title[:3] + rng.sample(docs, 2)}.values())
        paras = gold + [d for d in distractors if d["id"] not in task["supporting_ids"]]
        rng.shuffle(paras)
        idx = {d["id"]: i for i, d in enumerate(paras)}
        rows.append({
            "id": task["id"], "question": task["question"], "answer": task["answers"][0],
            "answer_aliases": task["answers"][1:], "answerable": True,
            "paragraphs": [{"idx": i, "title": d["title"], "paragraph_text": d["text"],
                            "is_supporting": d["id"] in task["supporting_ids"]} for i, d in enumerate(paras)],
            "question_decomposition": [{"id": k, "paragraph_support_idx": idx[i]}
                                       for k, i in enumerate(task["supporting_ids"])],
        })
    with open(HERE / "musique_dev_sample.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _context_rows(shared: Path, name: str, rng: random.Random, n: int) -> list[dict]:
    tasks = _jsonl(shared / f"{name}_dev_public.jsonl")[:n]
    docs = _jsonl(shared / f"{name}_corpus.jsonl")
    by_id = {d["id"]: d for d in docs}
    rows = []
    for task in tasks:
        gold = [by_id[i] for i in task["supporting_ids"]]
        paras = gold + [d for d in rng.sample(docs, 2) if d["id"] not in task["supporting_ids"]]
        rng.shuffle(paras)
        row = {"_id": task["id"], "question": task["question"], "answer": task["answers"][0],
               "type": task.get("type"), "supporting_facts": [[g["title"], 0] for g in gold],
               "context": [[d["title"], _sentences(d["text"])] for d in paras]}
        if name == "hotpotqa":
            row["level"] = task.get("level")
        else:
            row["evidences"] = []  # the shared sample keeps no evidence triples
        rows.append(row)
    return rows


def _search_r1(shared: Path, n: int = 5) -> None:
    rows = []
    for i, task in enumerate(_jsonl(shared / "bamboogle_public.jsonl")[:n]):
        rows.append({"id": task["id"], "question": task["question"], "golden_answers": task["answers"],
                     "data_source": "bamboogle", "prompt": [{"role": "user", "content": PREFIX + task["question"] + "\n"}],
                     "ability": "fact-reasoning",
                     "reward_model": {"style": "rule", "ground_truth": {"target": task["answers"]}},
                     "extra_info": {"split": "test", "index": i}})
    rows[1].pop("question")  # one row as verl writes it: the question only inside the prompt
    rows[1].pop("golden_answers")
    rows[1].pop("id")
    with open(HERE / "search_r1_sample.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    docs = _jsonl(shared / "hotpotqa_corpus.jsonl")[:8]
    with open(HERE / "search_r1_corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": str(i), "contents": f'"{d["title"]}"\n{d["text"]}'}, ensure_ascii=False) + "\n"
                     for i, d in enumerate(docs))


def main(shared: Path) -> None:
    rng = random.Random(15)
    _musique(shared, rng)
    for name in ("hotpotqa", "2wiki"):
        path = HERE / f"{name}_dev_sample.json"
        path.write_text(json.dumps(_context_rows(shared, name, rng, 5), ensure_ascii=False, indent=1) + "\n",
                        encoding="utf-8")
    _search_r1(shared)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
