"""tracerl: reinforcement learning for multi-turn tool-using LLM agents.

The two TRACE methods (tree rollout allocation and reference-based turn credit) live as pure
math in :mod:`tracerl.core`; models, environments, the rollout engine and the trainer sit
around that core.
"""

__version__ = "0.1.0"
