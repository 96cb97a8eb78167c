"""The embedded tiny base model: tokenizer round trips, reloads, deterministic pretraining."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from tracerl.agent.formats import get_format
from tracerl.core.types import Action
from tracerl.envs.synthwiki import build_world
from tracerl.testbed.tiny import (
    TinyModelConfig,
    build_tiny_tokenizer,
    get_preset,
    load_or_pretrain,
    pretrain_tiny_model,
    random_tiny_model,
)
from tracerl.testbed.tiny_data import ExplorerConfig, Sample, WorldTools, explore, vocabulary_texts
from tracerl.testbed.tiny_train import collate, lr_at, pack_rows

# Tiny models are dominated by per-op overhead; with other processes on 2 cores, two intra-op
# threads spin against each other (the smoke pretraining took 7.5 s on 2 threads, 0.15 s on 1).
torch.set_num_threads(1)

SMOKE = get_preset("smoke")
FMT = get_format("react")


@pytest.fixture(scope="module")
def world_tools() -> WorldTools:
    world = build_world(replace(SMOKE.world, fact_seed=123))
    return WorldTools(world, SMOKE.explorer, SMOKE.max_turns)


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 - a PreTrainedTokenizerFast
    return build_tiny_tokenizer(vocabulary_texts(SMOKE.world, FMT))


def _episodes(wt: WorldTools, count: int, seed: int = 0) -> list[list[tuple[str, bool]]]:
    rng = random.Random(seed)
    return [explore(task, wt, FMT, rng, SMOKE.explorer) for task in wt.world.train[:count]]


# --- tokenizer ------------------------------------------------------------------------------


def test_round_trip_and_piecewise_encoding_on_react_episodes(tokenizer, world_tools: WorldTools) -> None:
    for episode in _episodes(world_tools, 10):
        text = "".join(piece for piece, _ in episode)
        whole = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.unk_token_id not in whole
        assert tokenizer.decode(whole) == text
        # The engine encodes prompt, turns and observations separately: same ids as one string.
        pieces = [i for piece, _ in episode for i in tokenizer.encode(piece, add_special_tokens=False)]
        assert pieces == whole


def test_entity_name_is_one_token_wherever_it_appears(tokenizer, world_tools: WorldTools) -> None:
    name = world_tools.world.entities[0].name
    (name_id,) = tokenizer.encode(name, add_special_tokens=False)
    for text in (f"Action: search[{name}]", f" {name} was born.", f"x.\n{name}: text", f"Action: answer[{name}]"):
        assert name_id in tokenizer.encode(text, add_special_tokens=False), text


WORDS = ["Question", "search", "answer", "the", "city", "Action", "Observation", "born", "Error", "query"]
SEPARATORS = [" ", "\n", "  ", ": ", "[", "]", ". ", ", ", "?", "]\n", " \n "]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SEPARATORS), st.sampled_from(WORDS)), max_size=12),
       st.sampled_from(SEPARATORS))
def test_decode_inverts_encode_for_in_vocabulary_text(tokenizer, pairs: list[tuple[str, str]], end: str) -> None:
    text = "".join(sep + word for sep, word in pairs) + end
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.unk_token_id not in ids  # every word exists with and without a leading space
    assert tokenizer.decode(ids) == text


def test_tokenizer_reloads_with_identical_ids(tokenizer, world_tools: WorldTools, tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "".join(piece for piece, _ in _episodes(world_tools, 1)[0])
    assert reloaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert len(reloaded) == len(tokenizer)
    assert (reloaded.pad_token_id, reloaded.unk_token_id, reloaded.eos_token_id) == (0, 1, 2)
    chat = reloaded.apply_chat_template([{"role": "user", "content": "Question: x?\n"},
                                         {"role": "assistant", "content": "Action: answer[x]"}], tokenize=False)
    assert chat == "Question: x?\nAction: answer[x]<eos>"


# --- exploratory episodes --------------------------------------------------------------------


def test_exploratory_turns_parse_and_answers_come_from_context(world_tools: WorldTools) -> None:
    for episode in _episodes(world_tools, 20, seed=3):
        context = episode[0][0]
        for text, is_assistant in episode[1:]:
            if is_assistant:
                action = FMT.parse(text, world_tools.tools)
                assert action.kind in ("tool", "answer"), text
                named = action.answer if action.kind == "answer" else next(iter(action.arguments.values()))
                assert named in context  # every query and answer names something already seen
            context += text


def test_explorer_with_full_focus_follows_links(world_tools: WorldTools) -> None:
    cfg = ExplorerConfig(focus=1.0, search_count_weights=(0.0, 1.0), open_prob=0.0)
    rng = random.Random(0)
    task = world_tools.world.train[0]
    episode = explore(task, world_tools, FMT, rng, cfg)
    first = FMT.parse(episode[1][0], world_tools.tools).arguments["query"]
    second = FMT.parse(episode[3][0], world_tools.tools).arguments["query"]
    assert first in task.question
    assert second in world_tools.links(first)
    answer = FMT.parse(episode[5][0], world_tools.tools)
    assert answer == Action(kind="answer", answer=answer.answer)
    assert answer.answer in world_tools.links(second)


# --- training pieces -------------------------------------------------------------------------


def test_packing_restarts_positions_and_masks_labels() -> None:
    a = Sample([5, 6, 7], [1.0, 1.0, 0.5])
    b = Sample([8, 9], [1.0, 0.0])
    rows = pack_rows([3, 2], [0, 1], seq_len=6)
    assert rows == [[0, 1]]
    ids, pos, labels, weights = collate([[a, b]], seq_len=6, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0]]
    # position t predicts token t+1 of the same sample, weighted by that token's weight;
    # nothing is predicted across a sample boundary or into the padding
    assert labels[0, :2].tolist() == [6, 7] and labels[0, 3] == 9
    assert weights.tolist() == [[1.0, 0.5, 0.0, 0.0, 0.0, 0.0]]


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = replace(SMOKE, steps=10, warmup_steps=2, lr=1.0, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in (0, 1)] == [0.5, 1.0]
    assert lr_at(9, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * 7 / 8)).item()))
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(1, 9))


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelConfig(hidden_size=0)
    with pytest.raises(ValueError, match="focus"):
        TinyModelConfig(explorer=ExplorerConfig(focus=1.5))
    with pytest.raises(ValueError, match="precision"):
        TinyModelConfig(precision="fp8")
    with pytest.raises(ValueError, match="unknown field 'bogus'"):
        TinyModelConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="valid: bench, bench_guided, bench_hops, bench_hops_2l, bench_hops_clues, bench_hops_clues5, bench_hops_clues5_2x, bench_hops_clues_2x, bench_hops_clues_exact, bench_hops_clues_longer, bench_hops_long, bench_hops_lookalike, default, smoke, two_layer"):
        get_preset("huge")


def test_config_dict_round_trip_and_hash() -> None:
    assert TinyModelConfig.from_dict(json.loads(json.dumps(SMOKE.to_dict()))) == SMOKE
    assert SMOKE.hash() == TinyModelConfig.from_dict(SMOKE.to_dict()).hash()
    assert replace(SMOKE, seed=1).hash() != SMOKE.hash()


# --- models ----------------------------------------------------------------------------------


def test_random_model_reloads_with_identical_logits(tokenizer, tmp_path: Path) -> None:
    model = random_tiny_model(tokenizer, SMOKE).eval()
    assert model.config.vocab_size == len(tokenizer)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([tokenizer.encode("Question: Who is the mayor of x?\n", add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


def _logits(folder: Path) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tok.encode("Question: Who is the mayor of x?\nAction: search[", add_special_tokens=False)])
    with torch.no_grad():
        return model(ids).logits


def test_pretraining_is_deterministic_and_lowers_the_loss(tmp_path: Path) -> None:
    cfg = replace(SMOKE, steps=12)
    first = pretrain_tiny_model(cfg, tmp_path / "a", progress=False)
    second = pretrain_tiny_model(cfg, tmp_path / "b", progress=False)
    log_a = json.loads((first / "pretrain_log.json").read_text())
    log_b = json.loads((second / "pretrain_log.json").read_text())
    assert log_a["losses"] == log_b["losses"]
    assert sum(log_a["losses"][-3:]) < sum(log_a["losses"][:3])
    assert log_a["unknown_tokens"] == 0
    # The pretrained model reloads from its folder with identical outputs, run after run.
    assert torch.equal(_logits(first), _logits(second))
    assert TinyModelConfig.from_dict(json.loads((first / "tiny_config.json").read_text())) == cfg


def test_load_or_pretrain_caches_by_config(tmp_path: Path) -> None:
    cfg = replace(SMOKE, steps=2)
    path = load_or_pretrain(cfg, cache_dir=tmp_path, progress=False)
    assert path == tmp_path / cfg.hash()
    stamp = (path / "pretrain_log.json").stat().st_mtime_ns
    assert load_or_pretrain(cfg, cache_dir=tmp_path, progress=False) == path
    assert (path / "pretrain_log.json").stat().st_mtime_ns == stamp  # reused, not retrained
    assert [p.name for p in tmp_path.iterdir()] == [cfg.hash()]  # no temporary folder left
