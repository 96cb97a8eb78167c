"""Progress inside a step's rollout phase (tracerl/rollout/progress.py): the status line's text,
the counters the engine feeds, the heartbeat on a plain stream and the live line on a terminal."""

from __future__ import annotations

import io
import re
import threading

from helpers_tiny import ScriptedPolicy

from tracerl.agent.formats import get_format
from tracerl.envs.base import EnvConfig, ToolEnvironment
from tracerl.envs.tools import ToolSet
from tracerl.envs.verifiers import exact_match
from tracerl.rollout.engine import EngineConfig, RolloutEngine
from tracerl.rollout.progress import WIDTH, RolloutProgress, current_progress, step_progress

LINE = re.compile(r"rollouts \d+/\d+ \| tool calls in flight \d+ \| \d+ tok/s \| \d+:\d\d")


def test_the_status_line_reads_the_counters_and_fits_80_columns() -> None:
    progress = RolloutProgress(64)
    progress.rollouts, progress.tokens, progress.tools_in_flight = 12, 3000, 5
    assert progress.line(now=progress.started + 75) == "rollouts 12/64 | tool calls in flight 5 | 40 tok/s | 1:15"
    progress.rollouts, progress.planned, progress.tokens = 10**30, 10**30, 10**40
    assert len(progress.line(now=progress.started + 1)) == WIDTH


class Stream(io.StringIO):
    """A stream that says when something was written, and whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty, self.wrote = tty, threading.Event()

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        out = super().write(text)
        self.wrote.set()
        return out


def _engine(world, tok) -> RolloutEngine:
    gold = {t.question: t.gold for t in world.train}

    def respond(prefix: str) -> str:
        question = prefix.split("Question: ", 1)[1].split("\n", 1)[0]
        if prefix.count("Action:") == 0:
            return f"Thought: look it up.\nAction: search[{question}]\nObservation:"
        return f"Action: answer[{gold[question]}]"

    def search(query: str) -> str:
        """Answers at once."""
        return "known"

    env = ToolEnvironment(ToolSet([search]), EnvConfig(max_turns=3))
    return RolloutEngine(ScriptedPolicy(tok, respond), env, get_format("react"), exact_match,
                         EngineConfig(max_turns=3, max_turn_tokens=96, tool_concurrency=4))


def test_the_engine_counts_rollouts_and_tokens_into_the_active_phase_only(world, tok) -> None:
    engine = _engine(world, tok)
    _, before = engine.rollout(world.train[:1], [2], seed=0)  # outside a phase: nothing is counted
    assert current_progress().rollouts == 0
    with step_progress(6, stream=Stream(tty=False), heartbeat_s=3600) as progress:
        _, cost = engine.rollout(world.train[:3], [2, 2, 2], seed=0)
    assert (progress.rollouts, progress.tokens, progress.tools_in_flight) == (6, cost.generated_tokens, 0)
    assert cost.generated_tokens > before.generated_tokens > 0


def test_a_plain_stream_gets_heartbeat_lines() -> None:
    stream = Stream(tty=False)
    with step_progress(8, stream=stream, heartbeat_s=0.01):
        assert stream.wrote.wait(60)
    lines = stream.getvalue().splitlines()
    assert lines and all(LINE.fullmatch(line) for line in lines)
    assert "\r" not in stream.getvalue()


def test_a_terminal_gets_one_line_rewritten_in_place_and_cleared_at_the_end() -> None:
    stream = Stream(tty=True)
    with step_progress(8, stream=stream):
        assert stream.wrote.wait(60)
    text = stream.getvalue()
    assert "\n" not in text and text.endswith("\r" + " " * WIDTH + "\r")
    drawn = [part for part in text.split("\r") if part.strip()]
    assert drawn and all(LINE.fullmatch(part.rstrip()) and len(part) == WIDTH for part in drawn)
