"""Shared fixtures of the engine and executor tests: a small SynthWiki world, its search
environment and a tiny BPE tokenizer (fixtures of a test module override these)."""

from __future__ import annotations

import pytest
from helpers_tiny import bpe_tokenizer

from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import WorldConfig, build_world

SMALL = WorldConfig(num_people=20, num_cities=10, num_countries=4, num_books=10, num_bands=6,
                    num_companies=8, num_train=6, num_test=0, max_hops=2)


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


@pytest.fixture(scope="module")
def env(world, tmp_path_factory) -> ToolEnvironment:
    index = SearchIndex(world.documents, cache_dir=tmp_path_factory.mktemp("bm25"))
    return ToolEnvironment(search_tools(index, top_k=2, max_tokens=40), EnvConfig(max_turns=6))


@pytest.fixture(scope="module")
def tok():
    return bpe_tokenizer()
