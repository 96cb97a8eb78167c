"""Strangers' checkpoints, models, configs and data files, round three: each crafted input ends in
one error naming the file (and field), touches nothing outside, and never blocks or grows unbounded.

Library-level checks (fast); benchmarks/reliability/hostile_inputs.py runs the same cases through the CLI.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tracerl.config.loading import ConfigError, check_keys, load_yaml
from tracerl.config.no_import import unresolved_yaml
from tracerl.config.schema import TrainConfig, resolve_config
from tracerl.core.registry import RegistryError
from tracerl.core.types import Task
from tracerl.envs.bounded import open_regular, printable
from tracerl.envs.convert import convert
from tracerl.envs.data import load_tasks
from tracerl.envs.manifest import MANIFEST, publish, write_temp_lines
from tracerl.envs.verifiers import VERIFIERS, GuardedVerifier, VerifierError, get_verifier
from tracerl.errors import UserError
from tracerl.runs.checkpoint import RESUME_FIELDS, CheckpointError, RngState, check_trainer_state
from tracerl.runs.folder import LOCK_FILE, RunFolderError, RunLock
from tracerl.runs.initial import REFERENCE_FILE, initial_source
from tracerl.runs.metrics import MAX_METRIC_KEYS, parse_metrics
from tracerl.runs.rollout_log import RolloutRecordError, record_lines
from tracerl.runs.state import check_optimizer_shapes, refuse_foreign_config

SECRET = "SECRET content outside the run folder\n"
TASK = '{{"id": "{i}", "question": "Who is {i}?", "answers": ["A{i}"]}}\n'


def _returns_within(seconds: float, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised (None if none). Fails if it is still running:
    a blocking open would otherwise hang the test run instead of failing it."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds} s (a blocking open?)"
    return outcome[0]


# --- B3: a hard-linked .lock -----------------------------------------------------------------


def test_hard_linked_lock_moves_to_its_own_file(tmp_path: Path) -> None:
    outside, run = tmp_path / "secret.txt", tmp_path / "run"
    outside.write_text(SECRET)
    run.mkdir()
    os.link(outside, run / LOCK_FILE)
    lock = RunLock(run)
    assert outside.read_text() == SECRET  # the holder's record went into a new file
    assert os.stat(run / LOCK_FILE).st_nlink == 1 and json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(RunFolderError, match="in use"):  # still locked: the lock moved, it never lapsed
        RunLock(run)
    lock.release()


# --- B4, B14, B15: no blocking open, no unbounded read ---------------------------------------


def test_fifos_and_devices_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    assert isinstance(_returns_within(10, lambda: open_regular(fifo)), UserError)
    assert isinstance(_returns_within(10, lambda: load_tasks(fifo)), UserError)
    config = tmp_path / "config.yaml"
    os.mkfifo(config)
    error = _returns_within(10, lambda: load_yaml(config))
    assert isinstance(error, ConfigError) and "not a regular file" in str(error)
    step = tmp_path / "step-000001.jsonl.gz"
    os.mkfifo(step)
    error = _returns_within(10, lambda: list(record_lines(step)))
    assert isinstance(error, RolloutRecordError) and str(step) in str(error)
    zero = tmp_path / "tasks.json"
    zero.symlink_to("/dev/zero")
    error = _returns_within(10, lambda: load_tasks(zero))
    assert isinstance(error, UserError) and "not a regular file" in str(error)


# --- B5: the user's own config.yaml in --out ---------------------------------------------------


def test_fresh_start_refuses_a_foreign_config_yaml(tmp_path: Path) -> None:
    mine = tmp_path / "config.yaml"
    refuse_foreign_config(mine, b"steps: 2\n")  # none there: fine
    mine.write_text("steps: 2\n")
    refuse_foreign_config(mine, b"steps: 2\n")  # the very text the run would write: no loss
    with pytest.raises(RunFolderError, match="already exists and is not this run's config"):
        refuse_foreign_config(mine, b"steps: 3\n")
    assert mine.read_text() == "steps: 2\n"


# --- B6, B7, and converters meeting converted files --------------------------------------------


def _converted(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    rows = [json.loads(TASK.format(i=i)) for i in range(3)]
    publish(data, {"tasks.jsonl": write_temp_lines(data / "tasks.jsonl", rows)})
    return data


@pytest.mark.parametrize("entry, field", [("x", "files.tasks.jsonl"), ('{"records": [3], "bytes": 1, "sha256": "0"}',
                                                                         "files.tasks.jsonl.records"),
                                          ('{"records": 1e400, "bytes": 1, "sha256": "0"}', "files.tasks.jsonl.records")])
def test_crafted_manifest_entry_is_one_error_naming_the_field(tmp_path: Path, entry: str, field: str) -> None:
    data = _converted(tmp_path)
    value = json.dumps(entry) if entry == "x" else entry
    (data / MANIFEST).write_text(f'{{"kind": "tracerl data convert", "status": "complete", '
                                 f'"files": {{"tasks.jsonl": {value}}}}}')
    with pytest.raises(UserError, match=f"{field} must be"):
        load_tasks(data / "tasks.jsonl")


def _musique(i: int, idx: str = "0") -> str:
    row = {"id": f"m{i}", "question": f"Who is {i}?", "answer": f"A{i}", "answerable": True,
           "paragraphs": [{"idx": 0, "title": f"T{i}", "paragraph_text": f"T{i} is A{i}.", "is_supporting": True}]}
    return json.dumps(row).replace('"idx": 0', f'"idx": {idx}')


def test_one_musique_row_with_infinite_idx_is_skipped_and_listed(tmp_path: Path) -> None:
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join([_musique(1), _musique(2, "Infinity"), _musique(3)]) + "\n")
    report = convert("musique", raw, tmp_path / "out")
    assert report.tasks == 2 and report.documents == 2
    assert len(report.errors) == 1 and report.errors[0].startswith(f"{raw}:2: ") and "'idx'" in report.errors[0]


def test_converter_recognises_a_converted_file(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(TASK.format(i=i) for i in range(20)))
    with pytest.raises(UserError, match="already in tracerl's task format") as caught:
        convert("musique", tasks, tmp_path / "out")
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


def test_raw_musique_as_tasks_says_convert_it(tmp_path: Path) -> None:
    raw = tmp_path / "raw.jsonl"
    raw.write_text(_musique(1) + "\n")
    with pytest.raises(UserError, match="tracerl data convert musique"):
        load_tasks(raw)


# --- B8, B13: metrics.jsonl ---------------------------------------------------------------------


@pytest.mark.parametrize("step", ["null", "1e400", "[3]", '"1"', "-1", "true"])
def test_metrics_step_of_the_wrong_type_names_line_and_field(tmp_path: Path, step: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n' + f'{{"step": {step}, "loss": 0.5}}\n')
    with pytest.raises(ValueError, match=f"{path}:2: field 'step' must be a non-negative integer"):
        parse_metrics(path)


def test_metrics_with_too_many_distinct_keys_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, **{f"k{s}_{i}": 1 for i in range(MAX_METRIC_KEYS // 3)}}) + "\n"
                            for s in range(4)))
    with pytest.raises(ValueError, match=f"{path}:4: more than {MAX_METRIC_KEYS} distinct metric keys"):
        parse_metrics(path)


# --- B9: trainer.pt that loads safely but is malformed -------------------------------------------


def _state() -> dict[str, Any]:
    return {"step": 2, "cursor": 4, "totals": {"rollouts": 8}, "optimizer": None, "scheduler": {"last_epoch": 2},
            "predictor": None, "rng": RngState.capture(torch.Generator()).to_dict()}


@pytest.mark.parametrize("edit, field", [
    (lambda s: {}, "step"), (lambda s: [1], None), (lambda s: {**s, "step": "2"}, "step"),
    (lambda s: {**s, "totals": {"rollouts": "8"}}, "totals"),
    (lambda s: {**s, "rng": {**s["rng"], "torch": torch.zeros(3, dtype=torch.uint8)}}, "rng.torch"),
    (lambda s: {**s, "rng": {**s["rng"], "python": {"version": 3, "state": [1, 2], "gauss": None}}}, "rng.python"),
])
def test_malformed_trainer_state_names_the_field(edit: Callable[[dict[str, Any]], Any], field: str | None) -> None:
    check_trainer_state(_state(), Path("trainer.pt"), require=RESUME_FIELDS)  # the real layout passes
    with pytest.raises(CheckpointError, match=f"trainer.pt: field '{field}'" if field else "trainer.pt holds a list"):
        check_trainer_state(edit(_state()), Path("trainer.pt"), require=RESUME_FIELDS)


def test_optimizer_state_of_the_wrong_shape_is_named() -> None:
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters())
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    check_optimizer_shapes(optimizer)
    state = optimizer.state_dict()
    state["state"][0]["exp_avg"] = torch.zeros(2, 2)  # the weight is (2, 3)
    optimizer.load_state_dict(state)  # torch checks group sizes only
    with pytest.raises(ValueError, match=r"state 'exp_avg' has shape \(2, 2\), its parameter \(2, 3\)"):
        check_optimizer_shapes(optimizer)


# --- B11: initial/reference.json with fields of the wrong types -----------------------------------


@pytest.mark.parametrize("record, field", [({"path": 3, "fingerprint": {}}, "path"),
                                           ({"path": "/x", "fingerprint": [1]}, "fingerprint"),
                                           ({"path": "/x", "fingerprint": {"config_sha256": "a", "files": []}},
                                            "fingerprint.files"),
                                           ([1, 2], None)])
def test_reference_json_types_are_checked(tmp_path: Path, record: Any, field: str | None) -> None:
    (tmp_path / REFERENCE_FILE).write_text(json.dumps(record))
    with pytest.raises(RunFolderError, match=f"field '{field}'" if field else "must hold a JSON object"):
        initial_source(tmp_path)


# --- B16, B17: escapes and ranges at config load ---------------------------------------------------


def test_control_characters_of_a_strangers_config_are_escaped() -> None:
    assert printable("a\x1b]0;x\x07b\x9bc\td") == "a\\x1b]0;x\\x07b\\x9bc\td"
    with pytest.raises(ConfigError) as caught:
        check_keys(TrainConfig, {"\x1b[2Jclear": 1})
    assert "\x1b" not in str(caught.value) and "\\x1b[2Jclear" in str(caught.value)


def test_world_sizes_are_range_checked_at_load() -> None:
    with pytest.raises(ConfigError, match=r"data.world.num_people = 1000000000 is out of range: it must lie in \[0, "):
        resolve_config("grpo", overrides=["data.world.num_people=1000000000"])


# --- plug-ins: signatures at load, verifier failures counted ------------------------------------


def test_a_verifier_of_the_wrong_shape_is_refused_at_load() -> None:
    with pytest.raises(RegistryError, match=r"verifier 'os:system' takes \(command\); it is called as f\(answer, task\)"):
        VERIFIERS.get("os:system")
    with pytest.raises(ConfigError, match="data.verifier"):
        resolve_config("grpo", overrides=["data.verifier=os:system"])


def test_verifier_failures_count_and_stop_after_a_streak(capsys: pytest.CaptureFixture[str]) -> None:
    replies: list[Any] = [1.0, "1.0", float("nan"), 1e308, 0.5]

    def flaky(answer: str, task: Task) -> Any:
        reply = replies.pop(0) if replies else None
        if reply is None:
            raise ConnectionError("judge down")
        return reply

    guarded = GuardedVerifier(flaky, "judge", max_failed_calls=4)
    task = Task("t", "Q?", ("A",))
    assert [guarded("a", task) for _ in range(5)] == [1.0, 0.0, 0.0, 0.0, 0.5]  # three failures, then a success
    assert guarded.failures == 3 and guarded.streak == 0
    assert capsys.readouterr().err.count("\n") == 1  # the first failure, once
    assert [guarded("a", task) for _ in range(3)] == [0.0, 0.0, 0.0]
    with pytest.raises(VerifierError, match=r"verifier 'judge' failed 4 calls in a row \(last: raised ConnectionError"):
        guarded("a", task)
    assert get_verifier("em")("A", task) == 1.0  # built-ins are not wrapped


# --- a stranger's config read without importing it -------------------------------------------------


def test_config_show_no_import_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported.txt"
    (tmp_path / "their_plugin_r3.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                                 "def verify(answer, task):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "their.yaml"
    config.write_text("data:\n  verifier: their_plugin_r3:verify\n  tools: [their_plugin_r3:verify]\n")
    text = unresolved_yaml("grpo", config_file=config)
    assert not marker.exists()
    assert "# data.verifier = 'their_plugin_r3:verify' would import" in text and "# data.tools =" in text


# --- B12: a stranger's chat template runs under a time, memory and size limit ----------------------


LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
DOUBLING = ("{% set s = namespace(x='ab') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}{% endfor %}"
            "{{ messages[0].content }}")
HUGE = "{% for i in range(100000) %}{{ messages[0].content * 20 }}{% endfor %}"


@pytest.fixture(scope="module")
def chat_tok() -> Any:
    from helpers_chat import chat_tokenizer

    return chat_tokenizer()


@pytest.mark.parametrize("template, timeout, why", [(LOOPS, 1, "it ran past 1 s"), (DOUBLING, 20, "MiB of memory"),
                                                    (HUGE, 20, "characters, more than 1000000")])
def test_a_hostile_chat_template_is_stopped(chat_tok: Any, template: str, timeout: float, why: str) -> None:
    from tracerl.agent.template_sandbox import TemplateLimitError, TemplateSandbox

    messages = [{"role": "user", "content": "hello there"}]
    honest = TemplateSandbox(chat_tok, timeout_s=5)
    assert honest.render(messages, add_generation_prompt=True) == chat_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)  # the sandbox renders what the tokenizer renders
    honest.close()
    hostile = TemplateSandbox(chat_tok, timeout_s=timeout, memory_mib=256, max_chars=1_000_000)
    original, chat_tok.chat_template = chat_tok.chat_template, template
    try:
        error = _returns_within(60, lambda: hostile.render(messages))
        assert isinstance(error, TemplateLimitError) and why in str(error), error
        assert hostile._process is None  # killed, not left running
        with pytest.raises(TemplateLimitError):  # and not run again
            hostile.render(messages)
    finally:
        chat_tok.chat_template = original


def test_a_fresh_start_on_a_live_folder_says_in_use(tmp_path: Path) -> None:
    from tracerl.runs.folder import refuse_if_state

    (tmp_path / "metrics.jsonl").write_text("")
    lock = RunLock(tmp_path)
    with pytest.raises(RunFolderError, match=f"in use by another tracerl process \\(pid {os.getpid()} on host"):
        refuse_if_state(tmp_path)
    lock.release()
    with pytest.raises(RunFolderError, match=r"already holds run state \(metrics.jsonl\)"):
        refuse_if_state(tmp_path)
