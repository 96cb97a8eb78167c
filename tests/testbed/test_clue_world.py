"""SynthWiki with clue sentences (``WorldConfig.clues``): each document ends by naming the entities
two relations away, so the gold answer of a chain is in context one search before the last.
Checked by hand on a small world whose documents are quoted below."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from tracerl.agent.formats import get_format
from tracerl.envs.synthwiki import RELATIONS_OF, WorldConfig, build_world
from tracerl.testbed.tiny_config import get_preset
from tracerl.testbed.tiny_data import ExplorerConfig, WorldTools, explore

SMALL = WorldConfig(num_people=24, num_cities=12, num_countries=6, num_books=10, num_bands=8, num_companies=10,
                    distractors=1, min_hops=4, max_hops=4, num_train=20, num_test=10, clues=1)
CLUE = re.compile(r" ?(\w+) is linked to ([\w, ]+)\.$")


@pytest.fixture(scope="module")
def world():
    return build_world(SMALL)


def clue_names(text: str) -> list[str]:
    (match,) = CLUE.findall(text)
    return match[1].split(", ")


def test_a_four_hop_chain_with_its_clues(world) -> None:
    task = world.train[0]
    assert task.question == "Who is the leader of the country where the city where the author of Viltanon was born is located?"
    assert task.answers == ("Vagun",) and task.supporting_titles == ("Viltanon", "Lirmimkom", "Thonbol", "Krosgal")
    docs = {d.title: d.text for d in world.documents}
    assert docs["Thonbol"] == ("The mayor of Thonbol is Dudrom. Thonbol has a small population. Thonbol is a city in "
                               "Krosgal. Thonbol sits on a hill. Thonbol is linked to Krasol, Vagun, Thonbola.")
    # The third search's document names the gold among three candidates (its own look-alike Thonbola is
    # two relations away: the birthplace of its mayor)...
    assert clue_names(docs["Thonbol"]) == ["Krasol", "Vagun", "Thonbola"]
    # ...and no relation sentence of any document names an entity two hops further down the chain.
    chain = [*task.supporting_titles, "Vagun"]
    for i, title in enumerate(task.supporting_titles):
        relations = CLUE.sub("", docs[title]).replace(".", "").split()
        assert chain[i + 1] in relations and not set(relations) & set(chain[i + 2:])


def test_clues_are_the_two_hop_entities_and_nothing_else(world) -> None:
    for entity in world.entities:
        near = [world.facts[(entity.index, r.name)] for r in RELATIONS_OF[entity.type]]
        far = {world.facts[(m, r.name)] for m in near for r in RELATIONS_OF[world.entities[m].type]}
        far -= {entity.index, *near}  # two relations away and not one
        doc = world.documents[entity.index].text
        named = clue_names(doc) if far else []
        assert sorted(named) == sorted(world.entities[i].name for i in far), entity.name


def test_the_clue_sentence_ends_a_document_that_is_otherwise_unchanged(world) -> None:
    """Same facts, questions and sentences as the world without clues, plus the clue at the end."""
    plain = build_world(replace(SMALL, clues=0))
    assert plain.facts == world.facts and plain.train == world.train and plain.test == world.test
    for with_clue, without in zip(world.documents, plain.documents, strict=True):
        assert CLUE.sub("", with_clue.text) == without.text and "linked" not in without.text


def test_clues_is_zero_or_one() -> None:
    with pytest.raises(ValueError, match="WorldConfig.clues must be 0 or 1, got 2"):
        replace(SMALL, clues=2)


def test_the_explorer_follows_relation_links_only(world) -> None:
    """Clue names are in context, never searched next or answered: the explorer (and so the base
    model's success rate) is that of the world without clues."""
    cfg = ExplorerConfig(focus=1.0, search_count_weights=(0.0, 0.0, 1.0), top_k=3)
    tools = WorldTools(world, cfg, max_turns=8)
    assert tools.links("Thonbol") == ["Dudrom", "Krosgal"]  # the relation links, not the three clue names
    assert set(tools.named_in("Thonbol")) == {"Dudrom", "Krosgal", "Krasol", "Vagun", "Thonbola"}
    fmt = get_format("react")
    moves = 0
    for seed in range(20):
        for task in world.train[:5]:
            pieces = explore(task, tools, fmt, random.Random(seed), cfg)
            acts = re.findall(r"(search|open|answer)\[(\w+)\]", "".join(t for t, is_assistant in pieces if is_assistant))
            for (_, before), (_, after) in zip(acts, acts[1:], strict=False):
                assert after in tools.links(before)  # focus 1: always a relation link of the last document
                moves += 1
    assert moves > 100


def test_clue_presets_and_the_old_hashes() -> None:
    clues, longer = get_preset("bench_hops_clues"), get_preset("bench_hops_clues_longer")
    assert clues.world.clues == 1 and clues.seq_len == 768 and replace(longer, steps=clues.steps) == clues
    exact = get_preset("bench_hops_clues_exact")
    assert replace(exact, explorer=longer.explorer) == longer and exact.explorer.hop_aware == 1.0
    # worlds without the new field keep the hash (and shipped manifest) they had
    assert get_preset("bench_hops_lookalike").hash() == "410e57bedbfd5c64"
