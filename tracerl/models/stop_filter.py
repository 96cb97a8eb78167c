"""Stop-string pre-filter for the decode loop: which sampled tokens could complete a stop string.

Every decode step the backend used to decode the tail of every live row to look for stop strings.
A row whose text did not contain a stop string before its new token can only contain one now if
the new occurrence ends inside the text the new token added, so the token's own text holds the
stop string's last character, or the token adds a byte that completes a character begun earlier
(its own decode then shows U+FFFD). :func:`stop_candidates` marks those tokens once per vocabulary;
the decode loop looks the sampled tokens up on the device (no extra sync: the flags ride the step's
one device-to-host copy) and decodes only the flagged rows' tails. The outcome is exactly the
unfiltered check's, given the assumptions checked here, else there is no filter (None):

- the tokenizer's decoder concatenates per-token text (``ByteLevel``, ``Metaspace``: dropping
  tokens on the left of the window only removes text, and UTF-8 resynchronises), and no
  ``clean_up_tokenization_spaces`` pass rewrites the joined text;
- no stop string ends in whitespace (``Metaspace`` strips a first token's leading space) nor
  contains U+FFFD.
"""

from __future__ import annotations

from typing import Any

import torch

LOCAL_DECODERS = ("ByteLevel", "Metaspace")
"""Decoders whose output is the concatenation of each token's text (see the module docstring)."""

REPLACEMENT = "\ufffd"


def filter_is_exact(tokenizer: Any, stop_strings: tuple[str, ...]) -> bool:
    """Whether :func:`stop_candidates` gives exactly the unfiltered outcome for this tokenizer and stops."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ not in LOCAL_DECODERS or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return False
    return all(s and not s[-1].isspace() and REPLACEMENT not in s for s in stop_strings)


def stop_candidates(tokenizer: Any, stop_strings: tuple[str, ...], vocab_size: int,
                    device: torch.device | str) -> torch.Tensor | None:
    """[max(vocab_size, len(tokenizer))] bool on ``device``: token ``t`` may complete a stop string
    (ids the tokenizer does not know: True). None when there are no stop strings or the filter
    would not be exact (:func:`filter_is_exact`); then every live row is checked."""
    if not stop_strings or not filter_is_exact(tokenizer, stop_strings):
        return None
    known = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=False)
    lasts = {s[-1] for s in stop_strings}
    flags = [REPLACEMENT in text or any(c in text for c in lasts) for text in texts]
    flags += [True] * max(0, vocab_size - known)
    return torch.tensor(flags, dtype=torch.bool, device=device)
