"""The long-horizon SynthWiki variant (issue 48 item 2): 4-5 hop chains over a world with one
look-alike per name. Checked by hand on a small world whose documents are quoted below."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tracerl.envs.synthwiki import MAX_HOPS, WorldConfig, build_world

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "science"))

SMALL = WorldConfig(num_people=24, num_cities=12, num_countries=6, num_books=10, num_bands=8, num_companies=10,
                    distractors=1, min_hops=4, max_hops=5, num_train=20, num_test=10)


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


def test_questions_are_four_and_five_hops_with_one_document_per_hop(world) -> None:
    tasks = world.train + world.test
    assert {t.hops for t in tasks} == {4, 5} and MAX_HOPS == 5
    for task in tasks:
        assert len(task.supporting_titles) == task.hops == len(set(task.supporting_titles))


def test_a_four_hop_chain_needs_its_four_documents(world) -> None:
    task = world.train[0]
    assert task.question == ("What is the company that the founder of the company that the founder of Vepim works for "
                             "works for?")
    assert task.answers == ("Nuski",) and task.supporting_titles == ("Vepim", "Vagun", "Kontron", "Dummol")
    docs = {d.title: d.text for d in world.documents}
    assert docs["Vepim"] == ("Vepim makes glass. Vepim is based in Fumza. The founder of Vepim is Vagun. "
                             "Vepim has thousands of workers.")
    assert docs["Vagun"] == ("Vagun likes horses. Vagun has two children. Vagun is employed by Kontron. "
                             "The birthplace of Vagun is Dunlen.")
    assert docs["Kontron"] == ("Kontron is based in Thonbol. Kontron was founded by Dummol. Kontron makes paper. "
                               "Kontron sells its goods in foreign markets.")
    assert docs["Dummol"] == ("Dummol was born in Krestres. Dummol works as a doctor. Dummol likes horses. "
                              "Dummol has a job at Nuski.")
    chain = [*task.supporting_titles, "Nuski"]
    for i, title in enumerate(task.supporting_titles):
        words = set(docs[title].replace(".", "").split())
        assert chain[i + 1] in words  # each document gives the next link...
        assert not words & set(chain[i + 2:])  # ...and none a later one: no document can be skipped


def test_look_alikes_share_the_surface_but_not_the_chain(world) -> None:
    """Each chain entity has a look-alike one edit away, of the same kind (a document of the same
    relations), whose link leads elsewhere: a search for it reads like progress and is not."""
    docs = {d.title: d.text for d in world.documents}
    lookalikes = {"Vepim": ("Vepimen", "The founder of Vepimen is Lirmimkomis."),
                  "Vagun": ("Vagin", "Vagin is employed by Nuski."),
                  "Kontron": ("Kontronen", "Kontronen was founded by Penten."),
                  "Dummol": ("Dummola", "Dummola is employed by Krasolen.")}
    types = {e.name: e.type for e in world.entities}
    chain = ["Vepim", "Vagun", "Kontron", "Dummol", "Nuski"]
    for i, (name, (twin, link)) in enumerate(lookalikes.items()):
        swapped = len(twin) == len(name) and sum(a != b for a, b in zip(twin, name, strict=True)) == 1
        one_edit = twin.startswith(name) or swapped  # a suffix added, or one vowel swapped
        assert one_edit and types[twin] == types[name]
        assert link in docs[twin] and chain[i + 1] not in docs[twin].replace(".", "").split()
    # Vagin answers the right relation with the chain's final answer one hop early: the look-alike
    # is a trap a policy can only avoid by reading the name it searched for.
    assert "Nuski" in docs["Vagin"]


def test_pilot_variants_resolve_to_the_long_setting() -> None:
    import long_horizon_pilot as pilot
    from common import resolve

    for name, overrides in pilot.VARIANTS.items():
        config = resolve("trace_credit", pilot.RUN + pilot.LONG_BASE + overrides, False)
        world = config.data.world
        assert world.min_hops in (4, 5) and world.max_hops in (4, 5) and world.distractors == 1, name
        clue_base = config.model.tiny_preset in ("bench_hops_clues", "bench_hops_clues_longer", "bench_hops_clues_exact",
                                                 "bench_hops_clues_2x", "bench_hops_clues5", "bench_hops_clues5_2x")
        assert config.model.tiny_preset == "bench_hops_lookalike" or (clue_base and world.clues == 1), name
        assert config.rollout.engine.max_turns >= world.max_hops + 1  # every search and the answer


def test_long_preset_pretrains_on_five_hop_episodes_that_fit_its_rows() -> None:
    """``bench_hops_long``: its explorer makes five searches on five-hop questions, and rows of 768
    tokens hold every sample of a pretraining world (the default 512 would cut five-search episodes)."""
    from dataclasses import replace

    from tracerl.testbed.tiny import pretraining_samples, tokenizer_for_world
    from tracerl.testbed.tiny_config import get_preset

    config = replace(get_preset("bench_hops_long"), num_worlds=1, episodes_per_world=60)
    assert config.world.max_hops == 5 and config.max_turns > len(config.explorer.search_count_weights) == 5
    tokenizer = tokenizer_for_world(config.world)
    samples, stats = pretraining_samples(config, tokenizer)
    lengths = [len(s.ids) for s in samples]
    assert stats["unknown_tokens"] == 0 and max(lengths) <= config.seq_len
    assert max(lengths) > 512  # five searches of three results: longer than the other presets' rows


@pytest.mark.parametrize("preset", ["bench_hops_clues5", "bench_hops_clues5_2x"])
def test_five_hop_clue_presets_fit_five_searches_with_clues_in_their_rows(preset: str) -> None:
    """The clue presets pretrained on five-hop worlds: clue sentences make five-search episodes longer
    than the 768-token rows of the four-hop clue bases (measured: ~830 tokens), and rows of 896 hold them."""
    from dataclasses import replace

    from tracerl.testbed.tiny import pretraining_samples, tokenizer_for_world
    from tracerl.testbed.tiny_config import get_preset

    config = replace(get_preset(preset), num_worlds=2)
    assert config.world.max_hops == 5 and config.world.clues == 1 and len(config.explorer.search_count_weights) == 5
    samples, stats = pretraining_samples(config, tokenizer_for_world(config.world))
    lengths = [len(s.ids) for s in samples]
    assert stats["unknown_tokens"] == 0 and 768 < max(lengths) <= config.seq_len
