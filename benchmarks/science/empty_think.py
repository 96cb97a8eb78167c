"""Scoring a thinking model's reference after an empty think block (``algo.score_after_empty_think``).

A thinking model (Qwen3 in thinking mode) always opens its answer turn with ``<think> ... </think>``;
scored right after the turn opens, ``<answer>`` + gold is a continuation it never writes. This
script builds such a model in miniature and measures what the option changes: a byte-level BPE
(``tracerl.testbed.tiny_bpe``) and a random two-layer Qwen3 trained for ``--steps`` steps on
chat episodes "document + question -> <think> copy of the fact </think> <answer> gold </answer>"
(pairings drawn afresh every batch, so the model must copy the city from the document), then, on
people it never saw, readiness ``l`` (mean log-prob of the gold's ids from
:func:`~tracerl.models.scoring.answer_token_ids`) of the prompt with the right document (useful)
and with a document about another person (useless), scored after ``<answer>`` alone and after
the empty think block; and the AUC of ``l`` for telling the two apart (the signal TRACE credit
reads as ``delta_k``).

    python benchmarks/science/empty_think.py   # 4,000 steps: ~14 min of one core on a loaded machine
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared modules (common.py, ...)
from common import RESULTS, configure_torch, machine, mean, provenance_of, write_json

from tracerl.allocation.predictor import weighted_auc
from tracerl.agent.formats import get_format
from tracerl.models.scoring import EMPTY_THINK, answer_token_ids, score_prefixes
from tracerl.testbed.tiny_bpe import random_qwen3, train_bpe_tokenizer

SYLLABLES = ["ka", "lo", "mi", "ren", "su", "ta", "vo", "zel", "bar", "dun", "fi", "gor", "hal", "jun"]


def names(rng: random.Random, n: int, syllables: int = 2) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize())
    return sorted(out)


def prompt(tok: Any, person: str, city: str) -> str:
    user = f"{person} was born in {city}. Where was {person} born?"
    return str(tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=True))


def episode(tok: Any, person: str, city: str) -> str:
    return prompt(tok, person, city) + f"<think>\n{person} was born in {city}.\n</think>\n\n<answer>{city}</answer><|im_end|>\n"


def train(model: Any, tok: Any, people: list[str], cities: list[str], steps: int, rng: random.Random) -> float:
    """Fresh (person, city) pairings every batch: no pairing repeats, so only copying the fact works."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        texts = [episode(tok, rng.choice(people), rng.choice(cities)) for _ in range(16)]
        batch = [tok.encode(t, add_special_tokens=False) for t in texts]
        width = max(len(b) for b in batch)
        ids = torch.tensor([b + [tok.pad_token_id] * (width - len(b)) for b in batch])
        labels = torch.tensor([b + [-100] * (width - len(b)) for b in batch])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def readiness(model: Any, tok: Any, fmt: Any, text: str, gold: str, prefix: str) -> float:
    opener, answer = answer_token_ids(tok, fmt, gold, prefix=prefix)
    ids = torch.tensor(tok.encode(text, add_special_tokens=False))
    return float(score_prefixes(model, ids, [len(ids)], torch.tensor(answer), opener_ids=torch.tensor(opener))[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--pairs", type=int, default=60, help="Held-out (person, city) pairs scored.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    configure_torch(args.threads)
    clock, rng = time.perf_counter(), random.Random(args.seed)
    people, cities = names(rng, 400, syllables=3), names(random.Random(args.seed + 1), 40)
    held = [(person, rng.choice(cities)) for person in people[-args.pairs:]]  # people never trained on
    tok = train_bpe_tokenizer([f"{a} was born in {b}. Where was {a} born?" for a in people for b in cities[:3]],
                              vocab_size=800)
    torch.manual_seed(args.seed)
    model = random_qwen3(tok, hidden=64, layers=2, seed=args.seed)
    final_loss = train(model, tok, people[: -args.pairs], cities, args.steps, rng)
    fmt = get_format("chat", tokenizer=tok)
    rows: dict[str, dict[str, Any]] = {}
    for label, prefix in (("after <answer>", ""), ("after the empty think block", EMPTY_THINK)):
        useful = [readiness(model, tok, fmt, prompt(tok, a, b), b, prefix) for a, b in held]
        other = [(a, b, held[(i + 1) % len(held)]) for i, (a, b) in enumerate(held)]
        useless = [readiness(model, tok, fmt, prompt(tok, oa, ob), b, prefix) for a, b, (oa, ob) in other if ob != b]
        auc = weighted_auc(useful + useless, [1.0] * len(useful) + [0.0] * len(useless),
                           [0.0] * len(useful) + [1.0] * len(useless))
        rows[label] = {"useful_readiness_mean": mean(useful), "useless_readiness_mean": mean(useless),
                       "gap": mean(useful) - mean(useless), "auc": auc, "useful": len(useful), "useless": len(useless)}
        print(f"{label:>28}: useful {mean(useful):.3f}  useless {mean(useless):.3f}  AUC {auc:.3f}")
    write_json(RESULTS / "empty_think.json", {
        "rows": rows, "steps": args.steps, "final_train_loss": final_loss, "held_out_pairs": args.pairs,
        "seed": args.seed, "model_parameters": sum(p.numel() for p in model.parameters()),
        "what": "readiness of the gold after a thinking-trained tiny BPE Qwen3's turn opens, with and without "
                "Qwen3's empty think block before <answer>; useful: the prompt's document states the gold",
        "seconds": time.perf_counter() - clock, **machine(),
        "provenance": provenance_of(name_or_path=None)})  # the model is trained here, from args.seed


if __name__ == "__main__":
    main()
