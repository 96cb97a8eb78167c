"""A small byte-level BPE Qwen3 built from your own text; nothing is downloaded.

The embedded tiny model reads SynthWiki only: its word-level vocabulary maps most words of real
text to ``<unk>``, and the coverage guard stops training on such data. This module builds a
stand-in for a real checkpoint that runs the whole real-data path on a CPU in seconds:

- a byte-level BPE tokenizer (no ``<unk>``: every text round-trips) trained with ``tokenizers``
  on the questions, answers and documents plus the chat format's markup, with Qwen's special
  tokens ``<|endoftext|>`` (BOS, padding), ``<|im_start|>`` and ``<|im_end|>`` (EOS);
- :data:`QWEN3_LIKE_TEMPLATE`: ChatML turns (``<|im_start|>role\\n...<|im_end|>\\n``), tool schemas
  in the system turn, ``tool`` messages grouped into one user turn of ``<tool_response>``
  blocks, and ``enable_thinking=false`` opening the assistant turn with an empty think block,
  as Qwen3 does (without Qwen3's rule that drops past think blocks, so it is prefix-stable);
- a randomly initialised Qwen3 (a few hundred thousand parameters, ``head_dim`` 32 as vLLM's
  CPU attention needs), saved with ``save_pretrained`` beside its tokenizer, so the folder
  loads as ``model.name_or_path``.

The model writes noise (it is untrained); what it checks is the plumbing: conversion, tokenizer
coverage, the chat template turn by turn, training, evaluation and the run viewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "QWEN3_LIKE_TEMPLATE", "SPECIALS", "build_bpe_qwen3", "count_parameters", "format_texts", "random_qwen3",
    "texts_from_files", "train_bpe_tokenizer",
]

BOS, IM_START, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = (BOS, IM_START, EOS)

# The template in parts, so tests can build variants that break one property each.
TEMPLATE_SYSTEM = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a tool as <tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
)
"""The system turn: the system text, then the tool schemas (one JSON per line) when tools are given."""
TEMPLATE_MESSAGES = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
)
"""Opens the message loop; user turns (and any later system turn)."""
TEMPLATE_ASSISTANT = "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}"
TEMPLATE_TOOL = (
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
)
"""Consecutive tool messages share one user turn, one ``<tool_response>`` block each (Qwen3's layout)."""
TEMPLATE_TAIL = (
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN3_LIKE_TEMPLATE = TEMPLATE_SYSTEM + TEMPLATE_MESSAGES + TEMPLATE_ASSISTANT + TEMPLATE_TOOL + TEMPLATE_TAIL


def format_texts() -> list[str]:
    """What the ``chat`` format writes around the data (system text, tool schemas, tool calls,
    answers, errors), so the BPE learns compact tokens for it."""
    from tracerl.agent.formats import DEFAULT_SYSTEM, TOOL_CALL_HELP

    call = json.dumps({"name": "search", "arguments": {"query": "Blue River"}})
    schema = json.dumps({"type": "function", "function": {
        "name": "search", "description": "Search the corpus; returns the best matching documents.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}})
    return [
        DEFAULT_SYSTEM, TOOL_CALL_HELP, f"# Tools\n\n<tools>\n{schema}\n</tools>",
        f"<tool_call>\n{call}\n</tool_call>", "<tool_response>\nNo results.\n</tool_response>",
        "<think>\n\n</think>\n\n<answer>Lumen</answer>", "system\nuser\nassistant\n",
        "Error: no action found. Call one of the tools (search, open) or give the final answer in <answer></answer>.",
    ]


def texts_from_files(tasks: Sequence[str | Path], corpus: str | Path | None = None) -> list[str]:
    """Questions and gold answers of the task files, and title + text of each corpus document."""
    from tracerl.envs.data import load_corpus, load_tasks

    texts = [text for path in tasks for task in load_tasks(path) for text in (task.question, *task.answers)]
    if corpus:
        texts += [f"{doc.title}: {doc.text}" for doc in load_corpus(corpus)]
    return texts


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 3000, template: str = QWEN3_LIKE_TEMPLATE) -> Any:
    """A byte-level BPE :class:`~transformers.PreTrainedTokenizerFast` trained on ``texts``, with
    the ChatML specials and ``template`` as its chat template. ``vocab_size`` is an upper bound
    (a small text runs out of merges first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=BOS,
                                      additional_special_tokens=[IM_START])
    wrapped.chat_template = template
    return wrapped


def random_qwen3(tokenizer: Any, *, hidden: int = 64, layers: int = 2, head_dim: int = 32, seed: int = 0,
                 max_len: int = 4096) -> Any:
    """A randomly initialised Qwen3 causal LM for ``tokenizer`` (tied embeddings; with the
    defaults and a 3k vocabulary about 270k parameters), fp32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    if hidden % head_dim:
        raise ValueError(f"hidden ({hidden}) must be a multiple of head_dim ({head_dim})")
    heads = hidden // head_dim
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=head_dim, intermediate_size=2 * hidden,
        max_position_embeddings=max_len, tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return model


def count_parameters(model: Any) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def build_bpe_qwen3(texts: Iterable[str], out: str | Path, *, vocab_size: int = 3000, hidden: int = 64,
                    layers: int = 2, seed: int = 0) -> Path:
    """Train the tokenizer on ``texts`` (plus :func:`format_texts`), build the random Qwen3 and
    save both to ``out`` (``model.name_or_path=out`` loads them). Returns ``out``."""
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("no text to train the tokenizer on (the task and corpus files are empty)")
    tokenizer = train_bpe_tokenizer(texts + format_texts(), vocab_size=vocab_size)
    model = random_qwen3(tokenizer, hidden=hidden, layers=layers, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
