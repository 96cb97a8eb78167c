"""A turn ends as soon as its action is written (issue 13 item 6), with tokens and masks exact.

``StreamPolicy`` writes a planned text token by token and stops the way HFPolicy does (once the
decoded generated text holds a stop string, that token kept), so a policy that would run on
after its action shows where the engine ends the turn. Each planned token carries a distinct
log-prob, so a turn sampled in several pieces can be checked token for token.
"""

from __future__ import annotations

import pytest
from helpers_tiny import assert_old_logprobs_recompute, tiny_model

from tracerl.agent.formats import ReactFormat, get_format
from tracerl.agent.search_r1 import SearchR1Format
from tracerl.agent.turn_end import OBSERVATION_MARK
from tracerl.core.types import Task
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.data import Document
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.envs.verifiers import exact_match
from tracerl.models.backend import Generation, HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine

REACT = get_format("react")
RUN_ON = " and I keep writing Action: open[Nobody] more words" * 8


class StreamPolicy:
    """Writes ``plan(prefix_text)`` token by token, stopping like HFPolicy; resumes its own pieces.

    A prefix equal to an earlier prefix plus what was written for it continues that plan where it
    stopped (the engine sampling on within a turn). Planned token ``i`` has log-prob ``-(i+1)/100``.
    """

    def __init__(self, tokenizer, plan) -> None:
        self.tokenizer, self.plan = tokenizer, plan
        self.stats: dict[str, int] = {}
        self.calls: list[list[int]] = []
        """Per call, the seed of each row."""
        self._resume: dict[tuple[int, ...], tuple[list[int], int]] = {}

    def sync_weights(self, model_or_state, version: int) -> None:
        """Nothing to sync: the turns are planned."""

    def generate(self, prefixes, params, seeds=None, routing_keys=None) -> list[Generation]:
        self.calls.append(list(seeds or []))
        return [self._one(list(prefix), params) for prefix in prefixes]

    def _one(self, prefix: list[int], params) -> Generation:
        plan, pos = self._resume.get(tuple(prefix), (None, 0))
        if plan is None:
            text = self.plan(self.tokenizer.decode(prefix, skip_special_tokens=True))
            plan = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        start, ids, reason = pos, [], "length"
        while len(ids) < params.max_new_tokens and pos < len(plan):
            ids.append(plan[pos])
            pos += 1
            if ids[-1] == self.tokenizer.eos_token_id:
                reason = "eos"
                break
            if any(s in self.tokenizer.decode(ids, skip_special_tokens=False) for s in params.stop_strings):
                reason = "stop"
                break
        self._resume[tuple(prefix + ids)] = (plan, pos)
        logprobs = [-(i + 1) / 100 for i in range(start, pos)]
        return Generation(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), reason)


class OldReact(ReactFormat):
    """The react format as it was: a turn ended only at ``Observation:`` (or the cap)."""

    stop_strings = ("Observation:",)

    def ends_turn(self, text: str) -> bool:
        return True

    def observation_ids(self, obs, sampled_ids, tokenizer) -> list[int]:
        return list(tokenizer.encode(self.render_observation(obs), add_special_tokens=False))


def _engine(policy, env, fmt=REACT, **cfg) -> RolloutEngine:
    config = EngineConfig(**{"max_turns": 3, "max_turn_tokens": 128, "max_total_tokens": 1500, **cfg})
    return RolloutEngine(policy, env, fmt, exact_match, config)


def _react_plan(world):
    gold = {t.question: t.gold for t in world.train}

    def plan(prefix: str) -> str:
        question = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        if "Observation:" not in prefix:  # a ] in the thought, then the action, then run-on text
            return f"Thought: a [note] first.\nAction: search[{question}]{RUN_ON}"
        return f"Action: answer[{gold[question]}]{RUN_ON}"

    return plan


