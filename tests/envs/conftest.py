"""Small SynthWiki worlds and the HotpotQA sample shared by the environment tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracerl.envs.synthwiki import World, WorldConfig, build_world

SMALL_SIZES = dict(num_people=60, num_cities=30, num_countries=8, num_books=30, num_bands=20,
                   num_companies=25, num_train=80, num_test=20)


@pytest.fixture(scope="session")
def small_config() -> WorldConfig:
    return WorldConfig(fact_seed=1, **SMALL_SIZES)


@pytest.fixture(scope="session")
def small_world(small_config: WorldConfig) -> World:
    return build_world(small_config)


@pytest.fixture(scope="session")
def default_world() -> World:
    return build_world(WorldConfig())


@pytest.fixture(scope="session")
def hotpotqa_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "hotpotqa"
