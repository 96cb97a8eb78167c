"""The small local BPE Qwen3 (tracerl/testbed/tiny_bpe.py): what it saves loads as a checkpoint
whose template the ``chat`` format accepts, and its tokenizer reads any text."""

from __future__ import annotations

import json
from pathlib import Path

from helpers_chat import TEXT, qwen_like_template
from transformers import AutoModelForCausalLM, AutoTokenizer

from tracerl.agent.chat_template import ChatTemplateFormat
from tracerl.envs.coverage import check_tokenizer_coverage
from tracerl.envs.data import load_corpus, load_tasks
from tracerl.testbed.tiny_bpe import QWEN3_LIKE_TEMPLATE, build_bpe_qwen3, count_parameters, texts_from_files

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "hotpotqa"


def test_the_tests_template_is_the_package_template() -> None:
    assert qwen_like_template() == QWEN3_LIKE_TEMPLATE


def test_build_saves_a_loadable_qwen3_with_the_chat_template(tmp_path: Path) -> None:
    out = build_bpe_qwen3([TEXT] * 4, tmp_path / "tiny-bpe", vocab_size=500)
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["head_dim"], config["hidden_size"]) == ("qwen3", 32, 64)
    assert 100_000 < count_parameters(model) < 1_000_000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert model.config.eos_token_id == tok.eos_token_id and len(tok) == model.config.vocab_size
    assert tok.chat_template == QWEN3_LIKE_TEMPLATE
    text = "Ünïcode, digits 1857 and a title never seen: Zyxt Qorvald"  # byte-level: no <unk>, exact round trip
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    fmt = ChatTemplateFormat(tok)  # the construction checks (prefix stability, tool role) pass
    assert fmt is not None


def test_texts_from_files_feed_a_tokenizer_the_coverage_guard_accepts(tmp_path: Path) -> None:
    tasks, corpus = SAMPLE / "tasks.jsonl", SAMPLE / "corpus.jsonl"
    texts = texts_from_files([tasks], corpus)
    first = load_tasks(tasks)[0]
    assert texts[:2] == [first.question, first.answers[0]]
    out = build_bpe_qwen3(texts, tmp_path / "m", vocab_size=800)
    report = check_tokenizer_coverage(AutoTokenizer.from_pretrained(out), load_tasks(tasks), load_corpus(corpus))
    assert report.unencodable == [] and max(report.unk_share.values()) == 0.0
