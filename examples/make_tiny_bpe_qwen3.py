"""Build a small local BPE Qwen3 from your own data, to run the real-data path on a CPU in seconds.

    python examples/make_tiny_bpe_qwen3.py --tasks data/musique/tasks.jsonl \
        --corpus data/musique/corpus.jsonl --out testbed/tiny-bpe

Trains a byte-level BPE tokenizer (no <unk>, so the coverage guard passes) on the questions,
answers and documents, gives it a Qwen3-like chat template with tools and tool messages, and
saves it beside a random Qwen3 of a few hundred thousand parameters. Then train with
``--set model.name_or_path=testbed/tiny-bpe --set model.format=chat``. The model is untrained:
it checks the plumbing, not the method (see tracerl/testbed/tiny_bpe.py).
"""

from __future__ import annotations

import argparse
import sys

from tracerl.errors import one_line
from tracerl.testbed.tiny_bpe import build_bpe_qwen3, count_parameters, texts_from_files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", required=True, action="append",
                        help="Tasks JSONL (id, question, answers); repeat for eval_tasks.jsonl.")
    parser.add_argument("--corpus", help="Corpus JSONL (id, title, text).")
    parser.add_argument("--out", required=True, help="Output folder (model.name_or_path).")
    parser.add_argument("--vocab-size", type=int, default=3000, help="BPE vocabulary size (upper bound).")
    parser.add_argument("--hidden", type=int, default=64, help="Hidden size (a multiple of head_dim 32).")
    parser.add_argument("--layers", type=int, default=2, help="Transformer layers.")
    parser.add_argument("--seed", type=int, default=0, help="Initialisation seed.")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # saving and reloading 266k parameters needs no progress bars
    try:
        out = build_bpe_qwen3(texts_from_files(args.tasks, args.corpus), args.out, vocab_size=args.vocab_size,
                              hidden=args.hidden, layers=args.layers, seed=args.seed)
    except Exception as exc:  # as the tracerl commands: a user-caused failure is one line, a bug a traceback
        message = one_line(exc, writing=args.out)
        if message is None:
            raise
        sys.exit(f"make_tiny_bpe_qwen3 failed: {message}")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    print(f"tiny BPE Qwen3: {count_parameters(model):,} parameters, vocabulary {len(tokenizer)} -> {out}")


if __name__ == "__main__":
    main()