def test_react_turn_ends_at_the_action_bracket_not_the_thought(env, world, tok) -> None:
    task = world.train[0]
    policy = StreamPolicy(tok, _react_plan(world))
    (tree,), cost = _engine(policy, env).rollout([task], [1], seed=3)
    traj = next(iter(tree.trajectories.values()))
    first, answer = traj.turns
    expected = f"Thought: a [note] first.\nAction: search[{task.question}]"
    assert first.text == expected and first.action.arguments == {"query": task.question}
    plan_ids = tok.encode(expected + RUN_ON, add_special_tokens=False)
    assert first.assistant_ids == plan_ids[: len(first.assistant_ids)]  # exactly the sampled tokens
    assert first.logprobs == [-(i + 1) / 100 for i in range(len(first.assistant_ids))]  # both pieces joined
    # the observation follows at once: the forced mark, then the search result
    assert tok.decode(first.observation_ids) == OBSERVATION_MARK + REACT.render_observation(
        env.start(task).step(first.action))
    assert answer.text == f"Action: answer[{task.gold}]" and traj.reward == 1.0
    # the thought's ] stopped the row, the engine sampled on with a new seed; then one call for the answer
    assert [len(seeds) for seeds in policy.calls] == [1, 1, 1] and policy.calls[0] != policy.calls[1]
    assert traj.token_ids == traj.prompt_ids + first.assistant_ids + first.observation_ids + answer.assistant_ids
    assert traj.sampled == ([False] * len(traj.prompt_ids) + [True] * len(first.assistant_ids)
                            + [False] * len(first.observation_ids) + [True] * len(answer.assistant_ids))
    sampled_lps = [lp for lp, s in zip(traj.old_logprobs, traj.sampled, strict=True) if s]
    assert sampled_lps == first.logprobs + answer.logprobs
    assert cost.generated_tokens == len(first.assistant_ids) + len(answer.assistant_ids)

    # the same policy under the old stop rule runs every turn on to the token cap (and never answers:
    # without "Observation:" in its text it keeps planning the search turn)
    (old_tree,), old_cost = _engine(StreamPolicy(tok, _react_plan(world)), env, fmt=OldReact()).rollout(
        [task], [1], seed=3)
    old = next(iter(old_tree.trajectories.values()))
    assert [len(t.assistant_ids) for t in old.turns] == [128, 128, 128] and old.reward == 0.0
    assert old_cost.generated_tokens == 3 * 128 > 5 * cost.generated_tokens


def test_the_closing_token_keeps_its_tail(env, world, tok) -> None:
    """bpe ``"]."`` is one token: the turn ends on it, the parser ignores the ``.``."""
    task = world.train[0]
    written = f"Action: search[{task.question}]."
    assert tok.decode(tok.encode(written)[-1:]) == "]."
    policy = StreamPolicy(tok, lambda prefix: written + RUN_ON if "Observation:" not in prefix else "Action: answer[x]")
    (tree,), _ = _engine(policy, env).rollout([task], [1], seed=0)
    first = next(iter(tree.trajectories.values())).turns[0]
    assert first.text == written and first.action.arguments == {"query": task.question}
    assert tok.decode(first.observation_ids).startswith("\nObservation: ")  # the episode reads "].\nObservation: ..."


def test_a_turn_without_an_action_ends_at_the_cap(env, world, tok) -> None:
    policy = StreamPolicy(tok, lambda prefix: "Thought:" + " [a] [b]" * 40)
    (tree,), cost = _engine(policy, env, max_turns=1, max_turn_tokens=20).rollout(world.train[:1], [1], seed=0)
    turn = next(iter(tree.trajectories.values())).turns[0]
    assert len(turn.assistant_ids) == 20 and cost.generated_tokens == 20  # every ] sampled on; the cap ends it
    assert len(policy.calls) > 2 and turn.action.kind == "invalid"
    assert turn.logprobs == [-(i + 1) / 100 for i in range(20)]


# --- chat and Search-R1 -------------------------------------------------------------------------

DOCS = [Document("1", "Blue River", "Blue River is a novel by Ada Stone."),
        Document("2", "Ada Stone", "Ada Stone was born in Lumen.")]
TASK = Task("q1", "Where was the author of Blue River born?", ("Lumen",))


