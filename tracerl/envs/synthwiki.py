"""SynthWiki: a seeded fictional encyclopedia for multi-hop search tasks.

Two seeds are kept apart on purpose. The *name seed* draws a fixed inventory of invented,
single-word names per entity type; the *fact seed* draws who is related to whom. Re-drawing
the facts over the same names gives a new world a model cannot have memorised, which is what
makes it read observations instead of recalling facts (issue 3: 93% -> 12% accuracy on
re-drawn facts for a model pretrained on one world; 92% on unseen worlds when trained across
many).

Each entity gets one document stating only its own facts (outgoing relations plus filler
attributes), so a k-hop question needs k searches: no document states two hops of a chain.
With ``clues`` on, each document ends by naming its two-hop entities: partial evidence that
narrows the answer one search early.
Templates use a small plain vocabulary and only the punctuation ``. , ?`` so a word-level
tokenizer keeps every entity name a single token.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from tracerl.core.types import Task
from tracerl.envs.data import Document, write_corpus, write_tasks

TYPES = ("person", "city", "country", "book", "band", "company")
MAX_HOPS = 5
"""Longest question chain. Five hops (the long-horizon testbed: 4-5 searches per question)
still leave a default world enough loop-free chains; the default worlds stop at four."""


@dataclass(frozen=True)
class Relation:
    """A functional relation ``source type -> target type`` with its wording."""

    name: str
    source: str
    target: str
    phrase: str
    """Noun phrase naming the target, with ``{x}`` for the source (used in questions)."""
    sentences: tuple[str, ...]
    """Document templates with ``{s}`` (the source) and ``{o}`` (the target)."""


RELATIONS: tuple[Relation, ...] = (
    Relation("born_in", "person", "city", "the city where {x} was born",
             ("{s} was born in {o}.", "{s} was born in the city of {o}.", "The birthplace of {s} is {o}.")),
    Relation("works_for", "person", "company", "the company that {x} works for",
             ("{s} works for {o}.", "{s} is employed by {o}.", "{s} has a job at {o}.")),
    Relation("located_in", "city", "country", "the country where {x} is located",
             ("{s} is a city in {o}.", "{s} is located in {o}.", "{s} lies in the country of {o}.")),
    Relation("mayor", "city", "person", "the mayor of {x}",
             ("The mayor of {s} is {o}.", "{s} is governed by the mayor {o}.")),
    Relation("leader", "country", "person", "the leader of {x}",
             ("The leader of {s} is {o}.", "{s} is led by {o}.")),
    Relation("written_by", "book", "person", "the author of {x}",
             ("{s} was written by {o}.", "{s} is a book by {o}.", "The author of {s} is {o}.")),
    Relation("founded_by", "company", "person", "the founder of {x}",
             ("{s} was founded by {o}.", "The founder of {s} is {o}.")),
    Relation("based_in", "company", "city", "the city where {x} is based",
             ("{s} is based in {o}.", "{s} has its main office in {o}.")),
    Relation("formed_in", "band", "city", "the city where {x} was formed",
             ("{s} was formed in {o}.", "{s} is a band from {o}.")),
    Relation("singer", "band", "person", "the singer of {x}",
             ("The singer of {s} is {o}.", "{s} is fronted by the singer {o}.")),
)
RELATIONS_OF: dict[str, tuple[Relation, ...]] = {
    t: tuple(r for r in RELATIONS if r.source == t) for t in TYPES
}

# Filler facts: (template with {s} and {v}, values). They never name another entity.
_NUMBERS = ("two", "three", "four", "five", "six")
ATTRIBUTES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "person": (("{s} works as a {v}.", ("painter", "farmer", "sailor", "doctor", "teacher", "builder")),
               ("{s} likes {v}.", ("music", "chess", "horses", "gardens", "boats", "maps")),
               ("{s} has {v} children.", _NUMBERS)),
    "city": (("{s} is known for its {v}.", ("bridges", "markets", "towers", "gardens", "harbour", "walls")),
             ("{s} has a {v} population.", ("large", "small", "growing", "young", "busy")),
             ("{s} sits on a {v}.", ("river", "hill", "lake", "coast", "plain"))),
    "country": (("{s} is a {v} country.", ("large", "small", "cold", "warm", "quiet")),
                ("{s} is famous for its {v}.", ("mountains", "forests", "lakes", "islands", "deserts")),
                ("{s} has a {v} climate.", ("dry", "wet", "mild", "harsh"))),
    "book": (("{s} is a {v}.", ("novel", "poem", "play", "history", "tale")),
             ("{s} tells a story about {v}.", ("the sea", "a war", "a family", "a journey", "a king")),
             ("{s} has {v} chapters.", _NUMBERS)),
    "band": (("{s} plays {v} music.", ("folk", "rock", "jazz", "dance", "choir")),
             ("{s} has {v} members.", _NUMBERS),
             ("{s} is known for its {v} songs.", ("loud", "slow", "sad", "happy", "long"))),
    "company": (("{s} makes {v}.", ("ships", "tools", "paper", "glass", "bread", "clocks")),
                ("{s} has {v} workers.", ("few", "many", "hundreds of", "thousands of")),
                ("{s} sells its goods in {v} markets.", ("local", "foreign", "distant", "busy"))),
}

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "th", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s", "m")
_SUFFIXES = ("a", "is", "on", "en", "ar")


CLUE_SENTENCE = "{s} is linked to {o}."
"""The clue sentence of :attr:`WorldConfig.clues` (``{o}``: the candidates, comma-separated)."""


@dataclass(frozen=True)
class WorldConfig:
    """Sizes and difficulty of one SynthWiki world (all validated in ``__post_init__``)."""

    name_seed: int = 0
    """Draws the entity names; keep it fixed to re-wire the same names into new worlds."""
    fact_seed: int = 0
    """Draws the relations, documents and questions."""
    num_people: int = 1000
    num_cities: int = 500
    num_countries: int = 80
    num_books: int = 500
    num_bands: int = 300
    num_companies: int = 420
    distractors: int = 1
    """Look-alike siblings per base name (differ by one syllable or suffix, own facts)."""
    clues: int = 0
    """1: each document ends with one more sentence naming the entities two relations away from its
    own: partial evidence, so the gold answer is in context one search before the last, among two to
    four candidates. 0: no clue sentence. A tiny base model needs the clue sentence's words in its
    vocabulary: the ``bench_hops_clues`` presets have them."""
    facts_per_document: int = 4
    """Sentences per document: all relations of the entity plus filler attributes."""
    min_hops: int = 1
    max_hops: int = 4
    num_train: int = 2000
    num_test: int = 500

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"WorldConfig.{f.name} must be an integer, got {value!r}")
        for t in TYPES:
            if self.size(t) < 2:
                raise ValueError(f"WorldConfig.{_size_field(t)} must be >= 2, got {self.size(t)}")
        if not 0 <= self.distractors <= 4:
            raise ValueError(f"WorldConfig.distractors must be in [0, 4], got {self.distractors}")
        if self.clues not in (0, 1):
            raise ValueError(f"WorldConfig.clues must be 0 or 1, got {self.clues}")
        lo = max(len(r) for r in RELATIONS_OF.values())
        hi = min(len(RELATIONS_OF[t]) + len(ATTRIBUTES[t]) for t in TYPES)
        if not lo <= self.facts_per_document <= hi:
            raise ValueError(f"WorldConfig.facts_per_document must be in [{lo}, {hi}], got {self.facts_per_document}")
        if not 1 <= self.min_hops <= self.max_hops:
            raise ValueError(f"WorldConfig.min_hops must be in [1, max_hops], got {self.min_hops}")
        if self.max_hops > MAX_HOPS:
            raise ValueError(f"WorldConfig.max_hops must be <= {MAX_HOPS}, got {self.max_hops}")
        for name in ("num_train", "num_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"WorldConfig.{name} must be >= 0, got {getattr(self, name)}")

    def size(self, entity_type: str) -> int:
        return int(getattr(self, _size_field(entity_type)))

    @property
    def num_documents(self) -> int:
        return sum(self.size(t) for t in TYPES)


_SIZE_FIELDS = {"person": "num_people", "city": "num_cities", "country": "num_countries",
                "book": "num_books", "band": "num_bands", "company": "num_companies"}


def _size_field(entity_type: str) -> str:
    return _SIZE_FIELDS[entity_type]


@dataclass(frozen=True)
class Entity:
    index: int
    name: str
    type: str


@dataclass
class World:
    """A built world: its documents, question splits and the fact graph they came from."""

    config: WorldConfig
    entities: list[Entity]
    facts: dict[tuple[int, str], int]
    """(source entity index, relation name) -> target entity index."""
    documents: list[Document]
    train: list[Task]
    test: list[Task]


def _template_words() -> set[str]:
    words: set[str] = set()
    texts = [r.phrase for r in RELATIONS] + [s for r in RELATIONS for s in r.sentences]
    texts += [tpl for attrs in ATTRIBUTES.values() for tpl, _ in attrs]
    texts += [v for attrs in ATTRIBUTES.values() for _, vals in attrs for v in vals]
    texts += ["What Who is", CLUE_SENTENCE]
    for text in texts:
        words.update(w.strip(".,?{}").lower() for w in text.split())
    return words


_RESERVED = _template_words() | {"search", "open", "answer", "question", "action", "observation", "thought", "error"}


def _base_name(rng: random.Random) -> str:
    syllables = rng.choice((2, 2, 2, 3))
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()


def _lookalike(rng: random.Random, base: str) -> str:
    """A name one edit away: swap the last vowel or append a suffix."""
    if rng.random() < 0.5:
        idx = max(i for i, c in enumerate(base) if c in _VOWELS)
        vowel = rng.choice([v for v in _VOWELS if v != base[idx]])
        return base[:idx] + vowel + base[idx + 1:]
    return base + rng.choice(_SUFFIXES)


def draw_names(config: WorldConfig) -> list[Entity]:
    """The name inventory: depends on the name seed and sizes only, never the fact seed."""
    rng = random.Random(f"synthwiki-names:{config.name_seed}")
    used: set[str] = set()
    entities: list[Entity] = []

    def fresh(make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            if name not in used and name.lower() not in _RESERVED and len(name) >= 4:
                used.add(name)
                return name
        raise ValueError("WorldConfig: too many entities for the name generator")

    for etype in TYPES:
        count = config.size(etype)
        for family_index in range(math.ceil(count / (1 + config.distractors))):
            base = fresh(lambda: _base_name(rng))
            family = [base] + [fresh(lambda: _lookalike(rng, base)) for _ in range(config.distractors)]
            room = count - family_index * (1 + config.distractors)  # the last family may be cut short
            for name in family[:room]:
                entities.append(Entity(len(entities), name, etype))
    return entities


def _wire(entities: list[Entity], rng: random.Random) -> dict[tuple[int, str], int]:
    by_type: dict[str, list[int]] = {t: [e.index for e in entities if e.type == t] for t in TYPES}
    facts: dict[tuple[int, str], int] = {}
    for entity in entities:
        for rel in RELATIONS_OF[entity.type]:
            facts[(entity.index, rel.name)] = rng.choice(by_type[rel.target])
    return facts


def _two_hop(entity: Entity, entities: list[Entity], facts: dict[tuple[int, str], int]) -> list[int]:
    """Entities two relations away from ``entity`` (not itself, not one relation away), in relation order."""
    near = [facts[(entity.index, r.name)] for r in RELATIONS_OF[entity.type]]
    out: list[int] = []
    for mid in near:
        for rel in RELATIONS_OF[entities[mid].type]:
            far = facts[(mid, rel.name)]
            if far != entity.index and far not in near and far not in out:
                out.append(far)
    return out


def _clue(entity: Entity, entities: list[Entity], facts: dict[tuple[int, str], int], rng: random.Random) -> str | None:
    """The clue sentence of ``entity`` (its two-hop entities, shuffled), or None when it has none."""
    names = _two_hop(entity, entities, facts)
    if not names:
        return None
    rng.shuffle(names)
    return CLUE_SENTENCE.format(s=entity.name, o=", ".join(entities[i].name for i in names))


def _document(entity: Entity, entities: list[Entity], facts: dict[tuple[int, str], int],
              per_doc: int, rng: random.Random, clue: str | None = None) -> Document:
    sentences = []
    for rel in RELATIONS_OF[entity.type]:
        target = entities[facts[(entity.index, rel.name)]].name
        sentences.append(rng.choice(rel.sentences).format(s=entity.name, o=target))
    for template, values in rng.sample(ATTRIBUTES[entity.type], per_doc - len(sentences)):
        sentences.append(template.format(s=entity.name, v=rng.choice(values)))
    rng.shuffle(sentences)
    if clue is not None:  # always last, after the facts: one place a reader learns to look for candidates
        sentences.append(clue)
    return Document(id=f"sw-{entity.index:05d}", title=entity.name, text=" ".join(sentences))


def _chain(start: int, hops: int, world_facts: dict[tuple[int, str], int], entities: list[Entity],
           rng: random.Random) -> tuple[list[int], list[Relation]] | None:
    """A random walk of ``hops`` relations over distinct entities, or None when it loops."""
    chain, rels = [start], []
    for _ in range(hops):
        rel = rng.choice(RELATIONS_OF[entities[chain[-1]].type])
        nxt = world_facts[(chain[-1], rel.name)]
        if nxt in chain:
            return None
        chain.append(nxt)
        rels.append(rel)
    # No document's relation sentences may name an entity two or more hops further down the chain
    # (a clue sentence does, on purpose: among the other two-hop entities).
    for i, node in enumerate(chain[:-2]):
        mentioned = {world_facts[(node, r.name)] for r in RELATIONS_OF[entities[node].type]}
        if mentioned & set(chain[i + 2:]):
            return None
    return chain, rels


def _questions(config: WorldConfig, entities: list[Entity], facts: dict[tuple[int, str], int],
               rng: random.Random) -> list[Task]:
    total = config.num_train + config.num_test
    span = config.max_hops - config.min_hops + 1
    seen: set[tuple[int, tuple[str, ...]]] = set()
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < total:
        attempts += 1
        if attempts > 50 * total + 1000:
            raise ValueError("WorldConfig.num_train + num_test: more questions than the world can supply")
        hops = config.min_hops + len(tasks) % span
        found = _chain(rng.randrange(len(entities)), hops, facts, entities, rng)
        if found is None:
            continue
        chain, rels = found
        key = (chain[0], tuple(r.name for r in rels))
        if key in seen:
            continue
        seen.add(key)
        phrase = entities[chain[0]].name
        for rel in rels:
            phrase = rel.phrase.format(x=phrase)
        opener = "Who" if entities[chain[-1]].type == "person" else "What"
        tasks.append(Task(id="", question=f"{opener} is {phrase}?", answers=(entities[chain[-1]].name,),
                          supporting_titles=tuple(entities[i].name for i in chain[:-1]), hops=hops))
    rng.shuffle(tasks)
    prefix = f"sw{config.name_seed}.{config.fact_seed}"
    out = []
    for i, task in enumerate(tasks):
        split = "train" if i < config.num_train else "test"
        out.append(Task(id=f"{prefix}-{split}-{i:05d}", question=task.question, answers=task.answers,
                        supporting_titles=task.supporting_titles, hops=task.hops))
    return out


def build_world(config: WorldConfig | None = None) -> World:
    """Generate a world deterministically from ``config`` (same config -> same world)."""
    config = config or WorldConfig()
    entities = draw_names(config)
    seed = f"{config.name_seed}:{config.fact_seed}"
    facts = _wire(entities, random.Random(f"synthwiki-facts:{seed}"))
    doc_rng = random.Random(f"synthwiki-docs:{seed}")
    if config.clues:
        clue_rng = random.Random(f"synthwiki-clues:{seed}")
        clues = [_clue(e, entities, facts, clue_rng) for e in entities]
    else:
        clues = [None] * len(entities)
    documents = [_document(e, entities, facts, config.facts_per_document, doc_rng, clue)
                 for e, clue in zip(entities, clues, strict=True)]
    tasks = _questions(config, entities, facts, random.Random(f"synthwiki-questions:{seed}"))
    return World(config=config, entities=entities, facts=facts, documents=documents,
                 train=tasks[: config.num_train], test=tasks[config.num_train:])


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write ``corpus.jsonl``, ``train.jsonl`` and ``test.jsonl`` (byte-identical per config)."""
    out = Path(out_dir)
    paths = {"corpus": out / "corpus.jsonl", "train": out / "train.jsonl", "test": out / "test.jsonl"}
    write_corpus(world.documents, paths["corpus"])
    write_tasks(world.train, paths["train"])
    write_tasks(world.test, paths["test"])
    return paths
