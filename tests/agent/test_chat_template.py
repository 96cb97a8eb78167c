"""The ``chat`` format on a tokenizer's own chat template: token-exact prompts, turns and masks.

A byte-level BPE tokenizer with a Qwen3-like template (tests/helpers_chat.py) and a tiny random
Qwen3 are built here; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers_chat import chat_tokenizer, qwen3_thinking_template, qwen_like_template
from helpers_tiny import tiny_model

from tracerl.agent.chat_template import ChatTemplateFormat, has_usable_template
from tracerl.agent.formats import Qwen3MarkupFormat, get_format
from tracerl.core.types import Task
from tracerl.envs.base import EnvConfig, Observation, ToolEnvironment
from tracerl.envs.data import Document
from tracerl.envs.search import SearchIndex, search_tools
from tracerl.models.backend import Generation, HFPolicy
from tracerl.rollout.engine import EngineConfig, RolloutEngine

DOCS = [Document("1", "Blue River", "Blue River is a novel by Ada Stone."),
        Document("2", "Ada Stone", "Ada Stone was born in Lumen.")]
TASK = Task("q1", "Where was the author of Blue River born?", ("Lumen",))
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Blue River"}}\n</tool_call>'
OPEN = '<tool_call>\n{"name": "open", "arguments": {"title": "Ada Stone"}}\n</tool_call>'
ANSWER = "<answer>Lumen</answer>"


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> ToolEnvironment:
    index = SearchIndex(DOCS, cache_dir=tmp_path_factory.mktemp("bm25"))
    return ToolEnvironment(search_tools(index, top_k=1), EnvConfig(max_turns=6))


class ScriptedTurns:
    """A backend that replays fixed turns as canonical token ids, with or without ``<|im_end|>``."""

    def __init__(self, tokenizer, turns: list[tuple[str, bool]]) -> None:
        self.tokenizer, self.turns, self.calls, self.emitted = tokenizer, turns, 0, []

    def generate(self, prefixes, params, seeds=None, routing_keys=None):
        text, ends = self.turns[self.calls]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids += [self.tokenizer.convert_tokens_to_ids("<|im_end|>")] if ends else []
        reason = "eos" if ends else "stop"
        self.emitted += ids
        return [Generation(ids, [-0.5] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True), reason)
                for _ in prefixes]


def _engine(backend, env, fmt, **cfg) -> RolloutEngine:
    config = EngineConfig(**{"max_turns": 4, "max_turn_tokens": 64, "max_total_tokens": 1500, **cfg})
    return RolloutEngine(backend, env, fmt, lambda answer, task: float(answer == task.gold), config)


def test_chat_uses_the_template_when_there_is_one(tok) -> None:
    from helpers_tiny import word_tokenizer

    fmt = get_format("chat", tokenizer=tok)
    assert isinstance(fmt, ChatTemplateFormat)
    assert (fmt.system_role, fmt.renders_tools, fmt.observation_role) == (True, True, "tool")
    assert fmt.end_of_turn == "<|im_end|>\n" and fmt.stop_strings == ("</tool_call>", "</answer>", "<|im_end|>")
    plain = word_tokenizer()  # its template concatenates contents: no turn markup
    assert not has_usable_template(plain)
    assert isinstance(get_format("chat", tokenizer=plain), Qwen3MarkupFormat)
    assert isinstance(get_format("chat"), Qwen3MarkupFormat)


def test_prompt_ids_are_the_templates_own_tokenisation(tok, env) -> None:
    fmt = get_format("chat", tokenizer=tok, system="Be brief.", thinking=False)
    tools = [{"type": "function", "function": s} for s in env.tools.schemas()]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TASK.question}]
    expected = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                       return_dict=False, enable_thinking=False)
    assert fmt.prompt_ids(TASK, env.tools, tok) == list(expected)
    assert fmt.render_prompt(TASK, env.tools).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_episode_ids_equal_the_template_rendering_of_the_whole_conversation(tok, env) -> None:
    """Turn 1 ends with <|im_end|> (sampled), turn 2 on the stop string (end of turn forced)."""
    fmt = get_format("chat", tokenizer=tok)
    backend = ScriptedTurns(tok, [(CALL, True), (OPEN, False), (ANSWER, True)])
    engine = _engine(backend, env, fmt)
    trees, _ = engine.rollout([TASK], [1])
    traj = next(iter(trees[0].trajectories.values()))
    assert traj.reward == 1.0 and [t.action.kind for t in traj.turns] == ["tool", "tool", "answer"]
    messages = [{"role": "system", "content": fmt.system}, {"role": "user", "content": TASK.question}]
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.text})
        if turn.action.kind == "tool":
            messages.append({"role": "tool", "content": turn.observation})
    tools = [{"type": "function", "function": s} for s in env.tools.schemas()]
    whole = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
    # The last assistant turn ends at the sampled <|im_end|>; the template adds its "\n".
    assert list(whole) == traj.token_ids + tok.encode("\n", add_special_tokens=False)
    # (c) the sampled mask is True exactly on the tokens the policy emitted, in order
    assert [t for t, m in zip(traj.token_ids, traj.sampled, strict=True) if m] == backend.emitted
    forced = [t for t, m in zip(traj.token_ids, traj.sampled, strict=True) if not m]
    assert forced == traj.prompt_ids + traj.turns[0].observation_ids + traj.turns[1].observation_ids
    # (d) turn 1 sampled <|im_end|>: only "\n" is forced before the tool turn; turn 2 gets both
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    first, second = traj.turns[0].observation_ids, traj.turns[1].observation_ids
    assert traj.turns[0].assistant_ids[-1] == im_end and first[0] != im_end
    assert tok.decode(first[:2], skip_special_tokens=False) == "\n<|im_start|>"
    assert traj.turns[1].assistant_ids[-1] != im_end and second[:2] == tok.encode("<|im_end|>\n")


def test_qwen3_no_think_history_differs_only_by_the_past_empty_think_blocks(env) -> None:
    """Qwen3's template drops the empty think block of past turns when it re-renders a history, so
    the whole-conversation rendering legitimately differs from the ids the policy saw; the
    per-turn invariant holds: the difference is exactly those blocks."""
    tok = chat_tokenizer(template=qwen3_thinking_template())
    fmt = ChatTemplateFormat(tok, thinking=False)  # the reference turn's think block keeps it prefix-stable
    engine = _engine(ScriptedTurns(tok, [(CALL, True), (OPEN, False), (ANSWER, True)]), env, fmt)
    traj = next(iter(engine.rollout([TASK], [1])[0][0].trajectories.values()))
    messages = [{"role": "system", "content": fmt.system}, {"role": "user", "content": TASK.question}]
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.text})
        if turn.action.kind == "tool":
            messages.append({"role": "tool", "content": turn.observation})
    tools = [{"type": "function", "function": s} for s in env.tools.schemas()]
    whole = tok.apply_chat_template(messages, tools=tools, tokenize=False, enable_thinking=False)
    seen = tok.decode(traj.token_ids, skip_special_tokens=False)
    empty = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert seen.count(empty) == 3 and whole.count(empty) == 1
    assert whole == seen.replace(empty, "<|im_start|>assistant\n", 2) + "\n"


def test_construction_checks(tok) -> None:
    unstable = chat_tokenizer(template=qwen_like_template(prefix_stable=False))
    with pytest.raises(ValueError, match="not prefix-stable"):
        ChatTemplateFormat(unstable)
    strict = ChatTemplateFormat(chat_tokenizer(template=qwen_like_template(tool_role=False)))
    assert strict.observation_role == "user"
    obs = strict.render_observation(Observation("Ada Stone was born in Lumen.", False, False))
    assert obs == "<|im_end|>\n<|im_start|>user\nAda Stone was born in Lumen.<|im_end|>\n<|im_start|>assistant\n"
    no_system = ChatTemplateFormat(chat_tokenizer(template=qwen_like_template(system_role=False)), system="Sys.")
    tools = search_tools(SearchIndex(DOCS, use_cache=False))
    prompt = no_system.render_prompt(TASK, tools)
    assert not no_system.system_role and prompt.startswith("<|im_start|>user\nSys.")
    no_tools = ChatTemplateFormat(chat_tokenizer(template=qwen_like_template(tools=False)))
    listing = no_tools.render_prompt(TASK, tools)
    assert not no_tools.renders_tools and '"name": "search"' in listing and "<tool_call>" in listing


MISTRAL_LIKE = (  # user/assistant only, and the system text rides on the LAST user message
    "{%- set sys = messages[0].content if messages[0].role == 'system' else '' %}"
    "{%- set rest = messages[1:] if sys else messages %}{%- set ns = namespace(last=-1) %}"
    "{%- for m in rest %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in rest %}{%- if m.role == 'user' %}{{- '[INST] ' }}"
    "{%- if loop.index0 == ns.last and sys %}{{- sys + '\\n\\n' }}{%- endif %}{{- m.content + '[/INST]' }}"
    "{%- elif m.role == 'assistant' %}{{- ' ' + m.content + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported') }}{%- endif %}{%- endfor %}"
)


def test_a_template_that_moves_the_system_message_gets_it_in_the_first_user_turn() -> None:
    tok = chat_tokenizer(template=MISTRAL_LIKE)
    fmt = ChatTemplateFormat(tok, system="Sys.")
    assert (fmt.system_role, fmt.observation_role, fmt.end_of_turn) == (False, "user", "<|im_end|>")
    assert fmt.stop_strings[-1] == "<|im_end|>"
    tools = search_tools(SearchIndex(DOCS, use_cache=False))
    assert fmt.render_prompt(TASK, tools).startswith("[INST] Sys.\n\n# Tools")
    assert fmt.render_observation(Observation("Ada.", False, False)) == "<|im_end|>[INST] Ada.[/INST]"
    assert fmt.observation_ids(Observation("Ada.", False, False), tok.encode("x<|im_end|>"), tok) == tok.encode(
        "[INST] Ada.[/INST]")


def test_error_observation_names_the_tools(tok) -> None:
    fmt = ChatTemplateFormat(tok)
    obs = Observation("no action found", False, True, valid_actions=(("search", "query"), ("open", "title")))
    text = fmt.render_observation(obs)
    assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nError: no action found. Call one")
    assert fmt.render_observation(Observation("", True, False)) == ""


def test_random_model_rollout_through_the_engine(tok, env) -> None:
    fmt = get_format("chat", tokenizer=tok)
    policy = HFPolicy(tiny_model(len(tok), seed=3), tok)
    engine = _engine(policy, env, fmt, max_turns=3, max_turn_tokens=6, max_total_tokens=800)
    trees, cost = engine.rollout([TASK], [3], generator=torch.Generator().manual_seed(0))
    assert cost.rollouts == 3 and len(trees[0].trajectories) == 3
    prompt = fmt.prompt_ids(TASK, env.tools, tok)
    for traj in trees[0].trajectories.values():
        assert traj.prompt_ids == prompt
        ids = list(prompt)
        for turn in traj.turns:
            assert len(turn.logprobs) == len(turn.assistant_ids) and all(lp <= 0 for lp in turn.logprobs)
            ids += turn.assistant_ids
            if turn.action.kind != "answer":  # forced: the missing end of turn, then the tool message
                obs = Observation(turn.observation, False, turn.tool_error,
                                  valid_actions=(("search", "query"), ("open", "title")) if turn.tool_error else ())
                assert turn.observation_ids == fmt.observation_ids(obs, turn.assistant_ids, tok)
                assert tok.decode(turn.observation_ids).endswith("<|im_start|>assistant\n")
            ids += turn.observation_ids
        assert traj.token_ids == ids
        assert sum(traj.sampled) == sum(len(t.assistant_ids) for t in traj.turns)


def test_answer_ids_for_scoring_follow_the_format(tok) -> None:
    from tracerl.models.scoring import answer_token_ids

    opener, answer = answer_token_ids(tok, ChatTemplateFormat(tok), "Lumen")
    assert tok.decode(opener) == "<answer>" and tok.decode(answer).strip() == "Lumen"
    assert json.loads(json.dumps(ChatTemplateFormat(tok).describe()))


def test_hostile_tool_calls_run_through_the_engine_and_the_records(tok, env, tmp_path) -> None:
    """Parsing never raises, and nothing after it does either: an escaped lone surrogate and deep
    nesting become error observations the tokenizer accepts and records JSON can hold."""
    from tracerl.rollout.evaluate import evaluate

    surrogate = '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>'
    deep = '<tool_call>{"name": "search", "arguments": {"query": ' + "[" * 900 + "]" * 900 + "}}</tool_call>"
    huge = '<tool_call>{"name": "search", "arguments": {"query": ' + "9" * 5000 + "}}</tool_call>"
    turns = [(surrogate, True), (deep, False), (huge, True), (ANSWER, True)]
    engine = _engine(ScriptedTurns(tok, turns), env, get_format("chat", tokenizer=tok), max_turn_tokens=3000,
                     max_total_tokens=20000, max_turns=5)
    report = evaluate(engine, [TASK])
    report.write_jsonl(tmp_path / "records.jsonl")
    record = json.loads((tmp_path / "records.jsonl").read_text())
    errors = [t["observation"] for t in record["turns"][:3]]
    assert errors == ["unknown action ?", "search argument query must be of type string",
                      "the tool call is not valid JSON"]
    assert report.metrics["em"] == 1.0 and report.metrics["error_action_rate"] == 0.75


def test_a_long_observation_is_cut_inside_the_tool_message(tok, env) -> None:
    """The token limit covers the forced end of turn and markup; only the result text is cut."""
    fmt = get_format("chat", tokenizer=tok)
    full = fmt.observation_ids(Observation("Blue River: Blue River is a novel by Ada Stone.", False, False),
                               tok.encode("x"), tok)
    limit = len(full) - 3
    engine = _engine(ScriptedTurns(tok, [(CALL, False), (ANSWER, True)]), env, fmt, max_observation_tokens=limit)
    traj = next(iter(engine.rollout([TASK], [1])[0][0].trajectories.values()))
    forced = tok.decode(traj.turns[0].observation_ids, skip_special_tokens=False)
    assert len(traj.turns[0].observation_ids) <= limit < len(full)
    assert forced.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nBlue River:")
    assert forced.endswith(" ...\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
