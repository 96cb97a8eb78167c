"""Tokenizer-coverage guard: the embedded tiny tokenizer on real text fails, on SynthWiki passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_tiny import bpe_tokenizer

from tracerl.core.types import Task
from tracerl.envs.convert import convert
from tracerl.envs.coverage import check_tokenizer_coverage, tokenizer_coverage
from tracerl.envs.data import Document, load_corpus, load_tasks
from tracerl.envs.synthwiki import build_world
from tracerl.errors import UserError
from tracerl.testbed.tiny import build_tiny_tokenizer, tokenizer_for_world
from tracerl.testbed.tiny_config import SMOKE_WORLD

RAW = Path(__file__).parents[1] / "data" / "raw"


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return tokenizer_for_world(SMOKE_WORLD)


def test_hand_counted_unknown_shares() -> None:
    # word-level: spaces before capitals are tokens "▁" of their own; unseen words are <unk>
    tok = build_tiny_tokenizer(["Ada Stone was born in Lumen ?"])
    tasks = [Task("a", "Where was Ada Stone born ?", ("Lumen",)), Task("b", "Who founded Varo ?", ("Orla Fenn",))]
    docs = [Document("d", "Ada Stone", "Ada Stone was born in Varo ?")]
    report = tokenizer_coverage(tok, tasks, docs, warn_above=0.1)
    # <unk> ▁was ▁ Ada ▁ Stone ▁born ▁ ?  |  <unk> <unk> ▁ <unk> ▁ ?   -> 4 of 15
    assert report.unk_share["questions"] == pytest.approx(4 / 15)
    # Ada ▁ Stone <unk>(":") ▁ Ada ▁ Stone ▁was ▁born ▁in ▁ <unk> ▁ ?   -> 2 of 15
    assert report.unk_share["documents"] == pytest.approx(2 / 15)
    # Lumen  |  <unk> ▁ <unk>   -> 2 of 4; "Orla Fenn" is nothing but <unk> and a space
    assert report.unk_share["answers"] == pytest.approx(2 / 4)
    assert report.unencodable == [("b", "Orla Fenn")] and report.answers_with_unk == 1
    assert report.warnings == ["27% of question tokens are <unk> (sample of 2)",
                               "13% of document tokens are <unk> (sample of 1)",
                               "50% of answer tokens are <unk> (sample of 2)",
                               "1 of 2 sampled gold answers contain <unk>"]
    with pytest.raises(UserError, match=r"cannot encode 1 of 2 sampled gold answers .*'b': 'Orla Fenn'"):
        check_tokenizer_coverage(tok, tasks, docs)
    assert check_tokenizer_coverage(tok, tasks[:1], docs).unencodable == []  # "Lumen" is readable: no error


def test_tiny_tokenizer_on_real_text_fails_naming_examples(tmp_path, tiny_tokenizer) -> None:
    convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path)
    tasks, docs = load_tasks(tmp_path / "tasks.jsonl"), load_corpus(tmp_path / "corpus.jsonl")
    report = tokenizer_coverage(tiny_tokenizer, tasks, docs)
    assert min(report.unk_share.values()) > 0.3 and len(report.warnings) == 4
    assert report.unencodable and report.answers_with_unk > len(report.unencodable)
    with pytest.raises(UserError, match=r"cannot encode \d+ of 100 sampled gold answers .* e\.g\. '"):
        check_tokenizer_coverage(tiny_tokenizer, tasks, docs)


def test_tiny_tokenizer_on_synthwiki_passes(tiny_tokenizer) -> None:
    world = build_world(SMOKE_WORLD)
    report = check_tokenizer_coverage(tiny_tokenizer, world.train + world.test, world.documents)
    assert report.unk_share == {"questions": 0.0, "documents": 0.0, "answers": 0.0}
    assert report.warnings == [] and report.unencodable == []


def test_byte_level_bpe_has_no_unknown_tokens(tmp_path) -> None:
    convert("hotpotqa", RAW / "hotpotqa_dev_sample.json", tmp_path)
    tasks, docs = load_tasks(tmp_path / "tasks.jsonl"), load_corpus(tmp_path / "corpus.jsonl")
    report = check_tokenizer_coverage(bpe_tokenizer(), tasks, docs)
    assert report.warnings == [] and report.unencodable == [] and report.sampled_answers == 5


def test_training_on_real_text_with_the_tiny_tokenizer_stops_before_any_step(tmp_path) -> None:
    """The guard is wired into the Trainer: real MuSiQue text with the word-level random-tiny model
    (its vocabulary is the SynthWiki world's) fails at start, naming unencodable answers."""
    from tracerl.config.schema import resolve_config
    from tracerl.train.loop import Trainer

    convert("musique", RAW / "musique_dev_sample.jsonl", tmp_path / "data")
    config = resolve_config("grpo", smoke="random", overrides=[
        "data.source=files", f"data.tasks={tmp_path / 'data' / 'tasks.jsonl'}",
        f"data.corpus={tmp_path / 'data' / 'corpus.jsonl'}"])
    with pytest.raises(UserError, match="cannot encode"):
        Trainer(config, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
