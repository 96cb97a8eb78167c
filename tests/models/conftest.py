"""Models shared by the scorer tests (per-trajectory and batched)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers_tiny import SCORING_VOCAB, tiny_model


@pytest.fixture(scope="module")
def sharp_model():
    """A random model with large weights: per-cut scores differ by several nats, so misplaced
    masks and cuts show."""
    model = tiny_model(SCORING_VOCAB, seed=1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0)
    return model


@pytest.fixture(scope="module")
def exact_model(sharp_model):
    """The sharp model in float64: in float32 its x6 weights turn summation-order noise into
    ~1e-5 relative differences (1.6e-4 absolute at a score of -19 was seen), so comparisons of
    algorithms run in float64 and hold far below 1e-4."""
    return copy.deepcopy(sharp_model).double()
