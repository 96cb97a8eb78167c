"""A tiny SynthWiki world, a briefly fitted tiny HF policy and a real rollout engine for tests.

The policy is a random Qwen3 model (``helpers_tiny.tiny_model``) fitted for a few seconds on
``react`` episodes that search a random entity and answer a random one of four names, so it
emits valid tool calls (real observations, real boundaries) and answers. The verifier
:func:`lucky_verifier` rewards two of those four names: a plain pluggable verifier that makes
outcomes mix without a trained agent, which DAPO and TRACE need in order to do anything.
Nothing is downloaded; caches stay in the given folder.
"""

from __future__ import annotations

import functools
import random

import torch
from helpers_tiny import _wrap
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tracerl.agent.formats import get_format
from tracerl.core.types import Action, Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.synthwiki import World, WorldConfig, build_world
from tracerl.models.backend import HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine

WORLD_CONFIG = WorldConfig(
    name_seed=1, fact_seed=1, num_people=12, num_cities=8, num_countries=4, num_books=6,
    num_bands=4, num_companies=6, num_train=32, num_test=4, max_hops=2,
)
ANSWER_NAMES = ("Alpha", "Bravo", "Delta", "Gamma")
LUCKY = frozenset({"Alpha", "Bravo"})


def lucky_verifier(answer: str, task: Task) -> float:
    """1.0 for two of the four names the fitted policy answers with (about half its answers)."""
    return float(answer.strip() in LUCKY)


def world() -> World:
    return build_world(WORLD_CONFIG)


def _tokenizer(texts: list[str]):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<pad>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _wrap(tok)


def _episodes(w: World, tools, fmt, rng: random.Random, count: int) -> list[str]:
    titles = [d.title for d in w.documents]
    out = []
    for _ in range(count):
        task = rng.choice(w.train)
        text = fmt.render_prompt(task, tools)
        for _ in range(rng.randint(0, 2)):
            action = Action(kind="tool", name="search", arguments={"query": rng.choice(titles)})
            text += fmt.render_action(action)
            text += " " + tools.call("search", action.arguments) + "\n"
        text += fmt.render_action(Action(kind="answer", answer=rng.choice(ANSWER_NAMES)))
        out.append(text)
    return out


def fitted_policy(w: World, tools, steps: int = 80, seed: int = 0) -> HFPolicy:
    """A tiny random Qwen3 fitted briefly on exploratory episodes (a few seconds on CPU)."""
    from helpers_tiny import tiny_model

    fmt = get_format("react")
    rng = random.Random(seed)
    texts = _episodes(w, tools, fmt, rng, 256)
    tok = _tokenizer(texts + [d.text for d in w.documents])
    model = tiny_model(len(tok), seed=seed, hidden=64, layers=2)
    eos = tok.eos_token_id
    seqs = [tok.encode(t, add_special_tokens=False) + [eos] for t in texts]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = [seqs[i] for i in torch.randint(len(seqs), (16,), generator=gen).tolist()]
        width = max(len(s) for s in batch)
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in batch])
        labels = torch.tensor([s + [-100] * (width - len(s)) for s in batch])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.zero_grad(set_to_none=True)
    return HFPolicy(model, tok)


def make_env(w: World, max_turns: int = 3) -> ToolEnvironment:
    index = SearchIndex(w.documents, use_cache=False)  # 40 documents: building is instant
    tools = search_tools(index, top_k=1, max_tokens=12)
    return ToolEnvironment(tools, EnvConfig(max_turns=max_turns, max_observation_tokens=12))


@functools.lru_cache(maxsize=1)
def shared() -> tuple[World, ToolEnvironment, HFPolicy]:
    """One world, environment and fitted policy per test session (the fit takes seconds)."""
    w = world()
    env = make_env(w)
    return w, env, fitted_policy(w, env.tools)


def make_engine(policy: HFPolicy, env: ToolEnvironment, max_turns: int = 3) -> RolloutEngine:
    config = EngineConfig(max_turns=max_turns, max_turn_tokens=24, max_total_tokens=512, max_observation_tokens=40)
    return RolloutEngine(policy, env, get_format("react"), lucky_verifier, config)
