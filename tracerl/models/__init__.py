"""Policy backends and the frozen reference scorer (transformers is imported lazily)."""

from tracerl.models.backend import Generation, HFPolicy, PolicyBackend, SamplingParams
from tracerl.models.scoring import ReferenceScorer, answer_token_ids, score_prefixes, score_prefixes_naive

__all__ = [
    "Generation",
    "HFPolicy",
    "PolicyBackend",
    "ReferenceScorer",
    "SamplingParams",
    "answer_token_ids",
    "score_prefixes",
    "score_prefixes_naive",
]
