"""A newcomer's first hour: nothing ignored silently, one-line usage errors, a console that fits.

Each test here failed on the code before these fixes: data paths without ``data.source`` trained
on SynthWiki; a resume to a step already reached did nothing and exited 0 in silence; ``config
show`` printed configs whose data ``train`` refused; usage errors were a multi-line panel; the
progress line was empty below ~200 columns.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracerl.cli import app, main
from tracerl.config.schema import resolve_config
from tracerl.runs.console import footer, header, progress_line

TASKS = "".join(f'{{"id": "{i}", "question": "Who is A{i}?", "answers": ["A{i}"]}}\n' for i in range(4))
DOC = '{"id": "d", "title": "Ada", "text": "Ada is a writer."}\n'


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(app, list(args))


def one_stderr_line(result, code: int) -> str:  # noqa: ANN001
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def data_files(tmp_path: Path, tasks: str = TASKS) -> list[str]:
    (tmp_path / "tasks.jsonl").write_text(tasks)
    (tmp_path / "corpus.jsonl").write_text(DOC)
    return [f"data.tasks={tmp_path / 'tasks.jsonl'}", f"data.corpus={tmp_path / 'corpus.jsonl'}"]


# --- 1. data paths are never ignored -------------------------------------------------------------


def test_data_paths_without_a_source_mean_files(tmp_path: Path) -> None:
    config = resolve_config("grpo", smoke="random", overrides=data_files(tmp_path))
    assert config.data.source == "files" and config.data.tasks.endswith("tasks.jsonl")


def test_synthwiki_beside_data_paths_is_refused_in_one_line(tmp_path: Path) -> None:
    sets = [a for s in [*data_files(tmp_path), "data.source=synthwiki"] for a in ("--set", s)]
    out = tmp_path / "run"
    line = one_stderr_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), *sets), 1)
    assert line.startswith("train failed: data.tasks and data.corpus are set but data.source = 'synthwiki'")
    assert not out.exists()


# --- 5. config show runs train's checks ----------------------------------------------------------


def test_config_show_refuses_the_data_train_refuses(tmp_path: Path) -> None:
    bad = TASKS + '{"id": "9", "question": "no answers"}\n'
    sets = [a for s in data_files(tmp_path, bad) for a in ("--set", s)]
    train = one_stderr_line(invoke("train", "grpo", "--smoke-random", "--out", str(tmp_path / "run"), *sets), 1)
    show = one_stderr_line(invoke("config", "show", "grpo", "--smoke-random", *sets), 1)
    assert "tasks.jsonl:5" in train and show.removeprefix("config show failed: ") == train.removeprefix("train failed: ")


# --- 3. resume says what it does -------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("first-hour") / "run"
    result = CliRunner().invoke(app, ["train", "grpo", "--smoke-random", "--steps", "2", "--out", str(out),
                                      "--set", "rollout.engine.max_turns=2", "--set", "eval.size=2"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("steps", [["--steps", "2"], ["--steps", "1"], []])
def test_a_resume_with_nothing_to_train_says_so(finished_run: Path, steps: list[str]) -> None:
    line = one_stderr_line(invoke("train", "--resume", str(finished_run), *steps), 1)
    assert f"is already at step 2 ({finished_run / 'ckpt-000002'})" in line and "give --steps above 2" in line
    assert len((finished_run / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_resume_names_the_checkpoint_it_loaded(finished_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    result = invoke("train", "--resume", str(run), "--steps", "3")
    assert one_stderr_line(result, 0) == f"resuming {run} from {run / 'ckpt-000002'} (step 2) to step 3"


# --- 8. version and usage errors -------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from tracerl import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"tracerl {__version__}\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["train", "--stpes", "3"], "tracerl train: No such option: --stpes"),
    (["bogus"], "tracerl: No such command 'bogus'."),
    (["view"], "tracerl view: Missing argument 'run_dir'."),
    (["train", "grpo", "--steps", "x"], "tracerl train: Invalid value for '--steps'"),
])
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(needle) and err.rstrip().endswith("--help)")


# --- 12. the console -------------------------------------------------------------------------------

RECORD = {"step": 37, "reward_mean": 0.28125, "effective_ratio": 0.5, "loss": -0.0123, "eval_accuracy": 0.22,
          "rollouts": 64, "generated_tokens": 4096, "step_seconds": 1.9, "infra_failed": 0}


@pytest.mark.parametrize("width", [80, 100])
def test_progress_line_fits_80_and_100_columns(width: int) -> None:
    line = progress_line(RECORD, total=200, elapsed=74.0, done=37, width=width)
    assert len(line) <= width
    # 74 s for 37 steps: 2 s a step, 163 to go -> 326 s = 5:26
    assert line.startswith("step 37/200  1:14 ETA 5:26  eval 0.220  reward 0.281  mixed 0.500")
    assert line.endswith("loss -0.012")


def test_progress_line_drops_metrics_not_the_clock_and_shows_faults_first() -> None:
    narrow = progress_line(RECORD, total=200, elapsed=74.0, done=37, width=40)
    assert narrow == "step 37/200  1:14 ETA 5:26  eval 0.220"
    faulty = progress_line({**RECORD, "infra_failed": 3}, total=200, elapsed=74.0, done=37, width=100)
    assert "ETA 5:26  infra_failed=3  eval 0.220" in faulty


def test_the_width_is_the_terminal_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracerl.runs.console import terminal_width

    monkeypatch.setenv("COLUMNS", "80")
    assert terminal_width() == 80
    monkeypatch.setenv("COLUMNS", "20")
    assert terminal_width() == 40  # never narrower than the clock needs


def test_header_and_footer(tmp_path: Path) -> None:
    config = resolve_config("trace", overrides=["steps=200"])
    assert header(config, tmp_path, 990_000, 0, width=1000) == (
        f"train trace | model tiny (default), 0.99M parameters | format react | run {tmp_path} | device cpu | "
        "steps 0 -> 200")
    records = [{"step": 10, "eval_accuracy": 0.1}, {"step": 20, "eval_accuracy": 0.25, "eval_f1": 0.3, "eval_turns": 2.5},
               {"step": 21}]
    assert footer(records, tmp_path / "ckpt-000021", width=1000) == (
        f"final evaluation at step 20: accuracy 0.250, F1 0.300, turns 2.500 | checkpoint {tmp_path / 'ckpt-000021'}")


def test_train_prints_header_lines_and_footer(finished_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    lines = CliRunner().invoke(app, ["train", "--resume", str(run), "--steps", "4"], env={"COLUMNS": "80"}).stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("step 3/4"))  # the header may take lines
    head, steps, foot = " ".join(lines[:first]), lines[first:first + 2], " ".join(lines[first + 2:])
    assert head.startswith("train grpo | model random-tiny, ") and head.endswith(" steps 2 -> 4")
    assert [line.split("  ")[0] for line in steps] == ["step 3/4", "step 4/4"]
    assert all(len(line) <= 80 and " ETA " in line and "reward " in line for line in steps)
    assert foot.startswith("final evaluation at step 4: accuracy ") and foot.endswith(str(run / "ckpt-000004"))


def test_pretrain_prints_an_eta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from tracerl.testbed.tiny import pretrain_tiny_model
    from tracerl.testbed.tiny_config import PRESETS

    pretrain_tiny_model(replace(PRESETS["smoke"], steps=2), tmp_path / "m")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pretrain step")]
    assert [line.split(" loss")[0] for line in lines] == ["pretrain step 1/2", "pretrain step 2/2"]
    assert all(" elapsed, ETA " in line for line in lines) and lines[-1].endswith("ETA 0:00")


# --- 2. tool names the tokenizer cannot spell --------------------------------------------------------


def zorblat(quux: str) -> str:
    """A tool whose name and argument are in no SynthWiki vocabulary."""
    return quux


def population(quux: str) -> str:
    """A known word as a tool name, with an unknown argument name."""
    return quux


@pytest.mark.parametrize(("tool", "needle"), [
    ("zorblat", "the tokenizer cannot encode tool name 'zorblat'"),
    ("population", "the tokenizer cannot encode argument 'quux' of tool 'population'"),
])
def test_a_tool_name_the_model_cannot_read_is_refused(finished_run: Path, tmp_path: Path, tool: str, needle: str) -> None:
    fixed_vocabulary = finished_run / "initial"  # a saved word-level tokenizer that never saw the tool
    out = tmp_path / "run"
    line = one_stderr_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), "--set", f"data.tools=[{__name__}:{tool}]",
                                  "--set", f"model.name_or_path={fixed_vocabulary}", "--set", "model.tool_list=true"), 1)
    assert line.startswith(f"train failed: {needle}")
    assert not (out / "metrics.jsonl").exists()


def test_a_random_tiny_vocabulary_includes_the_runs_tools(tmp_path: Path) -> None:
    from tracerl.train.loop import Trainer

    config = resolve_config("grpo", smoke="random", overrides=[f"data.tools=[{__name__}:zorblat]", "model.tool_list=true"])
    with Trainer(config, tmp_path / "run") as trainer:
        ids = trainer.fmt.prompt_ids(trainer.data.train[0], trainer.data.environment.tools, trainer.tokenizer)
        assert trainer.tokenizer.unk_token_id not in ids
        assert "zorblat[quux]" in trainer.tokenizer.decode(ids)


def test_markup_the_tokenizer_cannot_read_is_a_warning_naming_the_words() -> None:
    from tracerl.agent.formats import get_format
    from tracerl.core.types import Task
    from tracerl.envs.coverage import check_tool_coverage
    from tracerl.envs.tools import ToolSet
    from tracerl.testbed.tiny import build_tiny_tokenizer

    def search(query: str) -> str:
        """Search."""
        return query

    task = Task(id="q", question="Where was Ada Stone born?", answers=("Lumen",))
    word_level = build_tiny_tokenizer(["Question: Where was Ada Stone born?\nsearch[query] answer[text]"])
    listed = check_tool_coverage(word_level, ToolSet([search]), get_format("react", tool_list=True), task)
    assert listed == ["the prompt's markup and tool list have words the tokenizer encodes as <unk>: 'Actions:'"]
    assert check_tool_coverage(word_level, ToolSet([search]), get_format("react", tool_list=False), task) == []


# --- 4. a smoke run that exercises tools, rewards and credit ---------------------------------------


def test_smoke_pretrained_calls_tools_rewards_episodes_and_scores_credit(tmp_path: Path) -> None:
    import json

    out = tmp_path / "run"  # pretrains the smoke model once (about 30 s on one core), then cached
    result = invoke("train", "trace", "--smoke", "--steps", "2", "--out", str(out), "--set", "eval.size=2")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tool_calls"] > 0 and r["readiness_gain_mean"] is not None for r in records)
    assert max(r["reward_mean"] for r in records) > 0 and max(r["effective_ratio"] for r in records) > 0
    assert "model.name_or_path: tiny" not in (out / "config.yaml").read_text()  # YAML nests it
    assert "tiny_preset: smoke" in (out / "config.yaml").read_text()


def test_the_demo_ends_saying_where_tracerl_is_and_what_to_run_next() -> None:
    import sys

    from tracerl.train.demo import next_steps

    line = next_steps(Path("demo_out/run"))
    assert line.startswith(f"tracerl is {Path(sys.executable).parent / 'tracerl'} (")
    assert line.endswith("Next: tracerl eval --run demo_out/run; tracerl view demo_out/run; tracerl plot demo_out/run")