@pytest.fixture(scope="module")
def doc_env(tmp_path_factory) -> ToolEnvironment:
    index = SearchIndex(DOCS, cache_dir=tmp_path_factory.mktemp("bm25"))
    return ToolEnvironment(search_tools(index, top_k=1), EnvConfig(max_turns=4))


def test_chat_turn_ends_at_the_tool_call_outside_the_think_block(doc_env) -> None:
    from helpers_chat import chat_tokenizer

    ctok = chat_tokenizer()
    fmt = get_format("chat", tokenizer=ctok)
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "Blue River"}}\n</tool_call>'
    thought = f"<think>\nmaybe {call} is right\n</think>\n\n"

    def plan(prefix: str) -> str:
        return thought + call + " and more" * 30 if "<tool_response>" not in prefix else "<answer>Lumen</answer>"

    (tree,), _ = _engine(StreamPolicy(ctok, plan), doc_env, fmt=fmt).rollout([TASK], [1], seed=0)
    traj = next(iter(tree.trajectories.values()))
    first = traj.turns[0]
    assert first.text == thought + call and first.action.name == "search"
    assert ctok.decode(first.observation_ids).startswith(fmt.end_of_turn + "<|im_start|>user\n<tool_response>\n")
    assert traj.reward == 1.0 and traj.turns[1].text == "<answer>Lumen</answer>"


def test_search_r1_turn_ends_at_any_tool_closing_tag(doc_env, tok) -> None:
    fmt = SearchR1Format()
    thought = "<think> I could <search> Blue River </search> later </think> "

    def plan(prefix: str) -> str:
        if "<information>Ada" in prefix:  # the instruction itself mentions <information>
            return "<answer> Lumen </answer>"
        return thought + "<open> Ada Stone </open>" + RUN_ON

    (tree,), _ = _engine(StreamPolicy(tok, plan), doc_env, fmt=fmt).rollout([TASK], [1], seed=0)
    traj = next(iter(tree.trajectories.values()))
    first = traj.turns[0]
    assert first.text == thought + "<open> Ada Stone </open>"
    assert first.action.name == "open" and first.action.arguments == {"title": "Ada Stone"}
    assert tok.decode(first.observation_ids).startswith("\n\n<information>Ada Stone")
    assert traj.reward == 1.0


# --- a real model, many pieces per turn ---------------------------------------------------------


class EveryE(ReactFormat):
    """react with ``e`` as an extra stop that never ends a turn: a random model's turns come in
    many pieces, exercising the joining on a real backend."""

    def turn_stops(self, tools) -> tuple[str, ...]:
        return super().turn_stops(tools) + ("e",)


def test_pieces_join_into_exact_turns_on_a_real_model(env, world, tok) -> None:
    policy = HFPolicy(tiny_model(len(tok), seed=4), tok)

    def run(tasks, n):
        engine = _engine(policy, env, fmt=EveryE(), max_turns=2, max_turn_tokens=16, temperature=0.8)
        trees, _ = engine.rollout(tasks, n, tree_ids=[t.id for t in tasks], seed=11)
        return {(tr.group_id, leaf): tr for t in trees for leaf, tr in t.trajectories.items()}

    together = run(world.train[:2], [2, 2])
    pieces = 0
    for traj in together.values():
        assert_old_logprobs_recompute(policy.model, traj, 0.8)
        for turn in traj.turns:
            text = tok.decode(turn.assistant_ids, skip_special_tokens=False)
            pieces += text.count("e")
            assert turn.text == tok.decode(turn.assistant_ids, skip_special_tokens=True)
            # a turn ends only where the format says so, at EOS or at the cap
            assert (REACT.ends_turn(text) or turn.assistant_ids[-1] == tok.eos_token_id
                    or len(turn.assistant_ids) == 16)
    assert pieces > 4  # the extra stop did fire
    alone = run(world.train[:1], [2])  # per-piece seeds: a trajectory does not depend on its batch
    for key, traj in alone.items():
        assert together[key].token_ids == traj.token_ids
