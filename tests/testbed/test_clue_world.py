"""SynthWiki with clue sentences (``WorldConfig.clues``): each document also names the entities two
relations away among their look-alikes, so the gold answer of a chain is in context one search
before the last. Checked by hand on a small world whose documents are quoted below."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from tracerl.agent.formats import get_format
from tracerl.envs.synthwiki import RELATIONS_OF, WorldConfig, build_world, families
from tracerl.testbed.tiny_config import get_preset
from tracerl.testbed.tiny_data import ExplorerConfig, WorldTools, explore

SMALL = WorldConfig(num_people=24, num_cities=12, num_countries=6, num_books=10, num_bands=8, num_companies=10,
                    distractors=1, min_hops=4, max_hops=4, num_train=20, num_test=10, clues=1)
CLUE = re.compile(r"(\w+) is linked to ([\w, ]+)\.")


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
    assert docs["Thonbol"] == ("Thonbol has a busy population. Thonbol is linked to Vagun, Vagin, Thonbola, Krasol, "
                               "Krasolen. Thonbol is a city in Krosgal. Thonbol sits on a plain. The mayor of Thonbol "
                               "is Dudrom.")
    # The third search's document names the gold among five candidates, its look-alike Vagin beside it...
    assert "Vagun" in clue_names(docs["Thonbol"]) and "Vagin" in clue_names(docs["Thonbol"])
    # ...and no relation sentence of any document names an entity two hops further down the chain.
    chain = [*task.supporting_titles, "Vagun"]
    for i, title in enumerate(task.supporting_titles):
        relations = CLUE.sub("", docs[title]).replace(".", "").split()
        assert chain[i + 1] in relations and not set(relations) & set(chain[i + 2:])


def test_clues_are_the_two_hop_families_and_nothing_else(world) -> None:
    family = families(SMALL, world.entities)
    for entity in world.entities:
        near = [world.facts[(entity.index, r.name)] for r in RELATIONS_OF[entity.type]]
        far = {world.facts[(m, r.name)] for m in near for r in RELATIONS_OF[world.entities[m].type]}
        far -= {entity.index, *near}  # two relations away and not one
        expected = {world.entities[i].name for f in far for i in family[f]
                    if i != entity.index and i not in near}
        doc = world.documents[entity.index].text
        named = clue_names(doc) if expected else []
        assert set(named) == expected and len(named) == len(expected), entity.name
    # families are the look-alike pairs draw_names made: one edit apart, one type
    sizes = {len(f) for f in family}
    assert sizes == {2} and all(world.entities[a].type == world.entities[b].type for a, b in family)


def test_the_clue_sentence_is_added_without_changing_the_rest(world) -> None:
    """Same facts and questions as the world without clues; each document one sentence longer."""
    plain = build_world(replace(SMALL, clues=0))
    assert plain.facts == world.facts and plain.train == world.train and plain.test == world.test
    for with_clue, without in zip(world.documents, plain.documents, strict=True):
        assert CLUE.search(with_clue.text) and "linked" not in without.text
        assert with_clue.text.count(".") == without.text.count(".") + 1


def test_clues_is_zero_or_one() -> None:
    with pytest.raises(ValueError, match="WorldConfig.clues must be 0 or 1, got 2"):
        replace(SMALL, clues=2)


def test_explorer_follows_relations_and_answers_clues_only_when_asked(world) -> None:
    fmt = get_format("react")
    plain = ExplorerConfig(focus=1.0, search_count_weights=(0.0, 0.0, 1.0), top_k=3)
    tools = WorldTools(world, plain, max_turns=8)
    assert tools.links("Thonbol") == ["Krosgal", "Dudrom"]  # the relation links, not the five clue names
    assert set(tools.named_in("Thonbol")) == {"Vagun", "Vagin", "Thonbola", "Krasol", "Krasolen", "Krosgal", "Dudrom"}
    answers = {True: set(), False: set()}
    for clue_answers in (0.0, 1.0):
        cfg = replace(plain, clue_answers=clue_answers)
        for seed in range(40):
            for task in world.train[:5]:
                pieces = explore(task, tools, fmt, random.Random(seed), cfg)
                searched = re.findall(r"(?:search|open)\[(\w+)\]", "".join(t for t, a in pieces if a))
                answered = re.findall(r"answer\[(\w+)\]", pieces[-1][0])
                if answered:
                    in_clue = answered[0] not in tools.links(searched[-1])
                    answers[clue_answers > 0].add(in_clue)
    assert answers[False] == {False}  # clue_answers 0: always a relation link of the last document
    assert answers[True] == {False, True}  # 1: any name the last document holds


def test_clue_presets_differ_only_in_the_answer_rule_and_keep_old_hashes() -> None:
    clues, answers = get_preset("bench_hops_clues"), get_preset("bench_hops_clue_answers")
    assert clues.world == answers.world and clues.world.clues == 1 and clues.seq_len == 768
    assert replace(answers, explorer=clues.explorer) == clues and answers.explorer.clue_answers == 0.5
    assert clues.hash() != answers.hash()
    # worlds and explorers without the new fields keep the hash (and shipped manifest) they had
    assert get_preset("bench_hops_lookalike").hash() == "410e57bedbfd5c64"
