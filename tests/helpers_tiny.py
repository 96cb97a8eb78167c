"""Tiny tokenizers and random Qwen3 models built locally for tests (nothing is downloaded).

Import from tests as ``from helpers_tiny import ...`` (``tests/`` is on ``sys.path`` because
``tests/conftest.py`` lives there and the test folders are not packages).
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

# Tiny models are dominated by per-op overhead; with several processes on 2 cores, intra-op
# threads spin against each other (a decode step measured 40 ms on 2 threads vs 1 ms on 1).
torch.set_num_threads(1)

SENTENCES = [
    "Question: Where was the author of Blue River born?",
    "Thought: I should search for the author.\nAction: search[Blue River]\nObservation:",
    " Blue River is a novel by Ada Stone. Ada Stone was born in Lumen.\n",
    "Action: open[Ada Stone]\nObservation: Ada Stone is a writer from Lumen.\n",
    "Action: answer[Lumen]",
    " Error: unknown action. Valid actions: search[query], open[title], answer[text].\n",
    "The city of Lumen lies on the Blue River. Orla Fenn founded the city of Varo.",
]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
EOS = "<|endoftext|>"
PAD = "<pad>"


def bpe_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on :data:`SENTENCES` (round-trips any text)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    return _wrap(tok)


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer (whitespace-split words and punctuation runs, decode joins with spaces)."""
    words = sorted({w for s in SENTENCES for w in pre_tokenizers.Whitespace().pre_tokenize_str(s)})
    vocab = {PAD: 0, EOS: 1, "[UNK]": 2}
    for word, _ in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return _wrap(tok)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def tiny_model(vocab_size: int, seed: int = 0, hidden: int = 48, layers: int = 2, max_len: int = 4096):
    """A randomly initialised Qwen3 causal LM (about 50-100k parameters), eval mode, fp32."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    return model


class ScriptedPolicy:
    """A :class:`~tracerl.models.backend.PolicyBackend` that writes what ``respond(prefix_text)`` says.

    Lets engine tests drive exact tool calls and answers (a random model only writes garbage).
    A reply without a stop string ends with EOS, as a pretrained answer turn does. Every
    sampled token gets log-prob -0.5; ``calls`` records the batch size of each generate call.
    """

    def __init__(self, tokenizer, respond) -> None:
        self.tokenizer = tokenizer
        self.respond = respond
        self.calls: list[int] = []
        self.stats: dict[str, int] = {}

    def sync_weights(self, model_or_state, version: int) -> None:
        """Nothing to sync: the replies are scripted."""

    def generate(self, prefixes, params, seeds=None, routing_keys=None):
        from tracerl.models.backend import Generation

        self.calls.append(len(prefixes))
        out = []
        for prefix in prefixes:
            text = self.respond(self.tokenizer.decode(prefix, skip_special_tokens=True))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            reason = "stop" if any(s in text for s in params.stop_strings) else "eos"
            if reason == "eos":
                ids.append(self.tokenizer.eos_token_id)
            if len(ids) > params.max_new_tokens:
                ids, reason = ids[: params.max_new_tokens], "length"
            out.append(Generation(ids, [-0.5] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True), reason))
        return out


SCORING_VOCAB = 97
"""Vocabulary of the scorer tests' random models (tests/models/conftest.py: sharp_model, exact_model)."""


def assert_old_logprobs_recompute(model, traj, temperature: float, *, unsampled_zero: bool = False) -> None:
    """Every sampled token's stored log-prob equals a full forward's at ``temperature`` (1e-4);
    with ``unsampled_zero`` the other positions must hold 0.0."""
    import pytest
    import torch

    ids = torch.tensor([traj.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0] / temperature, -1)
    for pos, (sampled, old) in enumerate(zip(traj.sampled, traj.old_logprobs, strict=True)):
        if sampled:
            assert old == pytest.approx(logp[pos - 1, traj.token_ids[pos]].item(), abs=1e-4)
        elif unsampled_zero:
            assert old == 0.0
