"""A newcomer's first hour, round two: mistakes that say so, a Python trainer that resumes, screens that fit.

Each test failed on the code before these fixes: a mistyped local model folder went to the Hub
(60 s of retries, then a network error); a chat-template model trained on the react prompt; an
env-check of tasks over another dataset's corpus exited 0 and training on that pair ran; own data
with the embedded model started its pretraining before the coverage check; the Python example run
twice pointed to the CLI's ``--resume``; ``config show --explain`` needed a preset; the header
wrapped mid-word at 80 columns.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from helpers_cli import invoke, one_line
from tracerl.config.checks import check_model_source, looks_local
from tracerl.config.loading import ConfigError
from tracerl.config.model_format import format_reason
from tracerl.config.schema import resolve_config
from tracerl.envs.health import MIN_REACHABILITY, ReachabilityError, check_reachability
from tracerl.errors import UserError
from tracerl.runs.console import fit, footer, header
from tracerl.train.preflight import checked_config

# --- 1. a local-looking model path that does not exist --------------------------------------------


@pytest.mark.parametrize("value", ["testbed/tiny_bpe", "./models/x", "/no/such/model", "~/no-such-model", "a/b/c"])
def test_a_missing_local_folder_is_one_line_without_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                value: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the Hub would be tried if the path were taken for an id
    (tmp_path / "testbed" / "tiny-bpe").mkdir(parents=True)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        resolve_config("grpo", overrides=[f"model.name_or_path={value}"])
    assert time.perf_counter() - start < 10  # a hang check: the Hub's retries took 60 s
    message = str(err.value)
    assert message.startswith(f"model.name_or_path = {value!r}: no such folder (") and "\n" not in message


def test_hub_ids_are_still_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    (tmp_path / "testbed").mkdir()
    assert [looks_local(v) for v in ("Qwen/Qwen3-0.6B", "gpt2", "testbed/x", "org/a/b", "./x")] == [
        False, False, True, True, True]
    note = check_model_source("someone/some-model")  # no local 'someone/' folder: a Hub id, fetched later
    assert note is not None and "fetched from the Hugging Face Hub" in note


# --- 2. the chat format from the tokenizer's template ---------------------------------------------


def model_folder(tmp_path: Path, template: bool) -> Path:
    """A model folder as far as the config checks read it: config.json and the tokenizer's files."""
    folder = tmp_path / ("chat-model" if template else "plain-model")
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    if template:
        (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def test_a_chat_template_means_chat_unless_the_format_is_set(tmp_path: Path) -> None:
    chat, plain = model_folder(tmp_path, True), model_folder(tmp_path, False)
    assert resolve_config("grpo", overrides=[f"model.name_or_path={chat}"]).model.format == "chat"
    assert resolve_config("grpo", overrides=[f"model.name_or_path={plain}"]).model.format == "react"
    kept = resolve_config("grpo", overrides=[f"model.name_or_path={chat}", "model.format=react"])
    assert kept.model.format == "react"
    assert resolve_config("grpo").model.format == "react"  # the embedded tiny model (its tokenizer has a template)
    assert format_reason("chat", str(chat)) == "the tokenizer has a chat template"
    assert format_reason("react", str(plain)) == "the tokenizer has no chat template"
    assert format_reason("react", str(chat)) == "set by model.format"
    assert format_reason("react", "tiny") == "the embedded tiny models' format"
    # ... also given by its folder (a shipped or pretrained tiny model carries tiny_config.json and a template)
    (chat / "tiny_config.json").write_text("{}")
    assert resolve_config("grpo", overrides=[f"model.name_or_path={chat}"]).model.format == "react"
    assert format_reason("react", str(chat)) == "the embedded tiny models' format"


def test_a_template_in_tokenizer_config_counts(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, False)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert resolve_config("grpo", overrides=[f"model.name_or_path={folder}"]).model.format == "chat"


# --- 3. reachability: env-check's floor and train's refusal --------------------------------------

TASKS = "".join(json.dumps({"id": str(i), "question": f"Where was Ada {i} born?", "answers": ["Paris"],
                            "supporting_titles": ["Ada"]}) + "\n" for i in range(6))
ELSEWHERE = json.dumps({"id": "d", "title": "Ada", "text": "Ada wrote about engines."}) + "\n"
HERE = json.dumps({"id": "d", "title": "Ada", "text": "Ada was born in Paris."}) + "\n"


def data_pair(tmp_path: Path, corpus: str, tasks: str = TASKS) -> tuple[Path, Path]:
    (tmp_path / "tasks.jsonl").write_text(tasks)
    (tmp_path / "corpus.jsonl").write_text(corpus)
    return tmp_path / "tasks.jsonl", tmp_path / "corpus.jsonl"


def test_check_reachability_is_a_floor() -> None:
    assert MIN_REACHABILITY == 0.5
    check_reachability(0.5, 0.5, 10, "x", "y")  # at the floor passes
    check_reachability(0.0, 0.0, 10, "x", "y")  # 0 is off
    with pytest.raises(ReachabilityError, match=r"^answer_reachability 0.035 is below 0.5 on 200 tasks \(lower it\): .* \(pair\)$"):
        check_reachability(0.035, 0.5, 200, "pair", "lower it")


def test_env_check_exits_1_below_the_floor(tmp_path: Path) -> None:
    tasks, corpus = data_pair(tmp_path, ELSEWHERE)
    result = invoke("env-check", "--tasks", str(tasks), "--corpus", str(corpus))
    assert json.loads(result.stdout)["answer_reachability"] == 0.0  # the JSON still comes first
    one_line(result, "answer_reachability 0.000 is below 0.5", "--min-reachability 0")
    assert invoke("env-check", "--tasks", str(tasks), "--corpus", str(corpus), "--min-reachability", "0").exit_code == 0
    tasks, corpus = data_pair(tmp_path, HERE)
    assert invoke("env-check", "--tasks", str(tasks), "--corpus", str(corpus)).exit_code == 0


def test_train_refuses_a_pair_below_the_floor_unless_told(tmp_path: Path) -> None:
    tasks, corpus = data_pair(tmp_path, ELSEWHERE)
    sets = [f"data.tasks={tasks}", f"data.corpus={corpus}"]
    with pytest.raises(ReachabilityError, match="set data.min_reachability=0 to train anyway"):
        checked_config("grpo", smoke="random", overrides=sets)
    checked_config("grpo", smoke="random", overrides=[*sets, "data.min_reachability=0"])
    out = tmp_path / "run"
    args = [a for s in sets for a in ("--set", s)]
    one_line(invoke("train", "grpo", "--smoke-random", "--out", str(out), *args), "train failed: answer_reachability")
    assert not out.exists()


def test_tasks_citing_nothing_are_noted_not_judged(tmp_path: Path) -> None:
    bare = TASKS.replace(', "supporting_titles": ["Ada"]', "")
    tasks, corpus = data_pair(tmp_path, ELSEWHERE, bare)
    _, notes = checked_config("grpo", smoke="random", overrides=[f"data.tasks={tasks}", f"data.corpus={corpus}"])
    assert notes == [f"data.min_reachability not checked: 6 of the first 6 tasks in {tasks} cite no supporting_ids "
                     "or supporting_titles"]


# --- 4. coverage before any pretraining -----------------------------------------------------------


def test_own_data_the_tiny_model_cannot_read_is_refused_before_pretraining(tmp_path: Path) -> None:
    tasks = "".join(json.dumps({"id": str(i), "question": "Qwxz vrrp?", "answers": ["Zyxwvutsr"]}) + "\n"
                    for i in range(4))
    tasks_path, corpus = data_pair(tmp_path, ELSEWHERE, tasks)
    sets = [f"data.tasks={tasks_path}", f"data.corpus={corpus}", "model.tiny_preset=smoke"]
    with pytest.raises(UserError, match=r"^model.name_or_path = 'tiny' .* cannot read this data \(nothing was "
                                        r"pretrained\); set model.name_or_path .* cannot encode 4 of 4 sampled gold"):
        checked_config("grpo", overrides=sets)


# --- 5. the Python trainer: resume, overwrite, a console ------------------------------------------

FAST = ["rollout.engine.max_turns=2", "eval.size=2"]


@pytest.fixture(scope="module")
def python_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from contextlib import redirect_stdout
    from io import StringIO

    from tracerl.train import trainer

    out, printed = tmp_path_factory.mktemp("python") / "run", StringIO()
    with redirect_stdout(printed), trainer("grpo", out, smoke="random", steps=1, overrides=[*FAST, "log.plot=true"]) as run:
        run.run()
    return out, printed.getvalue()


def test_python_run_prints_the_console_and_writes_its_plot(python_run: tuple[Path, str]) -> None:
    out, printed = python_run
    lines = printed.splitlines()
    assert lines[0].startswith("train grpo | model random-tiny, ")
    assert any(line.startswith("step 1/1  ") and " ETA " in line for line in lines)
    assert f"plot {out / 'plot.png'}" in printed and (out / "plot.png").stat().st_size > 0


def test_python_run_twice_names_resume_and_overwrite(python_run: tuple[Path, str]) -> None:
    from tracerl.runs.folder import RunFolderError
    from tracerl.train import trainer

    with pytest.raises(RunFolderError) as err:
        trainer("grpo", python_run[0], smoke="random", steps=1, overrides=FAST)
    message = str(err.value)
    assert "resume=True" in message and "overwrite=True" in message and "--resume" not in message


def test_python_resume_and_overwrite(python_run: tuple[Path, str], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tracerl.runs.metrics import read_metrics
    from tracerl.train import trainer

    run = tmp_path / "copy"
    shutil.copytree(python_run[0], run)
    with pytest.raises(UserError, match=r"cannot change optim.lr \(run: 0.0003, given: 0.001\): a resume may change"):
        trainer("grpo", run, smoke="random", steps=2, overrides=[*FAST, "optim.lr=1e-3", "log.plot=true"], resume=True)
    with pytest.raises(UserError, match=r"already at step 1 and steps = 1 asks for no more; pass steps above 1"):
        trainer("grpo", run, smoke="random", steps=1, overrides=[*FAST, "log.plot=true"], resume=True)
    with trainer("grpo", run, smoke="random", steps=2, overrides=[*FAST, "log.plot=true"], resume=True,
                 quiet=True) as resumed:
        resumed.run()
    assert [r["step"] for r in read_metrics(run)] == [1, 2] and capsys.readouterr().out == ""  # quiet
    (run / "notes.txt").write_text("mine")
    with trainer("grpo", run, smoke="random", steps=1, overrides=FAST, overwrite=True, quiet=True) as fresh:
        assert not (run / "ckpt-000002").exists() and not (run / "plot.png").exists()
        fresh.run()
    assert [r["step"] for r in read_metrics(run)] == [1] and (run / "notes.txt").read_text() == "mine"


# --- 6. --explain on the base config ----------------------------------------------------------------


def test_config_show_explain_without_a_preset() -> None:
    result = invoke("config", "show", "--explain")
    assert result.exit_code == 0, result.output
    assert "\npreset: grpo\n" in result.stdout and "min_reachability: 0.5\n" in result.stdout
    assert "# ``files`` source with the ``search`` environment: before the run starts" in result.stdout


# --- 7. header and footer fit the terminal ---------------------------------------------------------


def words(text: str) -> list[str]:
    return [w for w in text.split() if w != "|"]  # a break between parts drops their separator


@pytest.mark.parametrize("width", [80, 100])
def test_header_and_footer_fit_without_breaking_words(width: int) -> None:
    config = resolve_config("trace", overrides=["steps=200"])
    config.dist.nproc = 2  # the header names the processes
    run_dir = Path("runs") / "a-run-folder-with-a-long-name"
    text = header(config, run_dir, 990_000, 0, width=width, format_why="the embedded tiny models' format")
    wide = header(config, run_dir, 990_000, 0, width=1000, format_why="the embedded tiny models' format")
    assert wide == (f"train trace | model tiny (default), 0.99M parameters | format react (the embedded tiny models' "
                    f"format) | run {run_dir} | device cpu, 2 processes (FSDP2) | steps 0 -> 200")
    assert all(len(line) <= width for line in text.splitlines()) and len(text.splitlines()) > 1
    assert words(text) == words(wide)  # the same words: lines break between parts, never inside a word
    records = [{"step": 20, "eval_accuracy": 0.25, "eval_f1": 0.3, "eval_turns": 2.5}]
    end = footer(records, run_dir / "ckpt-000020", width=width, plot=run_dir / "plot.png")
    assert all(len(line) <= width for line in end.splitlines())
    assert words(end) == words(f"final evaluation at step 20: accuracy 0.250, F1 0.300, turns 2.500 | checkpoint "
                           f"{run_dir / 'ckpt-000020'} | plot {run_dir / 'plot.png'}")


def test_fit_breaks_between_parts() -> None:
    assert fit(["aaaa", "bbbb", "cc"], 11) == "aaaa | bbbb\ncc"
    assert fit(["one two three"], 7) == "one two\nthree"  # a part wider than the line: between its words


def test_nproc_sets_omp_threads_for_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun prints a multi-line OMP_NUM_THREADS banner unless the variable is set: it is, to
    torchrun's own default, before the launch (our launcher is replaced; torchrun itself is not run)."""
    import os

    from tracerl.distributed import launch

    seen: list[str | None] = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launch, "check_launch", lambda *args, **kwargs: None)
    monkeypatch.setattr(launch, "relaunch", lambda nproc, argv: seen.append(os.environ.get("OMP_NUM_THREADS")) or 0)
    result = invoke("train", "grpo", "--smoke-random", "--nproc", "2", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert seen == ["1"]
