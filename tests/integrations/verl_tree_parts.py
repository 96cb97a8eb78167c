"""What the tests' tree workers build (:class:`~tracerl.integrations.verl.workers.ExpansionParts`):
the allocation tests' world, search environment, react format and verifier, with the fitted
policy's tokenizer handed over by the test (``functools.partial(tree_parts, tokenizer, scheduling)``).
Imported by the worker actors (the test cluster puts this folder on their ``PYTHONPATH``)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "allocation")]  # alloc_world and the helpers it imports


def tree_parts(tokenizer: Any, scheduling: str, config: Any) -> Any:
    from alloc_world import lucky_verifier, make_env, world

    from tracerl.agent.formats import get_format
    from tracerl.integrations.verl.workers import ExpansionParts
    from tracerl.rollout.engine import EngineConfig

    engine = EngineConfig(max_turns=3, max_turn_tokens=24, max_total_tokens=512, max_observation_tokens=40)
    engine = dataclasses.replace(engine, vllm_scheduling=scheduling)
    return ExpansionParts(tokenizer, get_format("react"), make_env(world()), lucky_verifier, engine)
