"""A custom tool and a custom verifier, plugged into training by import path.

    PYTHONPATH=examples tracerl train grpo --smoke-random --out runs/city \
        --set 'data.tools=[city_tools:population]' --set model.tool_list=true --set data.verifier=city_tools:contains

A tool is a typed function: its name is the tool's name, the first paragraph of its docstring
the description, and its type-hinted parameters (str, int, float, bool) the argument schema.
It returns text, which the policy reads as the observation. A verifier is any function
``(answer, task) -> float`` in [0, 1].
"""

from __future__ import annotations

from tracerl.core.types import Task
from tracerl.envs.verifiers import normalize_answer

POPULATION = {"paris": "2.1 million", "tokyo": "14 million", "lagos": "15 million"}


def population(city: str) -> str:
    """Population of a city (a few cities only)."""
    return POPULATION.get(city.strip().lower(), f"No population known for {city}.")


def contains(answer: str, task: Task) -> float:
    """1.0 when a gold alias appears inside the normalised answer (a lenient exact match)."""
    said = f" {normalize_answer(answer)} "
    return float(any(f" {normalize_answer(alias)} " in said for alias in task.answers if alias.strip()))
