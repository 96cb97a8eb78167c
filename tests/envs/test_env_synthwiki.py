"""SynthWiki: determinism, the two seeds, answerability by reading, and the one-hop rule."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tracerl.envs.synthwiki import RELATIONS, World, WorldConfig, build_world, write_world


def read_facts(world: World) -> dict[tuple[str, str], str]:
    """(title, relation) -> object, read from the document texts with the sentence templates only."""
    patterns = []
    for rel in RELATIONS:
        for template in rel.sentences:
            regex = re.escape(template).replace(r"\{s\}", r"(?P<s>[A-Z][a-z]+)").replace(r"\{o\}", r"(?P<o>[A-Z][a-z]+)")
            patterns.append((rel.name, re.compile(regex)))
    facts: dict[tuple[str, str], str] = {}
    for doc in world.documents:
        for sentence in re.split(r"(?<=\.) ", doc.text):
            for name, pattern in patterns:
                m = pattern.fullmatch(sentence)
                if m and m.group("s") == doc.title:
                    facts[(doc.title, name)] = m.group("o")
    return facts


def parse_question(phrase: str) -> tuple[str, list[str]] | None:
    """Peel the nested relation phrases: (start entity, relation names innermost first)."""
    if re.fullmatch(r"[A-Z][a-z]+", phrase):
        return phrase, []
    for rel in RELATIONS:
        prefix, suffix = rel.phrase.split("{x}")
        if phrase.startswith(prefix) and phrase.endswith(suffix) and len(phrase) > len(prefix) + len(suffix):
            inner = parse_question(phrase[len(prefix): len(phrase) - len(suffix)])
            if inner is not None:
                return inner[0], inner[1] + [rel.name]
    return None


def test_same_seeds_give_byte_identical_files(tmp_path, small_config) -> None:
    write_world(build_world(small_config), tmp_path / "a")
    write_world(build_world(small_config), tmp_path / "b")
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    write_world(build_world(replace(small_config, fact_seed=2)), tmp_path / "c")
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() != (tmp_path / "c" / "corpus.jsonl").read_bytes()


def test_name_seed_fixes_names_and_fact_seed_rewires(small_config) -> None:
    a = build_world(small_config)
    b = build_world(replace(small_config, fact_seed=99))
    c = build_world(replace(small_config, name_seed=5))
    assert [d.title for d in a.documents] == [d.title for d in b.documents]
    assert [d.title for d in a.documents] != [d.title for d in c.documents]
    changed = sum(a.facts[k] != b.facts[k] for k in a.facts)
    assert changed > len(a.facts) // 2  # most relations are re-drawn


def test_sizes_and_single_word_names(default_world) -> None:
    cfg = default_world.config
    assert len(default_world.documents) == cfg.num_documents == 2800
    assert len(default_world.train) == cfg.num_train and len(default_world.test) == cfg.num_test
    titles = [d.title for d in default_world.documents]
    assert len(set(titles)) == len(titles)
    assert all(re.fullmatch(r"[A-Z][a-z]+", t) for t in titles)
    allowed = re.compile(r"[A-Za-z .,?]+")
    assert all(allowed.fullmatch(d.text) for d in default_world.documents)
    assert all(allowed.fullmatch(t.question) for t in default_world.train + default_world.test)


def test_lookalike_distractors_exist(small_world) -> None:
    titles = [d.title for d in small_world.documents]
    # with distractors=1 each base name is followed by a sibling one edit away
    close = sum(_one_edit(a, b) for a, b in zip(titles[::2], titles[1::2], strict=False))
    assert close == len(titles) // 2


def _one_edit(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    return b.startswith(a) and len(b) - len(a) <= 2


@pytest.mark.parametrize("world_name", ["small_world", "default_world"])
def test_every_question_answerable_by_reading_the_chain(world_name, request) -> None:
    world: World = request.getfixturevalue(world_name)
    facts = read_facts(world)
    by_title = {d.title: d for d in world.documents}
    hop_counts = set()
    for task in world.train + world.test:
        parsed = parse_question(task.question.split(" is ", 1)[1].rstrip("?"))
        assert parsed is not None, task.question
        start, path = parsed
        assert len(path) == task.hops and len(task.supporting_titles) == task.hops
        visited, current = [], start
        for rel in path:
            visited.append(current)
            current = facts[(current, rel)]
        assert current == task.gold
        assert tuple(visited) == task.supporting_titles
        assert len(set(visited) | {task.gold}) == task.hops + 1  # each hop reads a distinct document
        # one-hop rule: no document of the chain names an entity two or more hops ahead
        chain = list(visited) + [task.gold]
        for i, title in enumerate(visited):
            words = set(by_title[title].text.replace(".", "").split())
            assert not words & set(chain[i + 2:]), task.question
        hop_counts.add(task.hops)
    assert hop_counts == {1, 2, 3, 4}


def test_train_and_test_questions_are_distinct(default_world) -> None:
    train = {t.question for t in default_world.train}
    assert not train & {t.question for t in default_world.test}
    assert len({t.id for t in default_world.train + default_world.test}) == 2500


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_hops", 6), ("min_hops", 0), ("facts_per_document", 9), ("num_cities", 1),
     ("distractors", -1), ("distractors", 5), ("num_train", -3), ("fact_seed", 1.5)],
)
def test_config_errors_name_the_field(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        WorldConfig(**{field: value})


def test_too_many_questions_is_an_error(small_config) -> None:
    with pytest.raises(ValueError, match="num_train"):
        build_world(replace(small_config, min_hops=1, max_hops=1, num_train=400, num_test=0))
