"""A BPE tokenizer with a Qwen3-like chat template, built locally (nothing is downloaded).

The template's parts live in :mod:`tracerl.testbed.tiny_bpe` (all flags on gives its
``QWEN3_LIKE_TEMPLATE``): ChatML markup (``<|im_start|>role\\n...<|im_end|>\\n``), tool schemas
in the system turn, ``tool`` messages grouped into one user turn of ``<tool_response>`` blocks,
and ``enable_thinking=false`` opening the assistant turn with an empty think block, as Qwen3 does.
Variants break one property each (prefix stability, the tool role, the system role, tools).
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from tracerl.testbed.tiny_bpe import (
    TEMPLATE_ASSISTANT as _ASSISTANT,
    TEMPLATE_MESSAGES as _MESSAGES,
    TEMPLATE_SYSTEM as _SYSTEM,
    TEMPLATE_TAIL as _TAIL,
    TEMPLATE_TOOL as _TOOL,
    train_bpe_tokenizer,
)


def qwen_like_template(tool_role: bool = True, system_role: bool = True, tools: bool = True,
                       prefix_stable: bool = True) -> str:
    """The Qwen3-like template; each flag False breaks one property (for the construction checks)."""
    system = _SYSTEM if tools else _SYSTEM[_SYSTEM.index("{%- elif"):].replace("{%- elif", "{%- if", 1)
    if not system_role:
        system = "{%- if messages[0].role == 'system' %}{{- raise_exception('System role not supported') }}{%- endif %}"
    assistant = _ASSISTANT
    if not prefix_stable:  # like Qwen3's stock template: a think block only on the last turn
        assistant = ("{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
                     "{%- if loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
                     "{{- m.content + '<|im_end|>\\n' }}")
    tool = _TOOL if tool_role else "{%- elif m.role == 'tool' %}{{- raise_exception('roles must alternate') }}"
    return system + _MESSAGES + assistant + tool + _TAIL


_LAST_QUERY = (  # index of the last real user message (tool responses do not count)
    "{%- set ns = namespace(last_query=messages|length - 1, found=false) %}"
    "{%- for m in messages[::-1] %}{%- if not ns.found and m.role == 'user' "
    "and not m.content.startswith('<tool_response>') %}"
    "{%- set ns.found = true %}{%- set ns.last_query = messages|length - 1 - loop.index0 %}{%- endif %}{%- endfor %}"
)
_THINKING_ASSISTANT = (  # Qwen3's rule: after the last query, a think block on the last turn or where it has reasoning
    "{%- elif m.role == 'assistant' %}{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}{{- '<|im_end|>\\n' }}"
)


def qwen3_thinking_template() -> str:
    """The Qwen3-like template with Qwen3's think-block rule for assistant turns: a past turn
    without reasoning is re-rendered without its (empty) think block."""
    return _SYSTEM + _LAST_QUERY + _MESSAGES + _THINKING_ASSISTANT + _TOOL + _TAIL


TEXT = """Answer the question by searching the document collection with the tools. When you know the
answer, reply with the final answer inside <answer></answer>, as short as possible. Search the
corpus; returns the best matching documents as title: text lines. Open the document with this
exact title. Where was the author of Blue River born? Blue River is a novel by Ada Stone. Ada Stone
was born in Lumen. The city of Lumen lies on the Blue River. Orla Fenn founded the city of Varo.
<tool_call> {"name": "search", "arguments": {"query": "Blue River"}} </tool_call> <tool_response>
</tool_response> <think> </think> <answer> Lumen </answer> Error: no action found. Call one of the
tools (search, open) or give the final answer. type function name description parameters object
properties string required # Tools <tools> </tools> system user assistant No results. No document
titled. Who founded Varo? Which river runs through Lumen? The novel was written in the north."""


def chat_tokenizer(vocab_size: int = 600, template: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE on :data:`TEXT` with ChatML specials and the Qwen3-like template
    (:func:`tracerl.testbed.tiny_bpe.train_bpe_tokenizer`, as ``examples/make_tiny_bpe_qwen3.py``)."""
    return train_bpe_tokenizer([TEXT] * 4, vocab_size=vocab_size,
                               template=template if template is not None else qwen_like_template())
